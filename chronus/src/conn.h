/* Client connections: frame input, bounded output queue, request dispatch. */
#ifndef CHRONUS_CONN_H
#define CHRONUS_CONN_H

#include "util.h"
#include "wire.h"

#define MAX_CONNS 64
/* Output events pause for a connection whose queue holds more than this. */
#define CONN_OUTPUT_PAUSE_BYTES (2u * 1024 * 1024)
/* Requests are not read from a connection whose queue holds more than this. */
#define CONN_INPUT_PAUSE_BYTES (4u * 1024 * 1024)

struct conn {
	int fd;
	bool is_stream;
	/* Which --stream-path this connection is (-1: none). */
	int stream_slot;
	bool dead;
	struct buf in;
	struct buf out;
	size_t out_head;
};

struct conn *conn_add(int fd, bool is_stream);
void conn_kill(struct conn *c, const char *why);
size_t conn_queued(const struct conn *c);
struct buf *conn_out(struct conn *c);
int conn_count(void);

void conn_poll(struct pollset *ps);
/* Processes buffered requests, writes queued output, frees closed connections. */
void conn_housekeeping(void);
void conns_flush(void);
void conns_reap(void);

void reply_ok(struct conn *c, uint32_t id);
void reply_ok_count(struct conn *c, uint32_t id, uint64_t count);
void reply_error(struct conn *c, uint32_t id, int err, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* Implemented by main.c: the stream connection of --stream-path number `slot` is gone. */
void stream_lost(int slot);
/* Implemented by main.c: milliseconds since the agent started. */
uint64_t agent_uptime_ms(void);
/* oom_score_adj given to every command (-1: leave as inherited). */
int agent_child_oom_score_adj(void);

#endif
