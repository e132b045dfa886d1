/* Logging, clocks and the poll set shared by the event loop's parts. */
#ifndef CHRONUS_UTIL_H
#define CHRONUS_UTIL_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NS_PER_MS 1000000LL

void log_msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int64_t mono_ns(void);
bool set_nonblock(int fd);

typedef void poll_fn(void *obj, int arg, short revents);

struct poll_ref {
	poll_fn *fn;
	void *obj;
	int arg;
};

/* The descriptors of one poll() call and who handles each. Rebuilt every loop iteration. */
struct pollset {
	struct pollfd *fds;
	struct poll_ref *refs;
	size_t n, cap;
};

bool pollset_add(struct pollset *ps, int fd, short events, poll_fn *fn, void *obj, int arg);

#endif
