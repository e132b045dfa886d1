// What a sandbox changed against its layers, read on the host from its writable layer: the
// upper directory holds every file it added or changed, a whiteout (a 0:0 character device) for
// every path it deleted, and an opaque directory for every directory it deleted and made again.
// Whether a path was added or changed depends on whether a layer has it, which is read from the
// node's (read-only) layer mounts, whiteouts and opaque directories of the layers included.
// The sandbox may be changing its upper directory while it is read: every open goes through
// openat2 below a directory fd without following any symlink, so nothing the sandbox plants can
// lead the host's reads outside its own files.
import { fstatSync, readlinkSync } from 'node:fs';
import type { Stats } from 'node:fs';
import { lstat, readdir } from 'node:fs/promises';
import { DEFAULT_DIFF_PAGE, MAX_HASH_BYTES, invalidArgument } from '@dsec/protocol';
import type { DiffEntry, DiffResult, VerifyItem } from '@dsec/protocol';
import type { IdRange } from './host/id-ranges.js';
import { readPool } from './host/read-pool.js';
import { closeFd, getxattr, O, OVERLAY_OPAQUE_XATTR, openBeneath, openFd } from './sys/linux.js';

/** Bytes hashed in one diff or verify call at most; files past it are listed unhashed. */
export const HASH_BUDGET_BYTES = 1024 * 1024 * 1024;
/** Entries of the writable layer visited in one diff call at most. */
export const MAX_DIFF_VISITS = 2_000_000;

/**
 * Mount points the runtime makes in the root (chronus's bind mount, /proc, /sys, /dev): what
 * the upper directory holds there is the platform's, never the sandbox's.
 */
export const PLATFORM_MOUNT_POINTS = ['/.dsec', '/proc', '/sys', '/dev'];

const ENOENT = 2;
/** Why a path was not read: what is there now is not a regular file (a FIFO, socket or device). */
const CHANGED = 'changed while it was read';
const NOT_REGULAR = 'not a regular file (a FIFO, socket or device is never opened for reading)';

/** A sandbox's file system as the host holds it. */
export interface SandboxLayersView {
  /** Host path of the upper directory. */
  upper: string;
  /** Host paths of the layer mounts, topmost first. */
  lowers: string[];
  /** The sandbox's user namespace: host ids are shifted back to the ids it sees. */
  idRange?: IdRange;
}

/** Options of {@link diffLayers}. */
export interface DiffLayersOptions {
  paths?: string[];
  hash?: boolean;
  limit?: number;
  cursor?: string;
  /** Whether the sandbox is frozen while this runs (reported back). */
  frozen?: boolean;
}

function typeOf(st: Stats): DiffEntry['type'] {
  if (st.isFile()) return 'file';
  if (st.isDirectory()) return 'dir';
  if (st.isSymbolicLink()) return 'symlink';
  return 'other';
}

function isWhiteout(st: Stats): boolean {
  return st.isCharacterDevice() && st.rdev === 0;
}

/** Components of an absolute path (`/` has none). */
function components(p: string): string[] {
  return p === '/' ? [] : p.slice(1).split('/');
}

/** Order of a depth-first walk with sorted names: a directory, then everything below it. */
export function comparePaths(a: string, b: string): number {
  const ca = components(a);
  const cb = components(b);
  for (let i = 0; i < Math.min(ca.length, cb.length); i++) {
    const x = ca[i] as string;
    const y = cb[i] as string;
    if (x !== y) return x < y ? -1 : 1;
  }
  return ca.length - cb.length;
}

function isAtOrBelow(p: string, dir: string): boolean {
  return dir === '/' || p === dir || p.startsWith(dir + '/');
}

function join(dir: string, name: string): string {
  return dir === '/' ? `/${name}` : `${dir}/${name}`;
}

/** Opens the roots of a view; every read below goes through these fds. */
class OpenView {
  readonly upperFd: number;
  readonly lowerFds: number[] = [];
  hashedBytes = 0;

  /** `signal` stops a hash between its chunks (and the walks that use this view between entries). */
  constructor(
    readonly view: SandboxLayersView,
    readonly signal?: AbortSignal,
  ) {
    this.upperFd = openFd(view.upper, O.RDONLY | O.DIRECTORY | O.CLOEXEC);
    try {
      for (const l of view.lowers) this.lowerFds.push(openFd(l, O.RDONLY | O.DIRECTORY | O.CLOEXEC));
    } catch (err) {
      this.close();
      throw err;
    }
  }

  close(): void {
    closeFd(this.upperFd);
    for (const fd of this.lowerFds) closeFd(fd);
  }

  /** A host id as the sandbox sees it. */
  insideId(id: number): number {
    const r = this.view.idRange;
    return r && id >= r.uid && id < r.uid + r.size ? id - r.uid : id;
  }

  /** lstat of `rel` below a root fd; undefined when absent or not reachable without a symlink. */
  statBeneath(rootFd: number, rel: string): { st: Stats; opaque: boolean } | { errno: number } {
    const fd = openBeneath(rootFd, rel, O.PATH);
    if (fd < 0) return { errno: -fd };
    try {
      const st = fstatSync(fd);
      const opaque = st.isDirectory() && getxattr(`/proc/self/fd/${fd}`, OVERLAY_OPAQUE_XATTR) === 'y';
      return { st, opaque };
    } finally {
      closeFd(fd);
    }
  }

  /**
   * The layers' view of a path: the topmost layer holding it and its lstat, or undefined when
   * no layer has it (or a layer above deleted it, or hid it below an opaque directory, a file or
   * a symlink).
   */
  inLayers(p: string): { layer: number; st: Stats } | undefined {
    const rel = p.slice(1);
    const comps = components(p);
    for (let i = 0; i < this.lowerFds.length; i++) {
      const fd = this.lowerFds[i] as number;
      const found = this.statBeneath(fd, rel);
      if ('st' in found) return isWhiteout(found.st) ? undefined : { layer: i, st: found.st };
      if (found.errno !== ENOENT) return undefined;
      // Absent here: does this layer hide the path from the layers below?
      for (let k = 1; k < comps.length; k++) {
        const above = this.statBeneath(fd, comps.slice(0, k).join('/'));
        if ('errno' in above) {
          if (above.errno === ENOENT) break;
          return undefined;
        }
        if (!above.st.isDirectory() || above.opaque) return undefined;
      }
    }
    return undefined;
  }

  /**
   * sha256 of a regular file opened below a root fd, within the per-file and per-call limits.
   * The open never blocks (O_NONBLOCK: a FIFO swapped in is not waited on) and what it opened
   * must be a regular file (fstat); the reading and hashing run in the host-read pool.
   */
  async hash(rootFd: number, rel: string | Buffer, size: number): Promise<{ sha256?: string; skipped?: string }> {
    if (size > MAX_HASH_BYTES) return { skipped: `larger than ${MAX_HASH_BYTES} bytes` };
    if (this.hashedBytes + size > HASH_BUDGET_BYTES) return { skipped: `this call's hashing budget of ${HASH_BUDGET_BYTES} bytes is spent` };
    const fd = openBeneath(rootFd, rel, O.RDONLY);
    if (fd < 0) return { skipped: CHANGED };
    try {
      if (!fstatSync(fd).isFile()) return { skipped: NOT_REGULAR };
      const r = await readPool().hashFd(fd, MAX_HASH_BYTES, this.signal);
      if (r.tooLarge || r.sha256 === undefined) return { skipped: `larger than ${MAX_HASH_BYTES} bytes` };
      this.hashedBytes += r.bytes;
      return { sha256: r.sha256 };
    } finally {
      closeFd(fd);
    }
  }
}

/** Lists what a sandbox added, changed and deleted against its layers, a page at a time; an abort of `signal` stops the walk between entries. */
export async function diffLayers(view: SandboxLayersView, opts: DiffLayersOptions = {}, signal?: AbortSignal): Promise<DiffResult> {
  signal?.throwIfAborted();
  const limit = opts.limit ?? DEFAULT_DIFF_PAGE;
  const hashing = opts.hash !== false;
  const filters = opts.paths && opts.paths.length > 0 ? opts.paths : undefined;
  let cursor: string | undefined;
  if (opts.cursor !== undefined) {
    cursor = Buffer.from(opts.cursor, 'base64url').toString('utf8');
    if (!cursor.startsWith('/')) throw invalidArgument('cursor', 'not a cursor from this API');
  }
  const v = new OpenView(view, signal);
  const entries: DiffEntry[] = [];
  let more = false;
  let visits = 0;

  const wanted = (p: string): boolean => !filters || filters.some((f) => isAtOrBelow(p, f));
  const worthDescending = (p: string): boolean => !filters || filters.some((f) => isAtOrBelow(p, f) || isAtOrBelow(f, p));
  const push = (e: DiffEntry): boolean => {
    if (!wanted(e.path)) return true;
    if (cursor !== undefined && comparePaths(e.path, cursor) <= 0) return true;
    if (entries.length >= limit) {
      more = true;
      return false;
    }
    entries.push(e);
    return true;
  };
  const meta = (st: Stats): Pick<DiffEntry, 'mode' | 'uid' | 'gid'> => ({ mode: st.mode & 0o7777, uid: v.insideId(st.uid), gid: v.insideId(st.gid) });

  // Walks one upper directory (already opened as dirFd); `fresh`: nothing below comes from the layers.
  const walk = async (dirFd: number, dir: string, fresh: boolean): Promise<boolean> => {
    // Names as bytes: a name that is not UTF-8 is still found (and listed, lossily named).
    const raw = await readdir(`/proc/self/fd/${dirFd}`, { encoding: 'buffer' });
    const named = raw.map((b) => ({ b, s: b.toString('utf8') })).sort((x, y) => (x.s < y.s ? -1 : x.s > y.s ? 1 : Buffer.compare(x.b, y.b)));
    for (const { b: nameBytes, s: name } of named) {
      signal?.throwIfAborted();
      if (++visits > MAX_DIFF_VISITS) throw invalidArgument('paths', `more than ${MAX_DIFF_VISITS} entries to walk; narrow the diff with paths`);
      const p = join(dir, name);
      const hostPath = Buffer.concat([Buffer.from(`/proc/self/fd/${dirFd}/`), nameBytes]);
      // Everything at or below p comes before the cursor: skip the subtree.
      if (cursor !== undefined && comparePaths(p, cursor) < 0 && !isAtOrBelow(cursor, p)) continue;
      if (!worthDescending(p) || PLATFORM_MOUNT_POINTS.includes(p)) continue;
      let st: Stats;
      try {
        st = await lstat(hostPath);
      } catch {
        continue; // removed meanwhile
      }
      const lower = fresh ? undefined : v.inLayers(p);
      if (isWhiteout(st)) {
        if (lower && !push({ path: p, change: 'deleted', type: typeOf(lower.st) })) return false;
        continue;
      }
      if (st.isDirectory()) {
        const fd = openBeneath(dirFd, nameBytes, O.RDONLY | O.DIRECTORY);
        if (fd < 0) continue;
        try {
          const opaque = getxattr(`/proc/self/fd/${fd}`, OVERLAY_OPAQUE_XATTR) === 'y';
          const lowerDir = lower?.st.isDirectory() === true;
          if (!lower) {
            if (!push({ path: p, change: 'added', type: 'dir', ...meta(st) })) return false;
          } else if (!lowerDir || opaque) {
            if (!push({ path: p, change: 'replaced', type: 'dir', ...meta(st) })) return false;
          } else {
            const m = meta(st);
            // A directory copied up only because something below it changed is not a change.
            if (
              (m.mode !== (lower.st.mode & 0o7777) || m.uid !== lower.st.uid || m.gid !== lower.st.gid) &&
              !push({ path: p, change: 'changed', type: 'dir', ...m })
            )
              return false;
          }
          if (!(await walk(fd, p, fresh || !lowerDir || opaque))) return false;
        } finally {
          closeFd(fd);
        }
        continue;
      }
      const type = typeOf(st);
      const e: DiffEntry = { path: p, change: !lower ? 'added' : typeOf(lower.st) !== type ? 'replaced' : 'changed', type, ...meta(st), size: st.size };
      if (type === 'symlink') {
        try {
          e.linkTarget = readlinkSync(hostPath, 'utf8');
        } catch {
          // removed meanwhile
        }
      }
      const listed = !wanted(p) || (cursor !== undefined && comparePaths(p, cursor) <= 0) ? false : entries.length < limit;
      if (hashing && type === 'file' && listed) {
        const h = await v.hash(dirFd, nameBytes, st.size);
        if (h.sha256) e.sha256 = h.sha256;
        if (h.skipped) e.hashSkipped = h.skipped;
        if (e.change === 'changed' && h.sha256 && lower) {
          if (lower.st.size !== st.size) e.contentChanged = true;
          else {
            const lh = await v.hash(v.lowerFds[lower.layer] as number, p.slice(1), lower.st.size);
            if (lh.sha256) e.contentChanged = lh.sha256 !== h.sha256;
          }
        }
      }
      if (!push(e)) return false;
    }
    return true;
  };

  try {
    await walk(v.upperFd, '/', false);
  } finally {
    v.close();
  }
  const last = entries[entries.length - 1];
  return { entries, nextCursor: more && last ? Buffer.from(last.path).toString('base64url') : null, frozen: opts.frozen === true };
}

/** Checks that each path holds a regular file with the expected sha256 (graders' integrity check); an abort of `signal` stops it between paths. */
export async function verifyLayers(
  view: SandboxLayersView,
  expected: Record<string, string>,
  signal?: AbortSignal,
): Promise<{ ok: boolean; results: VerifyItem[] }> {
  signal?.throwIfAborted();
  const v = new OpenView(view, signal);
  const results: VerifyItem[] = [];
  try {
    for (const [p, want] of Object.entries(expected)) {
      signal?.throwIfAborted();
      const item: VerifyItem = { path: p, expected: want, actual: null, ok: false };
      results.push(item);
      const found = locate(v, p);
      if ('reason' in found) {
        item.reason = found.reason;
        continue;
      }
      item.source = found.rootFd === v.upperFd ? 'upper' : 'layers';
      if (!found.st.isFile()) {
        item.reason = found.st.isSymbolicLink() ? 'symlink-in-path' : 'not-a-file';
        continue;
      }
      const h = await v.hash(found.rootFd, p.slice(1), found.st.size);
      if (!h.sha256) {
        item.reason = h.skipped === NOT_REGULAR || h.skipped === CHANGED ? 'not-a-file' : 'too-large';
        continue;
      }
      item.actual = h.sha256;
      item.ok = h.sha256 === want;
      if (!item.ok) item.reason = 'mismatch';
    }
  } finally {
    v.close();
  }
  return { ok: results.every((r) => r.ok), results };
}

/** Where the sandbox's view of `p` comes from: its upper directory or a layer (no symlinks followed). */
function locate(v: OpenView, p: string): { rootFd: number; st: Stats } | { reason: string } {
  if (p === '/') return { reason: 'not-a-file' };
  const comps = components(p);
  // The upper directory first: a whiteout deletes, an opaque directory hides the layers below.
  let hidden = false;
  for (let k = 1; k <= comps.length; k++) {
    const found = v.statBeneath(v.upperFd, comps.slice(0, k).join('/'));
    if ('errno' in found) {
      if (found.errno === ENOENT) break;
      return { reason: found.errno === 40 || found.errno === 18 ? 'symlink-in-path' : 'missing' };
    }
    if (isWhiteout(found.st)) return { reason: 'missing' };
    if (k === comps.length) return { rootFd: v.upperFd, st: found.st };
    if (found.st.isSymbolicLink()) return { reason: 'symlink-in-path' };
    if (!found.st.isDirectory()) return { reason: 'missing' };
    hidden ||= found.opaque;
  }
  if (hidden) return { reason: 'missing' };
  const lower = v.inLayers(p);
  if (!lower) {
    // A symlink above it in a layer means the sandbox sees it somewhere else.
    for (let k = 1; k < comps.length; k++) {
      const above = v.inLayers('/' + comps.slice(0, k).join('/'));
      if (above?.st.isSymbolicLink()) return { reason: 'symlink-in-path' };
    }
    return { reason: 'missing' };
  }
  return { rootFd: v.lowerFds[lower.layer] as number, st: lower.st };
}
