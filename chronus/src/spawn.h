/* Starting a command: parse EXEC, fork, set up stdio or a terminal, exec. */
#ifndef CHRONUS_SPAWN_H
#define CHRONUS_SPAWN_H

#include <sys/types.h>

#include "conn.h"

/* A command that has exec'd: its pid and the parent's ends of its pipes (non-blocking). */
struct spawned {
	pid_t pid;
	bool pty;
	int out_fd[2]; /* stdout (the terminal with pty) and stderr, -1 when absent */
	int in_fd;     /* stdin pipe or a dup of the terminal, -1 when absent */
	int64_t start_ns;
	uint64_t timeout_ms;
	struct buf argv_fields; /* the start of argv as ARGV fields, for LIST */
};

/* Parses and runs an EXEC request; on failure answers it with ERROR and returns false. */
bool spawn_exec(struct conn *c, const struct msg *m, struct spawned *out);

#endif
