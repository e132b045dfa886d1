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
 * usage: dsec-launch [--ns FILE] --rw DIR --tmpfs OPTS --rootfs DIR --lower DIRS -- CMD ARGS...
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static void __attribute__((noreturn)) die(const char *what, const char *arg)
{
	fprintf(stderr, "dsec-launch: %s %s: %s\n", what, arg ? arg : "", strerror(errno));
	exit(125);
}

static void __attribute__((noreturn)) usage(void)
{
	fprintf(stderr, "usage: dsec-launch [--ns FILE] --rw DIR --tmpfs OPTS --rootfs DIR"
			" --lower DIRS -- CMD ARGS...\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *ns = NULL, *rw = NULL, *tmpfs = NULL, *rootfs = NULL, *lower = NULL;
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
		else
			usage();
	}
	if (i >= argc - 1 || !rw || !tmpfs || !rootfs || !lower)
		usage();
	char **cmd = &argv[i + 1];

	if (mount("tmpfs", rw, "tmpfs", MS_NOSUID | MS_NODEV, tmpfs) < 0)
		die("mount tmpfs on", rw);
	char upper[4096], work[4096], opts[16384];
	if (snprintf(upper, sizeof upper, "%s/upper", rw) >= (int)sizeof upper ||
	    snprintf(work, sizeof work, "%s/work", rw) >= (int)sizeof work)
		die("path too long", rw);
	if (mkdir(upper, 0755) < 0)
		die("mkdir", upper);
	if (mkdir(work, 0700) < 0)
		die("mkdir", work);

	int tree = -1;
	if (ns) {
		/* A detached clone of the tmpfs mount travels into the runtime namespace. */
		tree = (int)syscall(SYS_open_tree, AT_FDCWD, rw, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
		if (tree < 0)
			die("open_tree", rw);
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
	if (tree >= 0 && syscall(SYS_move_mount, tree, "", AT_FDCWD, rw, MOVE_MOUNT_F_EMPTY_PATH) < 0)
		die("move_mount to", rw);
	if (snprintf(opts, sizeof opts, "lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work) >=
	    (int)sizeof opts)
		die("overlay options too long for", rootfs);
	if (mount("overlay", rootfs, "overlay", 0, opts) < 0)
		die("mount overlay on", rootfs);

	execvp(cmd[0], cmd);
	die("exec", cmd[0]);
}
