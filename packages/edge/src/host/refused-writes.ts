// Reads what the servers of container sandboxes' read-only protected paths (chronus/rofs/dsec-rofs)
// refused: each sandbox's log holds one line "<op> <path>" per refused change, the path escaped
// as \ooo where it holds a byte below 0x21, 0x7f or '\', and at most one "overflow" line (the
// server's cap was reached). The log is a local file the sandbox cannot reach: reading it never
// waits on the sandbox. How far a log was raised is kept beside it (`<log>.offset`, written after
// each drain that read some), and an edge that restarts reads on from there.
import { closeSync, fstatSync, openSync, readFileSync, readSync, renameSync, writeFileSync } from 'node:fs';

/** A change to a read-only protected path that its server refused. */
export interface RefusedWrite {
  sandboxId: string;
  /** The path inside the sandbox. */
  path: string;
  /** What was tried: open-write, create, truncate, setattr, unlink, rmdir, mkdir, mknod, symlink, link, rename, setxattr, removexattr. */
  op: string;
}

/** One parsed log line: a refused change, or the server's note that it stopped logging. */
export type RefusedWriteLine = { op: string; path: string } | { overflow: true };

/** Parses one line of a refusal log; undefined for a line that is neither form. */
export function parseRefusedWriteLine(line: string): RefusedWriteLine | undefined {
  if (line === 'overflow') return { overflow: true };
  const space = line.indexOf(' ');
  if (space <= 0 || line[space + 1] !== '/') return undefined;
  const path = line.slice(space + 1).replace(/\\([0-7]{3})/g, (_, oct: string) => String.fromCharCode(parseInt(oct, 8)));
  return { op: line.slice(0, space), path };
}

interface Followed {
  fd: number;
  /** The log's file (its offset is kept in `<file>.offset`). */
  file: string;
  /** Where the next unread line starts. */
  offset: number;
}

/** Bytes read from one log per drain at most (a line is at most ~12 KiB). */
const READ_BYTES = 64 * 1024;

/** The file beside a log that holds how far it was raised. */
function offsetFile(log: string): string {
  return `${log}.offset`;
}

/** Writes how far `log` was raised (a new file renamed over the old: never half written). */
function saveOffset(log: string, offset: number): void {
  const file = offsetFile(log);
  writeFileSync(`${file}.new`, `${offset}\n`, { mode: 0o600 });
  renameSync(`${file}.new`, file);
}

/** How far `log` was raised by an edge before, if that is known and lies within its `size`. */
function savedOffset(log: string, size: number): number | undefined {
  let text: string;
  try {
    text = readFileSync(offsetFile(log), 'utf8');
  } catch {
    return undefined;
  }
  const offset = Number(text.trim());
  return Number.isSafeInteger(offset) && offset >= 0 && offset <= size ? offset : undefined;
}

/**
 * The refusal logs of the node's sandboxes. Each drain starts at the next log in turn and reads
 * at most an even share of its budget from each, so that a log that floods cannot hold back the
 * others' refusals.
 */
export class RefusedWriteLogs {
  private readonly logs = new Map<string, Followed>();
  private readonly overflowed = new Set<string>();
  /** The log the next drain starts at (its place in the Map's order). */
  private next = 0;

  get size(): number {
    return this.logs.size;
  }

  /**
   * Follows `file` for `sandboxId` from its start (a new sandbox), or (an adopted one) from where
   * the previous edge raised it to, or from its current end when that is not known (a log of an
   * edge that kept no offset). A missing log (a sandbox launched before its paths were served) is
   * skipped: its paths are plain read-only binds with nothing to read.
   */
  add(sandboxId: string, file: string, fromStart: boolean): void {
    this.remove(sandboxId);
    let fd: number;
    try {
      fd = openSync(file, 'r');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT' && !fromStart) return;
      throw err;
    }
    try {
      const offset = fromStart ? 0 : (savedOffset(file, fstatSync(fd).size) ?? fstatSync(fd).size);
      if (fromStart) saveOffset(file, 0);
      this.logs.set(sandboxId, { fd, file, offset });
    } catch (err) {
      closeSync(fd);
      throw err;
    }
  }

  /** Stops following a sandbox's log. */
  remove(sandboxId: string): void {
    const f = this.logs.get(sandboxId);
    if (!f) return;
    closeSync(f.fd);
    this.logs.delete(sandboxId);
    this.overflowed.delete(sandboxId);
  }

  /** The refusals logged since the last drain (at most `max`), and the sandboxes whose logs overflowed now. */
  drain(max: number): { refused: RefusedWrite[]; overflowed: string[] } {
    const refused: RefusedWrite[] = [];
    const overflowed: string[] = [];
    const followed = [...this.logs];
    if (followed.length === 0) return { refused, overflowed };
    const share = Math.max(1, Math.ceil(max / followed.length));
    const buf = Buffer.allocUnsafe(READ_BYTES);
    const start = this.next % followed.length;
    this.next = start + 1;
    for (let i = 0; i < followed.length && refused.length < max; i++) {
      const [sandboxId, f] = followed[(start + i) % followed.length]!;
      const taken = this.read(sandboxId, f, buf, Math.min(share, max - refused.length));
      if (!taken) continue;
      refused.push(...taken.refused);
      if (taken.overflow && !this.overflowed.has(sandboxId)) {
        overflowed.push(sandboxId);
        this.overflowed.add(sandboxId);
      }
    }
    return { refused, overflowed };
  }

  /**
   * Reads up to `limit` refusals from one log, whole lines only (a line not yet ended is read
   * again next time), and keeps how far it got; undefined when there was nothing new.
   */
  private read(sandboxId: string, f: Followed, buf: Buffer, limit: number): { refused: RefusedWrite[]; overflow: boolean } | undefined {
    let n: number;
    try {
      n = readSync(f.fd, buf, 0, READ_BYTES, f.offset);
    } catch {
      return undefined;
    }
    if (n === 0) return undefined;
    const text = buf.toString('latin1', 0, n);
    const refused: RefusedWrite[] = [];
    let overflow = false;
    let at = 0;
    while (refused.length < limit) {
      const end = text.indexOf('\n', at);
      if (end < 0) break;
      const parsed = parseRefusedWriteLine(text.slice(at, end));
      at = end + 1;
      if (!parsed) continue;
      if ('overflow' in parsed) overflow = true;
      else refused.push({ sandboxId, path: Buffer.from(parsed.path, 'latin1').toString('utf8'), op: parsed.op });
    }
    // A full read with no line end holds no line the server writes: it is passed over.
    if (at === 0 && n === READ_BYTES) at = n;
    if (at === 0) return undefined;
    f.offset += at;
    try {
      saveOffset(f.file, f.offset);
    } catch {
      // Kept in memory still; an edge that restarts before the next save raises some twice.
    }
    return { refused, overflow };
  }

  /** Stops following every log. */
  close(): void {
    for (const id of [...this.logs.keys()]) this.remove(id);
  }
}
