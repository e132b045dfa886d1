/* File operations, run with the agent's own credentials (root in the sandbox). */
#include "files.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#define READ_MAX_BYTES (1024u * 1024)
#define REMOVE_MAX_DEPTH 512
#define DEFAULT_FILE_MODE 0644
#define DEFAULT_DIR_MODE 0755
#define XATTRS_MAX_PATHS 256
#define XATTR_PREFIX_MAX 64
/* Room a reply keeps for one more value (XATTR_SIZE_MAX) and its entry's fields. */
#define XATTR_REPLY_SLACK (64u * 1024 + 1024)

enum { OPEN_CREATE = 1, OPEN_TRUNCATE = 2, OPEN_APPEND = 4, OPEN_EXCLUSIVE = 8 };
enum { FTYPE_FILE = 1, FTYPE_DIR, FTYPE_SYMLINK, FTYPE_OTHER };

/* Reads a path field into dst or answers the request with EINVAL / ENAMETOOLONG. */
static bool get_path(struct conn *c, const struct msg *m, uint16_t tag, char *dst)
{
	int r = msg_cstr(m, tag, dst, PATH_MAX);
	if (r > 0 && dst[0])
		return true;
	reply_error(c, m->id, r == -ENAMETOOLONG ? ENAMETOOLONG : EINVAL, "%s missing or invalid",
		    tag == F_PATH2 ? "PATH2" : "PATH");
	return false;
}

static void fail(struct conn *c, const struct msg *m, const char *op, const char *path, int err)
{
	reply_error(c, m->id, err, "%s %s: %s", op, path, strerror(err));
}

/* Reads UID and GID; false (answered) when malformed. */
static bool get_owner(struct conn *c, const struct msg *m, uid_t *uid, gid_t *gid)
{
	uint64_t u = (uint64_t)-1, g = (uint64_t)-1;
	if (msg_u64(m, F_UID, &u) < 0 || msg_u64(m, F_GID, &g) < 0 ||
	    (u != (uint64_t)-1 && u >= UINT32_MAX) || (g != (uint64_t)-1 && g >= UINT32_MAX)) {
		reply_error(c, m->id, EINVAL, "bad UID or GID");
		return false;
	}
	*uid = (uid_t)u;
	*gid = (gid_t)g;
	return true;
}

static uint64_t ftype_of(mode_t mode)
{
	if (S_ISREG(mode))
		return FTYPE_FILE;
	if (S_ISDIR(mode))
		return FTYPE_DIR;
	if (S_ISLNK(mode))
		return FTYPE_SYMLINK;
	return FTYPE_OTHER;
}

/* The fields describing one file; dirfd/name locate a symlink to read its target. */
static void put_stat_fields(struct buf *b, const struct stat *st, int dirfd, const char *name)
{
	put_u64(b, F_FTYPE, ftype_of(st->st_mode));
	put_u64(b, F_MODE, st->st_mode);
	put_u64(b, F_SIZE, (uint64_t)st->st_size);
	put_u64(b, F_MTIME_MS, (uint64_t)st->st_mtim.tv_sec * 1000 +
			       (uint64_t)st->st_mtim.tv_nsec / 1000000);
	put_u64(b, F_UID_OUT, st->st_uid);
	put_u64(b, F_GID_OUT, st->st_gid);
	if (S_ISLNK(st->st_mode)) {
		char target[PATH_MAX];
		ssize_t n = readlinkat(dirfd, name, target, sizeof target);
		if (n >= 0)
			put_bytes(b, F_LINK, target, (size_t)n);
	}
}

void file_stat(struct conn *c, const struct msg *m)
{
	char path[PATH_MAX];
	if (!get_path(c, m, F_PATH, path))
		return;
	struct stat st;
	int flags = msg_flag(m, F_NOFOLLOW) ? AT_SYMLINK_NOFOLLOW : 0;
	if (fstatat(AT_FDCWD, path, &st, flags) < 0) {
		fail(c, m, "stat", path, errno);
		return;
	}
	struct buf *b = conn_out(c);
	size_t at = frame_begin(b, RP_STAT, m->id);
	put_stat_fields(b, &st, AT_FDCWD, path);
	frame_end(b, at);
}

void file_statfs(struct conn *c, const struct msg *m)
{
	char path[PATH_MAX];
	if (!get_path(c, m, F_PATH, path))
		return;
	struct statvfs sv;
	if (statvfs(path, &sv) < 0) {
		fail(c, m, "statfs", path, errno);
		return;
	}
	struct buf *b = conn_out(c);
	size_t at = frame_begin(b, RP_STATFS, m->id);
	put_u64(b, F_BYTES_TOTAL, (uint64_t)sv.f_blocks * sv.f_frsize);
	put_u64(b, F_BYTES_FREE, (uint64_t)sv.f_bfree * sv.f_frsize);
	put_u64(b, F_FILES_TOTAL, (uint64_t)sv.f_files);
	put_u64(b, F_FILES_FREE, (uint64_t)sv.f_ffree);
	frame_end(b, at);
}

static ssize_t pread_full(int fd, unsigned char *dst, size_t n, off_t off)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = pread(fd, dst + got, n - got, off + (off_t)got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return got ? (ssize_t)got : -1;
		if (r == 0)
			break;
		got += (size_t)r;
	}
	return (ssize_t)got;
}

void file_read(struct conn *c, const struct msg *m)
{
	char path[PATH_MAX];
	uint64_t offset = 0, want = READ_MAX_BYTES;
	if (!get_path(c, m, F_PATH, path))
		return;
	if (msg_u64(m, F_OFFSET, &offset) < 0 || msg_u64(m, F_LENGTH, &want) < 0 ||
	    offset > INT64_MAX) {
		reply_error(c, m->id, EINVAL, "bad OFFSET or LENGTH");
		return;
	}
	if (want > READ_MAX_BYTES)
		want = READ_MAX_BYTES;
	/* O_NONBLOCK: opening a FIFO must not stall the agent. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0) {
		fail(c, m, "open", path, errno);
		return;
	}
	struct stat st;
	int err = fstat(fd, &st) < 0 ? errno : S_ISDIR(st.st_mode) ? EISDIR
					  : !S_ISREG(st.st_mode)  ? EINVAL : 0;
	if (err) {
		fail(c, m, "read", path, err);
		close(fd);
		return;
	}
	struct buf *b = conn_out(c);
	size_t frame = frame_begin(b, RP_DATA, m->id);
	size_t field;
	unsigned char *dst = put_reserve(b, F_DATA, (size_t)want, &field);
	ssize_t n = dst ? pread_full(fd, dst, (size_t)want, (off_t)offset) : 0;
	err = errno;
	close(fd);
	if (n < 0) {
		b->len = frame;
		fail(c, m, "read", path, err);
		return;
	}
	put_commit(b, field, (size_t)n);
	put_u64(b, F_SIZE, (uint64_t)st.st_size);
	if ((uint64_t)n < want || (st.st_size > 0 && offset + (uint64_t)n >= (uint64_t)st.st_size))
		put_flag(b, F_EOF);
	frame_end(b, frame);
}

/* Opens for WRITE; *created tells whether this call made the file. */
static int open_for_write(const char *path, uint64_t flags, mode_t mode, bool *created)
{
	int base = O_WRONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
	if (flags & OPEN_TRUNCATE)
		base |= O_TRUNC;
	if (flags & OPEN_APPEND)
		base |= O_APPEND;
	*created = false;
	if (flags & (OPEN_CREATE | OPEN_EXCLUSIVE)) {
		int fd = open(path, base | O_CREAT | O_EXCL, mode);
		if (fd >= 0 || errno != EEXIST || (flags & OPEN_EXCLUSIVE)) {
			*created = fd >= 0;
			return fd;
		}
	}
	return open(path, base);
}

static bool write_full(int fd, const unsigned char *d, size_t n, bool at_offset, off_t off)
{
	size_t done = 0;
	while (done < n) {
		ssize_t r = at_offset ? pwrite(fd, d + done, n - done, off + (off_t)done)
				      : write(fd, d + done, n - done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			if (r == 0)
				errno = EIO;
			return false;
		}
		done += (size_t)r;
	}
	return true;
}

void file_write(struct conn *c, const struct msg *m)
{
	char path[PATH_MAX];
	uint64_t flags = OPEN_CREATE | OPEN_TRUNCATE, mode = DEFAULT_FILE_MODE, offset = 0;
	uid_t uid;
	gid_t gid;
	if (!get_path(c, m, F_PATH, path) || !get_owner(c, m, &uid, &gid))
		return;
	int has_offset = msg_u64(m, F_OFFSET, &offset);
	if (msg_u64(m, F_OPEN_FLAGS, &flags) < 0 || msg_u64(m, F_MODE, &mode) < 0 ||
	    has_offset < 0 || offset > INT64_MAX || mode > 07777) {
		reply_error(c, m->id, EINVAL, "bad OPEN_FLAGS, MODE or OFFSET");
		return;
	}
	const unsigned char *data = NULL;
	size_t n = 0;
	msg_bytes(m, F_DATA, &data, &n);
	bool created;
	int fd = open_for_write(path, flags, (mode_t)mode, &created);
	if (fd < 0) {
		fail(c, m, "open", path, errno);
		return;
	}
	const char *op = "write";
	bool ok = true;
	if (created) {
		op = "chmod";
		ok = fchmod(fd, (mode_t)mode) == 0;
		if (ok && (uid != (uid_t)-1 || gid != (gid_t)-1)) {
			op = "chown";
			ok = fchown(fd, uid, gid) == 0;
		}
	}
	if (ok) {
		op = "write";
		ok = write_full(fd, data, n, has_offset > 0, (off_t)offset);
	}
	int err = errno;
	if (close(fd) < 0 && ok) {
		ok = false;
		err = errno;
		op = "close";
	}
	if (!ok)
		fail(c, m, op, path, err);
	else
		reply_ok_count(c, m->id, n);
}

void file_listdir(struct conn *c, const struct msg *m)
{
	char path[PATH_MAX];
	uint64_t skip = 0;
	if (!get_path(c, m, F_PATH, path))
		return;
	if (msg_u64(m, F_OFFSET, &skip) < 0) {
		reply_error(c, m->id, EINVAL, "bad OFFSET");
		return;
	}
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		fail(c, m, "opendir", path, errno);
		if (fd >= 0)
			close(fd);
		return;
	}
	struct buf *b = conn_out(c);
	size_t at = frame_begin(b, RP_ENTRIES, m->id);
	uint64_t index = 0;
	bool complete = true;
	struct dirent *e;
	errno = 0;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (index++ < skip)
			continue;
		if (b->len - at > FRAME_MAX_PAYLOAD - 8192) {
			complete = false;
			index--;
			break;
		}
		struct stat st;
		if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue; /* removed meanwhile */
		size_t en = nest_begin(b, F_ENTRY);
		put_str(b, F_NAME, e->d_name);
		put_stat_fields(b, &st, dirfd(d), e->d_name);
		nest_end(b, en);
	}
	int err = errno;
	closedir(d);
	if (complete && err) {
		b->len = at;
		fail(c, m, "readdir", path, err);
		return;
	}
	if (complete)
		put_flag(b, F_EOF);
	else
		put_u64(b, F_OFFSET, index);
	frame_end(b, at);
}

/* mkdir with an exact mode and owner; *made tells whether it created the directory. */
static int make_dir(const char *path, mode_t mode, uid_t uid, gid_t gid, bool *made)
{
	*made = false;
	if (mkdir(path, mode) < 0)
		return -1;
	*made = true;
	if (chmod(path, mode) < 0)
		return -1;
	if ((uid != (uid_t)-1 || gid != (gid_t)-1) && lchown(path, uid, gid) < 0)
		return -1;
	return 0;
}

static int make_parents(char *path, mode_t mode, uid_t uid, gid_t gid)
{
	bool made;
	for (char *s = path + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = 0;
		int r = make_dir(path, mode, uid, gid, &made);
		*s = '/';
		if (r < 0 && (made || errno != EEXIST))
			return -1;
	}
	return 0;
}

void file_mkdir(struct conn *c, const struct msg *m)
{
	char path[PATH_MAX];
	uint64_t mode = DEFAULT_DIR_MODE;
	uid_t uid;
	gid_t gid;
	if (!get_path(c, m, F_PATH, path) || !get_owner(c, m, &uid, &gid))
		return;
	if (msg_u64(m, F_MODE, &mode) < 0 || mode > 07777) {
		reply_error(c, m->id, EINVAL, "bad MODE");
		return;
	}
	bool parents = msg_flag(m, F_PARENTS);
	if (parents && make_parents(path, (mode_t)mode, uid, gid) < 0) {
		fail(c, m, "mkdir", path, errno);
		return;
	}
	bool made;
	if (make_dir(path, (mode_t)mode, uid, gid, &made) < 0) {
		int err = errno;
		struct stat st;
		if (!(parents && !made && err == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode))) {
			fail(c, m, "mkdir", path, err);
			return;
		}
	}
	reply_ok(c, m->id);
}

/* Empties the directory dfd (which it closes) without following symlinks. */
static int remove_tree(int dfd, int depth)
{
	if (depth > REMOVE_MAX_DEPTH) {
		close(dfd);
		errno = ELOOP;
		return -1;
	}
	DIR *d = fdopendir(dfd);
	if (!d) {
		int err = errno;
		close(dfd);
		errno = err;
		return -1;
	}
	int err = 0;
	for (;;) {
		errno = 0;
		struct dirent *e = readdir(d);
		if (!e) {
			err = errno;
			break;
		}
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (unlinkat(dirfd(d), e->d_name, 0) == 0)
			continue;
		if (errno != EISDIR) {
			err = errno;
			break;
		}
		int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (sub < 0 || remove_tree(sub, depth + 1) < 0 ||
		    unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR) < 0) {
			err = errno;
			break;
		}
	}
	closedir(d);
	errno = err;
	return err ? -1 : 0;
}

void file_remove(struct conn *c, const struct msg *m)
{
	char path[PATH_MAX];
	if (!get_path(c, m, F_PATH, path))
		return;
	if (unlink(path) == 0) {
		reply_ok(c, m->id);
		return;
	}
	if (errno != EISDIR) {
		fail(c, m, "remove", path, errno);
		return;
	}
	if (msg_flag(m, F_RECURSIVE)) {
		int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0 || remove_tree(fd, 0) < 0) {
			fail(c, m, "remove", path, errno);
			return;
		}
	}
	if (rmdir(path) < 0) {
		fail(c, m, "remove", path, errno);
		return;
	}
	reply_ok(c, m->id);
}


/* An operation on two paths (PATH, PATH2) that answers OK or the call's errno. */
static void two_paths(struct conn *c, const struct msg *m, const char *op, int (*fn)(const char *, const char *))
{
	char path[PATH_MAX], path2[PATH_MAX];
	if (!get_path(c, m, F_PATH, path) || !get_path(c, m, F_PATH2, path2))
		return;
	if (fn(path, path2) < 0) {
		fail(c, m, op, path, errno);
		return;
	}
	reply_ok(c, m->id);
}

/* symlink(2) with the link first, like rename's source first. */
static int make_symlink(const char *link, const char *target)
{
	return symlink(target, link);
}

void file_rename(struct conn *c, const struct msg *m)
{
	two_paths(c, m, "rename", rename);
}

void file_symlink(struct conn *c, const struct msg *m)
{
	two_paths(c, m, "symlink", make_symlink);
}


/* Reads the PREFIX field: a namespace prefix in the user namespace ("user." or longer), or, to
 * read only, exactly overlayfs's own "trusted.overlay." (a microVM's snapshot reads the opaque
 * markers of its upper directory). */
static bool get_prefix(struct conn *c, const struct msg *m, char *dst, bool reading)
{
	int r = msg_cstr(m, F_PREFIX, dst, XATTR_PREFIX_MAX);
	if (r > 0 && !strncmp(dst, "user.", 5))
		return true;
	if (r > 0 && reading && !strcmp(dst, "trusted.overlay."))
		return true;
	reply_error(c, m->id, EINVAL, "PREFIX missing or not in the user. namespace");
	return false;
}

/* The request's XATTR entry at *pos as a full attribute name (prefix + NAME) and its value;
 * 0 at the end, -EINVAL for a bad entry. */
static int next_xattr(const struct msg *m, size_t *pos, const char *prefix, char full[XATTR_NAME_MAX + 1],
		      const unsigned char **value, size_t *value_len)
{
	size_t plen = strlen(prefix);
	struct field f;
	while (field_next(m->p, m->len, pos, &f)) {
		if (f.tag != F_XATTR)
			continue;
		const unsigned char *name = NULL;
		size_t name_len = 0, ipos = 0;
		struct field g;
		*value = (const unsigned char *)"";
		*value_len = 0;
		while (field_next(f.v, f.len, &ipos, &g)) {
			if (g.tag == F_NAME) {
				name = g.v;
				name_len = g.len;
			} else if (g.tag == F_DATA) {
				*value = g.v;
				*value_len = g.len;
			}
		}
		if (!name || !name_len || memchr(name, 0, name_len) || plen + name_len > XATTR_NAME_MAX)
			return -EINVAL;
		memcpy(full, prefix, plen);
		memcpy(full + plen, name, name_len);
		full[plen + name_len] = 0;
		return 1;
	}
	return 0;
}

/* True when the request sets the attribute full. */
static bool requested(const struct msg *m, const char *prefix, const char *full)
{
	char name[XATTR_NAME_MAX + 1];
	const unsigned char *value;
	size_t value_len, pos = 0;
	while (next_xattr(m, &pos, prefix, name, &value, &value_len) > 0)
		if (!strcmp(name, full))
			return true;
	return false;
}

/* Sets the request's XATTR entries on path, then removes its other attributes under prefix: a
 * failure part way leaves the old attributes (and some new values), never none. */
static int replace_xattrs(const struct msg *m, const char *path, const char *prefix)
{
	static char names[XATTR_LIST_MAX];
	char full[XATTR_NAME_MAX + 1];
	const unsigned char *value;
	size_t value_len, pos = 0;
	int r;
	/* Every entry is checked before anything is written. */
	while ((r = next_xattr(m, &pos, prefix, full, &value, &value_len)) > 0)
		;
	if (r < 0)
		return r;
	pos = 0;
	while (next_xattr(m, &pos, prefix, full, &value, &value_len) > 0)
		if (setxattr(path, full, value, value_len, 0) < 0)
			return -errno;
	size_t plen = strlen(prefix);
	ssize_t n = listxattr(path, names, sizeof names);
	if (n < 0)
		return -errno;
	for (ssize_t i = 0; i < n; i += (ssize_t)strlen(names + i) + 1)
		if (!strncmp(names + i, prefix, plen) && !requested(m, prefix, names + i) && removexattr(path, names + i) < 0 &&
		    errno != ENODATA)
			return -errno;
	return 0;
}

/* One ENTRY with the attributes of path under prefix (names without it), or its ERRNO. */
static void put_xattrs_entry(struct buf *b, size_t frame_at, const char *path, const char *prefix)
{
	static char names[XATTR_LIST_MAX];
	static unsigned char value[XATTR_SIZE_MAX];
	size_t plen = strlen(prefix);
	size_t en = nest_begin(b, F_ENTRY);
	/* Like the writes (and like reading the file), a symbolic link is followed. */
	ssize_t n = listxattr(path, names, sizeof names);
	if (n < 0) {
		put_u64(b, F_ERRNO, (uint64_t)errno);
		nest_end(b, en);
		return;
	}
	for (ssize_t i = 0; i < n; i += (ssize_t)strlen(names + i) + 1) {
		if (strncmp(names + i, prefix, plen))
			continue;
		if (b->len - frame_at > FRAME_MAX_PAYLOAD - XATTR_REPLY_SLACK) {
			put_u64(b, F_ERRNO, E2BIG);
			break;
		}
		ssize_t vn = getxattr(path, names + i, value, sizeof value);
		if (vn < 0)
			continue; /* removed meanwhile */
		size_t xn = nest_begin(b, F_XATTR);
		put_str(b, F_NAME, names + i + plen);
		put_bytes(b, F_DATA, value, (size_t)vn);
		nest_end(b, xn);
	}
	nest_end(b, en);
}

void file_xattrs(struct conn *c, const struct msg *m)
{
	char prefix[XATTR_PREFIX_MAX], path[PATH_MAX];
	if (!get_prefix(c, m, prefix, !msg_flag(m, F_REPLACE)))
		return;
	size_t paths = 0, pos = 0;
	struct field f;
	while (field_next(m->p, m->len, &pos, &f))
		if (f.tag == F_PATH && (f.len == 0 || f.len >= PATH_MAX || memchr(f.v, 0, f.len) || ++paths > XATTRS_MAX_PATHS)) {
			reply_error(c, m->id, EINVAL, "PATH invalid or more than %d", XATTRS_MAX_PATHS);
			return;
		}
	if (!paths || (msg_flag(m, F_REPLACE) && paths != 1)) {
		reply_error(c, m->id, EINVAL, "PATH missing (REPLACE takes exactly one)");
		return;
	}
	if (msg_flag(m, F_REPLACE)) {
		if (!get_path(c, m, F_PATH, path))
			return;
		int r = replace_xattrs(m, path, prefix);
		if (r < 0) {
			fail(c, m, "setxattr", path, -r);
			return;
		}
	}
	struct buf *b = conn_out(c);
	size_t at = frame_begin(b, RP_XATTRS, m->id);
	pos = 0;
	while (field_next(m->p, m->len, &pos, &f)) {
		if (f.tag != F_PATH)
			continue;
		memcpy(path, f.v, f.len);
		path[f.len] = 0;
		put_xattrs_entry(b, at, path, prefix);
	}
	frame_end(b, at);
}
