// Seccomp denials as the kernel reports them. Container sandboxes install their filter with
// SECCOMP_FILTER_FLAG_LOG, so every refused system call becomes an audit record (type 1326).
// Edge reads every record from the audit subsystem's netlink multicast group; the kernel log
// (/dev/kmsg) is only the fallback where that group cannot be joined, because without an audit
// daemon the kernel prints records there under a host-wide rate limit (printk_ratelimit, about
// 10 per 5 s), so that a busy sandbox would hide every other one's denials.
// dsec-launch gives each sandbox a login uid of its own (its host uid base), which the record
// carries as `auid`, so a record is attributed even when its process has already exited.
import { readSync } from 'node:fs';
import { closeFd, O, openAuditMulticast, openFd, seekEnd } from '../sys/linux.js';

/** One refused system call. */
export interface SeccompDenial {
  /** Audit login uid: the sandbox's host uid base (set by dsec-launch). */
  auid: number;
  /** Host uid of the process. */
  uid: number;
  /** Host pid of the process. */
  pid: number;
  comm: string;
  exe: string;
  /** System call name (`syscall <nr>` when not in the table). */
  syscall: string;
  syscallNr: number;
  /** `x86_64`, `i386`, `x32`, or another the kernel names. */
  arch: string;
}

// The system calls the default profile refuses (only refusals are logged), by number.
// Since Linux 5.1 new system calls take one number on every architecture (424 and up).
const SHARED_NUMBERS: Record<number, string> = {
  425: 'io_uring_setup',
  426: 'io_uring_enter',
  427: 'io_uring_register',
  428: 'open_tree',
  429: 'move_mount',
  430: 'fsopen',
  431: 'fsconfig',
  432: 'fsmount',
  433: 'fspick',
  435: 'clone3',
  438: 'pidfd_getfd',
  440: 'process_madvise',
  442: 'mount_setattr',
  443: 'quotactl_fd',
  460: 'lsm_set_self_attr',
};
const X86_64: Record<number, string> = {
  16: 'ioctl',
  56: 'clone',
  101: 'ptrace',
  134: 'uselib',
  136: 'ustat',
  139: 'sysfs',
  155: 'pivot_root',
  156: '_sysctl',
  163: 'acct',
  164: 'settimeofday',
  165: 'mount',
  166: 'umount2',
  167: 'swapon',
  168: 'swapoff',
  169: 'reboot',
  172: 'iopl',
  173: 'ioperm',
  174: 'create_module',
  175: 'init_module',
  176: 'delete_module',
  177: 'get_kernel_syms',
  178: 'query_module',
  179: 'quotactl',
  180: 'nfsservctl',
  212: 'lookup_dcookie',
  227: 'clock_settime',
  237: 'mbind',
  238: 'set_mempolicy',
  239: 'get_mempolicy',
  246: 'kexec_load',
  248: 'add_key',
  249: 'request_key',
  250: 'keyctl',
  272: 'unshare',
  279: 'move_pages',
  298: 'perf_event_open',
  300: 'fanotify_init',
  303: 'name_to_handle_at',
  304: 'open_by_handle_at',
  305: 'clock_adjtime',
  308: 'setns',
  310: 'process_vm_readv',
  311: 'process_vm_writev',
  312: 'kcmp',
  313: 'finit_module',
  320: 'kexec_file_load',
  321: 'bpf',
  323: 'userfaultfd',
  ...SHARED_NUMBERS,
};
const I386: Record<number, string> = {
  21: 'mount',
  22: 'umount',
  25: 'stime',
  26: 'ptrace',
  51: 'acct',
  52: 'umount2',
  54: 'ioctl',
  62: 'ustat',
  79: 'settimeofday',
  86: 'uselib',
  87: 'swapon',
  88: 'reboot',
  101: 'ioperm',
  110: 'iopl',
  113: 'vm86old',
  115: 'swapoff',
  120: 'clone',
  127: 'create_module',
  128: 'init_module',
  129: 'delete_module',
  130: 'get_kernel_syms',
  131: 'quotactl',
  135: 'sysfs',
  149: '_sysctl',
  166: 'vm86',
  167: 'query_module',
  169: 'nfsservctl',
  217: 'pivot_root',
  253: 'lookup_dcookie',
  264: 'clock_settime',
  274: 'mbind',
  275: 'get_mempolicy',
  276: 'set_mempolicy',
  283: 'kexec_load',
  286: 'add_key',
  287: 'request_key',
  288: 'keyctl',
  310: 'unshare',
  317: 'move_pages',
  336: 'perf_event_open',
  338: 'fanotify_init',
  341: 'name_to_handle_at',
  342: 'open_by_handle_at',
  343: 'clock_adjtime',
  346: 'setns',
  347: 'process_vm_readv',
  348: 'process_vm_writev',
  349: 'kcmp',
  350: 'finit_module',
  357: 'bpf',
  374: 'userfaultfd',
  ...SHARED_NUMBERS,
};
const AUDIT_ARCH_X86_64 = 'c000003e';
const AUDIT_ARCH_I386 = '40000003';
const X32_SYSCALL_BIT = 0x4000_0000;

/** Decodes an audit string field: `"text"` as is, hex (used for untrusted text) decoded. */
function auditString(v: string | undefined): string {
  if (v === undefined) return '';
  if (v.startsWith('"')) return v.slice(1, -1);
  return /^[0-9A-F]+$/i.test(v) && v.length % 2 === 0 ? Buffer.from(v, 'hex').toString('utf8') : v;
}

/** Parses one kernel log line; undefined unless it is a seccomp audit record. */
export function parseSeccompRecord(line: string): SeccompDenial | undefined {
  const at = line.indexOf('type=1326 ');
  if (at < 0) return undefined;
  // Fields are `key=value` separated by spaces; untrusted text (comm, exe) is quoted without
  // spaces or quotes inside, or hex-encoded, so splitting on spaces is safe.
  const fields = new Map<string, string>();
  for (const part of line.slice(at).split(' ')) {
    const eq = part.indexOf('=');
    if (eq > 0 && !fields.has(part.slice(0, eq))) fields.set(part.slice(0, eq), part.slice(eq + 1));
  }
  const nr = Number(fields.get('syscall'));
  const archCode = fields.get('arch') ?? '';
  if (!Number.isInteger(nr)) return undefined;
  let arch: string = archCode;
  let name: string | undefined;
  if (archCode === AUDIT_ARCH_X86_64 && nr & X32_SYSCALL_BIT) {
    arch = 'x32';
    name = X86_64[nr & ~X32_SYSCALL_BIT];
  } else if (archCode === AUDIT_ARCH_X86_64) {
    arch = 'x86_64';
    name = X86_64[nr];
  } else if (archCode === AUDIT_ARCH_I386) {
    arch = 'i386';
    name = I386[nr];
  }
  return {
    auid: Number(fields.get('auid') ?? -1),
    uid: Number(fields.get('uid') ?? -1),
    pid: Number(fields.get('pid') ?? 0),
    comm: auditString(fields.get('comm')),
    exe: auditString(fields.get('exe')),
    syscall: name ?? `syscall ${nr}`,
    syscallNr: nr,
    arch,
  };
}

/** The seccomp audit record type. */
const AUDIT_SECCOMP = 1326;
/** clone3's number (the same on every architecture). */
const CLONE3_NR = 435;

/**
 * True for a refusal that is not an attack: clone3 is refused with ENOSYS for every program
 * (its flags sit in memory, where a filter cannot check them), so that libc falls back to
 * clone, whose flags the filter does check. glibc tries it on every pthread_create and
 * posix_spawn; the clone that follows is what a namespace attempt is refused (and raised) on.
 */
export function isExpectedRefusal(d: SeccompDenial): boolean {
  return d.syscallNr === CLONE3_NR;
}

/** A reader of seccomp records: the audit netlink group, or the kernel log as a fallback. */
export interface SeccompRecordSource {
  /** Reads up to `max` new records (their text, with `type=1326`); never blocks. */
  read(max: number): string[];
  close(): void;
}

/** Largest audit netlink datagram read at once (a record's text is at most about 8 KiB). */
const MAX_DATAGRAM_BYTES = 16 * 1024;
/** struct nlmsghdr: len u32, type u16, flags u16, seq u32, pid u32. */
const NLMSG_HEADER_BYTES = 16;

/** Every audit record, from the audit subsystem's netlink multicast group (no rate limit). */
export class AuditNetlinkReader implements SeccompRecordSource {
  private readonly buf = Buffer.alloc(MAX_DATAGRAM_BYTES);
  /** Times the socket's buffer overflowed (records lost, ENOBUFS). */
  overruns = 0;

  private constructor(private fd: number) {}

  /** Joins the group; undefined when it cannot (no CAP_AUDIT_READ, no audit in the kernel). */
  static open(): AuditNetlinkReader | undefined {
    try {
      return new AuditNetlinkReader(openAuditMulticast());
    } catch {
      return undefined;
    }
  }

  read(max: number): string[] {
    const out: string[] = [];
    while (this.fd >= 0 && out.length < max) {
      let n: number;
      try {
        n = readSync(this.fd, this.buf, 0, this.buf.length, null);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'ENOBUFS') {
          this.overruns++;
          continue;
        }
        break; // EAGAIN: nothing more for now
      }
      if (n <= 0) break;
      for (let off = 0; off + NLMSG_HEADER_BYTES <= n;) {
        const len = this.buf.readUInt32LE(off);
        const type = this.buf.readUInt16LE(off + 4);
        if (len < NLMSG_HEADER_BYTES || off + len > n) break;
        if (type === AUDIT_SECCOMP) {
          const text = this.buf.toString('utf8', off + NLMSG_HEADER_BYTES, off + len).replace(/\0+$/, '');
          out.push(`type=${AUDIT_SECCOMP} ${text}`);
        }
        off += (len + 3) & ~3;
      }
    }
    return out;
  }

  close(): void {
    if (this.fd >= 0) closeFd(this.fd);
    this.fd = -1;
  }
}

/** Largest kernel log record (the kernel's own limit is 1 KiB of text plus its prefix). */
const MAX_RECORD_BYTES = 8192;

/** A non-blocking reader of the kernel log from the moment it was opened. */
export class KmsgReader implements SeccompRecordSource {
  private readonly buf = Buffer.alloc(MAX_RECORD_BYTES);

  private constructor(private fd: number) {}

  /** Opens /dev/kmsg at its end; undefined when it cannot be read (no privilege, no device). */
  static open(path = '/dev/kmsg'): KmsgReader | undefined {
    try {
      const fd = openFd(path, O.RDONLY | O.NONBLOCK | O.CLOEXEC);
      seekEnd(fd);
      return new KmsgReader(fd);
    } catch {
      return undefined;
    }
  }

  /** Reads up to `max` new records (their text); never blocks. */
  read(max: number): string[] {
    const out: string[] = [];
    while (this.fd >= 0 && out.length < max) {
      let n: number;
      try {
        n = readSync(this.fd, this.buf, 0, this.buf.length, null);
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        // EPIPE: records were overwritten before we read them; the next read goes on.
        if (code === 'EPIPE') continue;
        break; // EAGAIN: nothing more for now
      }
      if (n <= 0) break;
      const rec = this.buf.toString('utf8', 0, n);
      const semi = rec.indexOf(';');
      out.push(semi >= 0 ? rec.slice(semi + 1, rec.endsWith('\n') ? -1 : undefined) : rec);
    }
    return out;
  }

  close(): void {
    if (this.fd >= 0) closeFd(this.fd);
    this.fd = -1;
  }
}
