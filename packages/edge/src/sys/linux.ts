// Direct Linux system calls that Node does not expose, through koffi (FFI into libc).
// mount(2) is called directly because util-linux mount silently puts a loop device under a
// file-backed EROFS image; the unix socket is made here so its fd can be inherited by crun;
// mknod(2) and l*xattr(2) write overlayfs whiteouts without a child process per entry.
import { createRequire } from 'node:module';
import { DsecError } from '@dsec/protocol';

const require = createRequire(import.meta.url);
// koffi ships prebuilt binaries inside its npm package; it has no types worth importing.
// eslint-disable-next-line @typescript-eslint/no-require-imports
const koffi = require('koffi') as KoffiModule;

interface KoffiModule {
  load(path: string): { func(signature: string): (...args: unknown[]) => number };
  errno(): number;
}

const libc = koffi.load('libc.so.6');
const c = {
  mount: libc.func('int mount(const char *src, const char *target, const char *fstype, unsigned long flags, const char *data)'),
  umount2: libc.func('int umount2(const char *target, int flags)'),
  socket: libc.func('int socket(int domain, int type, int protocol)'),
  bind: libc.func('int bind(int fd, const void *addr, uint32_t len)'),
  listen: libc.func('int listen(int fd, int backlog)'),
  close: libc.func('int close(int fd)'),
  strerror: libc.func('const char *strerror(int errnum)') as unknown as (n: number) => string,
  mknod: libc.func('int mknod(const char *path, uint32_t mode, uint64_t dev)'),
  lsetxattr: libc.func('int lsetxattr(const char *path, const char *name, const void *value, size_t size, int flags)'),
  lgetxattr: libc.func('intptr_t lgetxattr(const char *path, const char *name, _Out_ uint8_t *value, size_t size)'),
  pidfdOpen: libc.func('int pidfd_open(int pid, unsigned int flags)'),
  processMadvise: libc.func('intptr_t process_madvise(int pidfd, const void *iovec, size_t vlen, int advice, unsigned int flags)'),
};

/** mount(2) flags used by dsec. */
export const MS = {
  RDONLY: 0x1,
  NOSUID: 0x2,
  NODEV: 0x4,
  NOEXEC: 0x8,
  BIND: 0x1000,
  REC: 0x4000,
  PRIVATE: 1 << 18,
  SLAVE: 1 << 19,
  SHARED: 1 << 20,
} as const;

/** umount2(2) flags. */
export const MNT = { FORCE: 1, DETACH: 2 } as const;

const ERRNO_NAMES: Record<number, string> = {
  1: 'EPERM', 2: 'ENOENT', 5: 'EIO', 13: 'EACCES', 16: 'EBUSY', 17: 'EEXIST', 20: 'ENOTDIR',
  22: 'EINVAL', 28: 'ENOSPC', 36: 'ENAMETOOLONG', 98: 'EADDRINUSE', 19: 'ENODEV', 61: 'ENODATA',
  3: 'ESRCH', 12: 'ENOMEM', 38: 'ENOSYS',
};

/** An error from a failed system call, carrying its errno name. */
export class SyscallError extends DsecError {
  readonly errno: number;
  constructor(call: string, errno: number, what: string) {
    const name = ERRNO_NAMES[errno] ?? `errno ${errno}`;
    super('INTERNAL', `${call}(${what}): ${c.strerror(errno)} (${name})`, { errno: name });
    this.errno = errno;
  }
}

function check(rc: number, call: string, what: string): number {
  if (rc < 0) throw new SyscallError(call, koffi.errno(), what);
  return rc;
}

/** mount(2). */
export function mount(source: string, target: string, fstype: string | null, flags: number, data: string | null = null): void {
  check(c.mount(source, target, fstype, flags, data), 'mount', `${fstype ?? 'none'} ${source} on ${target}`);
}

/** umount2(2); returns false when `target` was not mounted (EINVAL) or is gone (ENOENT). */
export function umount(target: string, flags: number = 0): boolean {
  if (c.umount2(target, flags) === 0) return true;
  const errno = koffi.errno();
  if (errno === 22 || errno === 2) return false;
  throw new SyscallError('umount2', errno, target);
}

/** Closes a raw file descriptor. */
export function closeFd(fd: number): void {
  c.close(fd);
}

/**
 * Creates a listening unix stream socket bound at `path` and returns its fd (close-on-exec;
 * child_process.spawn's stdio array dups it into the child, where it is inheritable).
 */
export function listenUnix(path: string, backlog = 64): number {
  const AF_UNIX = 1;
  const SOCK_STREAM = 1;
  const SOCK_CLOEXEC = 0o2000000;
  const pathBytes = Buffer.from(path);
  if (pathBytes.length >= 108) throw new DsecError('INVALID_ARGUMENT', `unix socket path too long: ${path}`, { path });
  const addr = Buffer.alloc(2 + 108);
  addr.writeUInt16LE(AF_UNIX, 0);
  pathBytes.copy(addr, 2);
  const fd = check(c.socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), 'socket', path);
  try {
    check(c.bind(fd, addr, 2 + pathBytes.length + 1), 'bind', path);
    check(c.listen(fd, backlog), 'listen', path);
  } catch (err) {
    c.close(fd);
    throw err;
  }
  return fd;
}

/** Mount points under `prefix` (from /proc/self/mountinfo), deepest first. */
export async function mountsUnder(prefix: string): Promise<string[]> {
  const { readFile } = await import('node:fs/promises');
  const text = await readFile('/proc/self/mountinfo', 'utf8');
  const out: string[] = [];
  const base = prefix.endsWith('/') ? prefix : prefix + '/';
  for (const line of text.split('\n')) {
    const target = line.split(' ')[4];
    if (target === undefined) continue;
    const decoded = target.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
    if (decoded === prefix || decoded.startsWith(base)) out.push(decoded);
  }
  return out.sort((a, b) => b.length - a.length);
}

const S_IFCHR = 0o020000;
const ENODATA = 61;

/** The xattr that marks a directory opaque to the layers below it in an overlay. */
export const OVERLAY_OPAQUE_XATTR = 'trusted.overlay.opaque';

/** Creates an overlayfs whiteout (character device 0:0) at `path`. */
export function mkWhiteout(path: string): void {
  check(c.mknod(path, S_IFCHR | 0o000, 0), 'mknod', path);
}

/** Sets an extended attribute on `path` itself (never on a symlink's target). */
export function lsetxattr(path: string, name: string, value: string): void {
  const buf = Buffer.from(value);
  check(c.lsetxattr(path, name, buf, buf.length, 0), 'lsetxattr', path);
}

/** Reads an extended attribute of `path` itself; null when it is not set. */
export function lgetxattr(path: string, name: string): string | null {
  const buf = Buffer.alloc(4096);
  const n = c.lgetxattr(path, name, buf, buf.length);
  if (n < 0) {
    if (koffi.errno() === ENODATA) return null;
    throw new SyscallError('lgetxattr', koffi.errno(), path);
  }
  return buf.subarray(0, n).toString();
}

/** madvise(2) advice that reads pages back in (swap-in for anonymous memory, readahead for files). */
export const MADV_WILLNEED = 3;
/** Most address ranges one process_madvise(2) call takes (UIO_MAXIOV). */
const MAX_IOVECS = 1024;

/** Opens a pidfd for `pid`; undefined when the process is gone. */
export function pidfdOpen(pid: number): number | undefined {
  const fd = c.pidfdOpen(pid, 0);
  if (fd >= 0) return fd;
  const errno = koffi.errno();
  if (errno === 3) return undefined;
  throw new SyscallError('pidfd_open', errno, String(pid));
}

/**
 * Gives `advice` for address ranges of another process (process_madvise(2), Linux 5.10+).
 * Ranges the kernel refuses (device mappings) are skipped; returns the bytes advised.
 */
export function processMadvise(pidfd: number, ranges: ReadonlyArray<readonly [start: bigint, length: bigint]>, advice: number): bigint {
  let advised = 0n;
  for (let i = 0; i < ranges.length; i += MAX_IOVECS) {
    const batch = ranges.slice(i, i + MAX_IOVECS);
    const iov = Buffer.alloc(16 * batch.length);
    batch.forEach(([start, length], j) => {
      iov.writeBigUInt64LE(start, 16 * j);
      iov.writeBigUInt64LE(length, 16 * j + 8);
    });
    const n = Number(c.processMadvise(pidfd, iov, batch.length, advice, 0));
    if (n >= 0) {
      advised += BigInt(n);
      continue;
    }
    const errno = koffi.errno();
    if (errno === 3 || errno === 38) return advised;
    // One refused range fails the whole call: go range by range.
    for (const [start, length] of batch) {
      const one = Buffer.alloc(16);
      one.writeBigUInt64LE(start, 0);
      one.writeBigUInt64LE(length, 8);
      const m = Number(c.processMadvise(pidfd, one, 1, advice, 0));
      if (m > 0) advised += BigInt(m);
    }
  }
  return advised;
}
