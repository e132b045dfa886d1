// dsec-lazyfs: a layer's data blob as one read-only file (`<mountpoint>/blob`) on FUSE, for an
// EROFS metadata image to be mounted over (`device=<mountpoint>/blob`) before the blob has
// arrived. The blob is a list of extents (EROFS chunks) in a binary index; each extent's bytes
// live in the node's chunk cache as `<cache>/<2 hex>/<64 hex>` (named by their sha256). A read
// of an extent the cache lacks asks the lazy server (the parent, over stdin/stdout: "F <i>\n"
// out, "O <i>\n" or "E <i> <errno>\n" back) to fetch, verify and store it, then reads the file.
// A read announces every extent it misses at once (the server merges neighbours into one range
// request). A read whose answer does not come within the deadline fails with EIO: the sandbox sees
// an I/O error, never a hang; when the server goes (its pipe closes) this process exits. Extents served from the cache are
// reported ("H <i> <bytes>\n") for the server's statistics and LRU order.
//
// Index file: "DSLZIDX1", u64 blob size, u32 count, then count x {u64 offset, u32 length,
// u8 sha256[32]} sorted by offset, not overlapping (little endian). Bytes outside every extent
// read as zeros.
//
// The mount may be made by the caller: with `/dev/fd/<n>` as the mount point, fd n is an open
// /dev/fuse already mounted (libfuse's convention). The caller keeps its own copy of that fd, so the
// FUSE connection outlives this process: when it dies, a new dsec-lazyfs started with `resume`
// takes the same fd over. The kernel answered INIT to the first one only, so the new one feeds its
// libfuse session a made-up INIT (the kernel refuses the reply: its id was never sent, which
// libfuse ignores), then asks the kernel (FUSE_NOTIFY_RESEND, Linux 6.9+) to queue again the
// requests the dead one had read and not answered: the reads in the sandbox carry on.
//
// Usage: dsec-lazyfs <mountpoint | /dev/fd/N> <index> <cache-dir> <deadline-ms> [resume]
#define FUSE_USE_VERSION 312
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct extent {
  uint64_t off;
  uint32_t len;
  char path[4 + 64 + 1];
};

enum { UNKNOWN = 0, FETCHING = 1, PRESENT = 2 };

static struct extent *extents;
static uint32_t n_extents;
static uint64_t blob_size;
static char *cache_dir;
static long deadline_ms;
static unsigned char *state;
static int *last_error;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv;
static pthread_mutex_t out_mu = PTHREAD_MUTEX_INITIALIZER;

static void say(const char *line) {
  pthread_mutex_lock(&out_mu);
  size_t n = strlen(line);
  const char *p = line;
  while (n > 0) {
    ssize_t w = write(1, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      break;
    }
    p += w;
    n -= (size_t)w;
  }
  pthread_mutex_unlock(&out_mu);
}

static int load_index(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  char magic[8];
  uint32_t count;
  if (fread(magic, 1, 8, f) != 8 || memcmp(magic, "DSLZIDX1", 8) != 0 || fread(&blob_size, 8, 1, f) != 1 || fread(&count, 4, 1, f) != 1) {
    fclose(f);
    return -1;
  }
  extents = calloc(count ? count : 1, sizeof(*extents));
  state = calloc(count ? count : 1, 1);
  last_error = calloc(count ? count : 1, sizeof(int));
  if (!extents || !state || !last_error) {
    fclose(f);
    return -1;
  }
  static const char hex[] = "0123456789abcdef";
  for (uint32_t i = 0; i < count; i++) {
    unsigned char rec[8 + 4 + 32];
    if (fread(rec, 1, sizeof(rec), f) != sizeof(rec)) {
      fclose(f);
      return -1;
    }
    memcpy(&extents[i].off, rec, 8);
    memcpy(&extents[i].len, rec + 8, 4);
    char *p = extents[i].path;
    *p++ = hex[rec[12] >> 4];
    *p++ = hex[rec[12] & 15];
    *p++ = '/';
    for (int k = 0; k < 32; k++) {
      *p++ = hex[rec[12 + k] >> 4];
      *p++ = hex[rec[12 + k] & 15];
    }
    *p = 0;
    if (i > 0 && extents[i].off < extents[i - 1].off + extents[i - 1].len) {
      fclose(f);
      return -1;
    }
  }
  n_extents = count;
  fclose(f);
  return 0;
}

/** First extent ending after `off`, or n_extents. */
static uint32_t find_extent(uint64_t off) {
  uint32_t lo = 0, hi = n_extents;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (extents[mid].off + extents[mid].len <= off)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static int open_chunk(uint32_t i) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", cache_dir, extents[i].path);
  return open(path, O_RDONLY | O_CLOEXEC);
}

/**
 * Asks the server for extent i if the cache lacks it and nobody asked yet; 1 when this call
 * asked. A read announces every extent it misses before it waits for the first, so that the
 * server sees neighbours together and fetches them with one range request.
 */
static int announce(uint32_t i) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", cache_dir, extents[i].path);
  if (access(path, F_OK) == 0) return 0;
  int asked = 0;
  pthread_mutex_lock(&mu);
  if (state[i] == UNKNOWN) {
    state[i] = FETCHING;
    last_error[i] = 0;
    char line[64];
    snprintf(line, sizeof(line), "F %u\n", i);
    say(line);
    asked = 1;
  }
  pthread_mutex_unlock(&mu);
  return asked;
}

/** An fd of extent i's cache file, fetched first if missing; -errno on failure. `asked`: this read announced it (no hit). */
static int chunk_fd(uint32_t i, int asked) {
  int fd = open_chunk(i);
  if (fd >= 0) {
    if (asked) return fd;
    char line[64];
    snprintf(line, sizeof(line), "H %u\n", i);
    say(line);
    return fd;
  }
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += deadline_ms / 1000;
  until.tv_nsec += (deadline_ms % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&mu);
  int err = 0;
  for (;;) {
    if (state[i] == PRESENT) break;
    if (state[i] == UNKNOWN) {
      state[i] = FETCHING;
      last_error[i] = 0;
      char line[64];
      snprintf(line, sizeof(line), "F %u\n", i);
      say(line);
    }
    int rc = pthread_cond_timedwait(&cv, &mu, &until);
    if (state[i] == UNKNOWN && last_error[i] != 0) {
      err = last_error[i];
      break;
    }
    if (rc == ETIMEDOUT && state[i] != PRESENT) {
      err = EIO;
      break;
    }
  }
  pthread_mutex_unlock(&mu);
  if (err != 0) return -err;
  fd = open_chunk(i);
  if (fd < 0) {
    pthread_mutex_lock(&mu);
    state[i] = UNKNOWN; // evicted under us (never for a mounted layer); the next read asks again
    pthread_mutex_unlock(&mu);
    return -EIO;
  }
  return fd;
}

/**
 * Reads the server's answers until it closes the pipe: the server died, and this process goes
 * with it. The FUSE connection lives on while another process holds a descriptor of it (the
 * edge keeps one): a new server and dsec-lazyfs take it over (`resume`) and the requests this one
 * had taken are queued again. Held by nobody, it is aborted and reads fail (ENOTCONN), never hang.
 */
static void *answers(void *arg) {
  (void)arg;
  FILE *in = fdopen(0, "r");
  char line[128];
  while (in && fgets(line, sizeof(line), in)) {
    unsigned i;
    int e;
    pthread_mutex_lock(&mu);
    if (sscanf(line, "O %u", &i) == 1 && i < n_extents) {
      state[i] = PRESENT;
    } else if (sscanf(line, "E %u %d", &i, &e) == 2 && i < n_extents) {
      state[i] = UNKNOWN;
      last_error[i] = e > 0 ? e : EIO;
    }
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
  }
  _exit(0);
}

// The low-level API, with fixed inode numbers (1: the root, 2: `blob`): a process that takes a
// mounted connection over must know the inodes the kernel already looked up, which libfuse's
// high-level API numbers by itself (a new process would not know them).
enum { ROOT_INO = 1, BLOB_INO = 2 };
static const double TIMEOUT_S = 3600;

static int fill_attr(fuse_ino_t ino, struct stat *st) {
  memset(st, 0, sizeof(*st));
  st->st_ino = ino;
  if (ino == ROOT_INO) {
    st->st_mode = S_IFDIR | 0555;
    st->st_nlink = 2;
    return 0;
  }
  if (ino == BLOB_INO) {
    st->st_mode = S_IFREG | 0444;
    st->st_nlink = 1;
    st->st_size = (off_t)blob_size;
    st->st_blksize = 4096;
    st->st_blocks = (blkcnt_t)((blob_size + 511) / 512);
    return 0;
  }
  return -1;
}

static void ll_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
  if (parent != ROOT_INO || strcmp(name, "blob") != 0) {
    fuse_reply_err(req, ENOENT);
    return;
  }
  struct fuse_entry_param e;
  memset(&e, 0, sizeof(e));
  e.ino = BLOB_INO;
  e.attr_timeout = TIMEOUT_S;
  e.entry_timeout = TIMEOUT_S;
  fill_attr(BLOB_INO, &e.attr);
  fuse_reply_entry(req, &e);
}

static void ll_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  (void)fi;
  struct stat st;
  if (fill_attr(ino, &st) != 0)
    fuse_reply_err(req, ENOENT);
  else
    fuse_reply_attr(req, &st, TIMEOUT_S);
}

static void ll_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
  (void)fi;
  if (ino != ROOT_INO) {
    fuse_reply_err(req, ENOTDIR);
    return;
  }
  static const char *const names[] = {".", "..", "blob"};
  static const fuse_ino_t inos[] = {ROOT_INO, ROOT_INO, BLOB_INO};
  char buf[512];
  size_t used = 0;
  for (off_t k = off; k < 3; k++) {
    struct stat st = {.st_ino = inos[k], .st_mode = k == 2 ? S_IFREG : S_IFDIR};
    size_t need = fuse_add_direntry(req, buf + used, sizeof(buf) - used, names[k], &st, k + 1);
    if (need > sizeof(buf) - used || used + need > size) break;
    used += need;
  }
  fuse_reply_buf(req, buf, used);
}

static void ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  if (ino != BLOB_INO) {
    fuse_reply_err(req, ino == ROOT_INO ? EISDIR : ENOENT);
    return;
  }
  if ((fi->flags & O_ACCMODE) != O_RDONLY) {
    fuse_reply_err(req, EROFS);
    return;
  }
  fi->keep_cache = 1;
  fuse_reply_open(req, fi);
}

/** Fills `buf` with the blob's bytes at `offset`; their count or -errno. */
static int blob_read(char *buf, size_t size, off_t offset) {
  uint64_t off = (uint64_t)offset;
  if (off >= blob_size) return 0;
  if (off + size > blob_size) size = (size_t)(blob_size - off);
  memset(buf, 0, size);
  uint64_t end = off + size;
  uint32_t first = find_extent(off);
  uint64_t asked = 0; // bit k: extent first+k announced by this read (the first 64)
  for (uint32_t i = first; i < n_extents && extents[i].off < end; i++)
    if (announce(i) && i - first < 64) asked |= 1ull << (i - first);
  for (uint32_t i = first; i < n_extents && extents[i].off < end; i++) {
    uint64_t from = extents[i].off > off ? extents[i].off : off;
    uint64_t to = extents[i].off + extents[i].len < end ? extents[i].off + extents[i].len : end;
    int fd = chunk_fd(i, i - first < 64 && ((asked >> (i - first)) & 1));
    if (fd < 0) return fd;
    size_t want = (size_t)(to - from);
    size_t got = 0;
    while (got < want) {
      ssize_t r = pread(fd, buf + (from - off) + got, want - got, (off_t)(from - extents[i].off + got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        close(fd);
        return -EIO;
      }
      got += (size_t)r;
    }
    close(fd);
  }
  return (int)size;
}

static void ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
  (void)fi;
  if (ino != BLOB_INO) {
    fuse_reply_err(req, EISDIR);
    return;
  }
  char *buf = malloc(size ? size : 1);
  if (buf == NULL) {
    fuse_reply_err(req, ENOMEM);
    return;
  }
  int n = blob_read(buf, size, off);
  if (n < 0)
    fuse_reply_err(req, -n);
  else
    fuse_reply_buf(req, buf, (size_t)n);
  free(buf);
}

static void ll_init(void *userdata, struct fuse_conn_info *conn) {
  (void)userdata;
  (void)conn;
  pthread_t t;
  pthread_create(&t, NULL, answers, NULL);
  pthread_detach(t);
}

static const struct fuse_lowlevel_ops ops = {
    .init = ll_init,
    .lookup = ll_lookup,
    .getattr = ll_getattr,
    .readdir = ll_readdir,
    .open = ll_open,
    .read = ll_read,
};

/** The kernel's INIT as a new process taking over a mounted connection would have got it. */
static int feed_init(struct fuse_session *se) {
  struct {
    struct fuse_in_header h;
    struct fuse_init_in in;
  } msg;
  memset(&msg, 0, sizeof(msg));
  msg.h.len = sizeof(msg);
  msg.h.opcode = FUSE_INIT;
  msg.h.unique = (1ULL << 62) | 1; // odd: never a kernel request id (those step by 2)
  msg.in.major = FUSE_KERNEL_VERSION;
  msg.in.minor = FUSE_KERNEL_MINOR_VERSION;
  msg.in.max_readahead = 128 * 1024;
  msg.in.flags = FUSE_ASYNC_READ | FUSE_BIG_WRITES | FUSE_MAX_PAGES | FUSE_PARALLEL_DIROPS;
  struct fuse_buf buf = {.size = sizeof(msg), .mem = &msg};
  fuse_session_process_buf(se, &buf);
  return 0;
}

/** Asks the kernel to queue again every request read from the connection and not answered. */
static int resend_pending(int fd) {
  struct fuse_out_header oh = {.len = sizeof(oh), .error = 7 /* FUSE_NOTIFY_RESEND */, .unique = 0};
  if (write(fd, &oh, sizeof(oh)) != (ssize_t)sizeof(oh)) {
    fprintf(stderr, "dsec-lazyfs: FUSE_NOTIFY_RESEND: %s (requests the last server had read stay unanswered)\n", strerror(errno));
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 5 && !(argc == 6 && strcmp(argv[5], "resume") == 0)) {
    fprintf(stderr, "usage: %s <mountpoint | /dev/fd/N> <index> <cache-dir> <deadline-ms> [resume]\n", argv[0]);
    return 2;
  }
  int resume = argc == 6;
  cache_dir = realpath(argv[3], NULL);
  if (cache_dir == NULL) {
    fprintf(stderr, "dsec-lazyfs: cache %s: %s\n", argv[3], strerror(errno));
    return 2;
  }
  deadline_ms = strtol(argv[4], NULL, 10);
  if (deadline_ms <= 0) deadline_ms = 10000;
  if (load_index(argv[2]) != 0) {
    fprintf(stderr, "dsec-lazyfs: bad index %s\n", argv[2]);
    return 2;
  }
  if (resume && strncmp(argv[1], "/dev/fd/", 8) != 0) {
    fprintf(stderr, "dsec-lazyfs: resume needs a /dev/fd/N mount point\n");
    return 2;
  }
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_cond_init(&cv, &ca);
  char *fargs[] = {argv[0], "-o", "ro,allow_other,fsname=dsec-lazy,subtype=dsec-lazy", NULL};
  struct fuse_args args = FUSE_ARGS_INIT(3, fargs);
  struct fuse_session *se = fuse_session_new(&args, &ops, sizeof(ops), NULL);
  if (se == NULL) return 1;
  int rc = 1;
  if (fuse_set_signal_handlers(se) == 0) {
    if (fuse_session_mount(se, argv[1]) == 0) {
      /* A kernel without FUSE_NOTIFY_RESEND (before 6.9) would leave the reads the dead server
       * had taken unanswered for good: exit instead, so that the restarts run out and the
       * layer is lost (its reads fail) rather than hang. */
      if (resume && (feed_init(se), resend_pending(fuse_session_fd(se)) != 0)) {
        rc = 3;
      } else {
        struct fuse_loop_config *loop = fuse_loop_cfg_create();
        fuse_loop_cfg_set_max_threads(loop, 32);
        rc = fuse_session_loop_mt(se, loop) == 0 ? 0 : 1;
        fuse_loop_cfg_destroy(loop);
      }
      fuse_session_unmount(se);
    }
    fuse_remove_signal_handlers(se);
  }
  fuse_session_destroy(se);
  return rc;
}
