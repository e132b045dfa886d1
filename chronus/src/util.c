#include "util.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void log_msg(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("chronus: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

int64_t mono_ns(void)
{
	struct timespec ts;
	if (clock_gettime(CLOCK_MONOTONIC, &ts) < 0)
		return 0;
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

bool set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	return fl >= 0 && fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0;
}

bool pollset_add(struct pollset *ps, int fd, short events, poll_fn *fn, void *obj, int arg)
{
	if (ps->n == ps->cap) {
		size_t cap = ps->cap ? ps->cap * 2 : 64;
		struct pollfd *fds = realloc(ps->fds, cap * sizeof *fds);
		if (!fds)
			return false;
		ps->fds = fds;
		struct poll_ref *refs = realloc(ps->refs, cap * sizeof *refs);
		if (!refs)
			return false;
		ps->refs = refs;
		ps->cap = cap;
	}
	ps->fds[ps->n] = (struct pollfd){ .fd = fd, .events = events };
	ps->refs[ps->n] = (struct poll_ref){ .fn = fn, .obj = obj, .arg = arg };
	ps->n++;
	return true;
}
