/*
 * Spike of a pre-created generic sandbox's switch into an image's root (issue 15; see
 * docs/benchmarks.md, "create path (eighth wave)"). Not used by the platform: a measurement probe
 * for bench/scripts/generic-switch-ab.mjs, which builds it with
 *   gcc -D_GNU_SOURCE -O2 -static -o OUT bench/scripts/generic-switch-spike.c
 *
 * usage: generic-switch-spike RUNTIME_NS RW TMPFS_OPTS LOWERS UID:GID PID SOURCE HOSTNAME
 *   RW: an empty host folder for the writable tmpfs; LOWERS: layer folders, top first,
 *   colon-separated; UID:GID: the sandbox's id base; PID: its PID 1 (chronus) on the host.
 *
 * Steps (each timed on stderr as "step NAME T ms", T since the start):
 *   1. the tmpfs on the host at RW, with upper/ (owned by the id base) and work/, and a marker
 *      file /GENERIC_ROOT in the upper directory (the driver checks that the switch happened);
 *   2. the runtime mount namespace, then a private one, the tmpfs's clone moved into it, each
 *      layer covered by an idmapped clone (the sandbox's own user namespace), the overlay made as
 *      a detached mount (layers named /proc/self/fd/N, source SOURCE: no host path in mountinfo);
 *   3. setns into the sandbox's user, mount and UTS namespaces through a pidfd, uid/gid 0 there,
 *      the hostname;
 *   4. mount points in the new root, the root attached at /.newroot of the old one, crun's
 *      /proc, /dev, /sys and the agent's bind mount moved into it (with their submounts);
 *   5. pivot_root(".", ".") in the new root and the old root detached: the kernel moves the root
 *      and working directory of every process whose root was the old one, chronus included.
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
#include <time.h>
#include <unistd.h>

static double start_ms;

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void step(const char *name)
{
	fprintf(stderr, "step %-28s %.3f ms\n", name, now_ms() - start_ms);
}

static void __attribute__((noreturn)) die(const char *what, const char *arg)
{
	fprintf(stderr, "generic-switch-spike: %s %s: %s\n", what, arg ? arg : "", strerror(errno));
	exit(125);
}

static void config(int fs, const char *key, const char *value)
{
	if (fsconfig(fs, FSCONFIG_SET_STRING, key, value, 0) < 0)
		die("fsconfig", key);
}

int main(int argc, char **argv)
{
	if (argc != 9) {
		fprintf(stderr, "usage: generic-switch-spike RUNTIME_NS RW TMPFS_OPTS LOWERS UID:GID PID SOURCE HOSTNAME\n");
		return 2;
	}
	const char *ns = argv[1], *rw = argv[2], *tmpfs = argv[3], *lower = argv[4], *source = argv[7], *host = argv[8];
	unsigned long uid, gid;
	if (sscanf(argv[5], "%lu:%lu", &uid, &gid) != 2)
		die("bad ids", argv[5]);
	int pid = atoi(argv[6]);
	start_ms = now_ms();

	char upper[4096], work[4096], mark[4200], path[64], lowers[8192] = "", fdpath[64];
	if (mount("tmpfs", rw, "tmpfs", MS_NOSUID | MS_NODEV, tmpfs) < 0)
		die("mount tmpfs on", rw);
	snprintf(upper, sizeof upper, "%s/upper", rw);
	snprintf(work, sizeof work, "%s/work", rw);
	if (mkdir(upper, 0755) < 0 || mkdir(work, 0700) < 0)
		die("mkdir", upper);
	if (chown(upper, (uid_t)uid, (gid_t)gid) < 0)
		die("chown", upper);
	snprintf(mark, sizeof mark, "%s/GENERIC_ROOT", upper);
	int mf = open(mark, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
	if (mf < 0 || write(mf, "switched\n", 9) != 9)
		die("write", mark);
	close(mf);
	step("host tmpfs");

	int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pidfd < 0)
		die("pidfd_open", argv[6]);
	snprintf(path, sizeof path, "/proc/%d/ns/user", pid);
	int userns = open(path, O_RDONLY | O_CLOEXEC);
	if (userns < 0)
		die("open", path);
	int tree = open_tree(AT_FDCWD, rw, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
	int nsfd = open(ns, O_RDONLY | O_CLOEXEC);
	if (tree < 0 || nsfd < 0 || setns(nsfd, CLONE_NEWNS) < 0)
		die("enter", ns);
	if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		die("private mount namespace", NULL);
	if (move_mount(tree, "", AT_FDCWD, rw, MOVE_MOUNT_F_EMPTY_PATH) < 0)
		die("move_mount to", rw);
	step("private ns + rw");

	char buf[8192];
	snprintf(buf, sizeof buf, "%s", lower);
	for (char *save = NULL, *dir = strtok_r(buf, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
		int t = open_tree(AT_FDCWD, dir, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
		struct mount_attr attr = {.attr_set = MOUNT_ATTR_IDMAP, .userns_fd = (unsigned long)userns};
		if (t < 0 || mount_setattr(t, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0)
			die("idmap", dir);
		if (move_mount(t, "", AT_FDCWD, dir, MOVE_MOUNT_F_EMPTY_PATH) < 0)
			die("move_mount to", dir);
		close(t);
		int fd = open(dir, O_PATH | O_DIRECTORY);
		size_t len = strlen(lowers);
		snprintf(lowers + len, sizeof lowers - len, "%s/proc/self/fd/%d", len ? ":" : "", fd);
	}
	step("idmapped lowers");

	int fs = fsopen("overlay", FSOPEN_CLOEXEC);
	if (fs < 0)
		die("fsopen", "overlay");
	config(fs, "source", source);
	config(fs, "lowerdir", lowers);
	snprintf(fdpath, sizeof fdpath, "/proc/self/fd/%d", open(upper, O_PATH | O_DIRECTORY));
	config(fs, "upperdir", fdpath);
	snprintf(fdpath, sizeof fdpath, "/proc/self/fd/%d", open(work, O_PATH | O_DIRECTORY));
	config(fs, "workdir", fdpath);
	if (fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
		die("fsconfig", "create");
	int root = fsmount(fs, FSMOUNT_CLOEXEC, 0);
	if (root < 0)
		die("fsmount", "overlay");
	step("overlay fsmount");

	if (setns(pidfd, CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWUTS) < 0)
		die("setns", "sandbox");
	if (setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0)
		die("setresuid", "0");
	if (sethostname(host, strlen(host)) < 0)
		die("sethostname", host);
	step("setns sandbox + hostname");

	const char *dirs[] = {"proc", "dev", "sys", ".dsec"};
	for (unsigned i = 0; i < sizeof dirs / sizeof *dirs; i++)
		if (mkdirat(root, dirs[i], 0755) < 0 && errno != EEXIST)
			die("mkdir", dirs[i]);
	int cf = openat(root, ".dsec/chronus", O_CREAT | O_WRONLY | O_CLOEXEC, 0755);
	if (cf < 0)
		die("create", ".dsec/chronus");
	close(cf);
	if (mkdir("/.newroot", 0700) < 0 && errno != EEXIST)
		die("mkdir", "/.newroot");
	step("mount points");

	if (move_mount(root, "", AT_FDCWD, "/.newroot", MOVE_MOUNT_F_EMPTY_PATH) < 0)
		die("attach root at", "/.newroot");
	const char *moves[][2] = {{"/proc", "/.newroot/proc"}, {"/dev", "/.newroot/dev"}, {"/sys", "/.newroot/sys"}, {"/.dsec/chronus", "/.newroot/.dsec/chronus"}};
	for (unsigned i = 0; i < sizeof moves / sizeof *moves; i++)
		if (move_mount(AT_FDCWD, moves[i][0], AT_FDCWD, moves[i][1], 0) < 0)
			die("move_mount", moves[i][0]);
	step("attach + move mounts");

	if (chdir("/.newroot") < 0 || syscall(SYS_pivot_root, ".", ".") < 0)
		die("pivot_root", NULL);
	if (umount2(".", MNT_DETACH) < 0 || chdir("/") < 0)
		die("detach old root", NULL);
	step("pivot + detach old root");
	return 0;
}
