// The default seccomp profile of container sandboxes. Everything is allowed except the system
// calls below, which fail with EPERM (ENOSYS for clone3, so libc falls back to clone, where the
// namespace flags can be inspected). Most of these are also refused for want of a capability;
// seccomp makes the refusal independent of the capability set and closes kernel surface that
// needs no capability at all (io_uring, userfaultfd, perf, bpf, keyrings, namespaces).
// The filter is installed with SECCOMP_FILTER_FLAG_LOG: every refusal becomes a kernel audit
// record (type 1326) that edge turns into a `seccomp.denied` event.

/** System calls that read or write another process's memory: denied unless the spec allows ptrace. */
export const PTRACE_SYSCALLS = ['ptrace', 'process_vm_readv', 'process_vm_writev', 'process_madvise', 'pidfd_getfd'] as const;

/** System calls denied in every container sandbox (plus {@link PTRACE_SYSCALLS} by default). */
export const DENIED_SYSCALLS = [
  'acct',
  'add_key',
  'bpf',
  'clock_adjtime',
  'clock_settime',
  'create_module',
  'delete_module',
  'finit_module',
  'fsconfig',
  'fsmount',
  'fsopen',
  'fspick',
  'get_kernel_syms',
  'get_mempolicy',
  'init_module',
  'io_uring_enter',
  'io_uring_register',
  'io_uring_setup',
  'ioperm',
  'iopl',
  'kcmp',
  'kexec_file_load',
  'kexec_load',
  'keyctl',
  'lookup_dcookie',
  'mbind',
  'mount',
  'mount_setattr',
  'move_mount',
  'move_pages',
  'name_to_handle_at',
  'nfsservctl',
  'open_by_handle_at',
  'open_tree',
  'perf_event_open',
  'pivot_root',
  'query_module',
  'quotactl',
  'quotactl_fd',
  'reboot',
  'request_key',
  'set_mempolicy',
  'setns',
  'settimeofday',
  'stime',
  'swapoff',
  'swapon',
  'sysfs',
  '_sysctl',
  'umount',
  'umount2',
  'unshare',
  'uselib',
  'userfaultfd',
  'ustat',
  'vm86',
  'vm86old',
  'fanotify_init',
  'lsm_set_self_attr',
] as const;

const EPERM = 1;
const ENOSYS = 38;
/** Namespace flags refused in clone(2): NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME. */
const CLONE_NS_FLAGS = [0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x00000080];

/**
 * ioctl requests refused, compared on their low 16 bits (type and number) so that neither the
 * size and direction bits nor garbage in the upper 32 bits of the argument (the kernel reads an
 * `unsigned int`) get around the rule.
 */
export const DENIED_IOCTLS: ReadonlyArray<{ name: string; request: number }> = [
  // Terminal input injection and console control.
  { name: 'TIOCSTI', request: 0x5412 },
  { name: 'TIOCLINUX', request: 0x541c },
  // XFS handle ioctls (open any inode by handle, bypassing path permissions), extent swaps
  // (XFS_IOC_SWAPEXT, used to get around access control) and FIFREEZE/FITHAW/FITRIM, which
  // share the 'X' type; all are harmless to refuse where no XFS holds the writable layers.
  ...[
    ['XFS_IOC_PATH_TO_FSHANDLE', 104],
    ['XFS_IOC_PATH_TO_HANDLE', 105],
    ['XFS_IOC_FD_TO_HANDLE', 106],
    ['XFS_IOC_OPEN_BY_HANDLE', 107],
    ['XFS_IOC_READLINK_BY_HANDLE', 108],
    ['XFS_IOC_SWAPEXT', 109],
    ['FIFREEZE', 119],
    ['FITHAW', 120],
    ['XFS_IOC_FSSETDM_BY_HANDLE', 121],
    ['XFS_IOC_ATTRLIST_BY_HANDLE', 122],
    ['XFS_IOC_ATTRMULTI_BY_HANDLE', 123],
    ['XFS_IOC_EXCHANGE_RANGE', 129],
    ['XFS_IOC_COMMIT_RANGE', 131],
  ].map(([name, nr]) => ({ name: name as string, request: (0x58 << 8) | (nr as number) })),
];
const IOCTL_MASK = 0xffff;

/** An OCI `linux.seccomp` object. */
export interface SeccompProfile {
  defaultAction: string;
  defaultErrnoRet?: number;
  architectures: string[];
  flags?: string[];
  syscalls: Array<{ names: string[]; action: string; errnoRet?: number; args?: Array<{ index: number; value: number; valueTwo?: number; op: string }> }>;
}

/**
 * Builds the default profile; `allowPtrace` re-allows {@link PTRACE_SYSCALLS} for debuggers;
 * `extraDenied` adds system calls (names from the protocol's SYSCALL_NAMES) that fail with EPERM.
 */
export function defaultSeccompProfile(opts: { allowPtrace?: boolean; extraDenied?: readonly string[] } = {}): SeccompProfile {
  const denied: string[] = [...new Set([...DENIED_SYSCALLS, ...(opts.allowPtrace ? [] : PTRACE_SYSCALLS), ...(opts.extraDenied ?? [])])];
  return {
    defaultAction: 'SCMP_ACT_ALLOW',
    architectures: ['SCMP_ARCH_X86_64', 'SCMP_ARCH_X86', 'SCMP_ARCH_X32'],
    flags: ['SECCOMP_FILTER_FLAG_LOG'],
    syscalls: [
      { names: denied, action: 'SCMP_ACT_ERRNO', errnoRet: EPERM },
      { names: ['clone3'], action: 'SCMP_ACT_ERRNO', errnoRet: ENOSYS },
      ...CLONE_NS_FLAGS.map((flag) => ({
        names: ['clone'],
        action: 'SCMP_ACT_ERRNO',
        errnoRet: EPERM,
        args: [{ index: 0, value: flag, valueTwo: flag, op: 'SCMP_CMP_MASKED_EQ' }],
      })),
      ...DENIED_IOCTLS.map(({ request }) => ({
        names: ['ioctl'],
        action: 'SCMP_ACT_ERRNO',
        errnoRet: EPERM,
        args: [{ index: 1, value: IOCTL_MASK, valueTwo: request, op: 'SCMP_CMP_MASKED_EQ' }],
      })),
    ],
  };
}
