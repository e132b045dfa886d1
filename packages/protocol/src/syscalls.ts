// System call names a seccomp rule may name: the x86-64 table of the Linux 6.x headers, the
// calls added since (up to 6.18), and the 32-bit-only names the default profile denies (libseccomp
// resolves each name per architecture). Pure data: the rules API validates against it and the
// container bundle builder takes names from it.

/** Every system call name the seccomp profile builder accepts. */
// prettier-ignore
export const SYSCALL_NAMES: ReadonlySet<string> = new Set([
  '_sysctl', 'accept', 'accept4', 'access', 'acct', 'add_key', 'adjtimex', 'alarm',
  'arch_prctl', 'bind', 'bpf', 'brk', 'cachestat', 'capget', 'capset', 'chdir',
  'chmod', 'chown', 'chroot', 'clock_adjtime', 'clock_getres', 'clock_gettime', 'clock_nanosleep', 'clock_settime',
  'clone', 'clone3', 'close', 'close_range', 'connect', 'copy_file_range', 'creat', 'create_module',
  'delete_module', 'dup', 'dup2', 'dup3', 'epoll_create', 'epoll_create1', 'epoll_ctl', 'epoll_pwait',
  'epoll_pwait2', 'epoll_wait', 'eventfd', 'eventfd2', 'execve', 'execveat', 'exit', 'exit_group',
  'faccessat', 'faccessat2', 'fadvise64', 'fallocate', 'fanotify_init', 'fanotify_mark', 'fchdir', 'fchmod',
  'fchmodat', 'fchmodat2', 'fchown', 'fchownat', 'fcntl', 'fdatasync', 'fgetxattr', 'finit_module',
  'flistxattr', 'flock', 'fork', 'fremovexattr', 'fsconfig', 'fsetxattr', 'fsmount', 'fsopen',
  'fspick', 'fstat', 'fstatfs', 'fsync', 'ftruncate', 'futex', 'futex_requeue', 'futex_wait',
  'futex_waitv', 'futex_wake', 'futimesat', 'get_kernel_syms', 'get_mempolicy', 'get_robust_list', 'get_thread_area', 'getcpu',
  'getcwd', 'getdents', 'getdents64', 'getegid', 'geteuid', 'getgid', 'getgroups', 'getitimer',
  'getpeername', 'getpgid', 'getpgrp', 'getpid', 'getppid', 'getpriority', 'getrandom', 'getresgid',
  'getresuid', 'getrlimit', 'getrusage', 'getsid', 'getsockname', 'getsockopt', 'gettid', 'gettimeofday',
  'getuid', 'getxattr', 'getxattrat', 'init_module', 'inotify_add_watch', 'inotify_init', 'inotify_init1', 'inotify_rm_watch',
  'io_cancel', 'io_destroy', 'io_getevents', 'io_pgetevents', 'io_setup', 'io_submit', 'io_uring_enter', 'io_uring_register',
  'io_uring_setup', 'ioctl', 'ioperm', 'iopl', 'ioprio_get', 'ioprio_set', 'kcmp', 'kexec_file_load',
  'kexec_load', 'keyctl', 'kill', 'landlock_add_rule', 'landlock_create_ruleset', 'landlock_restrict_self', 'lchown', 'lgetxattr',
  'link', 'linkat', 'listen', 'listmount', 'listxattr', 'listxattrat', 'llistxattr', 'lookup_dcookie',
  'lremovexattr', 'lseek', 'lsetxattr', 'lsm_get_self_attr', 'lsm_list_modules', 'lsm_set_self_attr', 'lstat', 'madvise',
  'map_shadow_stack', 'mbind', 'membarrier', 'memfd_create', 'memfd_secret', 'migrate_pages', 'mincore', 'mkdir',
  'mkdirat', 'mknod', 'mknodat', 'mlock', 'mlock2', 'mlockall', 'mmap', 'modify_ldt',
  'mount', 'mount_setattr', 'move_mount', 'move_pages', 'mprotect', 'mq_getsetattr', 'mq_notify', 'mq_open',
  'mq_timedreceive', 'mq_timedsend', 'mq_unlink', 'mremap', 'mseal', 'msgctl', 'msgget', 'msgrcv',
  'msgsnd', 'msync', 'munlock', 'munlockall', 'munmap', 'name_to_handle_at', 'nanosleep', 'newfstatat',
  'nfsservctl', 'open', 'open_by_handle_at', 'open_tree', 'open_tree_attr', 'openat', 'openat2', 'pause',
  'perf_event_open', 'personality', 'pidfd_getfd', 'pidfd_open', 'pidfd_send_signal', 'pipe', 'pipe2', 'pivot_root',
  'pkey_alloc', 'pkey_free', 'pkey_mprotect', 'poll', 'ppoll', 'prctl', 'pread64', 'preadv',
  'preadv2', 'prlimit64', 'process_madvise', 'process_mrelease', 'process_vm_readv', 'process_vm_writev', 'pselect6', 'ptrace',
  'pwrite64', 'pwritev', 'pwritev2', 'query_module', 'quotactl', 'quotactl_fd', 'read', 'readahead',
  'readlink', 'readlinkat', 'readv', 'reboot', 'recvfrom', 'recvmmsg', 'recvmsg', 'remap_file_pages',
  'removexattr', 'removexattrat', 'rename', 'renameat', 'renameat2', 'request_key', 'restart_syscall', 'rmdir',
  'rseq', 'rt_sigaction', 'rt_sigpending', 'rt_sigprocmask', 'rt_sigqueueinfo', 'rt_sigreturn', 'rt_sigsuspend', 'rt_sigtimedwait',
  'rt_tgsigqueueinfo', 'sched_get_priority_max', 'sched_get_priority_min', 'sched_getaffinity', 'sched_getattr', 'sched_getparam', 'sched_getscheduler', 'sched_rr_get_interval',
  'sched_setaffinity', 'sched_setattr', 'sched_setparam', 'sched_setscheduler', 'sched_yield', 'seccomp', 'select', 'semctl',
  'semget', 'semop', 'semtimedop', 'sendfile', 'sendmmsg', 'sendmsg', 'sendto', 'set_mempolicy',
  'set_mempolicy_home_node', 'set_robust_list', 'set_thread_area', 'set_tid_address', 'setdomainname', 'setfsgid', 'setfsuid', 'setgid',
  'setgroups', 'sethostname', 'setitimer', 'setns', 'setpgid', 'setpriority', 'setregid', 'setresgid',
  'setresuid', 'setreuid', 'setrlimit', 'setsid', 'setsockopt', 'settimeofday', 'setuid', 'setxattr',
  'setxattrat', 'shmat', 'shmctl', 'shmdt', 'shmget', 'shutdown', 'sigaltstack', 'signalfd',
  'signalfd4', 'socket', 'socketpair', 'splice', 'stat', 'statfs', 'statmount', 'statx',
  'stime', 'swapoff', 'swapon', 'symlink', 'symlinkat', 'sync', 'sync_file_range', 'syncfs',
  'sysfs', 'sysinfo', 'syslog', 'tee', 'tgkill', 'time', 'timer_create', 'timer_delete',
  'timer_getoverrun', 'timer_gettime', 'timer_settime', 'timerfd_create', 'timerfd_gettime', 'timerfd_settime', 'times', 'tkill',
  'truncate', 'umask', 'umount', 'umount2', 'uname', 'unlink', 'unlinkat', 'unshare',
  'uselib', 'userfaultfd', 'ustat', 'utime', 'utimensat', 'utimes', 'vfork', 'vhangup',
  'vm86', 'vm86old', 'vmsplice', 'wait4', 'waitid', 'write', 'writev',
]);

/**
 * System calls a run-time rule may not deny: the agent (PID 1 of every sandbox) and every command
 * need them to start, run and report, so denying one would make every new sandbox fail to start.
 */
// prettier-ignore
export const ESSENTIAL_SYSCALLS: ReadonlySet<string> = new Set([
  'execve', 'exit', 'exit_group', 'rt_sigreturn', 'rt_sigaction', 'rt_sigprocmask', 'read', 'write',
  'readv', 'writev', 'close', 'brk', 'mmap', 'munmap', 'mprotect', 'futex', 'clone', 'fork', 'vfork',
  'wait4', 'waitid', 'fcntl', 'dup', 'dup2', 'dup3', 'pipe', 'pipe2', 'setsid', 'accept', 'accept4',
  'poll', 'ppoll', 'epoll_wait', 'epoll_pwait', 'epoll_ctl', 'epoll_create1', 'open', 'openat',
  'fstat', 'newfstatat', 'statx', 'getpid', 'kill', 'prctl', 'arch_prctl', 'set_tid_address',
  'set_robust_list', 'rseq', 'sigaltstack', 'ioctl', 'lseek', 'getdents64', 'chdir', 'setgroups',
  'setuid', 'setgid', 'setresuid', 'setresgid', 'prlimit64', 'getrlimit', 'setrlimit', 'clock_gettime',
  'clock_nanosleep', 'nanosleep', 'signalfd4', 'timerfd_create', 'timerfd_settime', 'getrandom',
  'sendmsg', 'recvmsg', 'sendto', 'recvfrom', 'socket', 'connect', 'fchdir', 'access', 'faccessat',
  'faccessat2', 'getuid', 'geteuid', 'getgid', 'getegid', 'getppid', 'uname', 'seccomp',
]);
