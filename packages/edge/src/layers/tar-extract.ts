// Safe extraction of untrusted tar streams (OCI layer semantics) into a private directory.
//
// Every path is resolved component by component with lstat: nothing is ever written through a
// symlink, outside the destination, or over a device. What is rejected and what is made safe
// is listed in docs/layers.md ("Untrusted tars").
import { constants as fsc } from 'node:fs';
import { chmod, link, lchown, lstat, lutimes, mkdir, open, readdir, rm, symlink } from 'node:fs/promises';
import { join } from 'node:path';
import { Readable, Transform } from 'node:stream';
import type { TransformCallback } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createGunzip } from 'node:zlib';
import tar from 'tar-stream';
import type { Header } from 'tar-stream';
import { DsecError, isDsecError, limitExceeded, tarBytesBetweenEntriesFault, tarExtendedHeaderFault, tarHeaderOverflowFault } from '@dsec/protocol';
import type { LimitName } from '@dsec/protocol';
import { lsetxattr, mkWhiteout, OVERLAY_OPAQUE_XATTR } from '../sys/linux.js';

/** Limits on one extraction (summed over all layers of a squashed image). */
export interface TarLimits {
  /** Total bytes of entries' content (files', and any other entry's data, read and dropped); default 64 GiB. */
  maxTotalBytes: number;
  /**
   * The tenant limit `maxTotalBytes` stands for (`layerUploadBytes` for uploads and imports): past
   * it the refusal is that limit's 429 instead of LAYER_INVALID. Default none.
   */
  totalBytesLimit?: LimitName | undefined;
  /** Number of tar entries; default 2,000,000. */
  maxEntries: number;
  /** Length of an entry's path or link target in bytes; default 4096. */
  maxPathLength: number;
}

/** Default {@link TarLimits}. */
export const DEFAULT_TAR_LIMITS: TarLimits = {
  maxTotalBytes: 64 * 1024 ** 3,
  maxEntries: 2_000_000,
  maxPathLength: 4096,
};

/**
 * What to do with whiteouts (`.wh.NAME`, `.wh..wh..opq`):
 * `record` turns them into overlayfs whiteouts in the tree (the layer will sit above others);
 * `apply` deletes what they hide from the tree (squashing an image's layers into one).
 */
export type WhiteoutMode = 'record' | 'apply';

/** Options of {@link TarExtractor}. */
export interface TarExtractorOptions {
  whiteouts: WhiteoutMode;
  limits?: Partial<TarLimits> | undefined;
  signal?: AbortSignal | undefined;
  onProgress?: ((msg: string) => void) | undefined;
}

/** Anything a tar can be read from. */
export type TarInput = NodeJS.ReadableStream | AsyncIterable<Uint8Array>;

/** One entry as tar-stream yields it: its header and a readable of its content. */
type TarEntry = tar.Extract extends AsyncIterable<infer S> ? S : never;

interface DirMeta {
  mode: number;
  uid: number;
  gid: number;
  mtime: Date;
}

const WHITEOUT_PREFIX = '.wh.';
const OPAQUE_MARKER = '.wh..wh..opq';
const BLOCK = 512;
const EPOCH = new Date(0);
const MAX_ID = 4_294_967_294;
/** Mode bits kept on extracted files: setuid and setgid are dropped. */
const MODE_MASK = 0o1777;

function invalid(message: string, path?: string): DsecError {
  return new DsecError('LAYER_INVALID', message, path === undefined ? {} : { path });
}

function errnoOf(err: unknown): string | undefined {
  return (err as NodeJS.ErrnoException | null)?.code;
}

async function lstatOrNull(path: string) {
  try {
    return await lstat(path);
  } catch (err) {
    if (errnoOf(err) === 'ENOENT') return null;
    throw err;
  }
}

/**
 * Extracts one or more tar streams into `dest` (which must exist and be private to the caller).
 * Call {@link extract} once per layer, in order, then {@link finish} once.
 */
export class TarExtractor {
  private readonly limits: TarLimits;
  private readonly dirMeta = new Map<string, DirMeta>();
  /** Paths (relative, '/'-joined) written by the layer being extracted, with their ancestors. */
  private touched = new Set<string>();
  private entries = 0;
  private totalBytes = 0;

  constructor(
    private readonly dest: string,
    private readonly opts: TarExtractorOptions,
  ) {
    this.limits = { ...DEFAULT_TAR_LIMITS, ...opts.limits };
  }

  /** Extracts one tar (plain or gzip). Malformed input is LAYER_INVALID. */
  async extract(input: TarInput): Promise<void> {
    const { signal } = this.opts;
    signal?.throwIfAborted();
    this.touched = new Set(['']);
    const source = await openDecompressed(input);
    let lastEnd = 0;
    // Counts what reaches the parser, and refuses a run of extended headers that never reaches an
    // entry before the parser buffers it (each header is checked only once its entry arrives).
    const counter = new ByteCounter((bytes) => tarBytesBetweenEntriesFault(bytes, lastEnd));
    const extract = tar.extract();
    let streamError: unknown;
    const piped = pipeline([source.stream, ...source.transforms, counter, extract], signal ? { signal } : {}).catch((err: unknown) => {
      streamError ??= err;
    });
    try {
      for await (const entry of extract) {
        const header = entry.header as Header & { byteOffset?: number };
        const extendedFault = tarExtendedHeaderFault(header, lastEnd);
        lastEnd = (header.byteOffset ?? 0) + Math.ceil((header.size ?? 0) / BLOCK) * BLOCK;
        try {
          if (extendedFault) throw invalid(extendedFault, header.name);
          await this.entry(entry);
        } catch (err) {
          entry.resume();
          throw new HandlerError(err);
        }
      }
    } catch (err) {
      source.destroy();
      extract.destroy();
      await piped;
      signal?.throwIfAborted();
      if (err instanceof HandlerError) {
        if (isDsecError(err.inner)) throw err.inner;
        // A handler that failed because the stream broke under it reports the stream's error.
        if (streamError !== undefined && errnoOf(streamError) !== 'ERR_STREAM_PREMATURE_CLOSE') throw invalidStream(streamError);
        throw wrapFsError(err.inner);
      }
      throw invalidStream(streamError ?? err);
    }
    await piped;
    signal?.throwIfAborted();
    if (streamError !== undefined) throw invalidStream(streamError);
    // tar-stream accepts a stream cut at an entry boundary; a complete tar ends in two zero blocks.
    if (counter.bytes < lastEnd + 2 * BLOCK) {
      throw invalid(`truncated tar: ${counter.bytes} bytes, no end-of-archive marker`);
    }
  }

  /** Applies directory metadata (deepest first, after all children exist); returns counts. */
  async finish(): Promise<{ entries: number; bytes: number }> {
    if (!this.dirMeta.has('')) this.dirMeta.set('', { mode: 0o755, uid: 0, gid: 0, mtime: EPOCH });
    const dirs = [...this.dirMeta.entries()].sort((a, b) => depth(b[0]) - depth(a[0]));
    for (const [rel, meta] of dirs) {
      const path = this.abs(rel);
      const st = await lstatOrNull(path);
      if (!st?.isDirectory()) continue; // deleted by a later whiteout
      await lchown(path, meta.uid, meta.gid);
      await chmod(path, meta.mode);
      await lutimes(path, meta.mtime, meta.mtime);
    }
    return { entries: this.entries, bytes: this.totalBytes };
  }

  /** Counts `size` bytes of an entry's content against {@link TarLimits.maxTotalBytes}. */
  private count(size: number, name: string): void {
    this.totalBytes += size;
    const max = this.limits.maxTotalBytes;
    if (this.totalBytes <= max) return;
    const message = `tar content exceeds ${max} bytes at ${JSON.stringify(name.slice(0, 256))} (${size} bytes)`;
    throw this.limits.totalBytesLimit ? limitExceeded(this.limits.totalBytesLimit, max, message) : invalid(message, name);
  }

  private abs(rel: string): string {
    return rel === '' ? this.dest : join(this.dest, rel);
  }

  private async entry(entry: TarEntry): Promise<void> {
    const h = entry.header as Partial<Header> & { name: string };
    this.opts.signal?.throwIfAborted();
    if (++this.entries > this.limits.maxEntries) throw invalid(`tar has more than ${this.limits.maxEntries} entries`);
    if (this.entries % 10_000 === 0) this.opts.onProgress?.(`extracted ${this.entries} entries`);
    // Every entry's data counts before it is read: a bomb hidden in a whiteout, a directory or
    // a link (data that is read and dropped) is refused at its header, as a file is.
    this.count(h.size ?? 0, h.name);
    const comps = this.cleanPath(h.name);
    const rel = comps.join('/');
    // tar-stream reports typeflags it does not know (GNU sparse, volume labels...) as null.
    const type = h.type ?? 'unknown';
    const base = comps[comps.length - 1];

    if (base !== undefined && base.startsWith(WHITEOUT_PREFIX)) {
      await drain(entry);
      const parent = comps.slice(0, -1);
      if (base === OPAQUE_MARKER) return this.opaque(parent);
      const target = base.slice(WHITEOUT_PREFIX.length);
      if (target === '' || target === '.' || target === '..') throw invalid(`bad whiteout ${h.name}`, h.name);
      return this.whiteout([...parent, target], h.mtime);
    }
    if (comps.length === 0 && type !== 'directory') throw invalid(`entry ${JSON.stringify(h.name)} of type ${type} has an empty path`, h.name);

    const uid = h.uid ?? 0;
    const gid = h.gid ?? 0;
    if (!Number.isInteger(uid) || !Number.isInteger(gid) || uid < 0 || gid < 0 || uid > MAX_ID || gid > MAX_ID) {
      throw invalid(`bad owner ${uid}:${gid}`, h.name);
    }
    const mode = (h.mode ?? 0o644) & MODE_MASK;
    const mtime = h.mtime instanceof Date && !Number.isNaN(h.mtime.getTime()) ? h.mtime : EPOCH;

    switch (type) {
      case 'directory': {
        await drain(entry);
        if (comps.length > 0) {
          await this.parentOf(comps);
          const path = this.abs(rel);
          const st = await lstatOrNull(path);
          if (st && !st.isDirectory()) await rm(path, { recursive: true, force: true });
          if (!st?.isDirectory()) await mkdir(path, { mode: 0o700 });
          this.touch(comps);
        }
        this.dirMeta.set(rel, { mode, uid, gid, mtime });
        return;
      }
      case 'file':
      case 'contiguous-file': {
        const size = h.size ?? 0;
        const path = await this.prepare(comps);
        const fh = await open(path, fsc.O_WRONLY | fsc.O_CREAT | fsc.O_EXCL | fsc.O_NOFOLLOW, 0o600);
        try {
          let written = 0;
          for await (const chunk of entry) {
            const buf = chunk as Buffer;
            await fh.write(buf, 0, buf.length, written);
            written += buf.length;
          }
          if (written !== size) throw invalid(`entry ${h.name} is truncated`, h.name);
          await fh.chown(uid, gid);
          await fh.chmod(mode);
          await fh.utimes(mtime, mtime);
        } finally {
          await fh.close();
        }
        return;
      }
      case 'symlink': {
        await drain(entry);
        const target = h.linkname ?? '';
        if (target === '' || target.includes('\0') || Buffer.byteLength(target) > this.limits.maxPathLength) {
          throw invalid(`bad symlink target for ${h.name}`, h.name);
        }
        const path = await this.prepare(comps);
        await symlink(target, path);
        await lchown(path, uid, gid);
        await lutimes(path, mtime, mtime);
        return;
      }
      case 'link': {
        await drain(entry);
        const targetComps = this.cleanPath(h.linkname ?? '');
        const targetRel = targetComps.join('/');
        if (targetComps.length === 0 || targetRel === rel) throw invalid(`bad hard link ${h.name} -> ${h.linkname ?? ''}`, h.name);
        const targetPath = await this.existingPath(targetComps);
        const st = targetPath === null ? null : await lstatOrNull(targetPath);
        if (targetPath === null || !st?.isFile()) {
          throw invalid(`hard link ${h.name} -> ${h.linkname ?? ''}: target is not a regular file extracted earlier`, h.name);
        }
        const path = await this.prepare(comps);
        await link(targetPath, path);
        return;
      }
      case 'character-device':
        await drain(entry);
        // A char device 0:0 is how overlayfs itself stores a whiteout; accept it as one.
        if ((h.devmajor ?? 0) === 0 && (h.devminor ?? 0) === 0) return this.whiteout(comps, mtime);
        throw invalid(`device node ${h.name} not allowed in a layer`, h.name);
      case 'block-device':
        throw invalid(`device node ${h.name} not allowed in a layer`, h.name);
      case 'fifo':
        throw invalid(`fifo ${h.name} not allowed in a layer`, h.name);
      default:
        throw invalid(`unsupported tar entry type ${String(type)} for ${h.name}`, h.name);
    }
  }

  /** Splits an entry name into safe components: leading '/' and '.' dropped, '..' rejected. */
  private cleanPath(name: string): string[] {
    if (name.includes('\0')) throw invalid('NUL byte in entry name', name);
    if (Buffer.byteLength(name) > this.limits.maxPathLength) throw invalid(`entry name longer than ${this.limits.maxPathLength} bytes`, name.slice(0, 256));
    const comps = name.split('/').filter((c) => c !== '' && c !== '.');
    if (comps.includes('..')) throw invalid(`entry name contains '..': ${name}`, name);
    for (const c of comps) if (Buffer.byteLength(c) > 255) throw invalid(`path component longer than 255 bytes in ${name}`, name);
    return comps;
  }

  private touch(comps: string[]): void {
    for (let i = 1; i <= comps.length; i++) this.touched.add(comps.slice(0, i).join('/'));
  }

  /** Makes sure the parent directories of `comps` exist as real directories (never symlinks). */
  private async parentOf(comps: string[]): Promise<string> {
    let path = this.dest;
    for (let i = 0; i < comps.length - 1; i++) {
      path = join(path, comps[i]!);
      const st = await lstatOrNull(path);
      if (st === null) {
        await mkdir(path, { mode: 0o700 });
        const rel = comps.slice(0, i + 1).join('/');
        if (!this.dirMeta.has(rel)) this.dirMeta.set(rel, { mode: 0o755, uid: 0, gid: 0, mtime: EPOCH });
      } else if (!st.isDirectory()) {
        throw invalid(
          `${comps.join('/')}: parent ${comps.slice(0, i + 1).join('/')} is ${st.isSymbolicLink() ? 'a symlink' : 'not a directory'}`,
          comps.join('/'),
        );
      }
    }
    return path;
  }

  /** Parent dirs exist, and nothing (but an empty-to-be-replaced entry) is at the path. */
  private async prepare(comps: string[]): Promise<string> {
    await this.parentOf(comps);
    const path = this.abs(comps.join('/'));
    if ((await lstatOrNull(path)) !== null) await rm(path, { recursive: true, force: true });
    this.touch(comps);
    return path;
  }

  /** Absolute path of `comps` if every ancestor is a real directory, else null. */
  private async existingPath(comps: string[]): Promise<string | null> {
    let path = this.dest;
    for (let i = 0; i < comps.length - 1; i++) {
      path = join(path, comps[i]!);
      const st = await lstatOrNull(path);
      if (!st?.isDirectory()) return null;
    }
    return join(path, comps[comps.length - 1]!);
  }

  private async whiteout(comps: string[], mtime: Date | undefined): Promise<void> {
    const rel = comps.join('/');
    if (this.opts.whiteouts === 'record') {
      const path = await this.prepare(comps);
      mkWhiteout(path);
      const when = mtime instanceof Date && !Number.isNaN(mtime.getTime()) ? mtime : EPOCH;
      await lutimes(path, when, when);
      return;
    }
    if (this.touched.has(rel)) return; // the same layer also writes it: that entry wins
    const path = await this.existingPath(comps);
    if (path !== null) await rm(path, { recursive: true, force: true });
  }

  private async opaque(comps: string[]): Promise<void> {
    const rel = comps.join('/');
    const path = this.abs(rel);
    if (comps.length > 0) await this.parentOf(comps);
    const st = await lstatOrNull(path);
    if (st === null) {
      await mkdir(path, { mode: 0o700 });
      if (!this.dirMeta.has(rel)) this.dirMeta.set(rel, { mode: 0o755, uid: 0, gid: 0, mtime: EPOCH });
    } else if (!st.isDirectory()) {
      throw invalid(`opaque marker in ${rel || '/'}, which is not a directory`, rel);
    }
    this.touch(comps);
    if (this.opts.whiteouts === 'record') lsetxattr(path, OVERLAY_OPAQUE_XATTR, 'y');
    else await this.clearUntouched(rel);
  }

  /** Deletes everything under `rel` that the current layer did not write. */
  private async clearUntouched(rel: string): Promise<void> {
    const path = this.abs(rel);
    for (const ent of await readdir(path, { withFileTypes: true })) {
      const childRel = rel === '' ? ent.name : `${rel}/${ent.name}`;
      if (!this.touched.has(childRel)) await rm(join(path, ent.name), { recursive: true, force: true });
      else if (ent.isDirectory()) await this.clearUntouched(childRel);
    }
  }
}

class HandlerError extends Error {
  constructor(readonly inner: unknown) {
    super('entry handler failed');
  }
}

/** Counts the bytes passing; `fault` (given the count) refuses the stream with a LAYER_INVALID. */
class ByteCounter extends Transform {
  bytes = 0;
  constructor(private readonly fault: (bytes: number) => string | undefined) {
    super();
  }
  override _transform(chunk: Buffer, _enc: BufferEncoding, cb: TransformCallback): void {
    // Judged on what the parser was handed before this chunk: one large chunk of a valid tar
    // (its entries not parsed yet) is not taken for a run of headers.
    const fault = this.fault(this.bytes);
    if (fault) return cb(invalid(fault));
    this.bytes += chunk.length;
    cb(null, chunk);
  }
}

function depth(rel: string): number {
  return rel === '' ? 0 : rel.split('/').length;
}

async function drain(entry: TarEntry): Promise<void> {
  for await (const _ of entry) {
    // discard
  }
}

function invalidStream(err: unknown): unknown {
  if (isDsecError(err)) return err;
  if ((err as Error | null)?.name === 'AbortError') return err;
  const overflow = tarHeaderOverflowFault(err);
  if (overflow) return new DsecError('LAYER_INVALID', overflow, {}, { cause: err });
  const msg = err instanceof Error ? err.message : String(err);
  return new DsecError('LAYER_INVALID', `malformed tar stream: ${msg}`, {}, { cause: err });
}

function wrapFsError(err: unknown): unknown {
  if (isDsecError(err) || (err as Error | null)?.name === 'AbortError') return err;
  const e = err as NodeJS.ErrnoException;
  if (e.code === 'ERR_STREAM_PREMATURE_CLOSE' || e.code === 'ERR_STREAM_DESTROYED') {
    return new DsecError('LAYER_INVALID', `malformed tar stream: ${e.message}`, {}, { cause: err });
  }
  return new DsecError('INTERNAL', `extracting layer: ${e.message}`, e.path ? { path: e.path } : {}, { cause: err });
}

interface Decompressed {
  stream: Readable;
  transforms: NodeJS.ReadWriteStream[];
  destroy(): void;
}

const GZIP_MAGIC = [0x1f, 0x8b];
const ZSTD_MAGIC = [0x28, 0xb5, 0x2f, 0xfd];

/** Peeks at the first bytes: gzip is decompressed, zstd is refused (Node 20 has no zstd). */
async function openDecompressed(input: TarInput): Promise<Decompressed> {
  const iterable = input as AsyncIterable<Uint8Array | string>;
  const it = iterable[Symbol.asyncIterator]();
  let head = Buffer.alloc(0);
  let done = false;
  while (head.length < 4) {
    const r = await it.next();
    if (r.done) {
      done = true;
      break;
    }
    head = Buffer.concat([head, Buffer.from(r.value)]);
  }
  const destroy = () => {
    const s = input as Partial<Readable>;
    if (typeof s.destroy === 'function') s.destroy();
    else void it.return?.().catch(() => undefined);
  };
  if (ZSTD_MAGIC.every((b, i) => head[i] === b)) {
    destroy();
    throw invalid('zstd-compressed layers are not supported; use plain or gzip tar');
  }
  async function* rest(): AsyncGenerator<Buffer> {
    if (head.length > 0) yield head;
    while (!done) {
      const r = await it.next();
      if (r.done) return;
      yield Buffer.from(r.value);
    }
  }
  const stream = Readable.from(rest(), { objectMode: false });
  const transforms = GZIP_MAGIC.every((b, i) => head[i] === b) ? [createGunzip()] : [];
  return { stream, transforms, destroy };
}
