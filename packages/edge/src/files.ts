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

/** Refuses a symbolic link's target that is empty, too long or holds NUL (field `target`). */
export function checkLinkTarget(target: string): void {
  if (target.length === 0 || target.length > 4096 || target.includes('\0')) throw invalidArgument('target', 'must be 1-4096 bytes without NUL');
}
