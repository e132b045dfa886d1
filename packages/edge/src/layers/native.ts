// The few calls the layer builder needs that Node does not expose: mknod(2) for overlayfs
// whiteouts (character device 0:0) and l{set,get}xattr(2) for opaque directories. Called
// through koffi, like sys/linux.ts, so that a tar full of whiteouts costs no child processes.
import { createRequire } from 'node:module';
import { DsecError } from '@dsec/protocol';

const require = createRequire(import.meta.url);
// eslint-disable-next-line @typescript-eslint/no-require-imports
const koffi = require('koffi') as KoffiModule;

interface KoffiModule {
  load(path: string): { func(signature: string): (...args: unknown[]) => number };
  errno(): number;
}

const libc = koffi.load('libc.so.6');
const c = {
  mknod: libc.func('int mknod(const char *path, uint32_t mode, uint64_t dev)'),
  lsetxattr: libc.func('int lsetxattr(const char *path, const char *name, const void *value, size_t size, int flags)'),
  lgetxattr: libc.func('intptr_t lgetxattr(const char *path, const char *name, _Out_ uint8_t *value, size_t size)'),
};

const S_IFCHR = 0o020000;
const ENODATA = 61;

/** The xattr that marks a directory opaque to the layers below it in an overlay. */
export const OVERLAY_OPAQUE_XATTR = 'trusted.overlay.opaque';

function fail(call: string, path: string): never {
  const errno = koffi.errno();
  throw new DsecError('INTERNAL', `${call}(${path}) failed: errno ${errno}`, { path, errno: String(errno) });
}

/** Creates an overlayfs whiteout (character device 0:0) at `path`. */
export function mkWhiteout(path: string): void {
  if (c.mknod(path, S_IFCHR | 0o000, 0) < 0) fail('mknod', path);
}

/** Sets an extended attribute on `path` itself (never on a symlink's target). */
export function lsetxattr(path: string, name: string, value: string): void {
  const buf = Buffer.from(value);
  if (c.lsetxattr(path, name, buf, buf.length, 0) < 0) fail('lsetxattr', path);
}

/** Reads an extended attribute of `path` itself; null when it is not set. */
export function lgetxattr(path: string, name: string): string | null {
  const buf = Buffer.alloc(4096);
  const n = c.lgetxattr(path, name, buf, buf.length);
  if (n < 0) {
    if (koffi.errno() === ENODATA) return null;
    fail('lgetxattr', path);
  }
  return buf.subarray(0, n).toString();
}
