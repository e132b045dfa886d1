// dsec-rofs: serves a container sandbox's read-only protected paths over FUSE, and records every
// attempt to change them.
//
// A read-only bind mount refuses a write in the VFS (EROFS) before any hook that could report it
// runs. dsec-launch therefore mounts a FUSE file system over each read-only bind (the mount itself
// writable, so that the kernel sends every change to this process), and starts this server with
// the mounted /dev/fuse connections and an O_PATH descriptor of each read-only bind beneath them.
// Reads are answered from the read-only bind; every change (an open for writing, create, truncate
// and every other setattr, unlink, rmdir, mkdir, mknod, symlink, link, rename, set or remove an
// extended attribute) is refused with EROFS, as the bind would, and written to the log as one line
// "<op> <path>\n", the path as the sandbox names it, with bytes below 0x21, 0x7f and '\' written
// as \ooo. Edge reads the log and raises `protected-path.write`. The log is capped
// (LOG_CAP_BYTES); past it one line "overflow" is written and nothing more.
//
// One server per sandbox, single-threaded (its answers come from the page cache or a local
// disk): a sandbox can slow down only its own protected paths. Nothing it does waits on the
// sandbox: a node that is not a regular file or a directory (a FIFO, a socket, a device planted
// through a snapshot) is never opened (the kernel serves a FIFO's or socket's opens itself, and
// the server refuses them too), statfs is answered from the O_PATH descriptor, and every reopen
// is non-blocking. What a sandbox can make it hold is bounded: a node keeps its parent and its
// name (the path is built, bounded, only to log a refusal), at most MAX_NODES nodes live at once
// (past it a lookup answers ENFILE), and its descriptors are limited (RLIMIT_NOFILE). It runs in the host's mount
// namespace (dsec-launch moves it there before the exec), not the sandbox's, so it holds no
// reference to the sandbox's mounts but the read-only binds it serves: when the sandbox's mount
// namespaces are gone the kernel ends each connection (ENODEV) and the server exits. If it dies
// first, the sandbox's protected paths answer ENOTCONN (nothing can be written there still) until
// edge starts a new server over them (dsec-launch --reprotect). It
// ignores SIGHUP, SIGINT and SIGPIPE (dsec-launch starts it in a session of its own): a terminal
// or a process group that ends does not end it.
//
// Once every session is mounted it writes one byte to <ready-fd> and closes it: dsec-launch
// waits for that byte (end of file: the server failed, and so does the launch). Until then it is
// killed with the launcher (its parent-death signal, cleared just before the byte).
//
// Usage: dsec-rofs <log-fd> <ready-fd> <fuse-fd>:<dir-fd>:<path> ...
#define FUSE_USE_VERSION 312
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define MAX_MOUNTS 64
#define LOG_CAP_BYTES (1024 * 1024)
/* Nothing beneath a protected path changes while the sandbox runs: the kernel may cache it all. */
#define CACHE_SECONDS 86400.0
/* Nodes alive at once (each holds an O_PATH descriptor); past it a lookup answers ENFILE. */
#define MAX_NODES 65536
/* Descriptors: one per node, one per open file or directory, and a few of its own. */
#define MAX_FDS (2 * MAX_NODES + 256)
/* The longest path logged; a longer one keeps its end, after "/...". */
#define MAX_LOG_PATH 4096

struct node {
  int fd; /* O_PATH, on the read-only bind */
  struct node *parent; /* NULL for a mount's root */
  char *name; /* the root's: its path in the sandbox */
  uint64_t nlookup; /* the kernel's references */
  uint64_t children; /* live nodes looked up in it */
};

struct mount {
  struct fuse_session *se;
  struct node root;
};

static int log_fd = -1;
static size_t logged;
static size_t live_nodes;

/* Appends "<op> <path>\n" to the log, escaped; never blocks on the sandbox (a local file). */
static void record(const char *op, const char *path) {
  if (logged >= LOG_CAP_BYTES) return;
  char line[3 * 4096 + 64];
  size_t n = (size_t)snprintf(line, sizeof line, "%s ", op);
  for (const unsigned char *p = (const unsigned char *)path; *p && n + 6 < sizeof line; p++) {
    if (*p <= 0x20 || *p == 0x7f || *p == '\\')
      n += (size_t)snprintf(line + n, sizeof line - n, "\\%03o", *p);
    else
      line[n++] = (char)*p;
  }
  line[n++] = '\n';
  /* The last line that fits is "overflow", written once. */
  if (logged + n > LOG_CAP_BYTES - 9) {
    memcpy(line, "overflow\n", 9);
    n = 9;
    logged = LOG_CAP_BYTES;
  } else {
    logged += n;
  }
  while (write(log_fd, line, n) < 0 && errno == EINTR)
    ;
}

static struct node *node_of(fuse_req_t req, fuse_ino_t ino) {
  if (ino == FUSE_ROOT_ID) return &((struct mount *)fuse_req_userdata(req))->root;
  return (struct node *)(uintptr_t)ino;
}

/* Puts `s` before `at` in `buf` (built from its end); false when it does not fit. */
static bool prepend(char *buf, size_t *at, const char *s, size_t len) {
  if (len > *at) return false;
  *at -= len;
  memcpy(buf + *at, s, len);
  return true;
}

/*
 * Records `op` on the sandbox's path of node `n` (with "/name" after it when `name` is set),
 * built from the names up to the mount's root; one longer than MAX_LOG_PATH keeps its end.
 */
static void record_path(const char *op, const struct node *n, const char *name) {
  char buf[MAX_LOG_PATH + 1];
  size_t at = MAX_LOG_PATH;
  buf[at] = '\0';
  bool fits = !name || (prepend(buf, &at, name, strlen(name)) && prepend(buf, &at, "/", 1));
  for (; fits && n->parent; n = n->parent)
    fits = prepend(buf, &at, n->name, strlen(n->name)) && prepend(buf, &at, "/", 1);
  if (fits) fits = prepend(buf, &at, n->name, strlen(n->name));
  if (!fits) {
    while (at < MAX_LOG_PATH && (at < 4 || buf[at] != '/')) at++; /* a whole name, then the mark */
    at -= 4;
    memcpy(buf + at, "/...", 4);
  }
  record(op, buf + at);
}

/* Refuses a change to `name` in `parent` (or to `parent` itself when `name` is NULL) and records it. */
static void refuse(fuse_req_t req, const char *op, fuse_ino_t parent, const char *name) {
  record_path(op, node_of(req, parent), name);
  fuse_reply_err(req, EROFS);
}

static int stat_node(const struct node *n, struct stat *st) {
  return fstatat(n->fd, "", st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
}

/*
 * Opens node `n` again for reading (an O_PATH fd cannot be read), if it is of type `type` (a
 * regular file or a directory: nothing else is opened, so no open can wait); never blocks. The
 * node is no symbolic link (looked up O_NOFOLLOW, its type checked): the /proc link, which
 * O_NOFOLLOW would refuse, leads to it alone.
 */
static int reopen(const struct node *n, mode_t type, int flags) {
  struct stat st;
  int err = stat_node(n, &st);
  if (err) return err;
  if ((st.st_mode & S_IFMT) != type) return type == S_IFDIR ? -ENOTDIR : -EACCES;
  char proc[64];
  snprintf(proc, sizeof proc, "/proc/self/fd/%d", n->fd);
  int fd = open(proc, flags | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  return fd < 0 ? -errno : fd;
}

/* Drops node `n` once neither the kernel nor a child refers to it, then its parent likewise. */
static void drop(struct node *n) {
  while (n->parent && n->nlookup == 0 && n->children == 0) {
    struct node *parent = n->parent;
    close(n->fd);
    free(n->name);
    free(n);
    live_nodes--;
    parent->children--;
    n = parent;
  }
}

static void ll_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
  struct node *p = node_of(req, parent);
  struct fuse_entry_param e;
  memset(&e, 0, sizeof e);
  e.attr_timeout = CACHE_SECONDS;
  e.entry_timeout = CACHE_SECONDS;
  if (live_nodes >= MAX_NODES) {
    fuse_reply_err(req, ENFILE);
    return;
  }
  int fd = openat(p->fd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      fuse_reply_entry(req, &e); /* a negative entry, cached as long */
      return;
    }
    fuse_reply_err(req, errno);
    return;
  }
  struct node *n = calloc(1, sizeof *n);
  if (n == NULL || (n->name = strdup(name)) == NULL) {
    free(n);
    close(fd);
    fuse_reply_err(req, ENOMEM);
    return;
  }
  n->fd = fd;
  n->parent = p;
  p->children++;
  live_nodes++;
  int err = stat_node(n, &e.attr);
  if (err) {
    drop(n);
    fuse_reply_err(req, -err);
    return;
  }
  n->nlookup = 1;
  e.ino = (fuse_ino_t)(uintptr_t)n;
  if (fuse_reply_entry(req, &e) != 0) {
    n->nlookup = 0;
    drop(n);
  }
}

static void forget_one(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  if (ino == FUSE_ROOT_ID) return;
  struct node *n = node_of(req, ino);
  n->nlookup = nlookup >= n->nlookup ? 0 : n->nlookup - nlookup;
  drop(n);
}

static void ll_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  forget_one(req, ino, nlookup);
  fuse_reply_none(req);
}

static void ll_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets) {
  for (size_t i = 0; i < count; i++) forget_one(req, forgets[i].ino, forgets[i].nlookup);
  fuse_reply_none(req);
}

static void ll_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  (void)fi;
  struct stat st;
  int err = stat_node(node_of(req, ino), &st);
  if (err)
    fuse_reply_err(req, -err);
  else
    fuse_reply_attr(req, &st, CACHE_SECONDS);
}

static void ll_readlink(fuse_req_t req, fuse_ino_t ino) {
  char buf[4097];
  ssize_t n = readlinkat(node_of(req, ino)->fd, "", buf, sizeof buf - 1);
  if (n < 0) {
    fuse_reply_err(req, errno);
    return;
  }
  buf[n] = '\0';
  fuse_reply_readlink(req, buf);
}

static void ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)) {
    refuse(req, "open-write", ino, NULL);
    return;
  }
  int fd = reopen(node_of(req, ino), S_IFREG, O_RDONLY);
  if (fd < 0) {
    fuse_reply_err(req, -fd);
    return;
  }
  fi->fh = (uint64_t)fd;
  fi->keep_cache = 1;
  fuse_reply_open(req, fi);
}

static void ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
  (void)ino;
  struct fuse_bufvec buf = FUSE_BUFVEC_INIT(size);
  buf.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
  buf.buf[0].fd = (int)fi->fh;
  buf.buf[0].pos = off;
  fuse_reply_data(req, &buf, FUSE_BUF_SPLICE_MOVE);
}

static void ll_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  (void)ino;
  close((int)fi->fh);
  fuse_reply_err(req, 0);
}

static void ll_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  int fd = reopen(node_of(req, ino), S_IFDIR, O_RDONLY | O_DIRECTORY);
  if (fd < 0) {
    fuse_reply_err(req, -fd);
    return;
  }
  DIR *d = fdopendir(fd);
  if (d == NULL) {
    int e = errno;
    close(fd);
    fuse_reply_err(req, e);
    return;
  }
  fi->fh = (uint64_t)(uintptr_t)d;
  fi->cache_readdir = 1;
  fi->keep_cache = 1;
  fuse_reply_open(req, fi);
}

static void ll_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
  (void)ino;
  DIR *d = (DIR *)(uintptr_t)fi->fh;
  char *buf = malloc(size ? size : 1);
  if (buf == NULL) {
    fuse_reply_err(req, ENOMEM);
    return;
  }
  seekdir(d, off);
  size_t used = 0;
  for (;;) {
    errno = 0;
    struct dirent *de = readdir(d);
    if (de == NULL) break;
    struct stat st = {.st_ino = de->d_ino, .st_mode = (mode_t)DTTOIF(de->d_type)};
    size_t need = fuse_add_direntry(req, buf + used, size - used, de->d_name, &st, telldir(d));
    if (need > size - used) break;
    used += need;
  }
  fuse_reply_buf(req, buf, used);
  free(buf);
}

static void ll_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  (void)ino;
  closedir((DIR *)(uintptr_t)fi->fh);
  fuse_reply_err(req, 0);
}

/* From the O_PATH descriptor: no open (one of a FIFO would wait for a writer for good). */
static void ll_statfs(fuse_req_t req, fuse_ino_t ino) {
  struct statvfs sv;
  if (fstatvfs(node_of(req, ino)->fd, &sv) < 0)
    fuse_reply_err(req, errno);
  else
    fuse_reply_statfs(req, &sv);
}

/* Every change: refused, recorded. */
static void ll_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set, struct fuse_file_info *fi) {
  (void)attr;
  (void)fi;
  refuse(req, (to_set & FUSE_SET_ATTR_SIZE) ? "truncate" : "setattr", ino, NULL);
}

static void ll_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev) {
  (void)mode;
  (void)rdev;
  refuse(req, "mknod", parent, name);
}

static void ll_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode) {
  (void)mode;
  refuse(req, "mkdir", parent, name);
}

static void ll_unlink(fuse_req_t req, fuse_ino_t parent, const char *name) { refuse(req, "unlink", parent, name); }

static void ll_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name) { refuse(req, "rmdir", parent, name); }

static void ll_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name) {
  (void)link;
  refuse(req, "symlink", parent, name);
}

static void ll_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent, const char *newname, unsigned int flags) {
  (void)flags;
  record_path("rename", node_of(req, newparent), newname);
  refuse(req, "rename", parent, name);
}

static void ll_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname) {
  (void)ino;
  refuse(req, "link", newparent, newname);
}

static void ll_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, struct fuse_file_info *fi) {
  (void)mode;
  (void)fi;
  refuse(req, "create", parent, name);
}

static void ll_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value, size_t size, int flags) {
  (void)name;
  (void)value;
  (void)size;
  (void)flags;
  refuse(req, "setxattr", ino, NULL);
}

static void ll_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name) {
  (void)name;
  refuse(req, "removexattr", ino, NULL);
}

static const struct fuse_lowlevel_ops ops = {
    .lookup = ll_lookup,
    .forget = ll_forget,
    .forget_multi = ll_forget_multi,
    .getattr = ll_getattr,
    .readlink = ll_readlink,
    .open = ll_open,
    .read = ll_read,
    .release = ll_release,
    .opendir = ll_opendir,
    .readdir = ll_readdir,
    .releasedir = ll_releasedir,
    .statfs = ll_statfs,
    .setattr = ll_setattr,
    .mknod = ll_mknod,
    .mkdir = ll_mkdir,
    .unlink = ll_unlink,
    .rmdir = ll_rmdir,
    .symlink = ll_symlink,
    .rename = ll_rename,
    .link = ll_link,
    .create = ll_create,
    .setxattr = ll_setxattr,
    .removexattr = ll_removexattr,
};

int main(int argc, char **argv) {
  if (argc < 4 || argc - 3 > MAX_MOUNTS) {
    fprintf(stderr, "usage: %s <log-fd> <ready-fd> <fuse-fd>:<dir-fd>:<path> ...\n", argv[0]);
    return 2;
  }
  log_fd = atoi(argv[1]);
  int ready_fd = atoi(argv[2]);
  struct sigaction ign = {.sa_handler = SIG_IGN};
  sigaction(SIGHUP, &ign, NULL);
  sigaction(SIGINT, &ign, NULL);
  sigaction(SIGPIPE, &ign, NULL);
  /* Its own limit, not the launcher's: MAX_FDS, or its hard limit where it may not raise that. */
  struct rlimit fds = {.rlim_cur = MAX_FDS, .rlim_max = MAX_FDS};
  if (setrlimit(RLIMIT_NOFILE, &fds) < 0 &&
      (getrlimit(RLIMIT_NOFILE, &fds) < 0 || (fds.rlim_cur = fds.rlim_max, setrlimit(RLIMIT_NOFILE, &fds) < 0))) {
    fprintf(stderr, "dsec-rofs: cannot limit descriptors: %s\n", strerror(errno));
    return 1;
  }
  static struct mount mounts[MAX_MOUNTS];
  struct pollfd pfd[MAX_MOUNTS];
  int n = argc - 3;
  for (int i = 0; i < n; i++) {
    const char *spec = argv[i + 3];
    int fuse_fd, dir_fd, at = 0;
    if (sscanf(spec, "%d:%d:%n", &fuse_fd, &dir_fd, &at) != 2 || at == 0 || spec[at] != '/') {
      fprintf(stderr, "dsec-rofs: bad mount %s\n", spec);
      return 2;
    }
    struct mount *m = &mounts[i];
    m->root.fd = dir_fd;
    m->root.name = (char *)spec + at;
    char *fargs[] = {argv[0], NULL};
    struct fuse_args args = FUSE_ARGS_INIT(1, fargs);
    m->se = fuse_session_new(&args, &ops, sizeof ops, m);
    char dev[32];
    snprintf(dev, sizeof dev, "/dev/fd/%d", fuse_fd);
    if (m->se == NULL || fuse_session_mount(m->se, dev) != 0) {
      fprintf(stderr, "dsec-rofs: cannot serve %s\n", m->root.name);
      return 1;
    }
    pfd[i] = (struct pollfd){.fd = fuse_session_fd(m->se), .events = POLLIN};
  }
  /* Serving: from now on it outlives the launcher that started it (it died with it until here). */
  if (prctl(PR_SET_PDEATHSIG, 0) < 0) {
    fprintf(stderr, "dsec-rofs: cannot outlive the launcher: %s\n", strerror(errno));
    return 1;
  }
  while (write(ready_fd, "r", 1) < 0 && errno == EINTR)
    ;
  close(ready_fd);
  struct fuse_buf buf = {.mem = NULL};
  for (int live = n; live > 0;) {
    if (poll(pfd, (nfds_t)n, -1) < 0) {
      if (errno == EINTR) continue;
      return 1;
    }
    for (int i = 0; i < n; i++) {
      if (pfd[i].fd < 0 || !pfd[i].revents) continue;
      int r = fuse_session_receive_buf(mounts[i].se, &buf);
      if (r == -EINTR || r == -EAGAIN) continue;
      if (r <= 0) { /* ENODEV: the sandbox's mounts are gone */
        pfd[i].fd = -1;
        live--;
        continue;
      }
      fuse_session_process_buf(mounts[i].se, &buf);
    }
  }
  return 0;
}
