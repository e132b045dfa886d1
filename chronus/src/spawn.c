/* Starting a command: parse EXEC, fork, set up stdio or a terminal, exec. */
#include "spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#define ARGV_SUMMARY_BYTES 256
#define DEFAULT_ROWS 24
#define DEFAULT_COLS 80
#define DEFAULT_WINDOW_BYTES 262144
#define DEFAULT_PATH "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

static void close_fd(int *fd)
{
	if (*fd >= 0 && close(*fd) < 0)
		log_msg("close: %s", strerror(errno));
	*fd = -1;
}

struct spawn {
	char **argv;
	char **envp;
	char cwd[4096];
	bool set_ids;
	uid_t uid;
	gid_t gid;
	bool want_stdin, pty;
	struct winsize ws;
	uint64_t timeout_ms;
};

enum spawn_step { STEP_SETSID = 1, STEP_TTY, STEP_STDIO, STEP_IDS, STEP_CHDIR, STEP_EXEC };

static const char *step_name(int step)
{
	switch (step) {
	case STEP_SETSID: return "setsid";
	case STEP_TTY: return "open terminal";
	case STEP_STDIO: return "set up stdio";
	case STEP_IDS: return "set uid/gid";
	case STEP_CHDIR: return "chdir";
	default: return "exec";
	}
}

struct child_fds {
	int in, out, err;
	int status;
	const char *pts;
};

static void __attribute__((noreturn)) child_fail(int status_fd, int step)
{
	int msg[2] = { step, errno };
	ssize_t n = write(status_fd, msg, sizeof msg);
	(void)n;
	_exit(127);
}

/* Commands are the OOM killer's first choice; the agent itself (PID 1) is its last. */
static void set_oom_score_adj(int v)
{
	if (v < 0)
		return;
	char buf[16];
	int n = snprintf(buf, sizeof buf, "%d\n", v);
	int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	if (write(fd, buf, (size_t)n) < 0) {
		/* best effort: the command keeps the agent's score */
	}
	close(fd);
}

static void __attribute__((noreturn)) child_run(const struct spawn *q, struct child_fds f)
{
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	signal(SIGPIPE, SIG_DFL);
	if (setsid() < 0)
		child_fail(f.status, STEP_SETSID);
	if (q->pty) {
		int t = open(f.pts, O_RDWR | O_CLOEXEC);
		if (t < 0 || ioctl(t, TIOCSCTTY, 0) < 0)
			child_fail(f.status, STEP_TTY);
		f.in = f.out = f.err = t;
	} else if (f.in < 0) {
		f.in = open("/dev/null", O_RDONLY | O_CLOEXEC);
		if (f.in < 0)
			child_fail(f.status, STEP_STDIO);
	}
	if (dup2(f.in, 0) < 0 || dup2(f.out, 1) < 0 || dup2(f.err, 2) < 0)
		child_fail(f.status, STEP_STDIO);
	set_oom_score_adj(agent_child_oom_score_adj());
	if (q->set_ids &&
	    (setgroups(0, NULL) < 0 || setgid(q->gid) < 0 || setuid(q->uid) < 0))
		child_fail(f.status, STEP_IDS);
	if (chdir(q->cwd) < 0)
		child_fail(f.status, STEP_CHDIR);
	environ = q->envp;
	execvpe(q->argv[0], q->argv, q->envp);
	child_fail(f.status, STEP_EXEC);
}

static void free_strv(char **v)
{
	if (!v)
		return;
	for (char **s = v; *s; s++)
		free(*s);
	free(v);
}

/* Collects the repeated str field tag as a NULL-terminated vector; -errno on failure. */
static int collect_strv(const struct msg *m, uint16_t tag, char ***out)
{
	size_t n = 0, pos = 0;
	struct field f;
	while (field_next(m->p, m->len, &pos, &f))
		if (f.tag == tag)
			n++;
	*out = NULL;
	if (!n)
		return 0;
	char **v = calloc(n + 1, sizeof *v);
	if (!v)
		return -ENOMEM;
	size_t i = 0;
	pos = 0;
	while (field_next(m->p, m->len, &pos, &f)) {
		if (f.tag != tag)
			continue;
		if (memchr(f.v, 0, f.len) || !(v[i] = strndup((const char *)f.v, f.len))) {
			int err = memchr(f.v, 0, f.len) ? -EINVAL : -ENOMEM;
			free_strv(v);
			return err;
		}
		i++;
	}
	*out = v;
	return (int)n;
}

static char **strv_of(const char *const *src)
{
	size_t n = 0;
	while (src[n])
		n++;
	char **v = calloc(n + 1, sizeof *v);
	if (!v)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		if (!(v[i] = strdup(src[i]))) {
			free_strv(v);
			return NULL;
		}
	}
	return v;
}

/* Parses an EXEC request; on failure answers it and returns false. */
static bool parse_exec(struct conn *c, const struct msg *m, struct spawn *q)
{
	const unsigned char *shell;
	size_t shell_len;
	int r;
	if (msg_bytes(m, F_SHELL, &shell, &shell_len)) {
		char *cmd = memchr(shell, 0, shell_len) ? NULL : strndup((const char *)shell, shell_len);
		const char *sv[] = { "/bin/sh", "-c", cmd, NULL };
		q->argv = cmd ? strv_of(sv) : NULL;
		r = q->argv ? 1 : -EINVAL;
		free(cmd);
	} else {
		r = collect_strv(m, F_ARGV, &q->argv);
	}
	if (r <= 0) {
		reply_error(c, m->id, r == -ENOMEM ? ENOMEM : EINVAL,
			    r == 0 ? "EXEC needs ARGV or SHELL" : "bad ARGV or SHELL");
		return false;
	}
	uint64_t uid = 0, gid = 0, rows = DEFAULT_ROWS, cols = DEFAULT_COLS, timeout = 0;
	uint64_t window = DEFAULT_WINDOW_BYTES;
	int ru = msg_u64(m, F_UID, &uid), rg = msg_u64(m, F_GID, &gid);
	if (ru < 0 || rg < 0 || msg_u64(m, F_ROWS, &rows) < 0 || msg_u64(m, F_COLS, &cols) < 0 ||
	    msg_u64(m, F_TIMEOUT_MS, &timeout) < 0 || msg_u64(m, F_WINDOW, &window) < 0 ||
	    uid >= UINT32_MAX || gid >= UINT32_MAX || rows > 0xFFFF || cols > 0xFFFF) {
		reply_error(c, m->id, EINVAL, "bad numeric field");
		return false;
	}
	q->set_ids = ru > 0 || rg > 0;
	q->uid = (uid_t)uid;
	q->gid = (gid_t)gid;
	q->ws = (struct winsize){ .ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols };
	q->timeout_ms = timeout;
	q->want_stdin = msg_flag(m, F_STDIN);
	q->pty = msg_flag(m, F_PTY);
	r = msg_cstr(m, F_CWD, q->cwd, sizeof q->cwd);
	if (r < 0) {
		reply_error(c, m->id, -r, "bad CWD");
		return false;
	}
	if (r == 0)
		strcpy(q->cwd, "/");
	r = collect_strv(m, F_ENV, &q->envp);
	if (r < 0) {
		reply_error(c, m->id, -r, "bad ENV");
		return false;
	}
	if (r == 0) {
		const char *dv[] = { DEFAULT_PATH, uid == 0 ? "HOME=/root" : "HOME=/", NULL };
		if (!(q->envp = strv_of(dv))) {
			reply_error(c, m->id, ENOMEM, "out of memory");
			return false;
		}
	}
	return true;
}

/* The first ARGV_SUMMARY_BYTES of argv, encoded as ARGV fields for LIST. */
static void summarize_argv(struct buf *b, char **argv)
{
	size_t left = ARGV_SUMMARY_BYTES;
	for (char **a = argv; *a && left; a++) {
		size_t n = strlen(*a);
		if (n > left)
			n = left;
		put_bytes(b, F_ARGV, *a, n);
		left -= n;
	}
}

static int open_pty(const struct winsize *ws, char *name, size_t namesz)
{
	int fd = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	if (grantpt(fd) < 0 || unlockpt(fd) < 0 || ptsname_r(fd, name, namesz) != 0 ||
	    ioctl(fd, TIOCSWINSZ, ws) < 0) {
		int err = errno;
		close(fd);
		errno = err;
		return -1;
	}
	return fd;
}

/* Pipes and terminal of one spawn: [0] the parent's end, [1] the child's. */
struct spawn_fds {
	int out[2], err[2], in[2], status[2], master;
	char pts[128];
};

static void close_spawn_fds(struct spawn_fds *f)
{
	int *all[] = { &f->out[0], &f->out[1], &f->err[0], &f->err[1], &f->in[0],
		       &f->in[1], &f->status[0], &f->status[1], &f->master };
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		close_fd(all[i]);
}

static bool pipe_rw(int fds[2], bool child_reads)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC) < 0)
		return false;
	/* [0] is the parent's end. */
	fds[0] = child_reads ? p[1] : p[0];
	fds[1] = child_reads ? p[0] : p[1];
	return set_nonblock(fds[0]);
}

static int make_spawn_fds(const struct spawn *q, struct spawn_fds *f)
{
	if (q->pty) {
		f->master = open_pty(&q->ws, f->pts, sizeof f->pts);
		if (f->master < 0 || !set_nonblock(f->master))
			return errno;
		f->in[0] = fcntl(f->master, F_DUPFD_CLOEXEC, 3);
		if (f->in[0] < 0)
			return errno;
	} else {
		if (!pipe_rw(f->out, false) || !pipe_rw(f->err, false))
			return errno;
		if (q->want_stdin && !pipe_rw(f->in, true))
			return errno;
	}
	if (pipe2(f->status, O_CLOEXEC) < 0)
		return errno;
	return 0;
}

/* Waits for the child to exec: 0 on success, else the errno it failed with. */
static int await_exec(pid_t pid, int status_fd, int *step)
{
	int msg[2];
	ssize_t n;
	do
		n = read(status_fd, msg, sizeof msg);
	while (n < 0 && errno == EINTR);
	if (n == 0)
		return 0;
	int err = n == (ssize_t)sizeof msg ? msg[1] : EIO;
	*step = n == (ssize_t)sizeof msg ? msg[0] : STEP_EXEC;
	while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
		;
	return err;
}

static bool spawn(struct conn *c, const struct msg *m, struct spawn *q, struct spawned *out)
{
	struct spawn_fds f = { .out = { -1, -1 }, .err = { -1, -1 }, .in = { -1, -1 },
			       .status = { -1, -1 }, .master = -1 };
	int err = make_spawn_fds(q, &f);
	if (err) {
		reply_error(c, m->id, err, "spawn: %s", strerror(err));
		close_spawn_fds(&f);
		return false;
	}
	int64_t start = mono_ns();
	pid_t pid = fork();
	if (pid == 0) {
		struct child_fds cf = { .in = f.in[1], .out = f.out[1], .err = f.err[1],
					.status = f.status[1], .pts = f.pts };
		child_run(q, cf);
	}
	if (pid < 0) {
		err = errno;
		reply_error(c, m->id, err, "fork: %s", strerror(err));
		close_spawn_fds(&f);
		return false;
	}
	close_fd(&f.status[1]);
	close_fd(&f.out[1]);
	close_fd(&f.err[1]);
	close_fd(&f.in[1]);
	int step = 0;
	err = await_exec(pid, f.status[0], &step);
	close_fd(&f.status[0]);
	if (err) {
		reply_error(c, m->id, err, "%s %s: %s", step_name(step),
			    step == STEP_CHDIR ? q->cwd : q->argv[0], strerror(err));
		close_spawn_fds(&f);
		return false;
	}
	out->pid = pid;
	out->pty = q->pty;
	out->start_ns = start;
	out->timeout_ms = q->timeout_ms;
	out->out_fd[0] = q->pty ? f.master : f.out[0];
	out->out_fd[1] = q->pty ? -1 : f.err[0];
	out->in_fd = f.in[0];
	summarize_argv(&out->argv_fields, q->argv);
	return true;
}

bool spawn_exec(struct conn *c, const struct msg *m, struct spawned *out)
{
	struct spawn q = { 0 };
	bool ok = parse_exec(c, m, &q) && spawn(c, m, &q, out);
	free_strv(q.argv);
	free_strv(q.envp);
	return ok;
}

