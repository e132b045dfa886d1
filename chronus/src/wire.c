/* Frame and TLV encoding and strictly bounded decoding. */
#include "wire.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void le16(unsigned char *p, uint16_t v)
{
	p[0] = (unsigned char)v;
	p[1] = (unsigned char)(v >> 8);
}

static void le32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static void le64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

uint16_t rd16(const unsigned char *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}

uint32_t rd32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd64(const unsigned char *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

bool buf_reserve(struct buf *b, size_t n)
{
	if (b->oom)
		return false;
	if (n <= b->cap - b->len)
		return true;
	if (n > SIZE_MAX / 4 - b->len) {
		b->oom = true;
		return false;
	}
	size_t want = b->len + n;
	size_t cap = b->cap ? b->cap : 256;
	while (cap < want)
		cap *= 2;
	unsigned char *p = realloc(b->p, cap);
	if (!p) {
		b->oom = true;
		return false;
	}
	b->p = p;
	b->cap = cap;
	return true;
}

void buf_put(struct buf *b, const void *data, size_t n)
{
	if (!buf_reserve(b, n))
		return;
	if (n)
		memcpy(b->p + b->len, data, n);
	b->len += n;
}

void buf_free(struct buf *b)
{
	free(b->p);
	b->p = NULL;
	b->len = b->cap = 0;
	b->oom = false;
}

size_t frame_begin(struct buf *b, uint16_t type, uint32_t id)
{
	unsigned char h[FRAME_HEADER_BYTES];
	size_t at = b->len;
	le32(h, 0);
	le16(h + 4, type);
	le16(h + 6, 0);
	le32(h + 8, id);
	buf_put(b, h, sizeof h);
	return at;
}

void frame_end(struct buf *b, size_t at)
{
	if (!b->oom)
		le32(b->p + at, (uint32_t)(b->len - at - FRAME_HEADER_BYTES));
}

static void put_header(struct buf *b, uint16_t tag, uint32_t len)
{
	unsigned char h[FIELD_HEADER_BYTES];
	le16(h, tag);
	le32(h + 2, len);
	buf_put(b, h, sizeof h);
}

void put_u64(struct buf *b, uint16_t tag, uint64_t v)
{
	unsigned char x[8];
	le64(x, v);
	put_header(b, tag, 8);
	buf_put(b, x, 8);
}

void put_bytes(struct buf *b, uint16_t tag, const void *data, size_t n)
{
	put_header(b, tag, (uint32_t)n);
	buf_put(b, data, n);
}

void put_str(struct buf *b, uint16_t tag, const char *s)
{
	put_bytes(b, tag, s, strlen(s));
}

void put_flag(struct buf *b, uint16_t tag)
{
	put_header(b, tag, 0);
}

size_t nest_begin(struct buf *b, uint16_t tag)
{
	size_t at = b->len;
	put_header(b, tag, 0);
	return at;
}

void nest_end(struct buf *b, size_t at)
{
	if (!b->oom)
		le32(b->p + at + 2, (uint32_t)(b->len - at - FIELD_HEADER_BYTES));
}

unsigned char *put_reserve(struct buf *b, uint16_t tag, size_t max, size_t *at)
{
	*at = b->len;
	put_header(b, tag, 0);
	if (!buf_reserve(b, max))
		return NULL;
	return b->p + b->len;
}

void put_commit(struct buf *b, size_t at, size_t n)
{
	if (b->oom)
		return;
	b->len = at + FIELD_HEADER_BYTES + n;
	le32(b->p + at + 2, (uint32_t)n);
}

bool field_next(const unsigned char *p, size_t len, size_t *pos, struct field *f)
{
	if (*pos >= len || len - *pos < FIELD_HEADER_BYTES)
		return false;
	uint32_t flen = rd32(p + *pos + 2);
	if (flen > len - *pos - FIELD_HEADER_BYTES)
		return false;
	f->tag = rd16(p + *pos);
	f->v = p + *pos + FIELD_HEADER_BYTES;
	f->len = flen;
	*pos += FIELD_HEADER_BYTES + flen;
	return true;
}

bool fields_valid(const unsigned char *p, size_t len)
{
	size_t pos = 0;
	struct field f;
	while (field_next(p, len, &pos, &f))
		;
	return pos == len;
}

static bool msg_find(const struct msg *m, uint16_t tag, struct field *out)
{
	size_t pos = 0;
	while (field_next(m->p, m->len, &pos, out))
		if (out->tag == tag)
			return true;
	return false;
}

int msg_u64(const struct msg *m, uint16_t tag, uint64_t *out)
{
	struct field f;
	if (!msg_find(m, tag, &f))
		return 0;
	if (f.len != 8)
		return -1;
	*out = rd64(f.v);
	return 1;
}

bool msg_flag(const struct msg *m, uint16_t tag)
{
	struct field f;
	return msg_find(m, tag, &f);
}

bool msg_bytes(const struct msg *m, uint16_t tag, const unsigned char **v, size_t *n)
{
	struct field f;
	if (!msg_find(m, tag, &f))
		return false;
	*v = f.v;
	*n = f.len;
	return true;
}

int msg_cstr(const struct msg *m, uint16_t tag, char *dst, size_t dstsz)
{
	struct field f;
	if (!msg_find(m, tag, &f))
		return 0;
	if (memchr(f.v, 0, f.len))
		return -EINVAL;
	if (f.len >= dstsz)
		return -ENAMETOOLONG;
	memcpy(dst, f.v, f.len);
	dst[f.len] = 0;
	return 1;
}
