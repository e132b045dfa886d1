/* chronus: the in-sandbox agent. PID 1 duties, command line, and the event loop. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "conn.h"
#include "proc.h"
#include "util.h"

#define DEFAULT_GRACE_MS 2000
#define STREAM_REOPEN_MS 200
#define MIN_OUTPUT_CAP_BYTES 4096
#define MAX_OUTPUT_CAP_BYTES (1ull << 30)
/* --stream-path may be given this many times (a microVM's virtio-serial ports, one connection each). */
#define MAX_STREAM_PATHS 8

struct options {
	int listen_fd;
	int stream_fd;
	const char *stream_paths[MAX_STREAM_PATHS];
	int n_stream_paths;
	uint64_t output_cap;
	uint64_t grace_ms;
	bool best_effort;
	int child_oom_score_adj;
};

static struct options opt = { .listen_fd = -1, .stream_fd = -1,
			      .output_cap = DEFAULT_OUTPUT_CAP_BYTES, .grace_ms = DEFAULT_GRACE_MS,
			      .child_oom_score_adj = -1 };

int agent_child_oom_score_adj(void)
{
	return opt.child_oom_score_adj;
}
static int64_t start_ns;
static int64_t stream_reopen_ns[MAX_STREAM_PATHS] = { -1, -1, -1, -1, -1, -1, -1, -1 };
static int64_t shutdown_ns = -1;

uint64_t agent_uptime_ms(void)
{
	return (uint64_t)((mono_ns() - start_ns) / NS_PER_MS);
}

static void __attribute__((noreturn)) usage(void)
{
	fprintf(stderr, "usage: chronus (--listen-fd N | --stream-fd N | --stream-path PATH)"
			" [--output-cap BYTES] [--grace-ms MS]"
			" [--cpu-class latency-sensitive|best-effort] [--child-oom-score-adj N]\n");
	exit(2);
}

static uint64_t parse_u64(const char *s, uint64_t min, uint64_t max)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s || *end || s[0] == '-' || v < min || v > max)
		usage();
	return v;
}

static void parse_args(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (i + 1 >= argc)
			usage();
		const char *v = argv[++i];
		if (!strcmp(a, "--listen-fd"))
			opt.listen_fd = (int)parse_u64(v, 0, INT_MAX);
		else if (!strcmp(a, "--stream-fd"))
			opt.stream_fd = (int)parse_u64(v, 0, INT_MAX);
		else if (!strcmp(a, "--stream-path") && opt.n_stream_paths < MAX_STREAM_PATHS)
			opt.stream_paths[opt.n_stream_paths++] = v;
		else if (!strcmp(a, "--output-cap"))
			opt.output_cap = parse_u64(v, MIN_OUTPUT_CAP_BYTES, MAX_OUTPUT_CAP_BYTES);
		else if (!strcmp(a, "--grace-ms"))
			opt.grace_ms = parse_u64(v, 0, 24ull * 3600 * 1000);
		else if (!strcmp(a, "--child-oom-score-adj"))
			opt.child_oom_score_adj = (int)parse_u64(v, 0, 1000);
		else if (!strcmp(a, "--cpu-class") && !strcmp(v, "best-effort"))
			opt.best_effort = true;
		else if (!strcmp(a, "--cpu-class") && !strcmp(v, "latency-sensitive"))
			opt.best_effort = false;
		else
			usage();
	}
	int modes = (opt.listen_fd >= 0) + (opt.stream_fd >= 0) + (opt.n_stream_paths > 0);
	if (modes != 1)
		usage();
}

/* Children inherit 0, 1 and 2 by dup2: make sure they exist so no pipe lands on them. */
static void ensure_stdio(void)
{
	for (int fd = 0; fd < 3; fd++) {
		if (fcntl(fd, F_GETFD) >= 0)
			continue;
		int n = open("/dev/null", O_RDWR);
		if (n < 0) {
			log_msg("open /dev/null: %s", strerror(errno));
			exit(1);
		}
		if (n != fd) {
			log_msg("stdio descriptor %d landed on %d", fd, n);
			exit(1);
		}
	}
}

/* Everything chronus inherited beyond stdio must not leak into commands. */
static void cloexec_inherited(void)
{
	if (close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) == 0)
		return;
	log_msg("close_range: %s; marking descriptors one by one", strerror(errno));
	for (int fd = 3; fd < 1024; fd++) {
		int fl = fcntl(fd, F_GETFD);
		if (fl >= 0 && fcntl(fd, F_SETFD, fl | FD_CLOEXEC) < 0)
			log_msg("fcntl %d: %s", fd, strerror(errno));
	}
}

static void become_init(void)
{
	if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
		log_msg("PR_SET_DUMPABLE: %s", strerror(errno));
	if (getpid() != 1 && prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0)
		log_msg("PR_SET_CHILD_SUBREAPER: %s", strerror(errno));
	if (signal(SIGPIPE, SIG_IGN) == SIG_ERR)
		log_msg("SIGPIPE: %s", strerror(errno));
	/* Best-effort sandboxes run under SCHED_IDLE; every command inherits it. */
	struct sched_param sp = { .sched_priority = 0 };
	if (opt.best_effort && sched_setscheduler(0, SCHED_IDLE, &sp) < 0)
		log_msg("SCHED_IDLE: %s", strerror(errno));
}

static int make_signalfd(void)
{
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	if (sigprocmask(SIG_BLOCK, &set, NULL) < 0) {
		log_msg("sigprocmask: %s", strerror(errno));
		exit(1);
	}
	int fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
	if (fd < 0) {
		log_msg("signalfd: %s", strerror(errno));
		exit(1);
	}
	return fd;
}

static void begin_shutdown(int sig)
{
	if (shutdown_ns >= 0)
		return;
	log_msg("signal %d: stopping commands", sig);
	shutdown_ns = mono_ns() + (int64_t)opt.grace_ms * NS_PER_MS;
	proc_signal_all(SIGTERM);
}

static void on_signal(void *obj, int fd, short revents)
{
	(void)obj;
	(void)revents;
	struct signalfd_siginfo si;
	bool child = false;
	for (;;) {
		ssize_t n = read(fd, &si, sizeof si);
		if (n != (ssize_t)sizeof si)
			break;
		if (si.ssi_signo == SIGCHLD)
			child = true;
		else if (getpid() == 1 && si.ssi_pid != 0)
			/* From inside the sandbox (kill 1): an agent may not stop the sandbox. Signals
			 * from the runtime or the host arrive from outside the pid namespace (pid 0). */
			log_msg("ignoring signal %u from pid %u", si.ssi_signo, si.ssi_pid);
		else
			begin_shutdown((int)si.ssi_signo);
	}
	if (child)
		proc_reap();
}

static void on_listen(void *obj, int fd, short revents)
{
	(void)obj;
	(void)revents;
	for (int i = 0; i < 16; i++) {
		int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (c < 0) {
			if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				log_msg("accept: %s", strerror(errno));
			return;
		}
		if (conn_count() >= MAX_CONNS || !conn_add(c, false)) {
			log_msg("refusing connection: %d open", conn_count());
			close(c);
		}
	}
}

static void open_stream(int slot)
{
	int fd = open(opt.stream_paths[slot], O_RDWR | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
	struct conn *c = fd >= 0 ? conn_add(fd, true) : NULL;
	if (!c) {
		if (fd >= 0)
			close(fd);
		stream_reopen_ns[slot] = mono_ns() + STREAM_REOPEN_MS * NS_PER_MS;
		return;
	}
	c->stream_slot = slot;
	stream_reopen_ns[slot] = -1;
}

void stream_lost(int slot)
{
	if (slot >= 0 && slot < opt.n_stream_paths)
		stream_reopen_ns[slot] = mono_ns() + STREAM_REOPEN_MS * NS_PER_MS;
}

static int64_t min_deadline(int64_t a, int64_t b)
{
	if (a < 0)
		return b;
	if (b < 0)
		return a;
	return a < b ? a : b;
}

/* Timers, buffered requests, output, closing; returns the next deadline (ns) or -1. */
static int64_t housekeeping(void)
{
	int64_t now = mono_ns();
	if (shutdown_ns >= 0 && (now >= shutdown_ns || proc_signal_all(0) == 0)) {
		proc_signal_all(SIGKILL);
		exit(0);
	}
	for (int i = 0; i < opt.n_stream_paths; i++)
		if (stream_reopen_ns[i] >= 0 && now >= stream_reopen_ns[i])
			open_stream(i);
	int64_t next = proc_tick(now);
	conn_housekeeping();
	proc_pump();
	conns_flush();
	conns_reap();
	for (int i = 0; i < opt.n_stream_paths; i++)
		next = min_deadline(next, stream_reopen_ns[i]);
	return min_deadline(next, shutdown_ns);
}

static int poll_timeout_ms(int64_t deadline)
{
	if (deadline < 0)
		return -1;
	int64_t ms = (deadline - mono_ns() + NS_PER_MS - 1) / NS_PER_MS;
	return ms < 0 ? 0 : ms > INT_MAX ? INT_MAX : (int)ms;
}

static void __attribute__((noreturn)) run(int sigfd)
{
	struct pollset ps = { 0 };
	for (;;) {
		int64_t deadline = housekeeping();
		ps.n = 0;
		bool ok = pollset_add(&ps, sigfd, POLLIN, on_signal, NULL, sigfd);
		if (opt.listen_fd >= 0 && shutdown_ns < 0)
			ok = ok && pollset_add(&ps, opt.listen_fd, POLLIN, on_listen, NULL, opt.listen_fd);
		conn_poll(&ps);
		proc_poll(&ps);
		if (!ok)
			log_msg("poll set: out of memory");
		int n = poll(ps.fds, ps.n, poll_timeout_ms(deadline));
		if (n < 0 && errno != EINTR) {
			log_msg("poll: %s", strerror(errno));
			continue;
		}
		for (size_t i = 0; n > 0 && i < ps.n; i++) {
			if (!ps.fds[i].revents)
				continue;
			struct poll_ref *r = &ps.refs[i];
			r->fn(r->obj, r->arg, ps.fds[i].revents);
		}
	}
}

int main(int argc, char **argv)
{
	start_ns = mono_ns();
	parse_args(argc, argv);
	ensure_stdio();
	cloexec_inherited();
	become_init();
	proc_init((size_t)opt.output_cap);
	int sigfd = make_signalfd();
	if (opt.listen_fd >= 0 && !set_nonblock(opt.listen_fd)) {
		log_msg("listen fd %d: %s", opt.listen_fd, strerror(errno));
		return 1;
	}
	if (opt.stream_fd >= 0) {
		if (!set_nonblock(opt.stream_fd) || !conn_add(opt.stream_fd, true)) {
			log_msg("stream fd %d: %s", opt.stream_fd, strerror(errno));
			return 1;
		}
	}
	for (int i = 0; i < opt.n_stream_paths; i++)
		open_stream(i);
	run(sigfd);
}
