/* Frames and TLV fields of the chronus wire protocol (docs/chronus-protocol.md). */
#ifndef CHRONUS_WIRE_H
#define CHRONUS_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FRAME_HEADER_BYTES 12
#define FRAME_MAX_PAYLOAD (1024u * 1024u + 64u * 1024u)
#define FIELD_HEADER_BYTES 6

enum msg_type {
	T_PING = 0x01, T_EXEC = 0x02, T_STDIN = 0x03, T_SIGNAL = 0x04, T_WAIT = 0x05,
	T_LIST = 0x06, T_ATTACH = 0x07, T_ACK = 0x08, T_DETACH = 0x09, T_RESIZE = 0x0A,
	T_RELEASE = 0x0B, T_RESET = 0x0C,
	T_STAT = 0x20, T_READ = 0x21, T_WRITE = 0x22, T_LISTDIR = 0x23, T_MKDIR = 0x24,
	T_REMOVE = 0x25, T_RENAME = 0x26, T_SYMLINK = 0x27, T_STATFS = 0x28, T_XATTRS = 0x29,
	RP_OK = 0x80, RP_INFO = 0x81, RP_STARTED = 0x82, RP_PROCS = 0x86,
	E_OUTPUT = 0x90, E_GAP = 0x91, E_EXIT = 0x92,
	RP_STAT = 0xA0, RP_DATA = 0xA1, RP_ENTRIES = 0xA3, RP_STATFS = 0xA8, RP_XATTRS = 0xA9, RP_ERROR = 0xFF,
};

enum field_tag {
	F_ARGV = 1, F_SHELL, F_ENV, F_CWD, F_UID, F_GID, F_STDIN, F_PTY, F_ROWS, F_COLS,
	F_TIMEOUT_MS, F_ATTACH, F_WINDOW, F_DATA, F_EOF, F_PROC, F_PID, F_SIGNAL, F_STREAM,
	F_OFFSET, F_FROM_STDOUT, F_FROM_STDERR, F_EXIT_CODE, F_TIMED_OUT, F_DURATION_MS,
	F_CPU_USER_MS, F_CPU_SYS_MS, F_MAXRSS_KIB, F_STDOUT_END, F_STDERR_END, F_STATE,
	F_PATH, F_PATH2, F_MODE, F_LENGTH, F_OPEN_FLAGS, F_SIZE, F_MTIME_MS, F_FTYPE, F_NAME,
	F_ENTRY, F_PARENTS, F_RECURSIVE, F_ERRNO, F_MESSAGE, F_VERSION, F_UPTIME_MS, F_NPROCS,
	F_OUTPUT_CAP, F_COUNT, F_LINK, F_NOFOLLOW, F_PROCENTRY, F_GROUP, F_UID_OUT, F_GID_OUT,
	F_BYTES_TOTAL, F_BYTES_FREE, F_FILES_TOTAL, F_FILES_FREE, F_PREFIX, F_XATTR, F_REPLACE,
};

/* A growable byte buffer. After a failed allocation it stays failed (oom) and ignores writes. */
struct buf {
	unsigned char *p;
	size_t len, cap;
	bool oom;
};

bool buf_reserve(struct buf *b, size_t n);
void buf_put(struct buf *b, const void *data, size_t n);
void buf_free(struct buf *b);

size_t frame_begin(struct buf *b, uint16_t type, uint32_t id);
void frame_end(struct buf *b, size_t at);
void put_u64(struct buf *b, uint16_t tag, uint64_t v);
void put_bytes(struct buf *b, uint16_t tag, const void *data, size_t n);
void put_str(struct buf *b, uint16_t tag, const char *s);
void put_flag(struct buf *b, uint16_t tag);
size_t nest_begin(struct buf *b, uint16_t tag);
void nest_end(struct buf *b, size_t at);
/* Reserves a field of up to max value bytes; fill it through the pointer, then put_commit(). */
unsigned char *put_reserve(struct buf *b, uint16_t tag, size_t max, size_t *at);
void put_commit(struct buf *b, size_t at, size_t n);

uint32_t rd32(const unsigned char *p);
uint16_t rd16(const unsigned char *p);

/* A received request; p points into the connection's input buffer. */
struct msg {
	uint16_t type;
	uint32_t id;
	const unsigned char *p;
	size_t len;
};

struct field {
	uint16_t tag;
	const unsigned char *v;
	size_t len;
};

bool fields_valid(const unsigned char *p, size_t len);
bool field_next(const unsigned char *p, size_t len, size_t *pos, struct field *f);
/* 0 when absent, 1 when read, -1 when the value is not 8 bytes. */
int msg_u64(const struct msg *m, uint16_t tag, uint64_t *out);
bool msg_flag(const struct msg *m, uint16_t tag);
bool msg_bytes(const struct msg *m, uint16_t tag, const unsigned char **v, size_t *n);
/* Copies a str field into dst as a C string: 0 absent, 1 ok, -EINVAL (NUL) or -ENAMETOOLONG. */
int msg_cstr(const struct msg *m, uint16_t tag, char *dst, size_t dstsz);

#endif
