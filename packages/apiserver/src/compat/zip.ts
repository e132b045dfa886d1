// A small reader of zip archives (what SWE-ReX's client sends for a directory upload): the
// central directory, stored and deflated entries, Unix modes. No zip64, no encryption. Entries
// are read lazily, one at a time: each inflates on zlib's thread pool (not the event loop), bounded
// by the size it declares, and the caller drops it before reading the next.
import { promisify } from 'node:util';
import { inflateRaw } from 'node:zlib';
import { DsecError } from '@dsec/protocol';

/** One entry of a zip archive. */
export interface ZipEntry {
  /** Relative path (`/`-separated; a directory ends in `/`). */
  name: string;
  dir: boolean;
  /** Unix permission bits when the archive recorded them. */
  mode: number | undefined;
  /** The size the archive declares (what `read()` gives, never more). */
  size: number;
  /** The entry's bytes; an entry whose data is longer than it declares is refused (400). */
  read(): Promise<Buffer>;
}

const inflate = promisify(inflateRaw);

const EOCD_SIG = 0x06054b50;
const CEN_SIG = 0x02014b50;
const LOC_SIG = 0x04034b50;

function bad(why: string): DsecError {
  return new DsecError('INVALID_ARGUMENT', `file: not a zip archive this server reads (${why})`, { field: 'file' });
}

/** The entries of a zip archive; names with `..`, absolute paths or NUL are refused, and so is an
 * archive whose entries declare more than `maxBytes` in total or one more than `maxEntryBytes`. */
export function readZip(buf: Buffer, maxBytes: number, maxEntryBytes = maxBytes): ZipEntry[] {
  let eocd = -1;
  for (let i = buf.length - 22; i >= Math.max(0, buf.length - 22 - 65_535); i--) {
    if (buf.readUInt32LE(i) === EOCD_SIG) {
      eocd = i;
      break;
    }
  }
  if (eocd < 0) throw bad('no end of central directory');
  const count = buf.readUInt16LE(eocd + 10);
  let at = buf.readUInt32LE(eocd + 16);
  const out: ZipEntry[] = [];
  let total = 0;
  for (let n = 0; n < count; n++) {
    if (at + 46 > buf.length || buf.readUInt32LE(at) !== CEN_SIG) throw bad('bad central directory');
    const method = buf.readUInt16LE(at + 10);
    const compressed = buf.readUInt32LE(at + 20);
    const size = buf.readUInt32LE(at + 24);
    const nameLen = buf.readUInt16LE(at + 28);
    const extraLen = buf.readUInt16LE(at + 30);
    const commentLen = buf.readUInt16LE(at + 32);
    const madeBy = buf.readUInt16LE(at + 4) >> 8;
    const external = buf.readUInt32LE(at + 38);
    const local = buf.readUInt32LE(at + 42);
    const name = buf.subarray(at + 46, at + 46 + nameLen).toString('utf8');
    at += 46 + nameLen + extraLen + commentLen;
    if (name.includes('\0') || name.startsWith('/') || name.split('/').some((s) => s === '..')) throw bad(`unsafe entry name ${JSON.stringify(name)}`);
    if (local + 30 > buf.length || buf.readUInt32LE(local) !== LOC_SIG) throw bad('bad local header');
    const start = local + 30 + buf.readUInt16LE(local + 26) + buf.readUInt16LE(local + 28);
    if (start + compressed > buf.length) throw bad(`entry ${JSON.stringify(name)} runs past the end of the archive`);
    const raw = buf.subarray(start, start + compressed);
    if (size > maxEntryBytes)
      throw new DsecError('PAYLOAD_TOO_LARGE', `file: entry ${JSON.stringify(name)} unpacks to more than ${maxEntryBytes} bytes`, { field: 'file' });
    total += size;
    if (total > maxBytes) throw new DsecError('PAYLOAD_TOO_LARGE', `file: the archive unpacks to more than ${maxBytes} bytes`, { field: 'file' });
    if (method !== 0 && method !== 8) throw bad(`compression method ${method}`);
    const dir = name.endsWith('/');
    const unixMode = madeBy === 3 ? (external >>> 16) & 0o7777 : 0;
    out.push({ name, dir, mode: unixMode !== 0 ? unixMode : undefined, size, read: () => entryData(name, method, raw, size) });
  }
  return out;
}

/** One entry's bytes: stored as is, or inflated with at most `size` bytes of output. */
async function entryData(name: string, method: number, raw: Buffer, size: number): Promise<Buffer> {
  const larger = (): DsecError => bad(`entry ${JSON.stringify(name)} is larger than it declares (${size} bytes)`);
  if (method === 0) {
    if (raw.length > size) throw larger();
    return Buffer.from(raw);
  }
  let data: Buffer;
  try {
    // maxOutputLength: the inflate stops (ERR_BUFFER_TOO_LARGE) past the declared size.
    data = await inflate(raw, { maxOutputLength: Math.max(1, size) });
  } catch (err) {
    if (err instanceof RangeError || (err as { code?: string }).code === 'ERR_BUFFER_TOO_LARGE') throw larger();
    throw bad(`entry ${JSON.stringify(name)} is not valid deflate data`);
  }
  if (data.length > size) throw larger();
  return data;
}
