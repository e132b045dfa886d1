/* The process table: spawning, output rings, attachments with flow control, reaping. */
#include "proc.h"
#include "spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#define OUTPUT_CHUNK_BYTES 65536
#define RING_MIN_ALLOC_BYTES 4096
#define DEFAULT_WINDOW_BYTES 262144
#define MAX_WINDOW_BYTES (1ull << 30)
#define LINGER_MS 250
#define MAX_EXITED_PROCS 1024

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
	/* Trim the oldest exited processes, but never one a client is still reading. */
	for (struct proc *q = head; q && nexited > MAX_EXITED_PROCS; q = q->next)
		if (q->exited && !q->released && q != p && !q->attach)
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

static struct proc *proc_add(struct spawned *s)
{
	struct proc *p = calloc(1, sizeof *p);
	if (!p)
		return NULL;
	p->handle = next_handle++;
	p->pid = s->pid;
	p->pty = s->pty;
	p->start_ns = s->start_ns;
	if (s->timeout_ms)
		p->deadline_ns = s->start_ns + (int64_t)(s->timeout_ms > INT64_MAX / NS_PER_MS / 2
				? INT64_MAX / 2 : s->timeout_ms * NS_PER_MS);
	p->out_fd[0] = s->out_fd[0];
	p->out_fd[1] = s->out_fd[1];
	p->in_fd = s->in_fd;
	p->argv_fields = s->argv_fields;
	p->prev = tail;
	if (tail)
		tail->next = p;
	else
		head = p;
	tail = p;
	nprocs++;
	return p;
}

void proc_exec(struct conn *c, const struct msg *m)
{
	struct spawned s = { 0 };
	if (spawn_exec(c, m, &s)) {
		struct proc *p = proc_add(&s);
		if (!p) {
			/* Without a table entry nobody could wait for it: stop it again. */
			kill(-s.pid, SIGKILL);
			close_fd(&s.out_fd[0]);
			close_fd(&s.out_fd[1]);
			close_fd(&s.in_fd);
			buf_free(&s.argv_fields);
			reply_error(c, m->id, ENOMEM, "out of memory");
		} else {
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

/* ---- reset (function-call sandboxes reused between calls) ---- */

/* How long the reset waits for killed processes to be gone (one in uninterruptible sleep). */
#define RESET_DEADLINE_MS 2000

/* Sockets listed in one /proc/net table of the agent's network namespace (its header aside). */
static uint64_t net_table_entries(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : 1;
	uint64_t lines = 0;
	char chunk[4096];
	ssize_t n;
	while ((n = read(fd, chunk, sizeof chunk)) > 0)
		for (ssize_t i = 0; i < n; i++)
			lines += chunk[i] == '\n';
	close(fd);
	if (n < 0)
		return 1;
	return lines > 0 ? lines - 1 : 0;
}

/*
 * Kills every process of the sandbox but the agent and forgets every process record, so that
 * the next call finds nothing of the last one's processes (their timers, locks, sockets and
 * pipes die with them). Only as PID 1: kill(-1) there reaches exactly the processes of the
 * sandbox's PID namespace except the agent, and the kernel queues SIGKILL to each before a
 * fork racing it can complete. Replies OK with COUNT = sockets still listed in the network
 * namespace (TIME_WAIT and the like: the edge then discards the sandbox), or EBUSY when a
 * process outlived the deadline.
 */
void proc_reset(struct conn *c, const struct msg *m)
{
	if (getpid() != 1) {
		reply_error(c, m->id, EPERM, "reset: the agent is not PID 1");
		return;
	}
	int64_t deadline = mono_ns() + (int64_t)RESET_DEADLINE_MS * NS_PER_MS;
	for (;;) {
		if (kill(-1, SIGKILL) < 0 && errno != ESRCH)
			log_msg("reset: kill: %s", strerror(errno));
		proc_reap();
		errno = 0;
		bool none_left = kill(-1, 0) < 0 && errno == ESRCH;
		bool no_children = waitpid(-1, NULL, WNOHANG | __WALL) < 0 && errno == ECHILD;
		if (none_left && no_children)
			break;
		if (mono_ns() >= deadline) {
			reply_error(c, m->id, EBUSY, "reset: processes outlived SIGKILL");
			return;
		}
		struct timespec pause = { 0, 200000 };
		nanosleep(&pause, NULL);
	}
	for (struct proc *p = head; p; p = p->next) {
		/* Every child is gone (ECHILD above), reaped here or by proc_reap. */
		p->reaped = true;
		if (!p->exited) {
			finish_exit(p);
		}
		if (!p->released)
			release(p);
	}
	static const char *const tables[] = { "/proc/net/tcp", "/proc/net/tcp6", "/proc/net/udp",
					      "/proc/net/udp6", "/proc/net/raw", "/proc/net/raw6",
					      "/proc/net/unix" };
	uint64_t sockets = 0;
	for (size_t i = 0; i < sizeof tables / sizeof *tables; i++)
		sockets += net_table_entries(tables[i]);
	reply_ok_count(c, m->id, sockets);
}
