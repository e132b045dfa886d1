// Reads what the servers of container sandboxes' read-only protected paths (chronus/rofs/dsec-rofs)
// refused: each sandbox's log holds one line "<op> <path>" per refused change, the path escaped
// as \ooo where it holds a byte below 0x21, 0x7f or '\', and at most one "overflow" line (the
// server's cap was reached). The log is a local file the sandbox cannot reach: reading it never
// waits on the sandbox, and an edge that restarts reads on from where the file ends.
import { closeSync, fstatSync, openSync, readSync } from 'node:fs';

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
  offset: number;
  /** The bytes after the last newline read so far. */
  partial: string;
}

/** Bytes read from one log per drain at most. */
const READ_BYTES = 64 * 1024;

/** The refusal logs of the node's sandboxes, followed from where each ended when it was added. */
export class RefusedWriteLogs {
  private readonly logs = new Map<string, Followed>();
  private readonly overflowed = new Set<string>();

  get size(): number {
    return this.logs.size;
  }

  /**
   * Follows `file` for `sandboxId` from its start, or from its current end (an adopted sandbox:
   * what is there was raised before). A missing log (a sandbox launched before its paths were
   * served) is skipped: its paths are plain read-only binds with nothing to read.
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
    this.logs.set(sandboxId, { fd, offset: fromStart ? 0 : fstatSync(fd).size, partial: '' });
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
    const buf = Buffer.allocUnsafe(READ_BYTES);
    for (const [sandboxId, f] of this.logs) {
      if (refused.length >= max) break;
      let size: number;
      try {
        size = fstatSync(f.fd).size;
      } catch {
        continue;
      }
      if (size <= f.offset) continue;
      const n = readSync(f.fd, buf, 0, Math.min(READ_BYTES, size - f.offset), f.offset);
      f.offset += n;
      const lines = (f.partial + buf.toString('latin1', 0, n)).split('\n');
      f.partial = lines.pop() ?? '';
      for (const line of lines) {
        const parsed = parseRefusedWriteLine(line);
        if (!parsed) continue;
        if ('overflow' in parsed) {
          if (!this.overflowed.has(sandboxId)) overflowed.push(sandboxId);
          this.overflowed.add(sandboxId);
        } else {
          refused.push({ sandboxId, path: Buffer.from(parsed.path, 'latin1').toString('utf8'), op: parsed.op });
        }
      }
    }
    return { refused, overflowed };
  }

  /** Stops following every log. */
  close(): void {
    for (const id of [...this.logs.keys()]) this.remove(id);
  }
}
