/* The process table: spawning, output rings, attachments with flow control, reaping. */
#include "proc.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#define OUTPUT_CHUNK_BYTES 65536
#define RING_MIN_ALLOC_BYTES 4096
#define DEFAULT_WINDOW_BYTES 262144
#define MAX_WINDOW_BYTES (1ull << 30)
#define LINGER_MS 250
#define MAX_EXITED_PROCS 1024
#define ARGV_SUMMARY_BYTES 256
#define DEFAULT_ROWS 24
#define DEFAULT_COLS 80
#define DEFAULT_PATH "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

enum { STREAM_OUT = 0, STREAM_ERR = 1 };

/* Bytes [start, end) of a stream; byte at offset o lives at buf[o % output_cap]. The
 * allocation grows from a few KiB up to output_cap, and only wraps once it is full size. */
struct ring {
	unsigned char *buf;
	size_t alloc;
	uint64_t start, end;
};

struct attach {
	struct attach *next;
	struct conn *conn;
	uint32_t id;
	bool wait_only;
	uint64_t window;
	uint64_t sent[2], acked[2];
};

struct proc {
	struct proc *prev, *next;
	uint64_t handle;
	pid_t pid;
	bool pty;
	struct buf argv_fields;
	struct ring ring[2];
	int out_fd[2];
	int in_fd;
	struct {
		unsigned char *data;
		size_t len, off;
		bool eof, busy;
		struct conn *conn;
		uint32_t id;
	} in;
	struct attach *attach;
	int64_t start_ns, deadline_ns, linger_ns;
	bool reaped, exited, timed_out, released;
	int status;
	struct rusage ru;
	uint64_t duration_ms;
};

static size_t output_cap = DEFAULT_OUTPUT_CAP_BYTES;
static struct proc *head, *tail;
static uint64_t next_handle = 1;
static uint64_t nprocs, nexited;

void proc_init(size_t cap)
{
	output_cap = cap;
}

uint64_t proc_count(void)
{
	return nprocs;
}

uint64_t proc_output_cap(void)
{
	return output_cap;
}

static void close_fd(int *fd)
{
	if (*fd >= 0 && close(*fd) < 0)
		log_msg("close: %s", strerror(errno));
	*fd = -1;
}

static struct proc *find(uint64_t handle)
{
	for (struct proc *p = head; p; p = p->next)
		if (p->handle == handle && !p->released)
			return p;
	return NULL;
}

/* Finds the PROC named by a request, or answers it with an error. */
static struct proc *find_for(struct conn *c, const struct msg *m)
{
	uint64_t handle;
	int r = msg_u64(m, F_PROC, &handle);
	if (r <= 0) {
		reply_error(c, m->id, EINVAL, "PROC missing or malformed");
		return NULL;
	}
	struct proc *p = find(handle);
	if (!p)
		reply_error(c, m->id, ENOENT, "no process %llu", (unsigned long long)handle);
	return p;
}

/* ---- output rings ---- */

static bool ring_prepare(struct ring *r, size_t n)
{
	if (r->alloc == output_cap)
		return true;
	uint64_t want = r->end + n;
	if (want <= r->alloc)
		return true;
	size_t a = r->alloc ? r->alloc : RING_MIN_ALLOC_BYTES;
	while (a < want && a < output_cap)
		a *= 2;
	if (a > output_cap)
		a = output_cap;
	unsigned char *p = realloc(r->buf, a);
	if (!p)
		return false;
	r->buf = p;
	r->alloc = a;
	return true;
}

static void ring_free(struct ring *r)
{
	free(r->buf);
	*r = (struct ring){ 0 };
}

/* How many bytes may be read from a stream's pipe now: while attached, never overwrite
 * bytes an attachment has not acknowledged (back-pressure); otherwise drop the oldest. */
static size_t read_room(const struct proc *p, int s)
{
	size_t room = OUTPUT_CHUNK_BYTES < output_cap ? OUTPUT_CHUNK_BYTES : output_cap;
	const struct ring *r = &p->ring[s];
	for (struct attach *a = p->attach; a; a = a->next) {
		if (a->wait_only)
			continue;
		uint64_t used = r->end - a->acked[s];
		if (used >= output_cap)
			return 0;
		if (output_cap - used < room)
			room = output_cap - used;
	}
	return room;
}

/* ---- exit ---- */

static void unlink_proc(struct proc *p)
{
	if (p->prev)
		p->prev->next = p->next;
	else
		head = p->next;
	if (p->next)
		p->next->prev = p->prev;
	else
		tail = p->prev;
}

static void free_attachments(struct proc *p)
{
	while (p->attach) {
		struct attach *a = p->attach;
		p->attach = a->next;
		free(a);
	}
}

static void release(struct proc *p)
{
	p->released = true;
	free_attachments(p);
	nprocs--;
	if (p->exited)
		nexited--;
}

static void stdin_done(struct proc *p, int err)
{
	if (p->in.busy && p->in.conn) {
		if (err)
			reply_error(p->in.conn, p->in.id, err, "stdin: %s", strerror(err));
		else
			reply_ok(p->in.conn, p->in.id);
	}
	free(p->in.data);
	p->in.data = NULL;
	p->in.len = p->in.off = 0;
	p->in.busy = false;
	p->in.conn = NULL;
}

static void finish_exit(struct proc *p)
{
	close_fd(&p->out_fd[0]);
	close_fd(&p->out_fd[1]);
	close_fd(&p->in_fd);
	stdin_done(p, EPIPE);
	p->exited = true;
	nexited++;
	for (struct proc *q = head; q && nexited > MAX_EXITED_PROCS; q = q->next)
		if (q->exited && !q->released && q != p)
			release(q);
}

static void check_exit(struct proc *p, int64_t now)
{
	if (p->exited || !p->reaped)
		return;
	if (p->out_fd[0] < 0 && p->out_fd[1] < 0)
		finish_exit(p);
	else if (!p->linger_ns)
		p->linger_ns = now + LINGER_MS * NS_PER_MS;
}

void proc_reap(void)
{
	int64_t now = mono_ns();
	for (;;) {
		int status;
		struct rusage ru;
		pid_t pid = wait4(-1, &status, WNOHANG, &ru);
		if (pid < 0 && errno == EINTR)
			continue;
		if (pid < 0 && errno != ECHILD)
			log_msg("wait4: %s", strerror(errno));
		if (pid <= 0)
			return;
		for (struct proc *p = head; p; p = p->next) {
			if (p->pid != pid || p->reaped)
				continue;
			p->reaped = true;
			p->status = status;
			p->ru = ru;
			p->duration_ms = (uint64_t)((now - p->start_ns) / NS_PER_MS);
			p->deadline_ns = 0;
			check_exit(p, now);
			break;
		}
	}
}

int64_t proc_tick(int64_t now)
{
	int64_t next = -1;
	for (struct proc *p = head; p; p = p->next) {
		if (p->deadline_ns && !p->reaped) {
			if (now >= p->deadline_ns) {
				if (kill(-p->pid, SIGKILL) < 0 && errno != ESRCH)
					log_msg("kill %d: %s", p->pid, strerror(errno));
				p->timed_out = true;
				p->deadline_ns = 0;
			} else if (next < 0 || p->deadline_ns < next) {
				next = p->deadline_ns;
			}
		}
		if (p->linger_ns && !p->exited) {
			if (now >= p->linger_ns)
				finish_exit(p);
			else if (next < 0 || p->linger_ns < next)
				next = p->linger_ns;
		}
	}
	return next;
}

int proc_signal_all(int sig)
{
	int n = 0;
	for (struct proc *p = head; p; p = p->next) {
		if (p->exited)
			continue;
		if (kill(-p->pid, sig) < 0 && errno != ESRCH)
			log_msg("kill %d: %s", p->pid, strerror(errno));
		n++;
	}
	return n;
}

/* ---- events ---- */

static uint64_t ms_of(struct timeval tv)
{
	return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}

static void put_exit_fields(struct buf *b, const struct proc *p)
{
	uint64_t code = 0, sig = 0;
	if (WIFEXITED(p->status)) {
		code = (uint64_t)WEXITSTATUS(p->status);
	} else if (WIFSIGNALED(p->status)) {
		sig = (uint64_t)WTERMSIG(p->status);
		code = 128 + sig;
	}
	put_u64(b, F_EXIT_CODE, code);
	put_u64(b, F_SIGNAL, sig);
	if (p->timed_out)
		put_flag(b, F_TIMED_OUT);
	put_u64(b, F_DURATION_MS, p->duration_ms);
	put_u64(b, F_CPU_USER_MS, ms_of(p->ru.ru_utime));
	put_u64(b, F_CPU_SYS_MS, ms_of(p->ru.ru_stime));
	put_u64(b, F_MAXRSS_KIB, (uint64_t)p->ru.ru_maxrss);
}

static void send_exit(struct conn *c, uint32_t id, const struct proc *p)
{
	struct buf *b = conn_out(c);
	size_t at = frame_begin(b, E_EXIT, id);
	put_u64(b, F_PROC, p->handle);
	put_u64(b, F_PID, (uint64_t)p->pid);
	put_exit_fields(b, p);
	put_u64(b, F_STDOUT_END, p->ring[0].end);
	put_u64(b, F_STDERR_END, p->ring[1].end);
	frame_end(b, at);
}

static void send_gap(struct conn *c, const struct attach *a, const struct proc *p, int s,
		     uint64_t count)
{
	struct buf *b = conn_out(c);
	size_t at = frame_begin(b, E_GAP, a->id);
	put_u64(b, F_PROC, p->handle);
	put_u64(b, F_STREAM, (uint64_t)s + 1);
	put_u64(b, F_OFFSET, a->sent[s]);
	put_u64(b, F_COUNT, count);
	frame_end(b, at);
}

static void send_output(struct conn *c, struct attach *a, const struct proc *p, int s)
{
	const struct ring *r = &p->ring[s];
	while (a->sent[s] < r->end && a->sent[s] < a->acked[s] + a->window &&
	       conn_queued(c) < CONN_OUTPUT_PAUSE_BYTES) {
		uint64_t n = r->end - a->sent[s];
		uint64_t allowed = a->acked[s] + a->window - a->sent[s];
		size_t idx = (size_t)(a->sent[s] % output_cap);
		if (n > allowed)
			n = allowed;
		if (n > OUTPUT_CHUNK_BYTES)
			n = OUTPUT_CHUNK_BYTES;
		if (n > output_cap - idx)
			n = output_cap - idx;
		struct buf *b = conn_out(c);
		size_t at = frame_begin(b, E_OUTPUT, a->id);
		put_u64(b, F_PROC, p->handle);
		put_u64(b, F_STREAM, (uint64_t)s + 1);
		put_u64(b, F_OFFSET, a->sent[s]);
		put_bytes(b, F_DATA, r->buf + idx, (size_t)n);
		frame_end(b, at);
		if (b->oom)
			return;
		a->sent[s] += n;
	}
}

/* Sends what one attachment may send; true when it has ended (EXIT sent). */
static bool pump_one(struct proc *p, struct attach *a)
{
	struct conn *c = a->conn;
	if (c->dead)
		return false;
	if (!a->wait_only) {
		for (int s = 0; s < 2; s++) {
			const struct ring *r = &p->ring[s];
			if (a->sent[s] < r->start) {
				send_gap(c, a, p, s, r->start - a->sent[s]);
				a->sent[s] = r->start;
			}
			if (a->acked[s] < r->start)
				a->acked[s] = r->start;
			send_output(c, a, p, s);
		}
	}
	if (!p->exited)
		return false;
	if (!a->wait_only && (a->sent[0] < p->ring[0].end || a->sent[1] < p->ring[1].end))
		return false;
	send_exit(c, a->id, p);
	return true;
}

void proc_pump(void)
{
	for (struct proc *p = head, *next; p; p = next) {
		next = p->next;
		if (p->released) {
			unlink_proc(p);
			ring_free(&p->ring[0]);
			ring_free(&p->ring[1]);
			buf_free(&p->argv_fields);
			free(p);
			continue;
		}
		for (struct attach **ap = &p->attach; *ap;) {
			struct attach *a = *ap;
			if (pump_one(p, a)) {
				*ap = a->next;
				free(a);
			} else {
				ap = &a->next;
			}
		}
	}
}

void proc_conn_closed(struct conn *c)
{
	for (struct proc *p = head; p; p = p->next) {
		if (p->in.conn == c)
			p->in.conn = NULL;
		for (struct attach **ap = &p->attach; *ap;) {
			struct attach *a = *ap;
			if (a->conn == c) {
				*ap = a->next;
				free(a);
			} else {
				ap = &a->next;
			}
		}
	}
}

/* ---- pipes ---- */

/* Stores n bytes read from a stream; drops the oldest beyond output_cap. Out of memory, the
 * bytes are counted but lost, so an attachment sees a GAP rather than silence. */
static void ring_append(struct ring *r, const unsigned char *d, size_t n)
{
	if (ring_prepare(r, n)) {
		size_t idx = (size_t)(r->end % output_cap);
		size_t first = n < output_cap - idx ? n : output_cap - idx;
		memcpy(r->buf + idx, d, first);
		memcpy(r->buf, d + first, n - first);
		r->end += n;
	} else {
		r->end += n;
		r->start = r->end;
	}
	if (r->end - r->start > output_cap)
		r->start = r->end - output_cap;
}

static void on_output(void *obj, int s, short revents)
{
	(void)revents;
	static unsigned char chunk[OUTPUT_CHUNK_BYTES];
	struct proc *p = obj;
	if (p->released || p->out_fd[s] < 0)
		return;
	size_t room = read_room(p, s);
	if (!room)
		return;
	ssize_t n = read(p->out_fd[s], chunk, room);
	if (n > 0) {
		ring_append(&p->ring[s], chunk, (size_t)n);
		return;
	}
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	/* EOF, or EIO from a terminal whose other side is closed. */
	close_fd(&p->out_fd[s]);
	check_exit(p, mono_ns());
}

static void stdin_flush(struct proc *p)
{
	while (p->in.off < p->in.len) {
		ssize_t n = write(p->in_fd, p->in.data + p->in.off, p->in.len - p->in.off);
		if (n > 0) {
			p->in.off += (size_t)n;
		} else if (n < 0 && errno == EINTR) {
			continue;
		} else if (n < 0 && errno == EAGAIN) {
			return;
		} else {
			int err = n < 0 ? errno : EIO;
			close_fd(&p->in_fd);
			stdin_done(p, err);
			return;
		}
	}
	if (p->in.eof && !p->pty)
		close_fd(&p->in_fd);
	stdin_done(p, 0);
}

static void on_stdin(void *obj, int arg, short revents)
{
	(void)arg;
	(void)revents;
	struct proc *p = obj;
	if (!p->released && p->in.busy && p->in_fd >= 0)
		stdin_flush(p);
}

void proc_poll(struct pollset *ps)
{
	for (struct proc *p = head; p; p = p->next) {
		if (p->released)
			continue;
		for (int s = 0; s < 2; s++)
			if (p->out_fd[s] >= 0 && read_room(p, s) > 0)
				pollset_add(ps, p->out_fd[s], POLLIN, on_output, p, s);
		if (p->in.busy && p->in_fd >= 0)
			pollset_add(ps, p->in_fd, POLLOUT, on_stdin, p, 0);
	}
}

/* ---- spawning ---- */

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
	char shell[64 * 1024];
	int r = msg_cstr(m, F_SHELL, shell, sizeof shell);
	if (r < 0) {
		/* A long SHELL is fine; only NUL is refused. */
		const unsigned char *v;
		size_t n;
		if (r == -EINVAL || !msg_bytes(m, F_SHELL, &v, &n)) {
			reply_error(c, m->id, EINVAL, "SHELL contains NUL");
			return false;
		}
		char *s = strndup((const char *)v, n);
		const char *sv[] = { "/bin/sh", "-c", s ? s : "", NULL };
		q->argv = s ? strv_of(sv) : NULL;
		free(s);
		r = q->argv ? 1 : -ENOMEM;
	} else if (r > 0) {
		const char *sv[] = { "/bin/sh", "-c", shell, NULL };
		q->argv = strv_of(sv);
		r = q->argv ? 1 : -ENOMEM;
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

static struct proc *spawn(struct conn *c, const struct msg *m, struct spawn *q)
{
	struct spawn_fds f = { .out = { -1, -1 }, .err = { -1, -1 }, .in = { -1, -1 },
			       .status = { -1, -1 }, .master = -1 };
	struct proc *p = calloc(1, sizeof *p);
	int err = p ? make_spawn_fds(q, &f) : ENOMEM;
	if (err) {
		reply_error(c, m->id, err, "spawn: %s", strerror(err));
		close_spawn_fds(&f);
		free(p);
		return NULL;
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
		free(p);
		return NULL;
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
		free(p);
		return NULL;
	}
	p->handle = next_handle++;
	p->pid = pid;
	p->pty = q->pty;
	p->start_ns = start;
	if (q->timeout_ms)
		p->deadline_ns = start + (int64_t)(q->timeout_ms > INT64_MAX / NS_PER_MS / 2
				? INT64_MAX / 2 : q->timeout_ms * NS_PER_MS);
	p->out_fd[0] = q->pty ? f.master : f.out[0];
	p->out_fd[1] = q->pty ? -1 : f.err[0];
	p->in_fd = f.in[0];
	summarize_argv(&p->argv_fields, q->argv);
	p->prev = tail;
	if (tail)
		tail->next = p;
	else
		head = p;
	tail = p;
	nprocs++;
	return p;
}

static struct attach *attach_new(struct conn *c, struct proc *p, uint32_t id, bool wait_only,
				 uint64_t window)
{
	struct attach *a = calloc(1, sizeof *a);
	if (!a)
		return NULL;
	a->conn = c;
	a->id = id;
	a->wait_only = wait_only;
	a->window = window == 0 ? DEFAULT_WINDOW_BYTES
				: window > MAX_WINDOW_BYTES ? MAX_WINDOW_BYTES : window;
	a->next = p->attach;
	p->attach = a;
	return a;
}

void proc_exec(struct conn *c, const struct msg *m)
{
	struct spawn q = { 0 };
	if (parse_exec(c, m, &q)) {
		struct proc *p = spawn(c, m, &q);
		if (p) {
			struct buf *b = conn_out(c);
			size_t at = frame_begin(b, RP_STARTED, m->id);
			put_u64(b, F_PROC, p->handle);
			put_u64(b, F_PID, (uint64_t)p->pid);
			frame_end(b, at);
			uint64_t window = DEFAULT_WINDOW_BYTES;
			msg_u64(m, F_WINDOW, &window);
			if (msg_flag(m, F_ATTACH) && !attach_new(c, p, m->id, false, window))
				conn_kill(c, "out of memory");
		}
	}
	free_strv(q.argv);
	free_strv(q.envp);
}

/* ---- other process requests ---- */

void proc_stdin(struct conn *c, const struct msg *m)
{
	struct proc *p = find_for(c, m);
	if (!p)
		return;
	if (p->in_fd < 0 || p->exited) {
		reply_error(c, m->id, EBADF, "stdin is not open");
		return;
	}
	if (p->in.busy) {
		reply_error(c, m->id, EAGAIN, "previous STDIN still pending");
		return;
	}
	const unsigned char *data = NULL;
	size_t n = 0;
	msg_bytes(m, F_DATA, &data, &n);
	bool eof = msg_flag(m, F_EOF);
	size_t total = n + (eof && p->pty ? 1 : 0);
	p->in.data = malloc(total ? total : 1);
	if (!p->in.data) {
		reply_error(c, m->id, ENOMEM, "out of memory");
		return;
	}
	if (n)
		memcpy(p->in.data, data, n);
	if (eof && p->pty)
		p->in.data[n] = 4; /* the terminal's end-of-file character, ^D */
	p->in.len = total;
	p->in.off = 0;
	p->in.eof = eof;
	p->in.busy = true;
	p->in.conn = c;
	p->in.id = m->id;
	stdin_flush(p);
}

void proc_signal(struct conn *c, const struct msg *m)
{
	struct proc *p = find_for(c, m);
	if (!p)
		return;
	uint64_t sig = 0;
	if (msg_u64(m, F_SIGNAL, &sig) <= 0 || sig > 64) {
		reply_error(c, m->id, EINVAL, "SIGNAL missing or out of range");
		return;
	}
	bool group = msg_flag(m, F_GROUP);
	if (p->exited || (p->reaped && !group)) {
		reply_error(c, m->id, ESRCH, "process has exited");
		return;
	}
	if (kill(group ? -p->pid : p->pid, (int)sig) < 0) {
		reply_error(c, m->id, errno, "kill: %s", strerror(errno));
		return;
	}
	reply_ok(c, m->id);
}

void proc_wait(struct conn *c, const struct msg *m)
{
	struct proc *p = find_for(c, m);
	if (p && !attach_new(c, p, m->id, true, 0))
		reply_error(c, m->id, ENOMEM, "out of memory");
}

void proc_list(struct conn *c, const struct msg *m)
{
	struct buf *b = conn_out(c);
	size_t at = frame_begin(b, RP_PROCS, m->id);
	for (struct proc *p = head; p; p = p->next) {
		if (p->released)
			continue;
		if (b->len - at > FRAME_MAX_PAYLOAD - 2048)
			break;
		size_t e = nest_begin(b, F_PROCENTRY);
		put_u64(b, F_PROC, p->handle);
		put_u64(b, F_PID, (uint64_t)p->pid);
		buf_put(b, p->argv_fields.p, p->argv_fields.len);
		put_u64(b, F_STATE, p->exited ? 2 : 1);
		put_u64(b, F_STDOUT_END, p->ring[0].end);
		put_u64(b, F_STDERR_END, p->ring[1].end);
		if (p->exited)
			put_exit_fields(b, p);
		nest_end(b, e);
	}
	frame_end(b, at);
}

static struct attach **find_attachment(struct proc *p, struct conn *c)
{
	for (struct attach **ap = &p->attach; *ap; ap = &(*ap)->next)
		if ((*ap)->conn == c && !(*ap)->wait_only)
			return ap;
	return NULL;
}

static void detach(struct proc *p, struct conn *c)
{
	struct attach **ap = find_attachment(p, c);
	if (ap) {
		struct attach *a = *ap;
		*ap = a->next;
		free(a);
	}
}

void proc_attach(struct conn *c, const struct msg *m)
{
	struct proc *p = find_for(c, m);
	if (!p)
		return;
	uint64_t from[2] = { 0, 0 }, window = DEFAULT_WINDOW_BYTES;
	if (msg_u64(m, F_FROM_STDOUT, &from[0]) < 0 || msg_u64(m, F_FROM_STDERR, &from[1]) < 0 ||
	    msg_u64(m, F_WINDOW, &window) < 0) {
		reply_error(c, m->id, EINVAL, "bad numeric field");
		return;
	}
	if (from[0] > p->ring[0].end || from[1] > p->ring[1].end) {
		reply_error(c, m->id, EINVAL, "offset past the end of the stream");
		return;
	}
	detach(p, c);
	struct attach *a = attach_new(c, p, m->id, false, window);
	if (!a) {
		reply_error(c, m->id, ENOMEM, "out of memory");
		return;
	}
	for (int s = 0; s < 2; s++) {
		a->sent[s] = from[s];
		a->acked[s] = from[s] > p->ring[s].start ? from[s] : p->ring[s].start;
	}
	reply_ok(c, m->id);
}

void proc_ack(struct conn *c, const struct msg *m)
{
	uint64_t handle, stream, offset;
	if (msg_u64(m, F_PROC, &handle) <= 0 || msg_u64(m, F_STREAM, &stream) <= 0 ||
	    msg_u64(m, F_OFFSET, &offset) <= 0 || stream < 1 || stream > 2)
		return;
	struct proc *p = find(handle);
	struct attach **ap = p ? find_attachment(p, c) : NULL;
	if (!ap)
		return;
	struct attach *a = *ap;
	int s = (int)stream - 1;
	if (offset > a->sent[s])
		offset = a->sent[s];
	if (offset > a->acked[s])
		a->acked[s] = offset;
}

void proc_detach(struct conn *c, const struct msg *m)
{
	struct proc *p = find_for(c, m);
	if (p) {
		detach(p, c);
		reply_ok(c, m->id);
	}
}

void proc_resize(struct conn *c, const struct msg *m)
{
	struct proc *p = find_for(c, m);
	if (!p)
		return;
	uint64_t rows = 0, cols = 0;
	if (msg_u64(m, F_ROWS, &rows) <= 0 || msg_u64(m, F_COLS, &cols) <= 0 || rows > 0xFFFF ||
	    cols > 0xFFFF) {
		reply_error(c, m->id, EINVAL, "ROWS and COLS required");
		return;
	}
	if (!p->pty || p->out_fd[0] < 0) {
		reply_error(c, m->id, ENOTTY, "process has no terminal");
		return;
	}
	struct winsize ws = { .ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols };
	if (ioctl(p->out_fd[0], TIOCSWINSZ, &ws) < 0) {
		reply_error(c, m->id, errno, "resize: %s", strerror(errno));
		return;
	}
	reply_ok(c, m->id);
}

void proc_release(struct conn *c, const struct msg *m)
{
	struct proc *p = find_for(c, m);
	if (!p)
		return;
	if (!p->exited) {
		reply_error(c, m->id, EBUSY, "process is still running");
		return;
	}
	release(p);
	reply_ok(c, m->id);
}
