/*
 * kit: the attack kit of dsec's adversarial test suite. A static program put into a sandbox
 * that tries one thing a hostile agent would try and reports what happened, one JSON object per
 * line on stdout: {"probe":"bpf","result":"EPERM"}. "result" is "OK" when the attempt
 * succeeded (the attack worked) or the errno name of the call that stopped it. Every probe uses
 * arguments that would succeed for root on an unconfined host, so a refusal is the sandbox's doing
 * and not a malformed call. Exit status: 0 when the program ran (the result is in the output),
 * 2 on a usage error.
 *
 * These are plain system-call probes: none of them exploits a bug.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/io_uring.h>
#include <linux/keyctl.h>
#include <linux/perf_event.h>
#include <linux/userfaultfd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/klog.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- output: one JSON object per line ---- */

static bool first_field;

static void put_json_str(const char *s)
{
	putchar('"');
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			printf("\\%c", *p);
		else if (*p < 0x20 || *p >= 0x7f)
			printf("\\u%04x", *p);
		else
			putchar(*p);
	}
	putchar('"');
}

static void begin(const char *probe)
{
	printf("{\"probe\":");
	put_json_str(probe);
	first_field = false;
}

static void field_str(const char *k, const char *v)
{
	printf(",\"%s\":", k);
	put_json_str(v);
}

static void field_num(const char *k, long long v)
{
	printf(",\"%s\":%lld", k, v);
}

static void end(void)
{
	printf("}\n");
	fflush(stdout);
}

/* "OK" for a call that returned >= 0, else the errno name. */
static const char *outcome(long rc, int err)
{
	if (rc >= 0)
		return "OK";
	const char *name = strerrorname_np(err);
	return name ? name : "EUNKNOWN";
}

static void report(const char *probe, long rc, int err)
{
	begin(probe);
	field_str("result", outcome(rc, err));
	end();
}

/* ---- system calls that must be refused ---- */

static long try_bpf(void)
{
	/* A two-instruction socket filter (r0 = 0; exit): valid for any kernel with BPF. */
	struct bpf_insn prog[2] = {
		{ .code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_0, .imm = 0 },
		{ .code = BPF_JMP | BPF_EXIT },
	};
	union bpf_attr attr;
	memset(&attr, 0, sizeof attr);
	attr.prog_type = BPF_PROG_TYPE_SOCKET_FILTER;
	attr.insns = (uint64_t)(uintptr_t)prog;
	attr.insn_cnt = 2;
	attr.license = (uint64_t)(uintptr_t) "GPL";
	return syscall(SYS_bpf, BPF_PROG_LOAD, &attr, sizeof attr);
}

static long try_bpf_map(void)
{
	union bpf_attr attr;
	memset(&attr, 0, sizeof attr);
	attr.map_type = BPF_MAP_TYPE_ARRAY;
	attr.key_size = 4;
	attr.value_size = 8;
	attr.max_entries = 1;
	return syscall(SYS_bpf, BPF_MAP_CREATE, &attr, sizeof attr);
}

static long try_io_uring(void)
{
	struct io_uring_params p;
	memset(&p, 0, sizeof p);
	return syscall(SYS_io_uring_setup, 8, &p);
}

static long try_userfaultfd(void)
{
	return syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
}

static long try_perf(void)
{
	struct perf_event_attr a;
	memset(&a, 0, sizeof a);
	a.type = PERF_TYPE_SOFTWARE;
	a.size = sizeof a;
	a.config = PERF_COUNT_SW_CPU_CLOCK;
	a.disabled = 1;
	a.exclude_kernel = 1;
	a.exclude_hv = 1;
	return syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
}

static long try_unshare(int flags)
{
	return unshare(flags);
}

/* clone(2) with namespace flags, as a raw system call (libc's wrapper would use clone3). */
static long try_clone_ns(unsigned long flags)
{
	long pid = syscall(SYS_clone, flags | SIGCHLD, NULL, NULL, NULL, 0);
	if (pid == 0)
		_exit(0);
	if (pid > 0)
		waitpid((pid_t)pid, NULL, 0);
	return pid;
}

static long try_clone3_ns(void)
{
	struct {
		uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
	} args;
	memset(&args, 0, sizeof args);
	args.flags = CLONE_NEWUSER;
	args.exit_signal = SIGCHLD;
	long pid = syscall(SYS_clone3, &args, sizeof args);
	if (pid == 0)
		_exit(0);
	if (pid > 0)
		waitpid((pid_t)pid, NULL, 0);
	return pid;
}

static long try_mount_tmpfs(void)
{
	mkdir("/tmp/.kit-mnt", 0700);
	return mount("kit", "/tmp/.kit-mnt", "tmpfs", 0, "size=1m");
}

static long try_mount_proc(void)
{
	mkdir("/tmp/.kit-proc", 0700);
	return mount("proc", "/tmp/.kit-proc", "proc", 0, NULL);
}

/* The classic cgroup v1 escape starts by mounting a hierarchy to reach its release_agent. */
static long try_mount_cgroup(void)
{
	mkdir("/tmp/.kit-cg", 0700);
	return mount("cgroup", "/tmp/.kit-cg", "cgroup", 0, "memory");
}

static long try_fsopen(void)
{
	return syscall(SYS_fsopen, "tmpfs", 0);
}

static long try_open_tree(void)
{
	return syscall(SYS_open_tree, AT_FDCWD, "/", 1 /* OPEN_TREE_CLONE */);
}

static long try_keyctl(void)
{
	return syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0);
}

static long try_add_key(void)
{
	return syscall(SYS_add_key, "user", "kit", "x", 1, KEY_SPEC_PROCESS_KEYRING);
}

static long try_ptrace_1(void)
{
	return syscall(SYS_ptrace, 16 /* PTRACE_ATTACH */, 1, NULL, NULL);
}

/* PTRACE_ATTACH to a child of its own: the control for ptrace-attach-1 (allowed only where ptrace is). */
static long try_ptrace_child(void)
{
	pid_t child = fork();
	if (child < 0)
		return -1;
	if (child == 0) {
		pause();
		_exit(0);
	}
	long rc = syscall(SYS_ptrace, 16 /* PTRACE_ATTACH */, child, NULL, NULL);
	int err = errno;
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	errno = err;
	return rc;
}

static long try_process_vm_readv_1(void)
{
	char buf[16];
	struct iovec local = { buf, sizeof buf }, remote = { (void *)0x400000, sizeof buf };
	return syscall(SYS_process_vm_readv, 1, &local, 1, &remote, 1, 0);
}

/* Takes descriptors 0..63 of PID 1 (the agent) through a pidfd. */
static long try_pidfd_getfd_1(void)
{
	int pidfd = (int)syscall(SYS_pidfd_open, 1, 0);
	if (pidfd < 0)
		return -1;
	long rc = -1;
	int err = EBADF;
	for (int fd = 0; fd < 64; fd++) {
		rc = syscall(SYS_pidfd_getfd, pidfd, fd, 0);
		err = errno;
		if (rc >= 0 || err != EBADF)
			break;
	}
	close(pidfd);
	errno = err;
	return rc;
}

static long try_name_to_handle(void)
{
	struct {
		struct file_handle h;
		unsigned char bytes[MAX_HANDLE_SZ];
	} fh;
	int mount_id;
	fh.h.handle_bytes = MAX_HANDLE_SZ;
	return name_to_handle_at(AT_FDCWD, "/", &fh.h, &mount_id, 0);
}

/*
 * open_by_handle_at with a hand-made handle of inode 2 (the root of most file systems) relative to
 * a descriptor of /: the way out of a chroot-like root onto the file system below it.
 */
static long try_open_by_handle(void)
{
	struct {
		struct file_handle h;
		unsigned char bytes[8];
	} fh;
	memset(&fh, 0, sizeof fh);
	fh.h.handle_bytes = 8;
	fh.h.handle_type = 1; /* FILEID_INO32_GEN */
	fh.bytes[0] = 2;
	int root = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (root < 0)
		return -1;
	long rc = open_by_handle_at(root, &fh.h, O_RDONLY);
	int err = errno;
	close(root);
	errno = err;
	return rc;
}

static long try_setns(void)
{
	int fd = open("/proc/1/ns/net", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	long rc = setns(fd, 0);
	int err = errno;
	close(fd);
	errno = err;
	return rc;
}

static long try_init_module(void)
{
	return syscall(SYS_init_module, "", 0, "");
}

static long try_kexec(void)
{
	return syscall(SYS_kexec_load, 0, 0, NULL, 0);
}

static long try_syslog(void)
{
	char buf[256];
	return klogctl(3 /* SYSLOG_ACTION_READ_ALL */, buf, sizeof buf);
}

static long try_socket(int domain, int type, int proto)
{
	int fd = socket(domain, type, proto);
	if (fd >= 0)
		close(fd);
	return fd;
}

static long try_mknod(void)
{
	/* /dev/sda's numbers: a block device node would give the raw disk. */
	long rc = mknod("/tmp/.kit-sda", S_IFBLK | 0600, makedev(8, 0));
	if (rc == 0)
		unlink("/tmp/.kit-sda");
	return rc;
}

static long try_iopl(void)
{
	return syscall(SYS_iopl, 3);
}

static long try_reboot(void)
{
	/* CAD_OFF only changes what Ctrl-Alt-Del does; it still needs CAP_SYS_BOOT. */
	return syscall(SYS_reboot, 0xfee1dead, 672274793, 0 /* LINUX_REBOOT_CMD_CAD_OFF */, NULL);
}

static long try_swapon(void)
{
	return syscall(SYS_swapon, "/tmp/.kit-swap", 0);
}

static long try_ioctl_tiocsti(void)
{
	char c = '\n';
	return ioctl(0, TIOCSTI, &c);
}

/* XFS_IOC_SWAPEXT (_IOWR('X', 109, struct xfs_swapext), 120 bytes): swaps two files' extents. */
static long try_swapext(void)
{
	int a = open("/tmp/.kit-swap-a", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	int b = open("/tmp/.kit-swap-b", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (a < 0 || b < 0)
		return -1;
	unsigned char sx[120];
	memset(sx, 0, sizeof sx);
	long rc = ioctl(a, _IOC(_IOC_READ | _IOC_WRITE, 'X', 109, sizeof sx), sx);
	int err = errno;
	close(a);
	close(b);
	unlink("/tmp/.kit-swap-a");
	unlink("/tmp/.kit-swap-b");
	errno = err;
	return rc;
}

struct syscall_probe {
	const char *name;
	long (*fn)(void);
};

static long try_unshare_user(void) { return try_unshare(CLONE_NEWUSER); }
static long try_unshare_mount(void) { return try_unshare(CLONE_NEWNS); }
static long try_unshare_net(void) { return try_unshare(CLONE_NEWNET); }
static long try_unshare_pid(void) { return try_unshare(CLONE_NEWPID); }
static long try_clone_newuser(void) { return try_clone_ns(CLONE_NEWUSER); }
static long try_clone_newns(void) { return try_clone_ns(CLONE_NEWNS); }
static long try_raw_socket(void) { return try_socket(AF_INET, SOCK_RAW, IPPROTO_ICMP); }
static long try_packet_socket(void) { return try_socket(AF_PACKET, SOCK_RAW, 0); }

static const struct syscall_probe syscall_probes[] = {
	{ "bpf", try_bpf },
	{ "bpf-map", try_bpf_map },
	{ "io_uring", try_io_uring },
	{ "userfaultfd", try_userfaultfd },
	{ "perf_event_open", try_perf },
	{ "unshare-user", try_unshare_user },
	{ "unshare-mount", try_unshare_mount },
	{ "unshare-net", try_unshare_net },
	{ "unshare-pid", try_unshare_pid },
	{ "clone-newuser", try_clone_newuser },
	{ "clone-newns", try_clone_newns },
	{ "clone3-newuser", try_clone3_ns },
	{ "mount-tmpfs", try_mount_tmpfs },
	{ "mount-proc", try_mount_proc },
	{ "mount-cgroup", try_mount_cgroup },
	{ "fsopen", try_fsopen },
	{ "open_tree", try_open_tree },
	{ "keyctl", try_keyctl },
	{ "add_key", try_add_key },
	{ "ptrace-attach-1", try_ptrace_1 },
	{ "ptrace-child", try_ptrace_child },
	{ "process_vm_readv-1", try_process_vm_readv_1 },
	{ "pidfd_getfd-1", try_pidfd_getfd_1 },
	{ "name_to_handle_at", try_name_to_handle },
	{ "open_by_handle_at", try_open_by_handle },
	{ "setns", try_setns },
	{ "init_module", try_init_module },
	{ "kexec_load", try_kexec },
	{ "syslog", try_syslog },
	{ "socket-raw", try_raw_socket },
	{ "socket-packet", try_packet_socket },
	{ "mknod-block", try_mknod },
	{ "iopl", try_iopl },
	{ "reboot", try_reboot },
	{ "swapon", try_swapon },
	{ "ioctl-tiocsti", try_ioctl_tiocsti },
	{ "xfs-swapext", try_swapext },
};

static int cmd_syscall(int argc, char **argv)
{
	int done = 0;
	for (size_t i = 0; i < sizeof syscall_probes / sizeof syscall_probes[0]; i++) {
		const struct syscall_probe *p = &syscall_probes[i];
		bool wanted = argc == 0;
		for (int a = 0; a < argc; a++)
			wanted |= !strcmp(argv[a], p->name);
		if (!wanted)
			continue;
		/* Each probe runs in a child of its own, so that one that succeeds (a new namespace,
		 * a mount) does not change what the next one finds. */
		fflush(stdout);
		pid_t pid = fork();
		if (pid == 0) {
			errno = 0;
			long rc = p->fn();
			report(p->name, rc, errno);
			_exit(0);
		}
		if (pid < 0)
			report(p->name, -1, errno);
		else
			waitpid(pid, NULL, 0);
		done++;
	}
	return done > 0 || argc == 0 ? 0 : 2;
}

/* ---- files ---- */

/* Reads a whole file; reports the bytes read or the errno. */
static int cmd_read(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0) {
		report("read", -1, errno);
		return 0;
	}
	char buf[65536];
	long long total = 0;
	ssize_t n;
	while ((n = read(fd, buf, sizeof buf)) > 0)
		total += n;
	int err = errno;
	close(fd);
	begin("read");
	field_str("path", path);
	field_str("result", outcome(n, err));
	field_num("bytes", total);
	end();
	return 0;
}

static int cmd_write(const char *path, const char *data)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC | O_NOCTTY);
	long rc = fd;
	int err = errno;
	if (fd >= 0) {
		rc = write(fd, data, strlen(data));
		err = errno;
		close(fd);
	}
	begin("write");
	field_str("path", path);
	field_str("result", outcome(rc, err));
	end();
	return 0;
}

/*
 * Writes PATH by other names than its own: an O_PATH descriptor reopened for writing through
 * /proc/self/fd, a hard link to it in DIR (which would be writable), and a truncate through the
 * reopened descriptor. One line per route.
 */
static int cmd_reopen(const char *path, const char *dir)
{
	int opath = open(path, O_PATH | O_CLOEXEC);
	char proc[64], alias[4096];
	snprintf(proc, sizeof proc, "/proc/self/fd/%d", opath);
	int fd = open(proc, O_WRONLY | O_CLOEXEC | O_NOCTTY);
	long rc = fd;
	int err = errno;
	if (fd >= 0) {
		rc = write(fd, "x", 1);
		err = errno;
		close(fd);
	}
	begin("reopen-write");
	field_str("path", path);
	field_str("result", outcome(opath < 0 ? opath : rc, opath < 0 ? EBADF : err));
	end();
	rc = truncate(proc, 0);
	begin("reopen-truncate");
	field_str("path", path);
	field_str("result", outcome(rc, errno));
	end();
	snprintf(alias, sizeof alias, "%s/hardlink", dir);
	rc = linkat(AT_FDCWD, path, AT_FDCWD, alias, 0);
	err = errno;
	if (rc == 0) {
		fd = open(alias, O_WRONLY | O_CLOEXEC | O_NOCTTY);
		rc = fd < 0 ? fd : write(fd, "x", 1);
		err = errno;
		if (fd >= 0)
			close(fd);
	}
	begin("hardlink-write");
	field_str("path", path);
	field_str("result", outcome(rc, err));
	end();
	if (opath >= 0)
		close(opath);
	return 0;
}

static int cmd_opendir(const char *path)
{
	DIR *d = opendir(path);
	int err = errno;
	long n = 0;
	if (d) {
		while (readdir(d))
			n++;
		closedir(d);
	}
	begin("opendir");
	field_str("path", path);
	field_str("result", outcome(d ? 0 : -1, err));
	field_num("entries", n);
	end();
	return 0;
}

/* Lists this process's open descriptors with what they point at. */
static int cmd_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d) {
		report("fds", -1, errno);
		return 0;
	}
	int self = dirfd(d);
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.' || atoi(e->d_name) == self)
			continue;
		char link[300], target[4096];
		snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
		ssize_t n = readlink(link, target, sizeof target - 1);
		target[n > 0 ? n : 0] = 0;
		begin("fd");
		field_num("fd", atoi(e->d_name));
		field_str("target", target);
		end();
	}
	closedir(d);
	return 0;
}

#define MAX_NEEDLES 16
#define MAX_NEEDLE_BYTES 128

struct scan {
	struct {
		char bytes[MAX_NEEDLE_BYTES];
		size_t len;
	} needle[MAX_NEEDLES];
	int needles;
	size_t longest;
	long long files, dirs, bytes, errors, hits, capped;
};

/*
 * Most bytes read from one file. Some /proc files are views of a whole address space
 * (/proc/<pid>/pagemap: 8 bytes per page of 128 TiB) and never end in practice; a canary would
 * sit near the start of any file an agent could use anyway.
 */
#define SCAN_FILE_CAP_BYTES (8ll << 20)

/* Index of the first needle found in hay, or -1. */
static int find_needle(const struct scan *s, const char *hay, size_t n)
{
	for (int i = 0; i < s->needles; i++)
		if (s->needle[i].len <= n && memmem(hay, n, s->needle[i].bytes, s->needle[i].len))
			return i;
	return -1;
}

static void report_hit(struct scan *s, const char *path, const char *in, int needle)
{
	s->hits++;
	begin("hit");
	field_str("path", path);
	field_str("in", in);
	field_num("needle", needle);
	end();
}

/* Searches one regular file, including a needle split across two reads. */
static void scan_file(struct scan *s, int dirfd, const char *name, const char *path)
{
	int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0) {
		s->errors++;
		return;
	}
	s->files++;
	static char buf[65536 + MAX_NEEDLE_BYTES];
	size_t keep = 0;
	long long file_bytes = 0;
	int hit = -1;
	for (;;) {
		ssize_t n = read(fd, buf + keep, 65536);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			s->errors++;
			break;
		}
		if (n == 0)
			break;
		s->bytes += n;
		file_bytes += n;
		size_t len = keep + (size_t)n;
		if (hit < 0)
			hit = find_needle(s, buf, len);
		keep = s->longest - 1 < len ? s->longest - 1 : len;
		memmove(buf, buf + len - keep, keep);
		if (file_bytes >= SCAN_FILE_CAP_BYTES) {
			s->capped++;
			break;
		}
	}
	close(fd);
	if (hit >= 0)
		report_hit(s, path, "content", hit);
}

/*
 * Walks a tree as `grep -r` does: every directory, across mount points, without following
 * symbolic links, reading every regular file to its end (devices and FIFOs are skipped, as
 * GNU grep -r skips them). Names and link targets are searched too.
 */
static void scan_dir(struct scan *s, int dirfd, const char *path, int depth)
{
	if (depth > 64)
		return;
	DIR *d = fdopendir(dirfd);
	if (!d) {
		close(dirfd);
		s->errors++;
		return;
	}
	s->dirs++;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		char child[4096];
		snprintf(child, sizeof child, "%s/%s", strcmp(path, "/") ? path : "", e->d_name);
		int hit = find_needle(s, e->d_name, strlen(e->d_name));
		if (hit >= 0)
			report_hit(s, child, "name", hit);
		struct stat st;
		if (fstatat(dirfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			s->errors++;
			continue;
		}
		if (S_ISDIR(st.st_mode)) {
			int sub = openat(dirfd, e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
			if (sub < 0)
				s->errors++;
			else
				scan_dir(s, sub, child, depth + 1);
		} else if (S_ISREG(st.st_mode)) {
			scan_file(s, dirfd, e->d_name, child);
		} else if (S_ISLNK(st.st_mode)) {
			char target[4096];
			ssize_t n = readlinkat(dirfd, e->d_name, target, sizeof target - 1);
			if (n > 0 && (hit = find_needle(s, target, (size_t)n)) >= 0)
				report_hit(s, child, "link", hit);
		}
	}
	closedir(d);
}

/*
 * Needles come hex-encoded and comma-separated, so that the scan does not find them in its own
 * command line (/proc/<pid>/cmdline).
 */
static bool parse_needles(struct scan *s, const char *arg)
{
	for (const char *p = arg; *p && s->needles < MAX_NEEDLES;) {
		size_t len = strcspn(p, ",");
		if (len == 0 || len % 2 || len / 2 > MAX_NEEDLE_BYTES)
			return false;
		for (size_t i = 0; i < len / 2; i++) {
			unsigned v;
			if (sscanf(p + 2 * i, "%2x", &v) != 1)
				return false;
			s->needle[s->needles].bytes[i] = (char)v;
		}
		s->needle[s->needles].len = len / 2;
		if (len / 2 > s->longest)
			s->longest = len / 2;
		s->needles++;
		p += len + (p[len] == ',');
	}
	return s->needles > 0;
}

static int cmd_scan(const char *needles, int nroots, char **roots)
{
	static struct scan s;
	if (!parse_needles(&s, needles))
		return 2;
	for (int i = 0; i < nroots; i++) {
		int fd = open(roots[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (fd < 0) {
			s.errors++;
			continue;
		}
		scan_dir(&s, fd, roots[i], 0);
	}
	begin("scan");
	field_str("result", "OK");
	field_num("files", s.files);
	field_num("dirs", s.dirs);
	field_num("bytes", s.bytes);
	field_num("errors", s.errors);
	field_num("capped", s.capped);
	field_num("hits", s.hits);
	end();
	return 0;
}

/* ---- resources ---- */

/* Touches MiB of anonymous memory, one MiB at a time; prints progress every 16 MiB. */
static int cmd_balloon(long mib)
{
	long done = 0;
	for (; done < mib; done++) {
		char *p = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED) {
			begin("balloon");
			field_str("result", outcome(-1, errno));
			field_num("mib", done);
			end();
			return 0;
		}
		memset(p, 0xa5, 1 << 20);
		if (done % 16 == 15) {
			begin("balloon-progress");
			field_num("mib", done + 1);
			end();
		}
	}
	begin("balloon");
	field_str("result", "OK");
	field_num("mib", done);
	end();
	return 0;
}

/* Forks children that wait until the first fork fails; reports how many it got, then reaps. */
static int cmd_forkbomb(long max)
{
	pid_t *kids = calloc((size_t)max, sizeof *kids);
	if (!kids)
		return 2;
	long n = 0;
	int err = 0;
	for (; n < max; n++) {
		pid_t pid = fork();
		if (pid == 0) {
			pause();
			_exit(0);
		}
		if (pid < 0) {
			err = errno;
			break;
		}
		kids[n] = pid;
	}
	begin("forkbomb");
	field_str("result", n < max ? outcome(-1, err) : "OK");
	field_num("forked", n);
	end();
	for (long i = 0; i < n; i++)
		kill(kids[i], SIGKILL);
	for (long i = 0; i < n; i++)
		waitpid(kids[i], NULL, 0);
	free(kids);
	return 0;
}

/* Writes 1 MiB blocks to a file until a write fails. */
static int cmd_fill(const char *path, long max_mib)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		report("fill", -1, errno);
		return 0;
	}
	static char block[1 << 20];
	memset(block, 0x5a, sizeof block);
	long long total = 0;
	int err = 0;
	while (total < (long long)max_mib << 20) {
		ssize_t n = write(fd, block, sizeof block);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			err = n < 0 ? errno : ENOSPC;
			break;
		}
		total += n;
	}
	close(fd);
	begin("fill");
	field_str("result", err ? outcome(-1, err) : "OK");
	field_num("bytes", total);
	end();
	return 0;
}

/* Creates empty files in a directory until creation fails. */
static int cmd_flood_inodes(const char *dir, long max)
{
	mkdir(dir, 0700);
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		report("flood-inodes", -1, errno);
		return 0;
	}
	long n = 0;
	int err = 0;
	for (; n < max; n++) {
		char name[32];
		snprintf(name, sizeof name, "f%ld", n);
		int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd < 0) {
			err = errno;
			break;
		}
		close(fd);
	}
	close(dfd);
	begin("flood-inodes");
	field_str("result", err ? outcome(-1, err) : "OK");
	field_num("files", n);
	end();
	return 0;
}

/*
 * Leaves a process behind: forks, the child starts a session of its own and forks again, and the
 * grandchild ignores SIGTERM, SIGHUP and SIGINT, closes the command's output and sleeps under a
 * name of the caller's choosing. The command itself exits at once.
 */
static int cmd_doublefork(const char *name)
{
	int ready[2];
	if (pipe2(ready, O_CLOEXEC) < 0)
		return 2;
	pid_t child = fork();
	if (child < 0)
		return 2;
	if (child == 0) {
		setsid();
		pid_t grandchild = fork();
		if (grandchild != 0)
			_exit(grandchild < 0);
		signal(SIGTERM, SIG_IGN);
		signal(SIGHUP, SIG_IGN);
		signal(SIGINT, SIG_IGN);
		prctl(PR_SET_NAME, name, 0, 0, 0);
		int null = open("/dev/null", O_RDWR);
		dup2(null, 0);
		dup2(null, 1);
		dup2(null, 2);
		pid_t me = getpid();
		ssize_t w = write(ready[1], &me, sizeof me);
		(void)w;
		close(ready[1]);
		for (;;)
			pause();
	}
	close(ready[1]);
	pid_t survivor = 0;
	ssize_t r = read(ready[0], &survivor, sizeof survivor);
	waitpid(child, NULL, 0);
	begin("doublefork");
	field_str("result", r == sizeof survivor ? "OK" : "EIO");
	field_num("pid", survivor);
	end();
	return 0;
}

/* Writes `bytes` of "y\n" lines to stdout in 1 MiB writes, as fast as the pipe takes them. */
static int cmd_flood(long long bytes)
{
	static char block[1 << 20];
	for (size_t i = 0; i < sizeof block; i += 2)
		memcpy(block + i, "y\n", 2);
	long long left = bytes;
	while (left > 0) {
		size_t n = left < (long long)sizeof block ? (size_t)left : sizeof block;
		ssize_t w = write(1, block, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return 1;
		left -= w;
	}
	return 0;
}

static void *thread_main(void *arg)
{
	return arg;
}

/* Starts and joins threads one after the other, as any threaded runtime does. */
static int cmd_threads(long n)
{
	long started = 0;
	int err = 0;
	for (; started < n; started++) {
		pthread_t t;
		err = pthread_create(&t, NULL, thread_main, NULL);
		if (err)
			break;
		pthread_join(t, NULL);
	}
	begin("threads");
	field_str("result", err ? outcome(-1, err) : "OK");
	field_num("started", started);
	end();
	return 0;
}

/* ---- network ---- */

static int parse_addr(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len)
{
	memset(ss, 0, sizeof *ss);
	struct sockaddr_in *in4 = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
	if (inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
		in4->sin_family = AF_INET;
		in4->sin_port = htons((uint16_t)port);
		*len = sizeof *in4;
		return AF_INET;
	}
	if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons((uint16_t)port);
		*len = sizeof *in6;
		return AF_INET6;
	}
	return -1;
}

/* A TCP connect with a deadline: "OK", an errno name, or ETIMEDOUT. */
static const char *tcp_connect(const char *host, int port, int timeout_ms)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int family = parse_addr(host, port, &ss, &len);
	if (family < 0)
		return "EINVAL";
	int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return outcome(-1, errno);
	const char *res;
	if (connect(fd, (struct sockaddr *)&ss, len) == 0) {
		res = "OK";
	} else if (errno != EINPROGRESS) {
		res = outcome(-1, errno);
	} else {
		struct pollfd p = { .fd = fd, .events = POLLOUT };
		int n = poll(&p, 1, timeout_ms);
		int soerr = 0;
		socklen_t sl = sizeof soerr;
		if (n == 0)
			res = "ETIMEDOUT";
		else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
			res = outcome(-1, errno);
		else
			res = soerr ? outcome(-1, soerr) : "OK";
	}
	close(fd);
	return res;
}

/* Tries TCP ports lo..hi of a host; prints each port that connected and a summary by result. */
static int cmd_scan_ports(const char *host, int lo, int hi, int timeout_ms)
{
	const char *names[16];
	long counts[16];
	int kinds = 0;
	for (int port = lo; port <= hi; port++) {
		const char *r = tcp_connect(host, port, timeout_ms);
		if (!strcmp(r, "OK")) {
			begin("open-port");
			field_str("host", host);
			field_num("port", port);
			end();
		}
		int k = 0;
		while (k < kinds && strcmp(names[k], r))
			k++;
		if (k == kinds && kinds < 16) {
			names[kinds] = r;
			counts[kinds++] = 0;
		}
		if (k < kinds)
			counts[k]++;
	}
	for (int k = 0; k < kinds; k++) {
		begin("port-scan");
		field_str("host", host);
		field_str("result", names[k]);
		field_num("ports", counts[k]);
		end();
	}
	return 0;
}

/* Sends one UDP datagram (a DNS query for example.com when port is 53). */
static int cmd_udp(const char *host, int port)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int family = parse_addr(host, port, &ss, &len);
	if (family < 0)
		return 2;
	static const unsigned char query[] = { 0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 7, 'e', 'x', 'a', 'm', 'p', 'l',
					       'e', 3, 'c', 'o', 'm', 0, 0, 1, 0, 1 };
	int fd = socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	long rc = fd;
	int err = errno;
	if (fd >= 0) {
		rc = sendto(fd, query, sizeof query, 0, (struct sockaddr *)&ss, len);
		err = errno;
		close(fd);
	}
	begin("udp");
	field_str("host", host);
	field_num("port", port);
	field_str("result", outcome(rc, err));
	end();
	return 0;
}

/* Connects to a unix socket: a path, or an abstract name given as @name. */
static int cmd_unix(const char *name)
{
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	size_t n = strlen(name);
	if (n == 0 || n >= sizeof sa.sun_path)
		return 2;
	memcpy(sa.sun_path, name, n);
	if (name[0] == '@')
		sa.sun_path[0] = 0;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	long rc = fd;
	int err = errno;
	if (fd >= 0) {
		rc = connect(fd, (struct sockaddr *)&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n));
		err = errno;
		close(fd);
	}
	begin("unix");
	field_str("path", name);
	field_str("result", outcome(rc, err));
	end();
	return 0;
}

/* Puts a fresh object of kind `k` at `path` (whatever was there is removed first). */
static void swap_one(const char *path, int k)
{
	unlink(path);
	switch (k) {
	case 0: {
		int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd >= 0) {
			if (write(fd, "regular\n", 8) < 0) {
			}
			close(fd);
		}
		break;
	}
	case 1:
		mkfifo(path, 0644);
		break;
	case 2: {
		struct sockaddr_un sa;
		memset(&sa, 0, sizeof sa);
		sa.sun_family = AF_UNIX;
		if (strlen(path) < sizeof sa.sun_path) {
			strcpy(sa.sun_path, path);
			int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
			if (fd >= 0) {
				if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
				}
				close(fd);
			}
		}
		break;
	}
	default:
		if (symlink(k == 3 ? "/etc/shadow" : "/proc/self/fd/0", path) < 0) {
		}
		break;
	}
}

/*
 * Swaps the type of DIR/f0..f3 (regular file, FIFO, unix socket, symlink out of the sandbox)
 * and of the directory DIR/d (a directory holding f, or a symlink to /) for SECONDS: a race
 * against every host-side reader of the writable layer (diff, verify, snapshot, watches).
 */
static int cmd_swap(const char *dir, long seconds)
{
	char p[512], d[512], df[520];
	long swaps = 0;
	time_t until = time(NULL) + seconds;
	snprintf(d, sizeof d, "%s/d", dir);
	snprintf(df, sizeof df, "%s/f", d);
	mkdir(dir, 0755);
	for (long i = 0; time(NULL) < until; i++) {
		for (int n = 0; n < 4; n++) {
			snprintf(p, sizeof p, "%s/f%d", dir, n);
			swap_one(p, (int)((i + n) % 5));
			swaps++;
		}
		if (i % 2 == 0) {
			unlink(d);
			mkdir(d, 0755);
			swap_one(df, (int)(i % 5));
		} else {
			unlink(df);
			rmdir(d);
			if (symlink("/", d) < 0) {
			}
		}
		swaps++;
	}
	begin("swap");
	field_str("result", "OK");
	field_num("swaps", swaps);
	end();
	return 0;
}

/*
 * Writes what looks like a chronus EXIT frame (type 0x92, exit code 0) to stdout: an agent that
 * hopes the bytes it prints are parsed as the agent's own messages.
 */
static int cmd_forge_exit_frame(void)
{
	unsigned char f[12 + 6 + 8];
	memset(f, 0, sizeof f);
	uint32_t payload = 6 + 8;
	memcpy(f, &payload, 4);
	f[4] = 0x92;
	f[12] = 23; /* EXIT_CODE */
	f[14] = 8;
	ssize_t w = write(1, f, sizeof f);
	return w == (ssize_t)sizeof f ? 0 : 2;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: kit syscall [NAME...] | read PATH | write PATH DATA | reopen PATH DIR | opendir PATH | fds\n"
		"       kit scan HEX[,HEX...] ROOT... | balloon MIB | forkbomb MAX | fill PATH MAXMIB\n"
		"       kit threads N | flood BYTES | flood-inodes DIR MAX | doublefork NAME | ports HOST LO HI TIMEOUT_MS\n"
		"       kit udp HOST PORT | unix PATH|@NAME | forge-exit-frame | swap DIR SECONDS\n");
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage();
		return 2;
	}
	const char *cmd = argv[1];
	int n = argc - 2;
	char **a = argv + 2;
	if (!strcmp(cmd, "syscall"))
		return cmd_syscall(n, a);
	if (!strcmp(cmd, "read") && n == 1)
		return cmd_read(a[0]);
	if (!strcmp(cmd, "write") && n == 2)
		return cmd_write(a[0], a[1]);
	if (!strcmp(cmd, "reopen") && n == 2)
		return cmd_reopen(a[0], a[1]);
	if (!strcmp(cmd, "opendir") && n == 1)
		return cmd_opendir(a[0]);
	if (!strcmp(cmd, "fds") && n == 0)
		return cmd_fds();
	if (!strcmp(cmd, "scan") && n >= 2)
		return cmd_scan(a[0], n - 1, a + 1);
	if (!strcmp(cmd, "balloon") && n == 1)
		return cmd_balloon(atol(a[0]));
	if (!strcmp(cmd, "forkbomb") && n == 1 && atol(a[0]) > 0)
		return cmd_forkbomb(atol(a[0]));
	if (!strcmp(cmd, "flood") && n == 1)
		return cmd_flood(atoll(a[0]));
	if (!strcmp(cmd, "threads") && n == 1)
		return cmd_threads(atol(a[0]));
	if (!strcmp(cmd, "fill") && n == 2)
		return cmd_fill(a[0], atol(a[1]));
	if (!strcmp(cmd, "flood-inodes") && n == 2)
		return cmd_flood_inodes(a[0], atol(a[1]));
	if (!strcmp(cmd, "doublefork") && n == 1)
		return cmd_doublefork(a[0]);
	if (!strcmp(cmd, "ports") && n == 4)
		return cmd_scan_ports(a[0], atoi(a[1]), atoi(a[2]), atoi(a[3]));
	if (!strcmp(cmd, "udp") && n == 2)
		return cmd_udp(a[0], atoi(a[1]));
	if (!strcmp(cmd, "swap") && n == 2 && atol(a[1]) > 0)
		return cmd_swap(a[0], atol(a[1]));
	if (!strcmp(cmd, "unix") && n == 1)
		return cmd_unix(a[0]);
	if (!strcmp(cmd, "forge-exit-frame") && n == 0)
		return cmd_forge_exit_frame();
	usage();
	return 2;
}
