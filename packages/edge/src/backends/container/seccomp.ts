// The default seccomp profile of container sandboxes. Everything is allowed except the system
// calls below, which fail with EPERM (ENOSYS for clone3, so libc falls back to clone, where the
// namespace flags can be inspected). Most of these are also refused for want of a capability;
// seccomp makes the refusal independent of the capability set and closes kernel surface that
// needs no capability at all (io_uring, userfaultfd, perf, bpf, keyrings, namespaces).

/** System calls denied in every container sandbox. */
export const DENIED_SYSCALLS = [
  'acct', 'add_key', 'bpf', 'clock_adjtime', 'clock_settime', 'create_module', 'delete_module',
  'finit_module', 'fsconfig', 'fsmount', 'fsopen', 'fspick', 'get_kernel_syms', 'get_mempolicy',
  'init_module', 'io_uring_enter', 'io_uring_register', 'io_uring_setup', 'ioperm', 'iopl', 'kcmp',
  'kexec_file_load', 'kexec_load', 'keyctl', 'lookup_dcookie', 'mbind', 'mount', 'mount_setattr',
  'move_mount', 'move_pages', 'name_to_handle_at', 'nfsservctl', 'open_by_handle_at', 'open_tree',
  'perf_event_open', 'pivot_root', 'process_vm_readv', 'process_vm_writev', 'ptrace',
  'query_module', 'quotactl', 'quotactl_fd', 'reboot', 'request_key', 'set_mempolicy', 'setns',
  'settimeofday', 'stime', 'swapoff', 'swapon', 'sysfs', '_sysctl', 'umount', 'umount2', 'unshare',
  'uselib', 'userfaultfd', 'ustat', 'vm86', 'vm86old', 'fanotify_init', 'lsm_set_self_attr',
] as const;

const EPERM = 1;
const ENOSYS = 38;
/** Namespace flags refused in clone(2): NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME. */
const CLONE_NS_FLAGS = [0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x00000080];
/** Terminal ioctls that inject input or control the console: TIOCSTI, TIOCLINUX. */
const DENIED_IOCTLS = [0x5412, 0x541c];

/** An OCI `linux.seccomp` object. */
export interface SeccompProfile {
  defaultAction: string;
  defaultErrnoRet?: number;
  architectures: string[];
  syscalls: Array<{ names: string[]; action: string; errnoRet?: number; args?: Array<{ index: number; value: number; valueTwo?: number; op: string }> }>;
}

/**
 * Builds the default profile; `allowPtrace` re-allows ptrace and process_vm_* for debuggers;
 * `extraDenied` adds system calls (names from the protocol's SYSCALL_NAMES) that fail with EPERM.
 */
export function defaultSeccompProfile(opts: { allowPtrace?: boolean; extraDenied?: readonly string[] } = {}): SeccompProfile {
  const ptraceCalls = new Set(['ptrace', 'process_vm_readv', 'process_vm_writev']);
  const denied = new Set<string>(DENIED_SYSCALLS.filter((s) => !(opts.allowPtrace && ptraceCalls.has(s))));
  for (const s of opts.extraDenied ?? []) denied.add(s);
  return {
    defaultAction: 'SCMP_ACT_ALLOW',
    architectures: ['SCMP_ARCH_X86_64', 'SCMP_ARCH_X86', 'SCMP_ARCH_X32'],
    syscalls: [
      { names: [...denied], action: 'SCMP_ACT_ERRNO', errnoRet: EPERM },
      { names: ['clone3'], action: 'SCMP_ACT_ERRNO', errnoRet: ENOSYS },
      ...CLONE_NS_FLAGS.map((flag) => ({
        names: ['clone'],
        action: 'SCMP_ACT_ERRNO',
        errnoRet: EPERM,
        args: [{ index: 0, value: flag, valueTwo: flag, op: 'SCMP_CMP_MASKED_EQ' }],
      })),
      ...DENIED_IOCTLS.map((req) => ({
        names: ['ioctl'],
        action: 'SCMP_ACT_ERRNO',
        errnoRet: EPERM,
        args: [{ index: 1, value: req, op: 'SCMP_CMP_EQ' }],
      })),
    ],
  };
}
