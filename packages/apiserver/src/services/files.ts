// Files in sandboxes: reads, and changes recorded as trajectory steps (with their error when
// they fail). Whole directories go in and out as tar. Also what the sandbox changed against
// its layers (diff) and the graders' integrity check (verify).
import { invalidArgument } from '@dsec/protocol';
import type { DiffOptions, DiffResult, FileStat, TrajectoryStep, TrajectoryStepKind, VerifyRequest, VerifyResult } from '@dsec/protocol';
import type { Readable } from 'node:stream';
import type { FileRecording, TrajectoryLog } from '../trajectory.js';
import { downloadTar, uploadTar, writeStreamToFile } from '../tar-files.js';
import type { CommandTarget } from './commands.js';

/** Options of {@link FileService.write}. */
export interface WriteFileOptions {
  /** Permission bits of a new file. */
  mode?: number | undefined;
  append?: boolean;
  /** Most bytes the body may carry (PAYLOAD_TOO_LARGE past it). */
  limitBytes: number;
}

/** Files of sandboxes. */
export class FileService {
  constructor(private readonly trajectory: TrajectoryLog) {}

  /** Runs a file change, recorded as a trajectory step (with its error when it fails). */
  private async recorded<T>(
    sandboxId: string,
    kind: Exclude<TrajectoryStepKind, 'exec'>,
    fields: Partial<TrajectoryStep>,
    run: (rec: FileRecording) => Promise<T>,
  ): Promise<T> {
    const rec = await this.trajectory.beginFile(sandboxId, kind, fields);
    const out = await run(rec).catch(rec.failed);
    rec.ok();
    return out;
  }

  /** Writes (or appends) a stream of bytes to a file; `signal` (the request's) stops it between chunks. */
  async write(t: CommandTarget, path: string, body: AsyncIterable<Uint8Array>, opts: WriteFileOptions, signal?: AbortSignal): Promise<void> {
    const mode = opts.mode;
    const append = opts.append === true;
    await this.recorded(t.sandboxId, 'write', { path, ...(mode !== undefined ? { mode } : {}), ...(append ? { append } : {}) }, (rec) =>
      writeStreamToFile(t.edge, t.sandboxId, path, rec.tap(body), { ...(mode !== undefined ? { mode } : {}), append, limitBytes: opts.limitBytes, signal }),
    );
  }

  /** Reads a file (or a range of it). */
  read(t: CommandTarget, path: string, range: { offset?: number | undefined; length?: number | undefined } = {}, signal?: AbortSignal): Promise<Uint8Array> {
    return t.edge.readFile(t.sandboxId, path, {
      ...(range.offset !== undefined ? { offset: range.offset } : {}),
      ...(range.length !== undefined ? { length: range.length } : {}),
      signal,
    });
  }

  /** Removes a file or (with `recursive`) a tree. */
  async remove(t: CommandTarget, path: string, recursive: boolean, signal?: AbortSignal): Promise<void> {
    await this.recorded(t.sandboxId, 'remove', { path, ...(recursive ? { recursive } : {}) }, () => t.edge.remove(t.sandboxId, path, { recursive, signal }));
  }

  /** The entries of a directory. */
  list(t: CommandTarget, path: string, signal?: AbortSignal): Promise<FileStat[]> {
    return t.edge.listDir(t.sandboxId, path, { signal });
  }

  /** One file's metadata. */
  stat(t: CommandTarget, path: string, signal?: AbortSignal): Promise<FileStat> {
    return t.edge.stat(t.sandboxId, path, { signal });
  }

  /**
   * Extended attributes under `prefix` (`user.` namespace) of each path, null where unreadable;
   * with `replace` (one path), those under the prefix are replaced first.
   */
  xattrs(
    t: CommandTarget,
    paths: string[],
    prefix: string,
    replace?: Record<string, string>,
    signal?: AbortSignal,
  ): Promise<Array<Record<string, string> | null>> {
    return t.edge.xattrs(t.sandboxId, paths, prefix, { ...(replace ? { replace } : {}), signal });
  }

  /** Makes a directory (and its parents). */
  async mkdir(t: CommandTarget, path: string, signal?: AbortSignal): Promise<void> {
    await this.recorded(t.sandboxId, 'mkdir', { path }, () => t.edge.mkdir(t.sandboxId, path, { signal }));
  }

  /** Renames a file or directory. */
  async rename(t: CommandTarget, from: string, to: string, signal?: AbortSignal): Promise<void> {
    await this.recorded(t.sandboxId, 'rename', { from, to }, () => t.edge.rename(t.sandboxId, from, to, { signal }));
  }

  /** Unpacks a tar (or gzip-compressed tar) stream into a directory. */
  async uploadTar(t: CommandTarget, dir: string, body: AsyncIterable<Uint8Array>, limitBytes: number, signal?: AbortSignal): Promise<void> {
    await this.recorded(t.sandboxId, 'tar', { path: dir }, (rec) => uploadTar(t.edge, t.sandboxId, dir, rec.tap(body), limitBytes, signal));
  }

  /** A directory as a tar stream (`signal` covers the check before it; the stream ends when its reader goes). */
  async downloadTar(t: CommandTarget, dir: string, signal?: AbortSignal): Promise<Readable> {
    if ((await t.edge.stat(t.sandboxId, dir, { signal })).type !== 'dir') throw invalidArgument('query.path', `${dir} is not a directory`);
    return downloadTar(t.edge, t.sandboxId, dir);
  }

  /** What the sandbox changed against its layers. */
  diff(t: CommandTarget, opts: DiffOptions, signal?: AbortSignal): Promise<DiffResult> {
    return t.edge.diff(t.sandboxId, opts, { signal });
  }

  /** Checks files against expected digests (the graders' integrity check). */
  verify(t: CommandTarget, req: VerifyRequest, signal?: AbortSignal): Promise<VerifyResult> {
    return t.edge.verify(t.sandboxId, req, { signal });
  }
}
