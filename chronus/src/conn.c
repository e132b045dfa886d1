/* Client connections: frame input, bounded output queue, request dispatch. */
#include "conn.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "files.h"
#include "proc.h"

#define READ_CHUNK_BYTES 65536
#define VERSION_STRING "chronus 1.0"

static struct conn *conns[MAX_CONNS + 1];
static int nconns;

struct conn *conn_add(int fd, bool is_stream)
{
	if (nconns >= MAX_CONNS + 1)
		return NULL;
	struct conn *c = calloc(1, sizeof *c);
	if (!c)
		return NULL;
	c->fd = fd;
	c->is_stream = is_stream;
	c->stream_slot = -1;
	conns[nconns++] = c;
	return c;
}

int conn_count(void)
{
	return nconns;
}

void conn_kill(struct conn *c, const char *why)
{
	if (!c->dead && why)
		log_msg("closing connection: %s", why);
	c->dead = true;
}

size_t conn_queued(const struct conn *c)
{
	return c->out.len - c->out_head;
}

struct buf *conn_out(struct conn *c)
{
	return &c->out;
}

void reply_ok(struct conn *c, uint32_t id)
{
	frame_end(&c->out, frame_begin(&c->out, RP_OK, id));
}

void reply_ok_count(struct conn *c, uint32_t id, uint64_t count)
{
	size_t at = frame_begin(&c->out, RP_OK, id);
	put_u64(&c->out, F_COUNT, count);
	frame_end(&c->out, at);
}

void reply_error(struct conn *c, uint32_t id, int err, const char *fmt, ...)
{
	char text[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(text, sizeof text, fmt, ap);
	va_end(ap);
	size_t at = frame_begin(&c->out, RP_ERROR, id);
	put_u64(&c->out, F_ERRNO, (uint64_t)err);
	put_str(&c->out, F_MESSAGE, text);
	frame_end(&c->out, at);
}

static void do_ping(struct conn *c, const struct msg *m)
{
	struct buf *b = &c->out;
	size_t at = frame_begin(b, RP_INFO, m->id);
	put_str(b, F_VERSION, VERSION_STRING);
	put_u64(b, F_PID, (uint64_t)getpid());
	put_u64(b, F_UPTIME_MS, agent_uptime_ms());
	put_u64(b, F_NPROCS, proc_count());
	put_u64(b, F_OUTPUT_CAP, proc_output_cap());
	frame_end(b, at);
}

static void dispatch(struct conn *c, const struct msg *m)
{
	switch (m->type) {
	case T_PING: do_ping(c, m); break;
	case T_EXEC: proc_exec(c, m); break;
	case T_STDIN: proc_stdin(c, m); break;
	case T_SIGNAL: proc_signal(c, m); break;
	case T_WAIT: proc_wait(c, m); break;
	case T_LIST: proc_list(c, m); break;
	case T_ATTACH: proc_attach(c, m); break;
	case T_ACK: proc_ack(c, m); break;
	case T_DETACH: proc_detach(c, m); break;
	case T_RESIZE: proc_resize(c, m); break;
	case T_RELEASE: proc_release(c, m); break;
	case T_RESET: proc_reset(c, m); break;
	case T_STAT: file_stat(c, m); break;
	case T_READ: file_read(c, m); break;
	case T_WRITE: file_write(c, m); break;
	case T_LISTDIR: file_listdir(c, m); break;
	case T_MKDIR: file_mkdir(c, m); break;
	case T_REMOVE: file_remove(c, m); break;
	case T_RENAME: file_rename(c, m); break;
	case T_SYMLINK: file_symlink(c, m); break;
	case T_STATFS: file_statfs(c, m); break;
	case T_XATTRS: file_xattrs(c, m); break;
	default: reply_error(c, m->id, ENOSYS, "unknown request type 0x%x", m->type); break;
	}
}

/* Bytes of the frame that starts the input buffer, or 0 while its header is incomplete. */
static size_t pending_frame_bytes(const struct conn *c)
{
	if (c->in.len < FRAME_HEADER_BYTES)
		return 0;
	return FRAME_HEADER_BYTES + (size_t)rd32(c->in.p);
}

static bool has_complete_frame(const struct conn *c)
{
	size_t need = pending_frame_bytes(c);
	return need && c->in.len >= need;
}

static void process_input(struct conn *c)
{
	size_t pos = 0;
	while (!c->dead && conn_queued(c) < CONN_INPUT_PAUSE_BYTES) {
		size_t avail = c->in.len - pos;
		if (avail < FRAME_HEADER_BYTES)
			break;
		const unsigned char *h = c->in.p + pos;
		uint32_t len = rd32(h);
		if (len > FRAME_MAX_PAYLOAD) {
			conn_kill(c, "frame too large");
			break;
		}
		if (avail - FRAME_HEADER_BYTES < len)
			break;
		struct msg m = { .type = rd16(h + 4), .id = rd32(h + 8), .p = h + FRAME_HEADER_BYTES, .len = len };
		if (!fields_valid(m.p, m.len)) {
			conn_kill(c, "malformed fields");
			break;
		}
		pos += FRAME_HEADER_BYTES + len;
		dispatch(c, &m);
		if (c->out.oom)
			conn_kill(c, "out of memory");
	}
	if (pos) {
		memmove(c->in.p, c->in.p + pos, c->in.len - pos);
		c->in.len -= pos;
	}
	if (c->in.len == 0 && c->in.cap > 4 * READ_CHUNK_BYTES)
		buf_free(&c->in);
}

static void on_readable(void *obj, int arg, short revents)
{
	(void)arg;
	(void)revents;
	struct conn *c = obj;
	if (c->dead)
		return;
	size_t want = READ_CHUNK_BYTES;
	size_t frame = pending_frame_bytes(c);
	if (frame > FRAME_HEADER_BYTES + FRAME_MAX_PAYLOAD) {
		conn_kill(c, "frame too large");
		return;
	}
	if (frame > c->in.len && frame - c->in.len > want)
		want = frame - c->in.len;
	if (!buf_reserve(&c->in, want)) {
		conn_kill(c, "out of memory");
		return;
	}
	ssize_t n = read(c->fd, c->in.p + c->in.len, want);
	if (n < 0) {
		if (errno != EAGAIN && errno != EINTR)
			conn_kill(c, strerror(errno));
		return;
	}
	if (n == 0) {
		conn_kill(c, NULL);
		return;
	}
	c->in.len += (size_t)n;
	process_input(c);
}

static void flush(struct conn *c)
{
	while (!c->dead && conn_queued(c) > 0) {
		ssize_t n = write(c->fd, c->out.p + c->out_head, conn_queued(c));
		if (n > 0) {
			c->out_head += (size_t)n;
		} else if (n < 0 && errno == EINTR) {
			continue;
		} else if (n < 0 && errno == EAGAIN) {
			break;
		} else {
			conn_kill(c, n < 0 ? strerror(errno) : "write returned 0");
			break;
		}
	}
	if (c->out_head == c->out.len) {
		c->out.len = c->out_head = 0;
		if (c->out.cap > 4 * READ_CHUNK_BYTES)
			buf_free(&c->out);
	} else if (c->out_head >= 1024 * 1024) {
		memmove(c->out.p, c->out.p + c->out_head, conn_queued(c));
		c->out.len -= c->out_head;
		c->out_head = 0;
	}
}

static void on_writable(void *obj, int arg, short revents)
{
	(void)arg;
	(void)revents;
	flush(obj);
}

static void on_event(void *obj, int arg, short revents)
{
	struct conn *c = obj;
	if (revents & (POLLIN | POLLHUP | POLLERR))
		on_readable(c, arg, revents);
	if (revents & POLLOUT)
		on_writable(c, arg, revents);
	if ((revents & POLLNVAL))
		conn_kill(c, "invalid descriptor");
}

void conn_poll(struct pollset *ps)
{
	for (int i = 0; i < nconns; i++) {
		struct conn *c = conns[i];
		if (c->dead)
			continue;
		short ev = 0;
		if (!has_complete_frame(c))
			ev |= POLLIN;
		if (conn_queued(c))
			ev |= POLLOUT;
		pollset_add(ps, c->fd, ev, on_event, c, 0);
	}
}

void conns_flush(void)
{
	for (int i = 0; i < nconns; i++)
		if (!conns[i]->dead)
			flush(conns[i]);
}

void conns_reap(void)
{
	for (int i = 0; i < nconns;) {
		struct conn *c = conns[i];
		if (!c->dead && c->out.oom)
			conn_kill(c, "out of memory");
		if (!c->dead) {
			i++;
			continue;
		}
		proc_conn_closed(c);
		if (close(c->fd) < 0)
			log_msg("close connection: %s", strerror(errno));
		int slot = c->stream_slot;
		buf_free(&c->in);
		buf_free(&c->out);
		free(c);
		conns[i] = conns[--nconns];
		if (slot >= 0)
			stream_lost(slot);
	}
}

void conn_housekeeping(void)
{
	for (int i = 0; i < nconns; i++)
		if (!conns[i]->dead && has_complete_frame(conns[i]))
			process_input(conns[i]);
}
