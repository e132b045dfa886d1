// The checks of paths the node's file operations take (the agent resolves them in the sandbox).
import { invalidArgument } from '@dsec/protocol';

/** Largest file read in one call. */
export const MAX_FILE_READ_BYTES = 256 * 1024 * 1024;

/** Refuses a path that is not absolute, too long or holds NUL (field `path`). */
export function checkPath(p: string): void {
  if (typeof p !== 'string' || !p.startsWith('/') || p.length > 4096 || p.includes('\0')) {
    throw invalidArgument('path', 'must be an absolute path of at most 4096 bytes without NUL');
  }
}

/** Most paths one `xattrs` call reads. */
export const MAX_XATTR_PATHS = 10_000;
/** Most bytes of names and values one `xattrs` call sets. */
export const MAX_XATTR_SET_BYTES = 65_536;
const XATTR_PREFIX = /^user\.[A-Za-z0-9._-]{0,58}$/;

/** Refuses an extended-attribute request outside the `user.` namespace or over the bounds. */
export function checkXattrs(paths: string[], prefix: string, replace?: Record<string, string>): void {
  if (paths.length > MAX_XATTR_PATHS) throw invalidArgument('paths', `at most ${MAX_XATTR_PATHS}`);
  for (const p of paths) checkPath(p);
  if (!XATTR_PREFIX.test(prefix)) throw invalidArgument('prefix', 'must be user.<letters, digits, ".", "_", "-"> (at most 63 bytes)');
  if (!replace) return;
  if (paths.length !== 1) throw invalidArgument('paths', 'replacing attributes takes exactly one path');
  let bytes = 0;
  for (const [name, value] of Object.entries(replace)) {
    if (name.length === 0 || name.includes('\0') || Buffer.byteLength(prefix + name) > 255)
      throw invalidArgument('replace', `name ${JSON.stringify(name)} is empty, holds NUL or is too long`);
    bytes += Buffer.byteLength(name) + Buffer.byteLength(value);
  }
  if (bytes > MAX_XATTR_SET_BYTES) throw invalidArgument('replace', `at most ${MAX_XATTR_SET_BYTES} bytes of names and values`);
}

/** Refuses a symbolic link's target that is empty, too long or holds NUL (field `target`). */
export function checkLinkTarget(target: string): void {
  if (target.length === 0 || target.length > 4096 || target.includes('\0')) throw invalidArgument('target', 'must be 1-4096 bytes without NUL');
}
