/*
 * dsec-launch: starts a container sandbox with its mounts in a mount namespace of its own.
 *
 * Edge runs it for every container create. It mounts the sandbox's size-limited tmpfs (the
 * writable layer) where it is called, on the host, so that edge can read the upper directory
 * for snapshots and diffs. It then enters the runtime mount namespace (where crun can run on a
 * hybrid-cgroup host), makes a private mount namespace, attaches a clone of the tmpfs there,
 * mounts the overlay root, and execs crun. The container's namespace is cloned from this one.
 * The overlay never appears in the host's or the runtime namespace's mount table, and the
 * tmpfs only in the host's, under a private mount that does not propagate into the runtime
 * namespace: creating the 3,000th sandbox copies as few mounts as creating the first.
 *
 * With --idmap the sandbox runs in a user namespace of its own: the shared layer mounts are
 * replaced, in this private namespace only, by idmapped clones (a file owned by uid 0 in a layer
 * appears owned by the sandbox's host uid base), and the upper directory belongs to that base,
 * so root inside the sandbox owns its files and is nobody on the host.
 *
 * With --rw, /dev and /dev/shm are folders of the same tmpfs (beside the upper directory, so
 * outside snapshots and diffs), bound over the root's /dev and /dev/shm in the private namespace:
 * what a sandbox keeps there counts in its disk limit, and they cost no superblock of their own
 * (every superblock registers a shrinker, whose map every memory cgroup of the host keeps a share
 * of: bench/notes/density.md). crun finds /dev without a mount of its own in the config and
 * creates the device nodes there as it would in a tmpfs. An image whose /dev is not a directory
 * is refused (exit 4, "image: ..."). The tmpfs also holds `mask`, an empty directory that the
 * config binds read-only over the masked /proc and /sys directories: each sandbox its own (no
 * sandbox can watch or lock another's), in no superblock of its own either.
 *
 * Without --rw the root is the read-only overlay of the lower directories alone (function-call
 * sandboxes: one pre-created sandbox per call, writable only in the tmpfs mounts crun adds).
 *
 * The overlay names its layers as /proc/self/fd/N and its source as --source (default
 * "overlay"): overlayfs shows its options in /proc/self/mountinfo exactly as they were given,
 * so a sandbox reading its mountinfo learns neither the node's home nor its layer store nor its
 * writable layer's host path. --source lets edge mark the sandbox as its node's (a digest of the
 * node's home, not a path) for the garbage collection of a crashed edge's leftovers.
 *
 * With --protect PATH (repeatable) PATH inside the root becomes a read-only bind mount of itself,
 * and every directory above it a (writable) bind mount of itself: a mount point cannot be
 * renamed or removed, so the protected path cannot be swapped for another one either. The
 * read-only bind is covered by a FUSE mount that dsec-rofs serves from it, which refuses every
 * change as the bind would and logs it to --protect-log FILE (required with --protect), for edge
 * to raise: a write refused by the bind itself would leave no trace (see serve_protected).
 * With --reprotect a server that died is replaced in a running sandbox (see reprotect_main).
 *
 * With --serve it stays running and launches on request instead (edge starts one per process):
 * a fork of this small static process costs a fraction of a fork of edge's large Node process,
 * which also blocks edge's event loop for its duration. Requests come on stdin, framed as
 * u32 length (little endian), then the payload: u32 request id, a type byte, and for 'R' (run)
 * NUL-terminated strings: the log file, the agent socket path (empty: none), then the launch
 * arguments as on the command line. The child opens /dev/null as stdin, the log (append, created
 * 0600) as stdout and stderr, creates the agent's listening unix socket as fd 3 (/dev/null when
 * none is named), closes every other descriptor and launches exactly as a separate dsec-launch
 * would. 'K' (kill) sends SIGKILL to the request's child while it has not been reaped (its pid
 * cannot have been reused). Each child's end is answered on stdout as a line "E <id> <status>"
 * (the exit code, or 128 + the signal), and a refused request as "F <id> <errno>". The server
 * exits when stdin closes or its parent dies.
 *
 * usage: dsec-launch [--ns FILE] [--rw DIR --tmpfs OPTS] --rootfs DIR --lower DIRS
 *                    [--idmap UID:GID:COUNT] [--source NAME] [--protect PATH]... [--protect-log FILE]
 *                    [--loginuid N] -- CMD ARGS...
 *        dsec-launch --reprotect PID:START --upper DIR --lower DIRS [--idmap UID:GID:COUNT]
 *                    --protect PATH... --protect-log FILE
 *        dsec-launch --serve
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <stdint.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/statfs.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_PROTECT 64
#define MAX_PINNED 1024
#define MAX_LOWERS 64

/* Exit codes edge tells apart: a bad protected path or image is the caller's error, not the node's. */
#define EXIT_FAILED 125
#define EXIT_BAD_PROTECT 3
#define EXIT_BAD_IMAGE 4
/* --reprotect will not: the sandbox is not the one named, or a mount still answers (a retry would not either). */
#define EXIT_REFUSED 5

static void __attribute__((noreturn)) die(const char *what, const char *arg)
{
	fprintf(stderr, "dsec-launch: %s %s: %s\n", what, arg ? arg : "", strerror(errno));
	exit(EXIT_FAILED);
}

static void __attribute__((noreturn)) bad_protect(const char *path, const char *why)
{
	fprintf(stderr, "dsec-launch: protect %s: %s\n", path, why);
	exit(EXIT_BAD_PROTECT);
}

static void __attribute__((noreturn)) bad_image(const char *why)
{
	fprintf(stderr, "dsec-launch: image: %s\n", why);
	exit(EXIT_BAD_IMAGE);
}

static void __attribute__((noreturn)) refuse(const char *what, const char *why)
{
	fprintf(stderr, "dsec-launch: %s %s\n", what, why);
	exit(EXIT_REFUSED);
}

static void __attribute__((noreturn)) usage(void)
{
	fprintf(stderr, "usage: dsec-launch [--ns FILE] [--rw DIR --tmpfs OPTS] --rootfs DIR"
			" --lower DIRS [--idmap UID:GID:COUNT] [--source NAME] [--protect PATH]..."
			" [--protect-log FILE] [--loginuid N] -- CMD ARGS...\n"
			"       dsec-launch --reprotect PID:START --upper DIR --lower DIRS [--idmap UID:GID:COUNT]"
			" --protect PATH... --protect-log FILE\n");
	exit(2);
}

static void write_file(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		die("open", path);
	size_t n = strlen(text);
	if (write(fd, text, n) != (ssize_t)n)
		die("write", path);
	if (close(fd) < 0)
		die("close", path);
}

/*
 * A user namespace with the sandbox's mapping (0..count-1 -> uid..uid+count-1), as an fd: a
 * child is cloned into a new user namespace, its maps are written from here, its namespace
 * file is opened, and it exits.
 */
static int userns_fd(unsigned long uid, unsigned long gid, unsigned long count)
{
	int sync[2];
	if (pipe2(sync, O_CLOEXEC) < 0)
		die("pipe", NULL);
	pid_t pid = (pid_t)syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, NULL, NULL, NULL, NULL);
	if (pid < 0)
		die("clone", "CLONE_NEWUSER");
	if (pid == 0) {
		char c;
		close(sync[1]);
		/* Wait until the parent has opened the namespace (it closes its end). */
		while (read(sync[0], &c, 1) < 0 && errno == EINTR)
			;
		_exit(0);
	}
	close(sync[0]);
	char path[64], map[96];
	snprintf(map, sizeof map, "0 %lu %lu\n", uid, count);
	snprintf(path, sizeof path, "/proc/%d/uid_map", (int)pid);
	write_file(path, map);
	snprintf(map, sizeof map, "0 %lu %lu\n", gid, count);
	snprintf(path, sizeof path, "/proc/%d/gid_map", (int)pid);
	write_file(path, map);
	snprintf(path, sizeof path, "/proc/%d/ns/user", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		die("open", path);
	close(sync[1]);
	while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
		;
	return fd;
}

/*
 * Covers each lower directory, in this mount namespace only, with an idmapped clone of its
 * mount. The node's shared layer mount is not changed.
 */
static void idmap_lowers(const char *lower, int userns)
{
	char buf[16384];
	const char *seen[MAX_LOWERS];
	int nseen = 0;
	if (snprintf(buf, sizeof buf, "%s", lower) >= (int)sizeof buf)
		die("lower dirs too long", NULL);
	for (char *save = NULL, *dir = strtok_r(buf, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
		int dup = 0;
		for (int i = 0; i < nseen; i++)
			dup |= !strcmp(seen[i], dir);
		if (dup)
			continue;
		if (nseen == MAX_LOWERS)
			die("too many lower dirs", NULL);
		seen[nseen++] = dir;
		int tree = open_tree(AT_FDCWD, dir, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
		if (tree < 0)
			die("open_tree", dir);
		struct mount_attr attr = {.attr_set = MOUNT_ATTR_IDMAP, .userns_fd = (unsigned long)userns};
		if (mount_setattr(tree, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0)
			die("idmap", dir);
		if (move_mount(tree, "", AT_FDCWD, dir, MOVE_MOUNT_F_EMPTY_PATH) < 0)
			die("move_mount to", dir);
		close(tree);
	}
}

/*
 * Appends `/proc/self/fd/N` for `dir` (opened O_PATH, left open until the exec closes it) to
 * `out`, after `sep` when `out` is not empty.
 */
static void append_fd_path(char *out, size_t size, const char *sep, const char *dir)
{
	int fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		die("open", dir);
	size_t len = strlen(out);
	if (snprintf(out + len, size - len, "%s/proc/self/fd/%d", len ? sep : "", fd) >= (int)(size - len))
		die("too many lower dirs", NULL);
}

/* The lower dirs (top first, colon-separated) as a colon-separated list of fd paths. */
static void lower_fd_paths(const char *lower, char *out, size_t size)
{
	char buf[16384];
	if (snprintf(buf, sizeof buf, "%s", lower) >= (int)sizeof buf)
		die("lower dirs too long", NULL);
	out[0] = '\0';
	for (char *save = NULL, *dir = strtok_r(buf, ":", &save); dir; dir = strtok_r(NULL, ":", &save))
		append_fd_path(out, size, ":", dir);
}

/* Opens `name` in `dirfd` without following symlinks or leaving the tree (O_PATH). */
static int open_beneath(int dirfd, const char *name, int dir_only)
{
	struct open_how how = {
		.flags = O_PATH | O_CLOEXEC | O_NOFOLLOW | (dir_only ? O_DIRECTORY : 0),
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
	};
	return (int)syscall(SYS_openat2, dirfd, name, &how, sizeof how);
}

/* Mounts a clone of the mount tree at `fd` onto the same place, read-only when asked. */
static void bind_onto_itself(int fd, int readonly, const char *what)
{
	int tree = open_tree(fd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH | AT_RECURSIVE);
	if (tree < 0)
		die("open_tree", what);
	if (readonly) {
		struct mount_attr attr = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV};
		if (mount_setattr(tree, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr) < 0)
			die("mount_setattr rdonly", what);
	}
	if (move_mount(tree, "", fd, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0)
		die("move_mount onto", what);
	close(tree);
}

/* Binds a clone of the mount at `src` onto `target` (an O_PATH fd), with flags set and cleared. */
static void bind_at(const char *src, int target, uint64_t set, uint64_t clear, const char *what)
{
	int tree = open_tree(AT_FDCWD, src, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
	if (tree < 0)
		die("open_tree", src);
	struct mount_attr attr = {.attr_set = set, .attr_clr = clear};
	if (mount_setattr(tree, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0)
		die("mount_setattr", src);
	if (move_mount(tree, "", target, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0)
		die("move_mount onto", what);
	close(tree);
}

/*
 * Binds the writable tmpfs's `dev` folder over the root's /dev (made, owned by the sandbox's
 * root, when the image has none; an image whose /dev is a symlink or not a directory is refused)
 * and its `dev/shm` folder over /dev/shm. /dev keeps nodev in a user namespace, where crun binds
 * the host's device nodes in; outside one crun makes them with mknod, so there /dev allows device
 * nodes (the sandbox cannot make any: no CAP_MKNOD).
 */
static void bind_dev(const char *rootfs, const char *dev, const char *shm, int userns, uid_t owner, gid_t group)
{
	int rootfd = open(rootfs, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (rootfd < 0)
		die("open", rootfs);
	int fd = open_beneath(rootfd, "dev", 1);
	if (fd < 0 && errno == ENOENT) {
		if (mkdirat(rootfd, "dev", 0755) < 0 && errno != EEXIST)
			die("mkdir /dev in", rootfs);
		if (fchownat(rootfd, "dev", owner, group, AT_SYMLINK_NOFOLLOW) < 0)
			die("chown /dev in", rootfs);
		fd = open_beneath(rootfd, "dev", 1);
	}
	if (fd < 0 && (errno == ELOOP || errno == ENOTDIR || errno == EXDEV))
		bad_image("/dev is a symbolic link or not a directory");
	if (fd < 0)
		die("open /dev in", rootfs);
	bind_at(dev, fd, MOUNT_ATTR_NOSUID, userns ? 0 : MOUNT_ATTR_NODEV, "/dev");
	close(fd);
	/* Reopened through the new mount: the folder made below. */
	fd = open_beneath(rootfd, "dev/shm", 1);
	if (fd < 0)
		die("open /dev/shm in", rootfs);
	bind_at(shm, fd, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC, 0, "/dev/shm");
	close(fd);
	close(rootfd);
}

struct pins {
	char *dirs[MAX_PINNED];
	int n;
};

static int pinned(struct pins *p, const char *rel)
{
	for (int i = 0; i < p->n; i++)
		if (!strcmp(p->dirs[i], rel))
			return 1;
	return 0;
}

/*
 * Makes `path` (absolute, inside the root) read-only, creating it (as an empty directory, owned
 * by the sandbox's root) when missing. Every directory above it becomes a mount point, which
 * rename(2) and rmdir(2) refuse (EBUSY), so a parent cannot be moved aside and recreated.
 * Returns an O_PATH fd of the read-only bind.
 */
static int protect(int rootfd, const char *path, uid_t owner, gid_t group, struct pins *pins)
{
	char rel[4096];
	if (path[0] != '/' || snprintf(rel, sizeof rel, "%s", path + 1) >= (int)sizeof rel || !rel[0])
		bad_protect(path, "not an absolute path below /");
	int dirfd = dup(rootfd);
	if (dirfd < 0)
		die("dup", NULL);
	char *comp = rel;
	for (;;) {
		char *slash = strchr(comp, '/');
		int last = slash == NULL;
		if (slash)
			*slash = '\0';
		if (!comp[0] || !strcmp(comp, ".") || !strcmp(comp, ".."))
			bad_protect(path, "not a normalised path");
		int fd = open_beneath(dirfd, comp, !last);
		if (fd < 0 && errno == ENOENT) {
			if (mkdirat(dirfd, comp, 0755) < 0 && errno != EEXIST)
				die("mkdir", path);
			if (fchownat(dirfd, comp, owner, group, AT_SYMLINK_NOFOLLOW) < 0)
				die("chown", path);
			fd = open_beneath(dirfd, comp, !last);
		}
		if (fd < 0) {
			if (errno == ELOOP || errno == ENOTDIR || errno == EXDEV)
				bad_protect(path, "goes through a symbolic link or a non-directory");
			die("open", path);
		}
		struct stat st;
		if (fstat(fd, &st) < 0)
			die("stat", path);
		if (S_ISLNK(st.st_mode))
			bad_protect(path, "is a symbolic link");
		if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
			bad_protect(path, "is neither a directory nor a regular file");
		if (last) {
			bind_onto_itself(fd, 1, path);
			close(fd);
			/* Reopen: the read-only bind, which dsec-rofs serves and covers. */
			int ro = open_beneath(dirfd, comp, 0);
			if (ro < 0)
				die("reopen", path);
			close(dirfd);
			return ro;
		}
		if (!pinned(pins, rel)) {
			if (pins->n == MAX_PINNED)
				bad_protect(path, "too many directories to pin");
			bind_onto_itself(fd, 0, path);
			pins->dirs[pins->n] = strdup(rel);
			if (!pins->dirs[pins->n++])
				die("strdup", NULL);
			/* Reopen: the old fd still points below the new mount. */
			close(fd);
			fd = open_beneath(dirfd, comp, 1);
			if (fd < 0)
				die("reopen", path);
		}
		close(dirfd);
		dirfd = fd;
		*slash = '/';
		comp = slash + 1;
	}
}

/* Start time of process `pid` (field 22 of /proc/<pid>/stat, clock ticks); 0 when it cannot be read. */
static unsigned long long start_time(const char *pid)
{
	char file[64], stat[1024];
	snprintf(file, sizeof file, "/proc/%s/stat", pid);
	int fd = open(file, O_RDONLY | O_CLOEXEC);
	ssize_t got = fd < 0 ? -1 : read(fd, stat, sizeof stat - 1);
	if (fd >= 0)
		close(fd);
	if (got <= 0)
		return 0;
	stat[got] = '\0';
	/* Fields from the state on (the 3rd), after the command name, which may hold spaces. */
	char *f = strrchr(stat, ')');
	for (int k = 3; f && k <= 22; k++)
		f = strchr(f + 1, ' ');
	return f ? strtoull(f + 1, NULL, 10) : 0;
}

/* Writes "<pid> <start time>\n" of this process to `log`.pid; -1 with errno on failure. */
static int record_server(const char *log)
{
	char file[4200], line[64];
	unsigned long long started = start_time("self");
	if (started == 0 || snprintf(file, sizeof file, "%s.pid", log) >= (int)sizeof file) {
		errno = EINVAL;
		return -1;
	}
	int len = snprintf(line, sizeof line, "%d %llu\n", (int)getpid(), started);
	int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	int ok = write(fd, line, (size_t)len) == len;
	close(fd);
	return ok ? 0 : -1;
}

/*
 * What serve_protected needs that is named by a path in the host's namespaces (the server's
 * binary, /dev/fuse): opened before a restart enters the sandbox's mount namespace.
 */
static void open_server(char *server, size_t size, int n, int *fuse)
{
	ssize_t len = readlink("/proc/self/exe", server, size - 16);
	if (len < 0)
		die("readlink", "/proc/self/exe");
	server[len] = '\0';
	strcpy(strrchr(server, '/') + 1, "dsec-rofs");
	for (int k = 0; k < n; k++) {
		fuse[k] = open("/dev/fuse", O_RDWR | O_CLOEXEC);
		if (fuse[k] < 0)
			die("open", "/dev/fuse");
	}
}

/*
 * Covers each read-only bind (`onto`) with a FUSE mount served by dsec-rofs (beside this binary),
 * which answers reads from `ro` (the bind itself at a launch, a read-only view of the same tree
 * at a restart, see reprotect_main) and refuses and logs (to `log`) every change: the kernel
 * refuses a write to the bind itself before anything could report it. `server` and `fuse` come
 * from open_server. The server is moved to `hostns` first, so that it holds none of the
 * sandbox's mount namespaces: it ends with their mounts. It runs in a session of its own (a
 * terminal or a process group that ends does not end it), and records "<pid> <start time>"
 * (field 22 of /proc/<pid>/stat) in `log`.pid, for an edge that restarts to tell whether it
 * still serves. Returns once the server has mounted every session (it writes one byte on the
 * sync pipe); a server that cannot start or mount is a failed launch (nothing would answer the
 * mounts), one that dies later leaves them answering ENOTCONN.
 */
static void serve_protected(int hostns, const char *log, int n, const int *ro, const int *onto, const int *fuse, char *server,
			    const char **paths)
{
	char *args[MAX_PROTECT + 4], spec[MAX_PROTECT][4200], logarg[16], readyarg[16];
	args[0] = server;
	args[1] = logarg;
	args[2] = readyarg;
	for (int k = 0; k < n; k++) {
		struct stat st;
		if (fstat(ro[k], &st) < 0)
			die("stat", paths[k]);
		char fdopt[16], rootmode[16];
		snprintf(fdopt, sizeof fdopt, "%d", fuse[k]);
		snprintf(rootmode, sizeof rootmode, "%o", st.st_mode & S_IFMT);
		int fs = fsopen("fuse", FSOPEN_CLOEXEC);
		if (fs < 0 || fsconfig(fs, FSCONFIG_SET_STRING, "source", "dsec-protect", 0) < 0 ||
		    fsconfig(fs, FSCONFIG_SET_STRING, "subtype", "dsec-protect", 0) < 0 ||
		    fsconfig(fs, FSCONFIG_SET_STRING, "fd", fdopt, 0) < 0 ||
		    fsconfig(fs, FSCONFIG_SET_STRING, "rootmode", rootmode, 0) < 0 ||
		    fsconfig(fs, FSCONFIG_SET_STRING, "user_id", "0", 0) < 0 ||
		    fsconfig(fs, FSCONFIG_SET_STRING, "group_id", "0", 0) < 0 ||
		    fsconfig(fs, FSCONFIG_SET_FLAG, "allow_other", NULL, 0) < 0 ||
		    fsconfig(fs, FSCONFIG_SET_FLAG, "default_permissions", NULL, 0) < 0 ||
		    fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
			die("fuse fs for", paths[k]);
		/* Writable at the mount: a write must reach the server to be seen (it refuses them all). */
		int mnt = fsmount(fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
		if (mnt < 0)
			die("fsmount", paths[k]);
		if (move_mount(mnt, "", onto[k], "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0)
			die("move_mount fuse onto", paths[k]);
		close(mnt);
		close(fs);
		snprintf(spec[k], sizeof spec[k], "%d:%d:%s", fuse[k], ro[k], paths[k]);
		args[k + 3] = spec[k];
	}
	args[n + 3] = NULL;
	int sync[2];
	if (pipe2(sync, O_CLOEXEC) < 0)
		die("pipe", NULL);
	pid_t launcher = getpid();
	pid_t pid = fork();
	if (pid < 0)
		die("fork", server);
	if (pid == 0) {
		/*
		 * It dies with this launcher until it serves (dsec-rofs clears that before its ready
		 * byte): a launch killed meanwhile (edge's timeout) must not leave the new mounts held
		 * by a server that never answers; without one they answer ENOTCONN.
		 */
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != launcher)
			_exit(EXIT_FAILED);
		/* The log is opened in the host's namespace, as edge names it. */
		int err = 0, logfd = -1;
		if (setsid() < 0 || setns(hostns, CLONE_NEWNS) < 0 ||
		    syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) < 0 ||
		    (logfd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600)) < 0 || record_server(log) < 0)
			err = errno;
		snprintf(logarg, sizeof logarg, "%d", logfd);
		snprintf(readyarg, sizeof readyarg, "%d", sync[1]);
		for (int k = 0; k < n && !err; k++)
			if (fcntl(fuse[k], F_SETFD, 0) < 0 || fcntl(ro[k], F_SETFD, 0) < 0)
				err = errno;
		if (!err && fcntl(sync[1], F_SETFD, 0) == 0)
			execv(server, args);
		if (!err)
			err = errno;
		while (write(sync[1], &err, sizeof err) < 0 && errno == EINTR)
			;
		_exit(EXIT_FAILED);
	}
	close(sync[1]);
	/* An errno (it could not exec), the server's ready byte, or nothing: it failed after the exec. */
	int err = 0;
	ssize_t got;
	while ((got = read(sync[0], &err, sizeof err)) < 0 && errno == EINTR)
		;
	if (got == sizeof err) {
		errno = err;
		die("start", server);
	}
	if (got != 1) {
		fprintf(stderr, "dsec-launch: %s exited before serving the protected paths\n", server);
		exit(EXIT_FAILED);
	}
	close(sync[0]);
	for (int k = 0; k < n; k++)
		close(fuse[k]);
}

/*
 * --reprotect PID:START: serves again the protected paths of the running sandbox whose PID 1 is
 * PID (started at START, in clock ticks: a reused pid is refused) after their server died. Its
 * FUSE mounts answer ENOTCONN and cannot be unmounted: in the sandbox's mount namespace, owned
 * by its user namespace, every mount copied in is locked (not even root may uncover what lies
 * beneath), and the read-only binds beneath them cannot be reached any more. So a new FUSE mount
 * is stacked on each dead one, served from a read-only view of the same tree: a detached
 * overlay of the sandbox's upper directory (as its top lower layer) over its layers, idmapped
 * as at the launch. Nothing beneath a protected path changed since the launch (its server
 * refused every change), so the view holds what the bind held. Fail closed throughout: a dead
 * mount answers ENOTCONN until the new one covers it, and the new one waits for its server;
 * no path is ever writable. A path whose mount still answers is left alone, and a sandbox
 * process that is not PID:START is not touched: both exit EXIT_REFUSED (a retry would be too).
 */
static int reprotect_main(const char *target, const char *upper, const char *lower, const char *idmap, const char *log, int n,
			  const char **paths)
{
	char pid[16];
	unsigned long long started;
	unsigned long uid = 0, gid = 0, count = 0;
	if (!upper || !lower || !log || n == 0 || sscanf(target, "%15[0-9]:%llu", pid, &started) != 2 ||
	    (idmap && (sscanf(idmap, "%lu:%lu:%lu", &uid, &gid, &count) != 3 || count == 0)))
		usage();
	int pidfd = (int)syscall(SYS_pidfd_open, atoi(pid), 0);
	if (pidfd < 0 && errno == ESRCH)
		refuse(pid, "is not running");
	if (pidfd < 0)
		die("pidfd_open", pid);
	if (start_time(pid) != started)
		refuse(pid, "is another process than the sandbox's");
	int hostns = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
	if (hostns < 0)
		die("open", "/proc/self/ns/mnt");
	/* The layers' idmapped clones are mounted in a namespace of this process's own. */
	int userns = idmap ? userns_fd(uid, gid, count) : -1;
	if (unshare(CLONE_NEWNS) < 0)
		die("unshare", "CLONE_NEWNS");
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		die("make-rprivate", "/");
	if (userns >= 0) {
		idmap_lowers(lower, userns);
		close(userns);
	}
	char layers[16384] = "", lowers[8192];
	append_fd_path(layers, sizeof layers, "", upper);
	lower_fd_paths(lower, lowers, sizeof lowers);
	size_t len = strlen(layers);
	if (snprintf(layers + len, sizeof layers - len, ":%s", lowers) >= (int)(sizeof layers - len))
		die("overlay options too long for", upper);
	int fs = fsopen("overlay", FSOPEN_CLOEXEC);
	if (fs < 0 || fsconfig(fs, FSCONFIG_SET_STRING, "source", "dsec-protect", 0) < 0 ||
	    fsconfig(fs, FSCONFIG_SET_STRING, "lowerdir", layers, 0) < 0 || fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
		die("overlay view of", upper);
	int view = fsmount(fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
	if (view < 0)
		die("fsmount", "overlay view");
	close(fs);
	int ro[MAX_PROTECT], onto[MAX_PROTECT];
	for (int k = 0; k < n; k++) {
		struct stat st;
		ro[k] = open_beneath(view, paths[k] + 1, 0);
		if (ro[k] < 0 || fstat(ro[k], &st) < 0)
			die("open in the view", paths[k]);
		if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
			bad_protect(paths[k], "is neither a directory nor a regular file");
	}
	char server[4096];
	int fuse[MAX_PROTECT];
	open_server(server, sizeof server, n, fuse);
	/* The sandbox's mount namespace: its root is the sandbox's root. */
	if (setns(pidfd, CLONE_NEWNS) < 0)
		die("setns", pid);
	int root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (root < 0)
		die("open", "/");
	for (int k = 0; k < n; k++) {
		struct statfs sf;
		onto[k] = open_beneath(root, paths[k] + 1, 0);
		if (onto[k] < 0)
			die("open", paths[k]);
		if (fstatfs(onto[k], &sf) == 0 || errno != ENOTCONN)
			refuse(paths[k], "is served still (its mount is not a dead server's)");
	}
	serve_protected(hostns, log, n, ro, onto, fuse, server, paths);
	return 0;
}

static int launch_main(int argc, char **argv)
{
	const char *ns = NULL, *rw = NULL, *tmpfs = NULL, *rootfs = NULL, *lower = NULL;
	const char *idmap = NULL, *loginuid = NULL, *source = "overlay", *protect_log = NULL;
	const char *reprotect = NULL, *upper_dir = NULL;
	const char *protected[MAX_PROTECT];
	int nprotected = 0;
	int i = 1;
	for (; i < argc && strcmp(argv[i], "--") != 0; i += 2) {
		if (i + 1 >= argc)
			usage();
		const char *a = argv[i], *v = argv[i + 1];
		if (!strcmp(a, "--ns"))
			ns = v;
		else if (!strcmp(a, "--rw"))
			rw = v;
		else if (!strcmp(a, "--tmpfs"))
			tmpfs = v;
		else if (!strcmp(a, "--rootfs"))
			rootfs = v;
		else if (!strcmp(a, "--lower"))
			lower = v;
		else if (!strcmp(a, "--idmap"))
			idmap = v;
		else if (!strcmp(a, "--loginuid"))
			loginuid = v;
		else if (!strcmp(a, "--source"))
			source = v;
		else if (!strcmp(a, "--protect-log"))
			protect_log = v;
		else if (!strcmp(a, "--reprotect"))
			reprotect = v;
		else if (!strcmp(a, "--upper"))
			upper_dir = v;
		else if (!strcmp(a, "--protect") && nprotected < MAX_PROTECT)
			protected[nprotected++] = v;
		else
			usage();
	}
	if (reprotect)
		return reprotect_main(reprotect, upper_dir, lower, idmap, protect_log, nprotected, protected);
	if (i >= argc - 1 || !rootfs || !lower || !rw != !tmpfs || (nprotected > 0 && !protect_log))
		usage();
	char **cmd = &argv[i + 1];

	unsigned long uid = 0, gid = 0, count = 0;
	if (idmap && (sscanf(idmap, "%lu:%lu:%lu", &uid, &gid, &count) != 3 || count == 0))
		usage();

	char upper[4096], work[4096], dev[4096], shm[4096], mask[4096], opts[16384], lowers[8192];
	if (rw) {
		if (mount("tmpfs", rw, "tmpfs", MS_NOSUID | MS_NODEV, tmpfs) < 0)
			die("mount tmpfs on", rw);
		if (snprintf(upper, sizeof upper, "%s/upper", rw) >= (int)sizeof upper ||
		    snprintf(work, sizeof work, "%s/work", rw) >= (int)sizeof work ||
		    snprintf(dev, sizeof dev, "%s/dev", rw) >= (int)sizeof dev ||
		    snprintf(shm, sizeof shm, "%s/dev/shm", rw) >= (int)sizeof shm ||
		    snprintf(mask, sizeof mask, "%s/mask", rw) >= (int)sizeof mask)
			die("path too long", rw);
		if (mkdir(upper, 0755) < 0)
			die("mkdir", upper);
		if (mkdir(work, 0700) < 0)
			die("mkdir", work);
		if (mkdir(dev, 0755) < 0)
			die("mkdir", dev);
		if (mkdir(shm, 01777) < 0 || chmod(shm, 01777) < 0)
			die("mkdir", shm);
		/* The host's root owns it (nobody in the sandbox): read-only past its bind's flag too. */
		if (mkdir(mask, 0555) < 0)
			die("mkdir", mask);
		/* The root directory of the sandbox is the upper directory's: its root owns it, and /dev. */
		if (chown(upper, (uid_t)uid, (gid_t)gid) < 0 || chown(dev, (uid_t)uid, (gid_t)gid) < 0 ||
		    chown(shm, (uid_t)uid, (gid_t)gid) < 0)
			die("chown", upper);
	}
	int userns = idmap ? userns_fd(uid, gid, count) : -1;
	/* Where dsec-rofs runs: the namespace this launch was started in, not the sandbox's. */
	int hostns = nprotected > 0 ? open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC) : -1;
	if (nprotected > 0 && hostns < 0)
		die("open", "/proc/self/ns/mnt");

	int tree = -1;
	if (ns) {
		/* A detached clone of the tmpfs mount travels into the runtime namespace. */
		if (rw) {
			tree = open_tree(AT_FDCWD, rw, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
			if (tree < 0)
				die("open_tree", rw);
		}
		int fd = open(ns, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			die("open", ns);
		if (setns(fd, CLONE_NEWNS) < 0)
			die("setns", ns);
		close(fd);
	}
	if (unshare(CLONE_NEWNS) < 0)
		die("unshare", "CLONE_NEWNS");
	/* Nothing mounted here may travel back to the runtime namespace or the host. */
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		die("make-rprivate", "/");
	if (tree >= 0 && move_mount(tree, "", AT_FDCWD, rw, MOVE_MOUNT_F_EMPTY_PATH) < 0)
		die("move_mount to", rw);
	if (userns >= 0) {
		idmap_lowers(lower, userns);
		close(userns);
	}
	/* Opened after the idmapping: each fd is the idmapped clone on top of its directory. */
	lower_fd_paths(lower, lowers, sizeof lowers);
	int n;
	if (rw) {
		char upper_fd[64] = "", work_fd[64] = "";
		append_fd_path(upper_fd, sizeof upper_fd, "", upper);
		append_fd_path(work_fd, sizeof work_fd, "", work);
		n = snprintf(opts, sizeof opts, "lowerdir=%s,upperdir=%s,workdir=%s", lowers, upper_fd, work_fd);
	} else {
		n = snprintf(opts, sizeof opts, "lowerdir=%s", lowers);
	}
	if (n >= (int)sizeof opts)
		die("overlay options too long for", rootfs);
	if (mount(source, rootfs, "overlay", rw ? 0 : MS_RDONLY | MS_NOSUID | MS_NODEV, opts) < 0)
		die("mount overlay on", rootfs);

	if (nprotected > 0) {
		int rootfd = open(rootfs, O_PATH | O_DIRECTORY | O_CLOEXEC);
		if (rootfd < 0)
			die("open", rootfs);
		struct pins pins = {.n = 0};
		int ro[MAX_PROTECT];
		for (int k = 0; k < nprotected; k++)
			ro[k] = protect(rootfd, protected[k], (uid_t)uid, (gid_t)gid, &pins);
		close(rootfd);
		char server[4096];
		int fuse[MAX_PROTECT];
		open_server(server, sizeof server, nprotected, fuse);
		serve_protected(hostns, protect_log, nprotected, ro, ro, fuse, server, protected);
		for (int k = 0; k < nprotected; k++)
			close(ro[k]);
		close(hostns);
	}
	if (rw)
		bind_dev(rootfs, dev, shm, idmap != NULL, (uid_t)uid, (gid_t)gid);

	/*
	 * A login uid of the sandbox's own: the kernel's audit records (seccomp denials among them)
	 * carry it as auid, which tells edge whose record it is. Best effort: without audit
	 * support the sandbox still runs, its denials are just not attributed.
	 */
	if (loginuid) {
		int fd = open("/proc/self/loginuid", O_WRONLY | O_CLOEXEC);
		if (fd >= 0) {
			if (write(fd, loginuid, strlen(loginuid)) < 0)
				fprintf(stderr, "dsec-launch: loginuid: %s\n", strerror(errno));
			close(fd);
		}
	}

	execvp(cmd[0], cmd);
	die("exec", cmd[0]);
}

/* Server mode (--serve): see the comment at the top. */
#define MAX_REQUEST (256 * 1024)
#define MAX_ARGS 512
#define MAX_CHILDREN 4096

struct child {
	pid_t pid;
	uint32_t id;
};

static struct child children[MAX_CHILDREN];
static int nchildren;

/* Writes all of `buf` to stdout (the answers to edge); exits when edge is gone. */
static void answer(const char *fmt, unsigned long id, long value)
{
	char line[64];
	int n = snprintf(line, sizeof line, fmt, id, value);
	for (int off = 0; off < n;) {
		ssize_t w = write(STDOUT_FILENO, line + off, (size_t)(n - off));
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			exit(0);
		off += (int)w;
	}
}

/* A listening unix stream socket at `path` (as edge's listenUnix makes it), or -1. */
static int listen_unix(const char *path)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof addr.sun_path) {
		errno = ENAMETOOLONG;
		return -1;
	}
	strcpy(addr.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(fd, 64) < 0) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

/* In the forked child: stdio, the agent socket as fd 3, nothing else open, then the launch. */
static void __attribute__((noreturn)) run_child(pid_t server, const char *log, const char *sock, int argc, char **argv)
{
	/* Gone with the server: once nobody can read its answer the edge undoes the create, so the
	 * launch must not go on behind its back (it is not inherited by what the launch forks). */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != server)
		_exit(EXIT_FAILED);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	/* Ignored signals stay ignored across exec: the sandbox gets the default, as from edge. */
	signal(SIGPIPE, SIG_DFL);
	int logfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (logfd < 0)
		_exit(EXIT_FAILED);
	/* Kept above 3 until the dup2s below, whatever numbers they got. */
	int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
	/* No socket named (a restart of a protected-path server, say): fd 3 is /dev/null. */
	int listenfd = sock[0] ? listen_unix(sock) : open("/dev/null", O_RDWR | O_CLOEXEC);
	if (nul < 0 || listenfd < 0) {
		dprintf(logfd, "dsec-launch: agent socket %s: %s\n", sock, strerror(errno));
		_exit(EXIT_FAILED);
	}
	int hi_log = fcntl(logfd, F_DUPFD_CLOEXEC, 10), hi_nul = fcntl(nul, F_DUPFD_CLOEXEC, 10),
	    hi_sock = fcntl(listenfd, F_DUPFD_CLOEXEC, 10);
	if (hi_log < 0 || hi_nul < 0 || hi_sock < 0 || dup2(hi_nul, 0) < 0 || dup2(hi_log, 1) < 0 || dup2(hi_log, 2) < 0 ||
	    dup2(hi_sock, 3) < 0)
		_exit(EXIT_FAILED);
	if (syscall(SYS_close_range, 4U, ~0U, 0U) < 0)
		for (int fd = 4; fd < 65536; fd++)
			close(fd);
	exit(launch_main(argc, argv));
}

/* Handles one request payload. */
static void request(char *p, uint32_t len)
{
	if (len < 5)
		exit(EXIT_FAILED);
	uint32_t id;
	memcpy(&id, p, 4);
	char type = p[4];
	if (type == 'K') {
		for (int i = 0; i < nchildren; i++)
			if (children[i].id == id)
				kill(children[i].pid, SIGKILL);
		return;
	}
	if (type != 'R' || p[len - 1] != '\0')
		exit(EXIT_FAILED);
	char *argv[MAX_ARGS + 2];
	int argc = 0;
	argv[argc++] = "dsec-launch";
	char *log = NULL, *sock = NULL;
	for (char *s = p + 5; s < p + len; s += strlen(s) + 1) {
		if (!log)
			log = s;
		else if (!sock)
			sock = s;
		else if (argc <= MAX_ARGS)
			argv[argc++] = s;
		else {
			answer("F %lu %ld\n", id, E2BIG);
			return;
		}
	}
	argv[argc] = NULL;
	if (!sock || nchildren == MAX_CHILDREN) {
		answer("F %lu %ld\n", id, sock ? EAGAIN : EINVAL);
		return;
	}
	pid_t server = getpid();
	pid_t pid = fork();
	if (pid < 0) {
		answer("F %lu %ld\n", id, errno);
		return;
	}
	if (pid == 0)
		run_child(server, log, sock, argc, argv);
	children[nchildren++] = (struct child){.pid = pid, .id = id};
}

/* Answers for every child that has ended. */
static void reap(void)
{
	int status;
	pid_t pid;
	while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
		for (int i = 0; i < nchildren; i++) {
			if (children[i].pid != pid)
				continue;
			long code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
			answer("E %lu %ld\n", children[i].id, code);
			children[i] = children[--nchildren];
			break;
		}
	}
}

static int serve(void)
{
	/* Gone with edge: nobody else may send it requests. */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() == 1)
		return EXIT_FAILED;
	signal(SIGPIPE, SIG_IGN);
	sigset_t chld;
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	if (sigprocmask(SIG_BLOCK, &chld, NULL) < 0)
		die("sigprocmask", NULL);
	int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sfd < 0)
		die("signalfd", NULL);
	if (fcntl(STDIN_FILENO, F_SETFD, FD_CLOEXEC) < 0 || fcntl(STDOUT_FILENO, F_SETFD, FD_CLOEXEC) < 0)
		die("fcntl", NULL);
	static char buf[MAX_REQUEST + 4];
	size_t have = 0;
	for (;;) {
		struct pollfd fds[2] = {{.fd = sfd, .events = POLLIN}, {.fd = STDIN_FILENO, .events = POLLIN}};
		if (poll(fds, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			die("poll", NULL);
		}
		if (fds[0].revents) {
			struct signalfd_siginfo si;
			while (read(sfd, &si, sizeof si) > 0)
				;
			reap();
		}
		if (!fds[1].revents)
			continue;
		ssize_t n = read(STDIN_FILENO, buf + have, sizeof buf - have);
		if (n < 0 && errno == EINTR)
			continue;
		/* Edge is gone: the children finish on their own; nobody waits for their answers. */
		if (n <= 0)
			return 0;
		have += (size_t)n;
		for (;;) {
			uint32_t len;
			if (have < 4)
				break;
			memcpy(&len, buf, 4);
			if (len > MAX_REQUEST)
				return EXIT_FAILED;
			if (have < 4 + (size_t)len)
				break;
			request(buf + 4, len);
			have -= 4 + (size_t)len;
			memmove(buf, buf + 4 + len, have);
		}
	}
}

int main(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], "--serve"))
		return serve();
	return launch_main(argc, argv);
}
