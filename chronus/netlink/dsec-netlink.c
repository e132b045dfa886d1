/*
 * dsec-netlink: gives sandboxes their network links, without a fork per sandbox.
 *
 * Edge runs one per node and writes one request per line on its stdin; each gets one line back:
 *
 *   attach HOSTIF NETNS_PATH GATEWAY ADDRESS   ->  "ok IFINDEX" | "err MESSAGE"
 *
 * attach makes a veth pair. HOSTIF stays in this (the host's) network namespace with GATEWAY/32
 * pointing at ADDRESS/32, up. Its peer becomes eth0 in the namespace at NETNS_PATH, with
 * ADDRESS/32 pointing at GATEWAY/32, up, and a default route via GATEWAY; lo is brought up
 * there too. Neither end generates an IPv6 address. On any failure the pair is deleted.
 * IFINDEX is HOSTIF's interface index. The program exits at end of input or when its parent dies.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if_addr.h>
#include <linux/if_link.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

struct msg {
	struct nlmsghdr n;
	char buf[1024];
};

static uint32_t seq;

static void *tail(struct msg *m)
{
	return (char *)m + NLMSG_ALIGN(m->n.nlmsg_len);
}

static int put(struct msg *m, void *data, size_t len)
{
	if (NLMSG_ALIGN(m->n.nlmsg_len) + RTA_ALIGN(len) > sizeof *m)
		return -1;
	memcpy(tail(m), data, len);
	m->n.nlmsg_len = NLMSG_ALIGN(m->n.nlmsg_len) + RTA_ALIGN(len);
	return 0;
}

static struct rtattr *attr(struct msg *m, unsigned short type, const void *data, size_t len)
{
	struct rtattr *a = tail(m);
	size_t total = RTA_LENGTH(len);
	if (NLMSG_ALIGN(m->n.nlmsg_len) + RTA_ALIGN(total) > sizeof *m)
		return NULL;
	a->rta_type = type;
	a->rta_len = (unsigned short)total;
	if (len)
		memcpy(RTA_DATA(a), data, len);
	m->n.nlmsg_len = NLMSG_ALIGN(m->n.nlmsg_len) + RTA_ALIGN(total);
	return a;
}

static void nest_end(struct msg *m, struct rtattr *nest)
{
	nest->rta_len = (unsigned short)((char *)tail(m) - (char *)nest);
}

static void start(struct msg *m, uint16_t type, uint16_t flags, size_t header)
{
	memset(m, 0, sizeof *m);
	m->n.nlmsg_len = NLMSG_LENGTH(header);
	m->n.nlmsg_type = type;
	m->n.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | flags;
}

/* Sends a request and waits for its acknowledgement; 0 or -errno. */
static int talk(int fd, struct msg *m)
{
	m->n.nlmsg_seq = ++seq;
	if (send(fd, m, m->n.nlmsg_len, 0) < 0)
		return -errno;
	char buf[8192];
	for (;;) {
		ssize_t n = recv(fd, buf, sizeof buf, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
			if (h->nlmsg_seq != seq || h->nlmsg_type != NLMSG_ERROR)
				continue;
			return ((struct nlmsgerr *)NLMSG_DATA(h))->error;
		}
	}
}

static int route_socket(void)
{
	int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
	if (fd < 0)
		return -1;
	struct sockaddr_nl sa = { .nl_family = AF_NETLINK };
	if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Turns IPv6 address generation off on a link (before it goes up). */
static int no_ipv6(int fd, int ifindex)
{
	struct msg m;
	start(&m, RTM_NEWLINK, 0, sizeof(struct ifinfomsg));
	struct ifinfomsg *i = NLMSG_DATA(&m.n);
	i->ifi_family = AF_UNSPEC;
	i->ifi_index = ifindex;
	struct rtattr *spec = attr(&m, IFLA_AF_SPEC, NULL, 0);
	struct rtattr *inet6 = attr(&m, AF_INET6, NULL, 0);
	uint8_t mode = IN6_ADDR_GEN_MODE_NONE;
	attr(&m, IFLA_INET6_ADDR_GEN_MODE, &mode, sizeof mode);
	nest_end(&m, inet6);
	nest_end(&m, spec);
	return talk(fd, &m);
}

static int set_up(int fd, int ifindex)
{
	struct msg m;
	start(&m, RTM_NEWLINK, 0, sizeof(struct ifinfomsg));
	struct ifinfomsg *i = NLMSG_DATA(&m.n);
	i->ifi_family = AF_UNSPEC;
	i->ifi_index = ifindex;
	i->ifi_flags = IFF_UP;
	i->ifi_change = IFF_UP;
	return talk(fd, &m);
}

/* local/32 with peer/32 on a link. */
static int add_address(int fd, int ifindex, struct in_addr local, struct in_addr peer)
{
	struct msg m;
	start(&m, RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, sizeof(struct ifaddrmsg));
	struct ifaddrmsg *a = NLMSG_DATA(&m.n);
	a->ifa_family = AF_INET;
	a->ifa_prefixlen = 32;
	a->ifa_scope = RT_SCOPE_UNIVERSE;
	a->ifa_index = (unsigned)ifindex;
	attr(&m, IFA_LOCAL, &local, sizeof local);
	attr(&m, IFA_ADDRESS, &peer, sizeof peer);
	return talk(fd, &m);
}

static int default_route(int fd, int ifindex, struct in_addr gateway)
{
	struct msg m;
	start(&m, RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, sizeof(struct rtmsg));
	struct rtmsg *r = NLMSG_DATA(&m.n);
	r->rtm_family = AF_INET;
	r->rtm_table = RT_TABLE_MAIN;
	r->rtm_protocol = RTPROT_BOOT;
	r->rtm_scope = RT_SCOPE_UNIVERSE;
	r->rtm_type = RTN_UNICAST;
	uint32_t oif = (uint32_t)ifindex;
	attr(&m, RTA_GATEWAY, &gateway, sizeof gateway);
	attr(&m, RTA_OIF, &oif, sizeof oif);
	return talk(fd, &m);
}

static int create_veth(int fd, const char *hostif, int nsfd)
{
	struct msg m;
	start(&m, RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, sizeof(struct ifinfomsg));
	((struct ifinfomsg *)NLMSG_DATA(&m.n))->ifi_family = AF_UNSPEC;
	attr(&m, IFLA_IFNAME, hostif, strlen(hostif) + 1);
	struct rtattr *info = attr(&m, IFLA_LINKINFO, NULL, 0);
	attr(&m, IFLA_INFO_KIND, "veth", 5);
	struct rtattr *data = attr(&m, IFLA_INFO_DATA, NULL, 0);
	struct rtattr *peer = attr(&m, VETH_INFO_PEER, NULL, 0);
	struct ifinfomsg peer_info = { .ifi_family = AF_UNSPEC };
	if (!peer || put(&m, &peer_info, sizeof peer_info) < 0)
		return -EMSGSIZE;
	attr(&m, IFLA_IFNAME, "eth0", 5);
	uint32_t ns = (uint32_t)nsfd;
	if (!attr(&m, IFLA_NET_NS_FD, &ns, sizeof ns))
		return -EMSGSIZE;
	nest_end(&m, peer);
	nest_end(&m, data);
	nest_end(&m, info);
	return talk(fd, &m);
}

static int delete_link(int fd, const char *name)
{
	struct msg m;
	start(&m, RTM_DELLINK, 0, sizeof(struct ifinfomsg));
	((struct ifinfomsg *)NLMSG_DATA(&m.n))->ifi_family = AF_UNSPEC;
	attr(&m, IFLA_IFNAME, name, strlen(name) + 1);
	return talk(fd, &m);
}

static int host_fd = -1;
static int host_ns = -1;

/* The sandbox side, from inside its namespace; the caller returns to the host's. */
static const char *configure_inside(int nsfd, struct in_addr gateway, struct in_addr address)
{
	if (setns(nsfd, CLONE_NEWNET) < 0)
		return "enter the sandbox's network namespace";
	int fd = route_socket();
	if (fd < 0)
		return "open a netlink socket in the sandbox";
	const char *why = NULL;
	int eth0 = (int)if_nametoindex("eth0"), lo = (int)if_nametoindex("lo");
	int err = 0;
	if (!eth0 || !lo)
		why = "find eth0 and lo in the sandbox";
	else if ((err = no_ipv6(fd, eth0)) < 0)
		why = "turn IPv6 off on eth0";
	else if ((err = add_address(fd, eth0, address, gateway)) < 0)
		why = "address eth0";
	else if ((err = set_up(fd, lo)) < 0 || (err = set_up(fd, eth0)) < 0)
		why = "bring eth0 up";
	else if ((err = default_route(fd, eth0, gateway)) < 0)
		why = "add the default route";
	if (err < 0)
		errno = -err;
	close(fd);
	return why;
}

/* Handles one attach; writes the answer line. */
static void attach(const char *hostif, const char *nspath, const char *gw, const char *addr)
{
	struct in_addr gateway, address;
	if (strlen(hostif) >= IFNAMSIZ || inet_pton(AF_INET, gw, &gateway) != 1 || inet_pton(AF_INET, addr, &address) != 1) {
		printf("err bad request\n");
		return;
	}
	int nsfd = open(nspath, O_RDONLY | O_CLOEXEC);
	if (nsfd < 0) {
		printf("err open %s: %s\n", nspath, strerror(errno));
		return;
	}
	const char *why = NULL;
	int err = create_veth(host_fd, hostif, nsfd);
	int ifindex = 0;
	if (err < 0) {
		printf("err create %s: %s\n", hostif, strerror(-err));
		close(nsfd);
		return;
	}
	if (!(ifindex = (int)if_nametoindex(hostif))) {
		why = "find the host end";
		err = -errno;
	} else if ((err = no_ipv6(host_fd, ifindex)) < 0) {
		why = "turn IPv6 off on the host end";
	} else if ((err = add_address(host_fd, ifindex, gateway, address)) < 0) {
		why = "address the host end";
	} else if ((err = set_up(host_fd, ifindex)) < 0) {
		why = "bring the host end up";
	} else {
		why = configure_inside(nsfd, gateway, address);
		err = why ? -errno : 0;
		if (setns(host_ns, CLONE_NEWNET) < 0) {
			/* Cannot get back: every later answer would be wrong. */
			fprintf(stderr, "dsec-netlink: cannot return to the host namespace: %s\n", strerror(errno));
			exit(1);
		}
	}
	close(nsfd);
	if (why) {
		delete_link(host_fd, hostif);
		printf("err %s: %s\n", why, strerror(err < 0 ? -err : EIO));
		return;
	}
	printf("ok %d\n", ifindex);
}

int main(void)
{
	if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0 || getppid() == 1)
		return 1;
	host_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
	host_fd = route_socket();
	if (host_ns < 0 || host_fd < 0) {
		fprintf(stderr, "dsec-netlink: %s\n", strerror(errno));
		return 1;
	}
	char line[8192];
	while (fgets(line, sizeof line, stdin)) {
		char *argv[6] = { 0 };
		int argc = 0;
		for (char *tok = strtok(line, " \n"); tok && argc < 6; tok = strtok(NULL, " \n"))
			argv[argc++] = tok;
		if (argc == 5 && !strcmp(argv[0], "attach"))
			attach(argv[1], argv[2], argv[3], argv[4]);
		else
			printf("err bad request\n");
		if (fflush(stdout) != 0)
			return 0;
	}
	return 0;
}
