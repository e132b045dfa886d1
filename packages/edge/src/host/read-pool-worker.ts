// A thread of the host-read pool (read-pool.ts): hashes, tree counts and digests of data a
// sandbox controls, done with synchronous reads so that the node's event loop never waits on
// them. Every fd it is given was opened (non-blocking, checked with fstat) by the main thread,
// which closes it only after the task settled. A walk opens each entry below the fd of its
// directory through /proc/self/fd/N/<name> with O_NOFOLLOW: a name never holds a slash, so the
// only component looked up is the last, and a symlink there is refused, never followed.
import { createHash } from 'node:crypto';
import { closeSync, constants, fstatSync, lstatSync, openSync, readSync, readdirSync } from 'node:fs';
import { parentPort } from 'node:worker_threads';
import type { ReadTask } from './read-pool.js';

const CHUNK_BYTES = 1024 * 1024;
const DIR_FLAGS = constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW | constants.O_NONBLOCK;
const FILE_FLAGS = constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK;
/** Deepest directory a count walks into (each level holds an fd while below it). */
const MAX_DEPTH = 4096;

function hashFd(fd: number, maxBytes: number): { sha256?: string; bytes: number; tooLarge?: boolean } {
  const h = createHash('sha256');
  const buf = Buffer.allocUnsafe(CHUNK_BYTES);
  let bytes = 0;
  for (;;) {
    const n = readSync(fd, buf, 0, buf.length, null);
    if (n === 0) break;
    bytes += n;
    if (bytes > maxBytes) return { bytes, tooLarge: true };
    h.update(buf.subarray(0, n));
  }
  return { sha256: h.digest('hex'), bytes };
}

function hashFiles(paths: string[]): string {
  const h = createHash('sha256');
  const buf = Buffer.allocUnsafe(CHUNK_BYTES);
  for (const p of paths) {
    const fd = openSync(p, FILE_FLAGS);
    try {
      if (!fstatSync(fd).isFile()) throw new Error(`${p}: not a regular file`);
      for (;;) {
        const n = readSync(fd, buf, 0, buf.length, null);
        if (n === 0) break;
        h.update(buf.subarray(0, n));
      }
    } finally {
      closeSync(fd);
    }
  }
  return h.digest('hex');
}

/** Entries below `root` and bytes of regular-file content (hard links once), no symlink followed. */
function countTree(root: string): { files: number; contentBytes: number } {
  let files = 0;
  let contentBytes = 0;
  const seen = new Set<string>();
  const walk = (dirFd: number, depth: number): void => {
    if (depth > MAX_DEPTH) throw new Error(`deeper than ${MAX_DEPTH} directories`);
    const base = `/proc/self/fd/${dirFd}/`;
    for (const ent of readdirSync(base, { withFileTypes: true, encoding: 'buffer' })) {
      files++;
      const at = Buffer.concat([Buffer.from(base), ent.name]);
      if (ent.isDirectory()) {
        let fd: number;
        try {
          fd = openSync(at, DIR_FLAGS);
        } catch {
          continue; // replaced meanwhile: counted, not entered
        }
        try {
          walk(fd, depth + 1);
        } finally {
          closeSync(fd);
        }
      } else if (ent.isFile()) {
        let st;
        try {
          st = lstatSync(at);
        } catch {
          continue;
        }
        if (!st.isFile()) continue;
        if (st.nlink > 1) {
          const key = `${st.dev}:${st.ino}`;
          if (seen.has(key)) continue;
          seen.add(key);
        }
        contentBytes += st.size;
      }
    }
  };
  const fd = openSync(root, DIR_FLAGS);
  try {
    walk(fd, 0);
  } finally {
    closeSync(fd);
  }
  return { files, contentBytes };
}

function run(task: ReadTask): unknown {
  switch (task.op) {
    case 'hash-fd':
      return hashFd(task.fd, task.maxBytes);
    case 'hash-files':
      return hashFiles(task.paths);
    case 'count-tree':
      return countTree(task.root);
    case 'sleep': {
      const until = Date.now() + task.ms;
      while (Date.now() < until) {
        // busy: a test's stand-in for a task that overruns its deadline
      }
      return null;
    }
  }
}

parentPort?.on('message', (msg: { id: number; task: ReadTask }) => {
  try {
    parentPort?.postMessage({ id: msg.id, ok: true, value: run(msg.task) });
  } catch (err) {
    parentPort?.postMessage({ id: msg.id, ok: false, message: (err as Error).message, code: (err as NodeJS.ErrnoException).code });
  }
});
