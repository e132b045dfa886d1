/*
 * dsec-fnreset: the outside half of resetting a function-call sandbox between two calls.
 *
 * Edge starts it once and keeps it: each request on standard input is one line
 * "ID PID STARTTIME" (PID: the sandbox's PID 1, chronus, on the host; STARTTIME: field 22 of its
 * /proc/PID/stat as crun recorded it), sent after chronus has killed every other process of the
 * sandbox (chronus's RESET). For each, a child is forked that opens a pidfd of PID, checks the
 * start time (no pid reuse: a pidfd of a process that then dies makes setns fail), joins the
 * sandbox's user, IPC and mount namespaces (one setns through the pidfd), and there:
 *   - removes every System V shared memory segment, message queue and semaphore set (found
 *     with the *_STAT_ANY walks) and checks that none is left;
 *   - removes every POSIX message queue (the entries of /dev/mqueue, the mqueue file system
 *     crun mounted for the sandbox's IPC namespace) and checks that none is left;
 *   - replaces each writable tmpfs named with --tmpfs by a fresh, empty one with the given
 *     options (the old one detached: its inodes, xattrs, modes, times and counters go with it).
 * The child runs as root of the sandbox's user namespace (its capabilities there, none on the
 * host), so the new tmpfs mounts belong to that namespace exactly as the ones crun made, and
 * their uid=/gid= options are read in it. The answer is one line "ID 0" when the reset is
 * complete, "ID N" (N > 0) otherwise (edge then destroys the sandbox instead of reusing it);
 * the reason goes to standard error. Standard input's end stops it.
 *
 * usage: dsec-fnreset [--tmpfs PATH FLAGS DATA]...   (FLAGS: comma list of nosuid, nodev,
 *        noexec, or "-"; DATA: tmpfs options such as mode=1777,size=512m,uid=65534,gid=65534)
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/msg.h>
#include <sys/mount.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <unistd.h>

#define EXIT_FAILED 125
#define MAX_TMPFS 8

static void __attribute__((noreturn)) die(const char *what, const char *arg)
{
	fprintf(stderr, "dsec-fnreset: %s %s: %s\n", what, arg ? arg : "", strerror(errno));
	exit(EXIT_FAILED);
}

static void __attribute__((noreturn)) fail(const char *what)
{
	fprintf(stderr, "dsec-fnreset: %s\n", what);
	exit(EXIT_FAILED);
}

static void __attribute__((noreturn)) usage(void)
{
	fprintf(stderr, "usage: dsec-fnreset [--tmpfs PATH FLAGS DATA]... (requests \"ID PID STARTTIME\" on stdin)\n");
	exit(2);
}

static unsigned long mount_flags(const char *list)
{
	unsigned long flags = 0;
	char copy[128];
	if (strlen(list) >= sizeof copy)
		usage();
	strcpy(copy, list);
	for (char *save = NULL, *w = strtok_r(copy, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
		if (!strcmp(w, "-"))
			continue;
		if (!strcmp(w, "nosuid"))
			flags |= MS_NOSUID;
		else if (!strcmp(w, "nodev"))
			flags |= MS_NODEV;
		else if (!strcmp(w, "noexec"))
			flags |= MS_NOEXEC;
		else
			usage();
	}
	return flags;
}

/* Removes every System V object of the IPC namespace; returns how many are left after. */
static int clear_sysv(void)
{
	struct shm_info shm;
	int max = shmctl(0, SHM_INFO, (struct shmid_ds *)&shm);
	for (int i = 0; i <= max; i++) {
		struct shmid_ds ds;
		int id = shmctl(i, SHM_STAT_ANY, &ds);
		if (id >= 0 && shmctl(id, IPC_RMID, NULL) < 0)
			die("shmctl IPC_RMID", NULL);
	}
	struct msginfo msg;
	max = msgctl(0, MSG_INFO, (struct msqid_ds *)&msg);
	for (int i = 0; i <= max; i++) {
		struct msqid_ds ds;
		int id = msgctl(i, MSG_STAT_ANY, &ds);
		if (id >= 0 && msgctl(id, IPC_RMID, NULL) < 0)
			die("msgctl IPC_RMID", NULL);
	}
	struct seminfo sem;
	max = semctl(0, 0, SEM_INFO, &sem);
	for (int i = 0; i <= max; i++) {
		struct semid_ds ds;
		int id = semctl(i, 0, SEM_STAT_ANY, &ds);
		if (id >= 0 && semctl(id, 0, IPC_RMID) < 0)
			die("semctl IPC_RMID", NULL);
	}
	/* Counts after the walk: an object made between the two would show here. */
	if (shmctl(0, SHM_INFO, (struct shmid_ds *)&shm) < 0 || msgctl(0, MSG_INFO, (struct msqid_ds *)&msg) < 0 ||
	    semctl(0, 0, SEM_INFO, &sem) < 0)
		die("IPC_INFO", NULL);
	return shm.used_ids + msg.msgpool + sem.semusz;
}

/* Unlinks every POSIX message queue; returns how many are left after. */
static int clear_mqueues(void)
{
	int left = 0;
	for (int pass = 0; pass < 2; pass++) {
		DIR *d = opendir("/dev/mqueue");
		if (!d)
			die("open", "/dev/mqueue");
		left = 0;
		for (struct dirent *e; (e = readdir(d));) {
			if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
				continue;
			left++;
			if (pass == 0 && unlinkat(dirfd(d), e->d_name, 0) < 0 && errno != ENOENT)
				die("unlink mqueue", e->d_name);
		}
		closedir(d);
	}
	return left;
}

static void fresh_tmpfs(const char *path, unsigned long flags, const char *data)
{
	struct stat st;
	if (lstat(path, &st) < 0 || !S_ISDIR(st.st_mode))
		die("not a directory:", path);
	if (umount2(path, MNT_DETACH | UMOUNT_NOFOLLOW) < 0)
		die("umount", path);
	if (mount("tmpfs", path, "tmpfs", flags, data) < 0)
		die("mount tmpfs on", path);
}

/* Field 22 of /proc/PID/stat (the start time in clock ticks); 0 when unreadable. */
static unsigned long long start_time(pid_t pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	/* The fields count from after the command name, which may hold spaces. */
	char *p = strrchr(buf, ')');
	if (!p)
		return 0;
	p += 2;
	for (int field = 3; field < 22 && p; field++) {
		p = strchr(p, ' ');
		if (p)
			p++;
	}
	return p ? strtoull(p, NULL, 10) : 0;
}

struct tmpfs {
	const char *path, *data;
	unsigned long flags;
};

static void __attribute__((noreturn)) reset(pid_t pid, unsigned long long started, const struct tmpfs *t, int n)
{
	int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pidfd < 0)
		die("pidfd_open", NULL);
	if (start_time(pid) != started)
		fail("the agent's process is gone (start time differs)");
	/* The user namespace first (the kernel orders it so): the other two are then joined with
	 * the capabilities of the sandbox's root, and the mount namespace sets root and cwd to the
	 * sandbox's root. */
	if (setns(pidfd, CLONE_NEWUSER | CLONE_NEWIPC | CLONE_NEWNS) < 0)
		die("setns", "pidfd");
	/* Root of the sandbox's user namespace (its ids mapped), as crun was when it mounted the
	 * first ones: a tmpfs without uid=/gid= options belongs to its mounter, and the host's root
	 * is not mapped in the sandbox (it would own /dev/shm, seen as the overflow id 65534). */
	if (setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0)
		die("setresuid", "0");
	if (clear_sysv() != 0)
		fail("System V IPC objects are left");
	if (clear_mqueues() != 0)
		fail("POSIX message queues are left");
	for (int i = 0; i < n; i++)
		fresh_tmpfs(t[i].path, t[i].flags, t[i].data);
	exit(0);
}

int main(int argc, char **argv)
{
	struct tmpfs t[MAX_TMPFS];
	int n = 0;
	for (int i = 1; i < argc; i += 4) {
		if (i + 3 >= argc || strcmp(argv[i], "--tmpfs") || n >= MAX_TMPFS || argv[i + 1][0] != '/')
			usage();
		t[n].path = argv[i + 1];
		t[n].flags = mount_flags(argv[i + 2]);
		t[n].data = argv[i + 3];
		n++;
	}
	char line[128];
	while (fgets(line, sizeof line, stdin)) {
		unsigned long long id, started;
		int pid;
		if (sscanf(line, "%llu %d %llu", &id, &pid, &started) != 3 || pid <= 1)
			usage();
		pid_t child = fork();
		if (child < 0)
			die("fork", NULL);
		if (child == 0)
			reset(pid, started, t, n);
		int status = 0;
		while (waitpid(child, &status, 0) < 0)
			if (errno != EINTR)
				die("waitpid", NULL);
		int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
		printf("%llu %d\n", id, code);
		fflush(stdout);
	}
	return 0;
}
