/*
 * dsec-nflog: prints the packets nftables logs to an NFLOG group, one line each.
 *
 * Edge's network rules drop what a sandbox may not send and log the attempt with
 * `log group N prefix "<reason>"`. Edge runs one dsec-nflog per node and reads its output:
 *
 *   <4|6> <prefix> <source> <destination> <protocol> <source port> <destination port> <in ifindex>
 *
 * Ports are 0 for protocols without them; for ICMP the destination port is the ICMP type.
 * A line "lost <n>" says the kernel dropped messages because the reader fell behind.
 * The program exits when its parent does (PR_SET_PDEATHSIG) or when stdout is closed.
 *
 * usage: dsec-nflog GROUP
 */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_log.h>
#include <linux/netlink.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

/* Bytes of each packet copied to us: enough for any IPv4/IPv6 header plus the ports. */
#define COPY_RANGE 128
#define RECV_BUFFER (1 << 20)

static void __attribute__((noreturn)) die(const char *what)
{
	fprintf(stderr, "dsec-nflog: %s: %s\n", what, strerror(errno));
	exit(1);
}

struct request {
	struct nlmsghdr nlh;
	struct nfgenmsg nfg;
	char attrs[64];
};

static void put_attr(struct request *r, uint16_t type, const void *data, uint16_t len)
{
	struct nlattr *a = (struct nlattr *)((char *)r + NLMSG_ALIGN(r->nlh.nlmsg_len));
	a->nla_type = type;
	a->nla_len = NLA_HDRLEN + len;
	memcpy((char *)a + NLA_HDRLEN, data, len);
	r->nlh.nlmsg_len = NLMSG_ALIGN(r->nlh.nlmsg_len) + NLA_ALIGN(a->nla_len);
}

/* Sends one config message for the group and waits for the kernel's acknowledgement. */
static void configure(int fd, uint16_t group, uint16_t type, const void *data, uint16_t len, uint32_t seq)
{
	struct request r;
	memset(&r, 0, sizeof r);
	r.nlh.nlmsg_len = NLMSG_LENGTH(sizeof(struct nfgenmsg));
	r.nlh.nlmsg_type = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG;
	r.nlh.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
	r.nlh.nlmsg_seq = seq;
	r.nfg.nfgen_family = AF_UNSPEC;
	r.nfg.version = NFNETLINK_V0;
	r.nfg.res_id = htons(group);
	put_attr(&r, type, data, len);
	if (send(fd, &r, r.nlh.nlmsg_len, 0) < 0)
		die("send config");
	char buf[4096];
	for (;;) {
		ssize_t n = recv(fd, buf, sizeof buf, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("recv ack");
		}
		for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
			if (h->nlmsg_type != NLMSG_ERROR || h->nlmsg_seq != seq)
				continue;
			const struct nlmsgerr *e = NLMSG_DATA(h);
			if (e->error != 0) {
				errno = -e->error;
				die("configure group");
			}
			return;
		}
	}
}

static uint16_t port_at(const unsigned char *p, size_t len, size_t off)
{
	return off + 2 <= len ? (uint16_t)(p[off] << 8 | p[off + 1]) : 0;
}

/* Prints one logged packet. */
static void print_packet(const char *prefix, uint32_t ifindex, const unsigned char *p, size_t len)
{
	char src[INET6_ADDRSTRLEN], dst[INET6_ADDRSTRLEN];
	unsigned proto, sport = 0, dport = 0, fam;
	size_t l4;
	if (len >= 20 && p[0] >> 4 == 4) {
		fam = 4;
		l4 = (size_t)(p[0] & 0x0f) * 4;
		proto = p[9];
		inet_ntop(AF_INET, p + 12, src, sizeof src);
		inet_ntop(AF_INET, p + 16, dst, sizeof dst);
		/* Only the first fragment carries the ports. */
		if ((p[6] & 0x1f) != 0 || p[7] != 0)
			l4 = len;
	} else if (len >= 40 && p[0] >> 4 == 6) {
		fam = 6;
		l4 = 40;
		proto = p[6];
		inet_ntop(AF_INET6, p + 8, src, sizeof src);
		inet_ntop(AF_INET6, p + 24, dst, sizeof dst);
	} else {
		return;
	}
	if (proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP) {
		sport = port_at(p, len, l4);
		dport = port_at(p, len, l4 + 2);
	} else if ((proto == IPPROTO_ICMP || proto == IPPROTO_ICMPV6) && l4 < len) {
		dport = p[l4];
	}
	printf("%u %s %s %s %u %u %u %u\n", fam, prefix[0] ? prefix : "-", src, dst, proto, sport, dport, ifindex);
}

static void handle(const struct nlmsghdr *h)
{
	if (h->nlmsg_type != ((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET))
		return;
	const char *prefix = "";
	const unsigned char *payload = NULL;
	size_t payload_len = 0;
	uint32_t ifindex = 0;
	size_t off = NLMSG_HDRLEN + NLMSG_ALIGN(sizeof(struct nfgenmsg));
	while (off + NLA_HDRLEN <= h->nlmsg_len) {
		const struct nlattr *a = (const struct nlattr *)((const char *)h + off);
		if (a->nla_len < NLA_HDRLEN || off + a->nla_len > h->nlmsg_len)
			break;
		const char *data = (const char *)a + NLA_HDRLEN;
		size_t dlen = a->nla_len - NLA_HDRLEN;
		switch (a->nla_type & NLA_TYPE_MASK) {
		case NFULA_PREFIX:
			/* A prefix is NUL-terminated; refuse one that is not, or has spaces. */
			if (dlen > 0 && memchr(data, '\0', dlen) && !strchr(data, ' '))
				prefix = data;
			break;
		case NFULA_IFINDEX_INDEV:
			if (dlen == sizeof ifindex) {
				memcpy(&ifindex, data, sizeof ifindex);
				ifindex = ntohl(ifindex);
			}
			break;
		case NFULA_PAYLOAD:
			payload = (const unsigned char *)data;
			payload_len = dlen;
			break;
		}
		off += NLA_ALIGN(a->nla_len);
	}
	if (payload)
		print_packet(prefix, ifindex, payload, payload_len);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: dsec-nflog GROUP\n");
		return 2;
	}
	char *end;
	long group = strtol(argv[1], &end, 10);
	if (*end || group < 0 || group > 65535) {
		fprintf(stderr, "dsec-nflog: bad group %s\n", argv[1]);
		return 2;
	}
	if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0)
		die("prctl");
	if (getppid() == 1)
		return 0;
	signal(SIGPIPE, SIG_DFL);

	int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
	if (fd < 0)
		die("socket");
	int size = RECV_BUFFER;
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size) < 0)
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
	struct sockaddr_nl addr = { .nl_family = AF_NETLINK };
	if (bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0)
		die("bind");

	struct nfulnl_msg_config_cmd bind_cmd = { .command = NFULNL_CFG_CMD_BIND };
	configure(fd, (uint16_t)group, NFULA_CFG_CMD, &bind_cmd, sizeof bind_cmd, 1);
	struct nfulnl_msg_config_mode mode = { .copy_range = htonl(COPY_RANGE), .copy_mode = NFULNL_COPY_PACKET };
	configure(fd, (uint16_t)group, NFULA_CFG_MODE, &mode, sizeof mode, 2);
	uint32_t qthresh = htonl(1);
	configure(fd, (uint16_t)group, NFULA_CFG_QTHRESH, &qthresh, sizeof qthresh, 3);
	printf("ready %ld\n", group);
	fflush(stdout);

	static char buf[65536];
	unsigned long lost = 0;
	for (;;) {
		ssize_t n = recv(fd, buf, sizeof buf, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == ENOBUFS) {
				printf("lost %lu\n", ++lost);
				fflush(stdout);
				continue;
			}
			die("recv");
		}
		for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n))
			handle(h);
		if (fflush(stdout) != 0)
			return 0;
	}
}
