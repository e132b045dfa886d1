// Direct Linux system calls that Node does not expose, through koffi (FFI into libc).
// mount(2) is called directly because util-linux mount silently puts a loop device under a
// file-backed EROFS image; the unix socket is made here so its fd can be inherited by crun;
// mknod(2) and l*xattr(2) write overlayfs whiteouts without a child process per entry.
import { readFileSync, writeSync } from 'node:fs';
import { createRequire } from 'node:module';
// The errors alone: the lazy server imports this module, and the schemas (zod) would double its start.
import { DsecError } from '@dsec/protocol/errors';

const require = createRequire(import.meta.url);
// koffi ships prebuilt binaries inside its npm package; it has no types worth importing.

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
  setsockopt: libc.func('int setsockopt(int fd, int level, int name, const void *value, uint32_t len)'),
  close: libc.func('int close(int fd)'),
  strerror: libc.func('const char *strerror(int errnum)') as unknown as (n: number) => string,
  mknod: libc.func('int mknod(const char *path, uint32_t mode, uint64_t dev)'),
  lsetxattr: libc.func('int lsetxattr(const char *path, const char *name, const void *value, size_t size, int flags)'),
  lgetxattr: libc.func('intptr_t lgetxattr(const char *path, const char *name, _Out_ uint8_t *value, size_t size)'),
  pidfdOpen: libc.func('int pidfd_open(int pid, unsigned int flags)'),
  processMadvise: libc.func('intptr_t process_madvise(int pidfd, const void *iovec, size_t vlen, int advice, unsigned int flags)'),
  open: libc.func('int open(const char *path, int flags, uint32_t mode)'),
  lseek: libc.func('int64_t lseek(int fd, int64_t offset, int whence)'),
  fanotifyInit: libc.func('int fanotify_init(unsigned int flags, unsigned int event_f_flags)'),
  fanotifyMark: libc.func('int fanotify_mark(int fd, unsigned int flags, uint64_t mask, int dirfd, const char *path)'),
  openByHandleAt: libc.func('int open_by_handle_at(int mount_fd, const void *handle, int flags)'),
  statfs: libc.func('int statfs(const char *path, _Out_ uint8_t *buf)'),
  syscall: libc.func('long syscall(long number, ...)'),
  getxattr: libc.func('intptr_t getxattr(const char *path, const char *name, _Out_ uint8_t *value, size_t size)'),
  memfdCreate: libc.func('int memfd_create(const char *name, unsigned int flags)'),
  fcntl: libc.func('int fcntl(int fd, int cmd, ...)'),
};

const SYS_OPEN_TREE = 428;
const SYS_MOVE_MOUNT = 429;
const SYS_MOUNT_SETATTR = 442;
const AT_FDCWD = -100;
const AT_EMPTY_PATH = 0x1000;
const AT_RECURSIVE = 0x8000;
const OPEN_TREE_CLONE = 1;
const O_CLOEXEC = 0o2000000;
const MOVE_MOUNT_F_EMPTY_PATH = 0x4;
const MOUNT_ATTR_IDMAP = 0x100000;

/** mount(2) flags used by dsec. */
export const MS = {
  RDONLY: 0x1,
  NOSUID: 0x2,
  NODEV: 0x4,
  NOEXEC: 0x8,
  REMOUNT: 0x20,
  BIND: 0x1000,
  REC: 0x4000,
  PRIVATE: 1 << 18,
  SLAVE: 1 << 19,
  SHARED: 1 << 20,
} as const;

/** umount2(2) flags. */
export const MNT = { FORCE: 1, DETACH: 2 } as const;

const ERRNO_NAMES: Record<number, string> = {
  1: 'EPERM',
  2: 'ENOENT',
  5: 'EIO',
  13: 'EACCES',
  16: 'EBUSY',
  17: 'EEXIST',
  20: 'ENOTDIR',
  22: 'EINVAL',
  28: 'ENOSPC',
  36: 'ENAMETOOLONG',
  98: 'EADDRINUSE',
  19: 'ENODEV',
  61: 'ENODATA',
  3: 'ESRCH',
  12: 'ENOMEM',
  38: 'ENOSYS',
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

/**
 * Mounts a clone of the tree at `source` on `target`, idmapped through the user namespace
 * `usernsFd` (open_tree + mount_setattr(MOUNT_ATTR_IDMAP) + move_mount). An inode owned by
 * `k` shows as the id that the namespace's map takes `k` to (its "inside" side read as
 * "outside"); ids the map does not cover show as the overflow id.
 */
export function idmappedBind(source: string, target: string, usernsFd: number): void {
  const tree = check(c.syscall(SYS_OPEN_TREE, 'int', AT_FDCWD, 'str', source, 'uint', OPEN_TREE_CLONE | O_CLOEXEC | AT_RECURSIVE), 'open_tree', source);
  try {
    const attr = Buffer.alloc(32); // struct mount_attr: attr_set, attr_clr, propagation, userns_fd
    attr.writeBigUInt64LE(BigInt(MOUNT_ATTR_IDMAP), 0);
    attr.writeBigUInt64LE(BigInt(usernsFd), 24);
    check(
      c.syscall(SYS_MOUNT_SETATTR, 'int', tree, 'str', '', 'uint', AT_EMPTY_PATH | AT_RECURSIVE, 'void *', attr, 'size_t', attr.length),
      'mount_setattr',
      source,
    );
    check(
      c.syscall(SYS_MOVE_MOUNT, 'int', tree, 'str', '', 'int', AT_FDCWD, 'str', target, 'uint', MOVE_MOUNT_F_EMPTY_PATH),
      'move_mount',
      `${source} to ${target}`,
    );
  } finally {
    c.close(tree);
  }
}

const MFD_CLOEXEC = 1;
const MFD_ALLOW_SEALING = 2;
const F_ADD_SEALS = 1033;
const F_GET_SEALS = 1034;
/** F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE: what crun (and runc) call a safe copy. */
export const EXEC_SEALS = 0x1 | 0x2 | 0x4 | 0x8;

/**
 * A sealed, close-on-exec memfd holding a copy of the executable `file` (no one can change it
 * afterwards, not even through /proc/<pid>/exe), for exec through /proc/<pid>/fd/<fd>.
 */
export function sealedCopy(file: string): number {
  const name = file.slice(file.lastIndexOf('/') + 1) || 'exe';
  const fd = check(c.memfdCreate(name, MFD_CLOEXEC | MFD_ALLOW_SEALING), 'memfd_create', file);
  try {
    const bytes = readFileSync(file);
    for (let done = 0; done < bytes.length;) done += writeSync(fd, bytes, done);
    check(c.fcntl(fd, F_ADD_SEALS, 'int', EXEC_SEALS), 'fcntl(F_ADD_SEALS)', file);
    return fd;
  } catch (err) {
    c.close(fd);
    throw err;
  }
}

/** The seals of a memfd (fcntl F_GET_SEALS), or undefined when `fd` is not one. */
export function sealsOf(fd: number): number | undefined {
  const seals = c.fcntl(fd, F_GET_SEALS);
  return seals < 0 ? undefined : seals;
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

const SYS_PIDFD_SEND_SIGNAL = 424;

/** pidfd_send_signal(2): signals the process a pidfd refers to (no pid reuse race). */
export function pidfdSendSignal(pidfd: number, signal: number): void {
  check(c.syscall(SYS_PIDFD_SEND_SIGNAL, 'int', pidfd, 'int', signal, 'void *', null, 'uint', 0), 'pidfd_send_signal', `pidfd ${pidfd}`);
}

const SYS_PIDFD_GETFD = 438;

/**
 * pidfd_getfd(2) (Linux 5.6+): a copy, in this process (close-on-exec), of descriptor `fd` of the
 * process `pidfd` refers to. Needs ptrace rights over it (root, or the same user without
 * restrictions).
 */
export function pidfdGetfd(pidfd: number, fd: number): number {
  return check(c.syscall(SYS_PIDFD_GETFD, 'int', pidfd, 'int', fd, 'uint', 0), 'pidfd_getfd', `fd ${fd} of pidfd ${pidfd}`);
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

/** open(2) flags used by dsec. */
export const O = { RDONLY: 0, NONBLOCK: 0o4000, DIRECTORY: 0o200000, NOFOLLOW: 0o400000, CLOEXEC: 0o2000000, PATH: 0o10000000, LARGEFILE: 0o100000 } as const;

/** open(2) of a path; returns the fd. */
export function openFd(path: string, flags: number): number {
  return check(c.open(path, flags, 0), 'open', path);
}

/** Moves a file offset to the end (SEEK_END); /dev/kmsg readers use it to skip old records. */
export function seekEnd(fd: number): void {
  const SEEK_END = 2;
  if (Number(c.lseek(fd, 0, SEEK_END)) < 0) throw new SyscallError('lseek', koffi.errno(), String(fd));
}

/** fanotify_init(2) and fanotify_mark(2) constants used by dsec. */
export const FAN = {
  CLASS_NOTIF: 0x0,
  CLOEXEC: 0x1,
  NONBLOCK: 0x2,
  REPORT_DFID_NAME: 0x00000c00,
  MARK_ADD: 0x1,
  MARK_REMOVE: 0x2,
  MARK_FILESYSTEM: 0x100,
  MODIFY: 0x2,
  CLOSE_WRITE: 0x8,
  ATTRIB: 0x4,
  MOVED_FROM: 0x40,
  MOVED_TO: 0x80,
  CREATE: 0x100,
  DELETE: 0x200,
  Q_OVERFLOW: 0x4000,
  ONDIR: 0x40000000,
} as const;

/** fanotify_init(2). */
export function fanotifyInit(flags: number, eventFlags: number): number {
  return check(c.fanotifyInit(flags, eventFlags), 'fanotify_init', String(flags));
}

/** fanotify_mark(2) on a path. */
export function fanotifyMark(fd: number, flags: number, mask: number, path: string): void {
  const AT_FDCWD = -100;
  check(c.fanotifyMark(fd, flags, BigInt(mask), AT_FDCWD, path), 'fanotify_mark', path);
}

/** open_by_handle_at(2) with O_PATH; -1 when the object is gone (ESTALE) or unreachable. */
export function openByHandle(mountFd: number, handle: Uint8Array): number {
  return c.openByHandleAt(mountFd, handle, O.PATH | O.CLOEXEC);
}

/** The file system id (statfs f_fsid) of the file system holding `path`, as 16 hex digits. */
export function fsidOf(path: string): string {
  const buf = Buffer.alloc(120);
  check(c.statfs(path, buf), 'statfs', path);
  return buf.subarray(56, 64).toString('hex');
}

const SYS_OPENAT2 = 437;
/** openat2(2) resolve flags: stay below the directory, follow no symlinks of any kind, cross no mounts. */
const RESOLVE_STRICT = 0x01 | 0x02 | 0x04 | 0x08;

/**
 * Opens `rel` below the directory `dirFd` without following any symlink (none in the path, and
 * none as the last component unless `flags` has O_PATH, which then opens the link itself), and
 * without leaving the directory's mount, and never blocking (always O_NONBLOCK: a FIFO swapped
 * in for a file opens at once instead of waiting for a writer; the caller checks what it got
 * with fstat). Returns the fd, or -errno. Used to read a sandbox's writable layer from the host:
 * the sandbox can change it at any moment, and a symlink or FIFO it plants must never lead the
 * host elsewhere or stall it.
 */
export function openBeneath(dirFd: number, rel: string | Buffer, flags: number): number {
  const how = Buffer.alloc(24);
  // openat2 refuses O_PATH with any flag but O_CLOEXEC, O_DIRECTORY and O_NOFOLLOW (and an
  // O_PATH open reads nothing, so it cannot block).
  const nonblock = flags & O.PATH ? 0 : O.NONBLOCK;
  how.writeBigUInt64LE(BigInt(flags | O.CLOEXEC | O.NOFOLLOW | nonblock), 0);
  how.writeBigUInt64LE(0n, 8);
  how.writeBigUInt64LE(BigInt(RESOLVE_STRICT), 16);
  const path = typeof rel === 'string' ? rel : Buffer.concat([rel, Buffer.from([0])]);
  const fd = Number(c.syscall(SYS_OPENAT2, 'int', dirFd, typeof path === 'string' ? 'const char *' : 'const void *', path, 'void *', how, 'size_t', 24));
  return fd < 0 ? -koffi.errno() : fd;
}

/** Reads an extended attribute of what `path` resolves to; null when it is not set. */
export function getxattr(path: string, name: string): string | null {
  const buf = Buffer.alloc(256);
  const n = Number(c.getxattr(path, name, buf, buf.length));
  if (n < 0) return null;
  return buf.subarray(0, n).toString();
}

/**
 * Opens a non-blocking netlink socket joined to the audit subsystem's read-only multicast group
 * (AUDIT_NLGRP_READLOG, CAP_AUDIT_READ): every audit record the kernel emits arrives here as one
 * datagram, whether or not an audit daemon runs, and without the kernel log's host-wide rate
 * limit. Its receive buffer is raised to `rcvbufBytes` (SO_RCVBUFFORCE, root; best effort).
 */
export function openAuditMulticast(rcvbufBytes = 8 * 1024 * 1024): number {
  const AF_NETLINK = 16;
  const SOCK_RAW = 3;
  const SOCK_NONBLOCK = 0o4000;
  const SOCK_CLOEXEC = 0o2000000;
  const NETLINK_AUDIT = 9;
  const AUDIT_NLGRP_READLOG = 1;
  const SOL_SOCKET = 1;
  const SO_RCVBUFFORCE = 33;
  const fd = check(c.socket(AF_NETLINK, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, NETLINK_AUDIT), 'socket', 'netlink audit');
  try {
    const size = Buffer.alloc(4);
    size.writeInt32LE(rcvbufBytes, 0);
    c.setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, size, 4);
    // struct sockaddr_nl: family u16, pad u16, pid u32, groups u32.
    const addr = Buffer.alloc(12);
    addr.writeUInt16LE(AF_NETLINK, 0);
    addr.writeUInt32LE(AUDIT_NLGRP_READLOG, 8);
    check(c.bind(fd, addr, addr.length), 'bind', 'netlink audit group');
  } catch (err) {
    c.close(fd);
    throw err;
  }
  return fd;
}
