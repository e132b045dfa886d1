/* The process table: spawning, output rings, attachments with flow control, reaping. */
#ifndef CHRONUS_PROC_H
#define CHRONUS_PROC_H

#include "conn.h"

#define DEFAULT_OUTPUT_CAP_BYTES (4u * 1024 * 1024)

void proc_init(size_t output_cap);
uint64_t proc_count(void);
uint64_t proc_output_cap(void);

void proc_exec(struct conn *c, const struct msg *m);
void proc_stdin(struct conn *c, const struct msg *m);
void proc_signal(struct conn *c, const struct msg *m);
void proc_wait(struct conn *c, const struct msg *m);
void proc_list(struct conn *c, const struct msg *m);
void proc_attach(struct conn *c, const struct msg *m);
void proc_ack(struct conn *c, const struct msg *m);
void proc_detach(struct conn *c, const struct msg *m);
void proc_resize(struct conn *c, const struct msg *m);
void proc_release(struct conn *c, const struct msg *m);
/* Kills every process but the agent (PID 1 only) and forgets every process record. */
void proc_reset(struct conn *c, const struct msg *m);

/* Drops every attachment and pending reply that belongs to a closing connection. */
void proc_conn_closed(struct conn *c);
/* Reaps every child that has exited, known or not. */
void proc_reap(void);
/* Handles timeouts and lingering pipes; returns the next deadline (ns) or -1. */
int64_t proc_tick(int64_t now);
/* Sends what attachments may send now; frees released processes. */
void proc_pump(void);
void proc_poll(struct pollset *ps);
/* Sends sig to the process group of every process not yet exited; returns how many. */
int proc_signal_all(int sig);

#endif
