// Watches the writable layers of sandboxes with watched paths. Every change a sandbox makes to
// its file system lands in its upper directory, on a tmpfs of its own mounted on the host: one
// fanotify filesystem mark per watched sandbox sees every create, write, attribute change,
// rename and delete there (overlayfs's copy-ups included), with the directory and name of the
// entry, whatever process inside did it. The sandbox cannot see or remove the mark.
import { fstatSync, readSync, readlinkSync } from 'node:fs';
import { closeFd, FAN, fanotifyInit, fanotifyMark, fsidOf, O, openBeneath, openByHandle, openFd } from '../sys/linux.js';

/** A change under a watched path. */
export interface WatchHit {
  sandboxId: string;
  /** The path inside the sandbox that changed. */
  path: string;
  /** The watched path it is, or is under (or above, for a rename or delete of a parent). */
  watched: string;
  /** What happened: create, write, attrib, delete, rename. */
  op: string;
  /** Host pid of the process that did it. */
  pid: number;
}

/** Events watched in each marked file system. */
const MASK = FAN.CREATE | FAN.MODIFY | FAN.CLOSE_WRITE | FAN.ATTRIB | FAN.DELETE | FAN.MOVED_FROM | FAN.MOVED_TO | FAN.ONDIR;
const EVENT_BUF_BYTES = 64 * 1024;
/** fanotify_event_metadata: event_len u32, vers u8, reserved u8, metadata_len u16, mask u64, fd s32, pid s32. */
const META_BYTES = 24;
const FAN_EVENT_INFO_TYPE_DFID_NAME = 2;
const DELETE_LIKE = FAN.DELETE | FAN.MOVED_FROM;
const CREATE_LIKE = FAN.CREATE | FAN.MOVED_TO;

interface Marked {
  sandboxId: string;
  rw: string;
  upperPrefix: string;
  mountFd: number;
  watch: string[];
}

/**
 * True when the upper directory holds a whiteout (a 0:0 character device: a deletion) at `rel`,
 * looked up below the writable layer's fd without following any symlink (O_PATH: nothing is
 * opened for reading, nothing can block).
 */
function isWhiteout(rwFd: number, rel: string): boolean {
  const fd = openBeneath(rwFd, rel, O.PATH);
  if (fd < 0) return false;
  try {
    const st = fstatSync(fd);
    return st.isCharacterDevice() && st.rdev === 0;
  } catch {
    return false;
  } finally {
    closeFd(fd);
  }
}

function opOf(mask: number): string {
  if (mask & FAN.DELETE) return 'delete';
  if (mask & (FAN.MOVED_FROM | FAN.MOVED_TO)) return 'rename';
  if (mask & FAN.CREATE) return 'create';
  if (mask & (FAN.MODIFY | FAN.CLOSE_WRITE)) return 'write';
  return 'attrib';
}

/** One fanotify group for the node; a filesystem mark per watched sandbox. */
export class UpperWatcher {
  private readonly byFsid = new Map<string, Marked>();
  private readonly byId = new Map<string, string>();
  private readonly buf = Buffer.alloc(EVENT_BUF_BYTES);
  private fd = -1;
  /** Set when the kernel's queue overflowed: changes were lost. */
  overflowed = false;

  /** Starts watching a sandbox's writable layer (`rw` holds `upper/`) for changes to `paths`. */
  add(sandboxId: string, rw: string, paths: string[]): void {
    if (paths.length === 0 || this.byId.has(sandboxId)) return;
    if (this.fd < 0) this.fd = fanotifyInit(FAN.CLASS_NOTIF | FAN.REPORT_DFID_NAME | FAN.NONBLOCK | FAN.CLOEXEC, O.RDONLY | O.LARGEFILE);
    const fsid = fsidOf(rw);
    const mountFd = openFd(rw, O.RDONLY | O.DIRECTORY | O.CLOEXEC);
    try {
      fanotifyMark(this.fd, FAN.MARK_ADD | FAN.MARK_FILESYSTEM, MASK, rw);
    } catch (err) {
      closeFd(mountFd);
      throw err;
    }
    this.byFsid.set(fsid, { sandboxId, rw, upperPrefix: `${rw}/upper`, mountFd, watch: paths });
    this.byId.set(sandboxId, fsid);
  }

  /** Stops watching a sandbox (before its writable layer is unmounted). */
  remove(sandboxId: string): void {
    const fsid = this.byId.get(sandboxId);
    if (fsid === undefined) return;
    const m = this.byFsid.get(fsid);
    this.byId.delete(sandboxId);
    this.byFsid.delete(fsid);
    if (!m) return;
    try {
      fanotifyMark(this.fd, FAN.MARK_REMOVE | FAN.MARK_FILESYSTEM, MASK, m.rw);
    } catch {
      // already gone with its file system
    }
    closeFd(m.mountFd);
  }

  /** Sandboxes being watched. */
  get size(): number {
    return this.byId.size;
  }

  /** Reads queued events (never blocks) and returns the ones that touch watched paths. */
  drain(maxEvents: number): WatchHit[] {
    const hits: WatchHit[] = [];
    let seen = 0;
    while (this.fd >= 0 && seen < maxEvents) {
      let n: number;
      try {
        n = readSync(this.fd, this.buf, 0, this.buf.length, null);
      } catch {
        break; // EAGAIN
      }
      if (n <= 0) break;
      for (let off = 0; off + META_BYTES <= n;) {
        const len = this.buf.readUInt32LE(off);
        if (len < META_BYTES || off + len > n) break;
        seen++;
        const mask = Number(this.buf.readBigUInt64LE(off + 8));
        const pid = this.buf.readInt32LE(off + 20);
        if (mask & FAN.Q_OVERFLOW) this.overflowed = true;
        else this.decode(this.buf.subarray(off + this.buf.readUInt16LE(off + 6), off + len), mask, pid, hits);
        off += len;
      }
    }
    return hits;
  }

  /** Decodes one event's DFID_NAME record into a hit when it concerns a watched path. */
  private decode(info: Buffer, mask: number, pid: number, hits: WatchHit[]): void {
    // fanotify_event_info_fid: info_type u8, pad u8, len u16, fsid 8 bytes, then a
    // file_handle (handle_bytes u32, handle_type s32, f_handle[handle_bytes]) and the name.
    if (info.length < 20 || info[0] !== FAN_EVENT_INFO_TYPE_DFID_NAME) return;
    const m = this.byFsid.get(info.subarray(4, 12).toString('hex'));
    if (!m) return;
    const handleBytes = info.readUInt32LE(12);
    const handleEnd = 20 + handleBytes;
    if (handleEnd > info.length) return;
    const nul = info.indexOf(0, handleEnd);
    const name = info.toString('utf8', handleEnd, nul < 0 ? info.length : nul);
    const dirFd = openByHandle(m.mountFd, info.subarray(12, handleEnd));
    if (dirFd < 0) return; // the directory is already gone
    let dir: string;
    try {
      dir = readlinkSync(`/proc/self/fd/${dirFd}`);
    } catch {
      return;
    } finally {
      closeFd(dirFd);
    }
    // Changes in overlayfs's work directory are copy-ups in progress; they arrive in upper/.
    if (dir !== m.upperPrefix && !dir.startsWith(m.upperPrefix + '/')) return;
    const parent = dir.slice(m.upperPrefix.length) || '/';
    const path = name === '.' || name === '' ? parent : parent === '/' ? `/${name}` : `${parent}/${name}`;
    for (const w of m.watch) {
      const inside = path === w || path.startsWith(w + '/');
      // A parent renamed, deleted or replaced by a file (a whiteout is a character device)
      // takes the watched path with it; a parent created or copied up leaves it alone.
      const replaced = (mask & DELETE_LIKE) !== 0 || ((mask & CREATE_LIKE) !== 0 && (mask & FAN.ONDIR) === 0);
      const above = replaced && w.startsWith(path === '/' ? '/' : path + '/');
      if (inside || above) {
        hits.push({ sandboxId: m.sandboxId, path, watched: w, op: isWhiteout(m.mountFd, `upper${path === '/' ? '' : path}`) ? 'delete' : opOf(mask), pid });
        return;
      }
    }
  }

  /** Stops every watch. */
  close(): void {
    for (const id of [...this.byId.keys()]) this.remove(id);
    if (this.fd >= 0) closeFd(this.fd);
    this.fd = -1;
  }
}
