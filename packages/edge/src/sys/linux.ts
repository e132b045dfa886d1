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
  syscall: libc.func('long syscall(long number, ...)'),
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
    check(c.syscall(SYS_MOUNT_SETATTR, 'int', tree, 'str', '', 'uint', AT_EMPTY_PATH | AT_RECURSIVE, 'void *', attr, 'size_t', attr.length), 'mount_setattr', source);
    check(c.syscall(SYS_MOVE_MOUNT, 'int', tree, 'str', '', 'int', AT_FDCWD, 'str', target, 'uint', MOVE_MOUNT_F_EMPTY_PATH), 'move_mount', `${source} to ${target}`);
  } finally {
    c.close(tree);
  }
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
