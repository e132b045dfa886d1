// Building an EROFS layer image: mkfs.erofs in chunked mode writes the metadata image and a
// separate data blob; the superblock's build time is then zeroed so that the same tree gives
// the same bytes (and so the same digest) on every build.
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { open } from 'node:fs/promises';
import { DsecError } from '@dsec/protocol';
import { readPool } from '../host/read-pool.js';

/** Chunk size of the data blob; the unit of on-demand fetching. */
export const DEFAULT_CHUNK_SIZE_BYTES = 1_048_576;

/** Fixed filesystem UUID: a layer's identity is its content, not when it was built. */
export const LAYER_UUID = '00000000-0000-0000-0000-000000000000';

const SUPER_OFFSET = 1024;
const EROFS_MAGIC = 0xe0f5e1e2;
const FEATURE_COMPAT_SB_CHKSUM = 0x1;

/** Options of {@link mkfsErofs}. */
export interface MkfsOptions {
  /** Power of two, at least 4096. */
  chunkSizeBytes: number;
  /** Filesystem UUID; default {@link LAYER_UUID}. Part of the digest, invisible in a sandbox. */
  uuid?: string | undefined;
  signal?: AbortSignal | undefined;
}

/** Runs mkfs.erofs over `dir`, writing `metaPath` and `blobPath`, then normalizes the superblock. */
export async function mkfsErofs(dir: string, metaPath: string, blobPath: string, opts: MkfsOptions): Promise<void> {
  const { chunkSizeBytes } = opts;
  if (!Number.isInteger(chunkSizeBytes) || chunkSizeBytes < 4096 || (chunkSizeBytes & (chunkSizeBytes - 1)) !== 0) {
    throw new DsecError('INVALID_ARGUMENT', `chunk size must be a power of two >= 4096, got ${chunkSizeBytes}`, { field: 'chunkSizeBytes' });
  }
  const args = ['--quiet', `--chunksize=${chunkSizeBytes}`, `--blobdev=${blobPath}`, '-U', opts.uuid ?? LAYER_UUID, metaPath, dir];
  await runTool('mkfs.erofs', args, opts.signal);
  await normalizeSuperblock(metaPath);
}

/**
 * Zeroes the build time in the superblock and recomputes its checksum. mkfs.erofs 1.5 can
 * only fix the build time with -T, which also overwrites every file's mtime; files keep their
 * own mtime in extended inodes, so the build time is otherwise unused.
 */
export async function normalizeSuperblock(metaPath: string): Promise<void> {
  const fh = await open(metaPath, 'r+');
  try {
    const head = Buffer.alloc(4096);
    const { bytesRead } = await fh.read(head, 0, head.length, 0);
    if (bytesRead < SUPER_OFFSET + 128 || head.readUInt32LE(SUPER_OFFSET) !== EROFS_MAGIC) {
      throw new DsecError('INTERNAL', `mkfs.erofs wrote no EROFS superblock to ${metaPath}`, { path: metaPath });
    }
    const blockSize = 1 << head.readUInt8(SUPER_OFFSET + 12);
    const sb = head.subarray(SUPER_OFFSET, Math.min(bytesRead, blockSize));
    const hasChecksum = (sb.readUInt32LE(8) & FEATURE_COMPAT_SB_CHKSUM) !== 0;
    if (hasChecksum && superblockChecksum(sb) !== sb.readUInt32LE(4)) {
      // A checksum layout we do not understand: leave the image as mkfs wrote it.
      return;
    }
    sb.writeBigUInt64LE(0n, 24); // build_time
    sb.writeUInt32LE(0, 32); // build_time_nsec
    if (hasChecksum) sb.writeUInt32LE(superblockChecksum(sb), 4);
    await fh.write(sb, 0, sb.length, SUPER_OFFSET);
  } finally {
    await fh.close();
  }
}

function superblockChecksum(sb: Buffer): number {
  const copy = Buffer.from(sb);
  copy.writeUInt32LE(0, 4);
  return crc32c(0xffffffff, copy);
}

let crcTable: Uint32Array | undefined;

/** Raw CRC32C (Castagnoli) as the kernel's crc32c(): no final inversion. */
function crc32c(seed: number, data: Uint8Array): number {
  if (crcTable === undefined) {
    crcTable = new Uint32Array(256);
    for (let n = 0; n < 256; n++) {
      let c = n;
      for (let k = 0; k < 8; k++) c = c & 1 ? 0x82f63b78 ^ (c >>> 1) : c >>> 1;
      crcTable[n] = c >>> 0;
    }
  }
  let crc = seed >>> 0;
  for (const byte of data) crc = (crcTable[(crc ^ byte) & 0xff]! ^ (crc >>> 8)) >>> 0;
  return crc >>> 0;
}

/**
 * The UUID of a snapshot layer: derived from the layers below it, so that the same packed
 * changes over different parents (an empty upper over two bases, say) are different layers.
 */
export function snapshotUuid(parents: readonly string[]): string {
  const h = createHash('sha256')
    .update('dsec-snapshot\n' + parents.join('\n'))
    .digest('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20, 32)}`;
}

/** `sha256:` + sha256 over the metadata image followed by the data blob. */
export async function layerDigest(metaPath: string, blobPath: string): Promise<string> {
  // Hashed in the host-read pool: a snapshot's blob can be gigabytes of a sandbox's data.
  return 'sha256:' + ((await readPool().run({ op: 'hash-files', paths: [metaPath, blobPath] })) as string);
}

/** Output of a finished tool run. */
export interface ToolResult {
  stdout: string;
  stderr: string;
}

/**
 * Runs a host tool to completion; a non-zero exit is an error carrying the tail of stderr.
 * Each complete stderr/stdout line is passed to `onLine` as it arrives.
 */
export function runTool(cmd: string, args: string[], signal?: AbortSignal, onLine?: (line: string) => void, env?: NodeJS.ProcessEnv): Promise<ToolResult> {
  return new Promise((resolve, reject) => {
    signal?.throwIfAborted();
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], env: env ?? process.env, ...(signal ? { signal } : {}) });
    let stdout = '';
    let stderr = '';
    const lines = (kind: 'out' | 'err') => {
      let partial = '';
      return (chunk: Buffer) => {
        const text = chunk.toString();
        if (kind === 'out') stdout = (stdout + text).slice(-65_536);
        else stderr = (stderr + text).slice(-65_536);
        if (!onLine) return;
        partial += text;
        const parts = partial.split(/\r?\n|\r/);
        partial = parts.pop() ?? '';
        for (const p of parts) if (p.trim() !== '') onLine(p);
      };
    };
    child.stdout.on('data', lines('out'));
    child.stderr.on('data', lines('err'));
    child.on('error', (err) => {
      if (signal?.aborted) reject(signal.reason instanceof Error ? signal.reason : err);
      else reject(new DsecError('INTERNAL', `${cmd}: ${err.message}`, {}, { cause: err }));
    });
    child.on('close', (code, sig) => {
      if (signal?.aborted) return reject(signal.reason instanceof Error ? signal.reason : new Error('aborted'));
      if (code === 0) return resolve({ stdout, stderr });
      const tail = stderr.trim().split('\n').slice(-5).join('\n');
      reject(new DsecError('INTERNAL', `${cmd} failed (${sig ?? `exit ${code}`}): ${tail}`, { exitCode: code }));
    });
  });
}
