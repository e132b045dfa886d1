// The chunk index of a layer: where each chunk of file data lies in the data blob and its
// sha256, so that a node holding only the EROFS metadata image can fetch, verify and cache the
// chunks a sandbox reads. mkfs.erofs in chunked mode (`--chunksize --blobdev`) gives every regular
// file chunk-based inodes whose chunks are written to the blob block-aligned and deduplicated;
// the index lists those extents (one per distinct chunk, its length rounded up to the block, the
// padding being zeros), found by walking the metadata image's directory tree. Equal chunks in two
// layers have equal digests: the node-wide cache, named by digest, stores and fetches them once.
import { createHash } from 'node:crypto';
import { open, readFile } from 'node:fs/promises';
// The errors alone: the lazy server imports this module, and the schemas (zod) would double its start.
import { DsecError } from '@dsec/protocol/errors';

const SUPER_OFFSET = 1024;
const EROFS_MAGIC = 0xe0f5e1e2;
const LAYOUT_FLAT_PLAIN = 0;
const LAYOUT_FLAT_INLINE = 2;
const LAYOUT_CHUNK_BASED = 4;
const CHUNK_FORMAT_INDEXES = 0x20;
const CHUNK_FORMAT_BLKBITS_MASK = 0x1f;
const NULL_ADDR = 0xffffffff;
const S_IFMT = 0o170000;
const S_IFDIR = 0o040000;
const S_IFREG = 0o100000;
const INDEX_MAGIC = 'DSLZIDX1';
const INDEX_HEADER_BYTES = 8 + 8 + 4;
const INDEX_ENTRY_BYTES = 8 + 4 + 32;
/** Most chunks a layer's index may list (a 64 GiB blob of 4 KiB files). */
const MAX_CHUNKS = 16 * 1024 * 1024;

/** One chunk of the data blob. */
export interface ChunkExtent {
  /** Byte offset in the blob (block-aligned). */
  offset: number;
  /** Bytes, a whole number of blocks. */
  length: number;
}

/** A chunk with its digest. */
export interface IndexedChunk extends ChunkExtent {
  /** sha256 of the chunk's bytes, hex. */
  sha256: string;
}

/** A layer's chunk index. */
export interface ChunkIndex {
  blobBytes: number;
  chunks: IndexedChunk[];
}

function invalid(why: string): DsecError {
  return new DsecError('LAYER_INVALID', `EROFS metadata: ${why}`, {});
}

/** The blob extents of every regular file's chunks in an EROFS metadata image, sorted, distinct. */
export function erofsChunkExtents(meta: Buffer): ChunkExtent[] {
  if (meta.length < SUPER_OFFSET + 128 || meta.readUInt32LE(SUPER_OFFSET) !== EROFS_MAGIC) throw invalid('no superblock');
  const blkbits = meta.readUInt8(SUPER_OFFSET + 12);
  const blksz = 2 ** blkbits;
  const rootNid = meta.readUInt16LE(SUPER_OFFSET + 14);
  const metaBase = meta.readUInt32LE(SUPER_OFFSET + 40) * blksz;
  const extraDevices = meta.readUInt16LE(SUPER_OFFSET + 86);
  const devtSlotOff = meta.readUInt16LE(SUPER_OFFSET + 88);
  // The blob is device 1; its chunks' block addresses are relative to its mapped start.
  const mappedBlk = extraDevices >= 1 ? meta.readUInt32LE(devtSlotOff * 128 + 68) : 0;
  const byOffset = new Map<number, number>();
  const seen = new Set<number>();
  const stack = [rootNid];

  const inodeAt = (nid: number) => {
    const at = metaBase + nid * 32;
    if (at + 32 > meta.length) throw invalid(`inode ${nid} out of range`);
    const format = meta.readUInt16LE(at);
    const extended = (format & 1) === 1;
    const layout = (format >> 1) & 0x7;
    const xattrCount = meta.readUInt16LE(at + 2);
    const mode = meta.readUInt16LE(at + 4);
    const size = extended ? Number(meta.readBigUInt64LE(at + 8)) : meta.readUInt32LE(at + 8);
    const iu = meta.readUInt32LE(at + 16);
    const isize = extended ? 64 : 32;
    const xattrBytes = xattrCount === 0 ? 0 : 12 + (xattrCount - 1) * 4;
    return { at, layout, mode, size, iu, tail: at + isize + xattrBytes };
  };

  while (stack.length > 0) {
    const nid = stack.pop()!;
    if (seen.has(nid)) continue;
    seen.add(nid);
    const ino = inodeAt(nid);
    const type = ino.mode & S_IFMT;
    if (type === S_IFREG && ino.layout === LAYOUT_CHUNK_BASED && ino.size > 0) {
      const cformat = ino.iu & 0xffff;
      const chunkBytes = blksz * 2 ** (cformat & CHUNK_FORMAT_BLKBITS_MASK);
      const count = Math.ceil(ino.size / chunkBytes);
      const indexes = (cformat & CHUNK_FORMAT_INDEXES) !== 0;
      let p = indexes ? Math.ceil(ino.tail / 8) * 8 : ino.tail;
      const entry = indexes ? 8 : 4;
      if (p + count * entry > meta.length) throw invalid(`chunk table of inode ${nid} out of range`);
      for (let i = 0; i < count; i++, p += entry) {
        const blk = indexes ? meta.readUInt32LE(p + 4) : meta.readUInt32LE(p);
        if (indexes && meta.readUInt16LE(p + 2) !== 1) throw invalid(`inode ${nid}: chunk not in the data blob`);
        if (blk === NULL_ADDR) continue;
        const bytes = Math.min(chunkBytes, ino.size - i * chunkBytes);
        const length = Math.ceil(bytes / blksz) * blksz;
        const offset = (blk - mappedBlk) * blksz;
        byOffset.set(offset, Math.max(length, byOffset.get(offset) ?? 0));
      }
    } else if (type === S_IFREG && ino.size > 0 && ino.layout !== LAYOUT_CHUNK_BASED) {
      throw invalid(`inode ${nid}: file data not chunk-based (layout ${ino.layout})`);
    } else if (type === S_IFDIR) {
      const data = dirData(meta, ino, blksz);
      for (let b = 0; b < data.length; b += blksz) {
        const block = data.subarray(b, Math.min(b + blksz, data.length));
        if (block.length < 12) break;
        const n = block.readUInt16LE(8) / 12;
        for (let k = 0; k < n; k++) {
          const child = Number(block.readBigUInt64LE(k * 12));
          const nameOff = block.readUInt16LE(k * 12 + 8);
          const nameEnd = k + 1 < n ? block.readUInt16LE((k + 1) * 12 + 8) : block.length;
          const name = block.subarray(nameOff, nameEnd).toString('latin1').replace(/\0.*$/s, '');
          if (name !== '.' && name !== '..') stack.push(child);
        }
      }
    }
    if (byOffset.size > MAX_CHUNKS) throw invalid(`more than ${MAX_CHUNKS} chunks`);
  }
  const extents = [...byOffset].map(([offset, length]) => ({ offset, length })).sort((a, b) => a.offset - b.offset);
  for (let i = 1; i < extents.length; i++) {
    if (extents[i]!.offset < extents[i - 1]!.offset + extents[i - 1]!.length) throw invalid('overlapping chunks');
  }
  return extents;
}

function dirData(meta: Buffer, ino: { layout: number; size: number; iu: number; tail: number }, blksz: number): Buffer {
  if (ino.layout === LAYOUT_FLAT_PLAIN) return meta.subarray(ino.iu * blksz, ino.iu * blksz + ino.size);
  if (ino.layout === LAYOUT_FLAT_INLINE) {
    const full = Math.floor(ino.size / blksz) * blksz;
    const head = meta.subarray(ino.iu * blksz, ino.iu * blksz + full);
    const tail = meta.subarray(ino.tail, ino.tail + (ino.size - full));
    return Buffer.concat([head, tail]);
  }
  throw invalid(`directory layout ${ino.layout} not supported`);
}

/** Reads the chunks of `blobPath` that `metaPath` lists and digests each. */
export async function buildChunkIndex(metaPath: string, blobPath: string): Promise<ChunkIndex> {
  const extents = erofsChunkExtents(await readFile(metaPath));
  const fh = await open(blobPath, 'r');
  try {
    const blobBytes = (await fh.stat()).size;
    const chunks: IndexedChunk[] = [];
    let buf = Buffer.alloc(1 << 20);
    for (const e of extents) {
      if (e.offset + e.length > blobBytes) throw invalid(`chunk at ${e.offset} past the blob's end`);
      if (buf.length < e.length) buf = Buffer.alloc(e.length);
      const { bytesRead } = await fh.read(buf, 0, e.length, e.offset);
      if (bytesRead !== e.length) throw invalid(`short read of the blob at ${e.offset}`);
      chunks.push({ ...e, sha256: createHash('sha256').update(buf.subarray(0, e.length)).digest('hex') });
    }
    return { blobBytes, chunks };
  } finally {
    await fh.close();
  }
}

/** The binary form of an index (what dsec-lazyfs reads; also the registry's chunk-index blob). */
export function encodeChunkIndex(index: ChunkIndex): Buffer {
  const out = Buffer.alloc(INDEX_HEADER_BYTES + index.chunks.length * INDEX_ENTRY_BYTES);
  out.write(INDEX_MAGIC, 0, 'latin1');
  out.writeBigUInt64LE(BigInt(index.blobBytes), 8);
  out.writeUInt32LE(index.chunks.length, 16);
  let p = INDEX_HEADER_BYTES;
  for (const c of index.chunks) {
    out.writeBigUInt64LE(BigInt(c.offset), p);
    out.writeUInt32LE(c.length, p + 8);
    out.write(c.sha256, p + 12, 'hex');
    p += INDEX_ENTRY_BYTES;
  }
  return out;
}

/** Parses and checks a binary index. */
export function decodeChunkIndex(buf: Buffer): ChunkIndex {
  if (buf.length < INDEX_HEADER_BYTES || buf.toString('latin1', 0, 8) !== INDEX_MAGIC) throw invalid('not a chunk index');
  const blobBytes = Number(buf.readBigUInt64LE(8));
  const count = buf.readUInt32LE(16);
  if (count > MAX_CHUNKS || buf.length !== INDEX_HEADER_BYTES + count * INDEX_ENTRY_BYTES) throw invalid('chunk index of the wrong size');
  const chunks: IndexedChunk[] = [];
  let p = INDEX_HEADER_BYTES;
  let end = 0;
  for (let i = 0; i < count; i++, p += INDEX_ENTRY_BYTES) {
    const offset = Number(buf.readBigUInt64LE(p));
    const length = buf.readUInt32LE(p + 8);
    if (offset < end || length === 0 || offset + length > blobBytes) throw invalid(`chunk ${i} out of order or past the blob`);
    end = offset + length;
    chunks.push({ offset, length, sha256: buf.toString('hex', p + 12, p + 44) });
  }
  return { blobBytes, chunks };
}
