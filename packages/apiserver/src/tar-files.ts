// Directory upload and download as tar, through the sandbox's agent (paths resolve inside the
// sandbox, so a symlink in the archive or the tree can never reach the host).
import path from 'node:path';
import { PassThrough, Readable, Transform } from 'node:stream';
import { createGunzip } from 'node:zlib';
import tar from 'tar-stream';
import { DsecError, invalidArgument, tarBytesBetweenEntriesFault, tarExtendedHeaderFault, tarHeaderOverflowFault } from '@dsec/protocol';
import type { EdgeClient } from '@dsec/protocol';

/** Largest tar a directory download produces. */
export const MAX_TAR_DOWNLOAD_BYTES = 1024 * 1024 * 1024;
/** Largest entry count of a directory download. */
export const MAX_TAR_ENTRIES = 200_000;
const CHUNK_BYTES = 1024 * 1024;

/** Splits a stream into chunks of at most `size` bytes, counting against `limit`. */
async function* limited(source: AsyncIterable<Uint8Array>, limit: { left: number }): AsyncGenerator<Buffer> {
  for await (const chunk of source) {
    limit.left -= chunk.byteLength;
    if (limit.left < 0) throw new DsecError('PAYLOAD_TOO_LARGE', 'upload exceeds the size limit');
    yield Buffer.from(chunk);
  }
}

/** Streams a request body into a file in 1 MiB writes (first creates or truncates). */
export async function writeStreamToFile(
  edge: EdgeClient,
  id: string,
  file: string,
  body: AsyncIterable<Uint8Array>,
  opts: { mode?: number; append?: boolean; limitBytes: number; signal?: AbortSignal | undefined },
): Promise<number> {
  let pending: Buffer[] = [];
  let pendingBytes = 0;
  let written = 0;
  let first = true;
  const flush = async (): Promise<void> => {
    const data = Buffer.concat(pending);
    pending = [];
    pendingBytes = 0;
    await edge.writeFile(id, file, data, {
      ...(opts.mode !== undefined ? { mode: opts.mode } : {}),
      append: opts.append === true || !first,
      signal: opts.signal,
    });
    first = false;
    written += data.length;
  };
  for await (const chunk of limited(body, { left: opts.limitBytes })) {
    pending.push(chunk);
    pendingBytes += chunk.length;
    if (pendingBytes >= CHUNK_BYTES) await flush();
  }
  if (pendingBytes > 0 || first) await flush();
  return written;
}

function safeJoin(root: string, name: string): string {
  const rel = path.posix.normalize(name.replace(/^\/+/, ''));
  if (rel === '..' || rel.startsWith('../')) throw invalidArgument('body', `tar entry ${name} leaves the target directory`);
  return rel === '.' || rel === '' ? root : path.posix.join(root, rel);
}

/** Unpacks a tar (or gzip-compressed tar) body into `dir` inside a sandbox. */
export async function uploadTar(
  edge: EdgeClient,
  id: string,
  dir: string,
  body: AsyncIterable<Uint8Array>,
  limitBytes: number,
  signal?: AbortSignal,
): Promise<{ files: number }> {
  const call = { signal };
  // Peek at the first chunk to tell gzip from plain tar (before anything is piped).
  const it = limited(body, { left: limitBytes });
  const first = await it.next();
  const head = first.done ? Buffer.alloc(0) : first.value;
  const source = Readable.from(
    (async function* () {
      if (head.length) yield head;
      yield* it;
    })(),
    { objectMode: false },
  );
  const input = head[0] === 0x1f && head[1] === 0x8b ? source.pipe(createGunzip()) : source;
  source.on('error', (err) => input.destroy(err));
  await edge.mkdir(id, dir, call);
  // Iterate as soon as the stream is piped: entries must not arrive before the loop runs.
  const extract = tar.extract();
  // Where the previous entry's data ended: what lies between it and an entry's header block are
  // that entry's extended headers.
  let previousEnd = 0;
  // What reaches the parser (after gunzip), refused when it runs on past the extended headers'
  // bound with no entry: each header is checked only once its entry arrives.
  let consumed = 0;
  const guard = new Transform({
    transform(chunk: Buffer, _enc, cb) {
      // Judged on what the parser was handed before this chunk (one large chunk of a valid tar
      // is not a run of headers).
      const fault = tarBytesBetweenEntriesFault(consumed, previousEnd);
      consumed += chunk.length;
      cb(fault ? invalidArgument('body', fault) : null, fault ? undefined : chunk);
    },
  });
  input.pipe(guard).pipe(extract);
  input.on('error', (err) => guard.destroy(err));
  guard.on('error', (err) => extract.destroy(err));
  let files = 0;
  try {
    for await (const entry of extract) {
      const h = entry.header as tar.Header & { byteOffset?: number };
      const extendedFault = tarExtendedHeaderFault(h, previousEnd);
      if (extendedFault) throw invalidArgument('body', extendedFault);
      previousEnd = (h.byteOffset ?? 0) + Math.ceil((h.size ?? 0) / 512) * 512;
      const target = safeJoin(dir, h.name);
      const mode = (h.mode ?? 0o644) & 0o777;
      if (h.type === 'directory') {
        await edge.mkdir(id, target, call);
      } else if (h.type === 'file' || h.type === 'contiguous-file') {
        await edge.mkdir(id, path.posix.dirname(target), call);
        await writeStreamToFile(edge, id, target, entry as unknown as AsyncIterable<Uint8Array>, { mode, limitBytes, signal });
        files++;
        continue;
      } else if (h.type === 'symlink') {
        await edge.mkdir(id, path.posix.dirname(target), call);
        await edge.remove(id, target, call).catch(() => undefined);
        await edge.symlink(id, target, h.linkname ?? '', call);
      } else {
        throw invalidArgument('body', `tar entry ${h.name} has unsupported type ${h.type ?? 'unknown'}`);
      }
      entry.resume();
    }
  } catch (err) {
    // The caller's abort is its own, not a fault of the archive.
    if (err instanceof DsecError || signal?.aborted) throw err;
    throw invalidArgument('body', tarHeaderOverflowFault(err) ?? `not a valid tar stream: ${(err as Error).message}`);
  }
  return { files };
}

/** The value of an agent read, or undefined when the path is gone or is no longer what it was listed as. */
async function changedAway<T>(read: Promise<T>): Promise<T | undefined> {
  try {
    return await read;
  } catch (err) {
    if (err instanceof DsecError && (err.code === 'FILE_NOT_FOUND' || err.code === 'INVALID_ARGUMENT')) return undefined;
    throw err;
  }
}

/** A tar stream of the tree at `dir` inside a sandbox. */
export function downloadTar(edge: EdgeClient, id: string, dir: string): Readable {
  const pack = tar.pack();
  const out = new PassThrough();
  pack.pipe(out);
  const addEntry = (header: Partial<tar.Header> & { name: string }, data: Buffer = Buffer.alloc(0)): Promise<void> =>
    new Promise((resolve, reject) => {
      pack.entry(header, data, (err) => (err ? reject(err) : resolve()));
    });
  const walk = async (): Promise<void> => {
    let bytes = 0;
    let entries = 0;
    const stack: string[] = [''];
    while (stack.length) {
      const rel = stack.pop()!;
      const abs = rel ? path.posix.join(dir, rel) : dir;
      // The sandbox runs while its tree is read: a directory gone or replaced (by a file, a
      // symlink) since it was listed is left out, as is a file gone or replaced by a FIFO, a
      // socket or a directory. The archive holds what could be read; it never stalls or fails.
      // A directory swapped for a symlink since its parent was listed is not followed (the
      // agent lists what a path resolves to; the check narrows the window to the two calls).
      if (rel && (await changedAway(edge.stat(id, abs)))?.type !== 'dir') continue;
      const listed = rel ? await changedAway(edge.listDir(id, abs)) : await edge.listDir(id, abs);
      for (const e of listed ?? []) {
        const name = rel ? `${rel}/${e.name}` : e.name;
        const full = path.posix.join(abs, e.name);
        if (++entries > MAX_TAR_ENTRIES) throw new DsecError('PAYLOAD_TOO_LARGE', `${dir} has more than ${MAX_TAR_ENTRIES} entries`);
        const base = {
          name,
          mode: e.mode,
          mtime: new Date(e.mtimeMs),
          ...(e.uid !== undefined ? { uid: e.uid } : {}),
          ...(e.gid !== undefined ? { gid: e.gid } : {}),
        };
        if (e.type === 'dir') {
          await addEntry({ ...base, type: 'directory' });
          stack.push(name);
        } else if (e.type === 'symlink') {
          await addEntry({ ...base, type: 'symlink', linkname: e.linkTarget ?? '' });
        } else if (e.type === 'file') {
          const raw = await changedAway(edge.readFile(id, full));
          if (raw === undefined) continue;
          const data = Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength);
          bytes += data.length;
          if (bytes > MAX_TAR_DOWNLOAD_BYTES) throw new DsecError('PAYLOAD_TOO_LARGE', `${dir} holds more than ${MAX_TAR_DOWNLOAD_BYTES} bytes`);
          await addEntry({ ...base, type: 'file', size: data.length }, data);
        }
      }
    }
    pack.finalize();
  };
  // The walk starts when a reader attaches (the HTTP response's 'data', an iterator's 'readable'):
  // an error destroys a stream someone already listens to, and reaches the client as a broken
  // download. The listener below only keeps an error that nobody awaits from becoming an
  // uncaught exception of the whole platform; so for the packer, which the pipe destroys with
  // the same error (streamx).
  out.on('error', () => undefined);
  pack.on('error', () => undefined);
  let started = false;
  out.on('newListener', (event: string | symbol) => {
    if (started || (event !== 'data' && event !== 'readable')) return;
    started = true;
    // After the listener is in place (newListener runs before it is added).
    queueMicrotask(() => void walk().catch((err: unknown) => out.destroy(err as Error)));
  });
  return out;
}
