// Frame and TLV codec of the chronus wire protocol (docs/chronus-protocol.md).

/** Bytes in a frame header: u32 length, u16 type, u16 flags, u32 id. */
export const HEADER_BYTES = 12;
/** Largest payload either side accepts. */
export const MAX_PAYLOAD_BYTES = 1_048_576 + 65_536;
/** Largest DATA a single READ or WRITE frame carries. */
export const MAX_IO_BYTES = 1_048_576;

/** Message types. */
export const T = {
  PING: 0x01, EXEC: 0x02, STDIN: 0x03, SIGNAL: 0x04, WAIT: 0x05, LIST: 0x06, ATTACH: 0x07,
  ACK: 0x08, DETACH: 0x09, RESIZE: 0x0a, RELEASE: 0x0b, RESET: 0x0c,
  STAT: 0x20, READ: 0x21, WRITE: 0x22, LISTDIR: 0x23, MKDIR: 0x24, REMOVE: 0x25, RENAME: 0x26, SYMLINK: 0x27, STATFS: 0x28, XATTRS: 0x29,
  OK: 0x80, INFO: 0x81, STARTED: 0x82, PROCS: 0x86, STATRES: 0xa0, DATA: 0xa1, ENTRIES: 0xa3, STATFSRES: 0xa8, XATTRSRES: 0xa9,
  OUTPUT: 0x90, GAP: 0x91, EXIT: 0x92, ERROR: 0xff,
} as const;

/** Field tags. */
export const F = {
  ARGV: 1, SHELL: 2, ENV: 3, CWD: 4, UID: 5, GID: 6, STDIN: 7, PTY: 8, ROWS: 9, COLS: 10,
  TIMEOUT_MS: 11, ATTACH: 12, WINDOW: 13, DATA: 14, EOF: 15, PROC: 16, PID: 17, SIGNAL: 18,
  STREAM: 19, OFFSET: 20, FROM_STDOUT: 21, FROM_STDERR: 22, EXIT_CODE: 23, TIMED_OUT: 24,
  DURATION_MS: 25, CPU_USER_MS: 26, CPU_SYS_MS: 27, MAXRSS_KIB: 28, STDOUT_END: 29,
  STDERR_END: 30, STATE: 31, PATH: 32, PATH2: 33, MODE: 34, LENGTH: 35, OPEN_FLAGS: 36,
  SIZE: 37, MTIME_MS: 38, FTYPE: 39, NAME: 40, ENTRY: 41, PARENTS: 42, RECURSIVE: 43,
  ERRNO: 44, MESSAGE: 45, VERSION: 46, UPTIME_MS: 47, NPROCS: 48, OUTPUT_CAP: 49, COUNT: 50,
  LINK: 51, NOFOLLOW: 52, PROCENTRY: 53, GROUP: 54, UID_OUT: 55, GID_OUT: 56,
  BYTES_TOTAL: 57, BYTES_FREE: 58, FILES_TOTAL: 59, FILES_FREE: 60,
  PREFIX: 61, XATTR: 62, REPLACE: 63,
} as const;

/** A field value: a number (u64), a string or bytes, `true` for a flag, or nested fields. */
export type FieldValue = number | string | Uint8Array | true | Field[];
/** One TLV field. */
export type Field = readonly [tag: number, value: FieldValue];

/** A decoded frame. */
export interface Frame {
  type: number;
  id: number;
  fields: Fields;
}

function encodeValue(v: FieldValue): Buffer {
  if (v === true) return Buffer.alloc(0);
  if (typeof v === 'number') {
    const b = Buffer.alloc(8);
    b.writeBigUInt64LE(BigInt(Math.trunc(v)));
    return b;
  }
  if (typeof v === 'string') return Buffer.from(v);
  if (v instanceof Uint8Array) return Buffer.from(v.buffer, v.byteOffset, v.byteLength);
  return encodeFields(v);
}

/** Encodes a list of fields as a TLV payload. */
export function encodeFields(fields: readonly Field[]): Buffer {
  const parts: Buffer[] = [];
  for (const [tag, value] of fields) {
    const body = encodeValue(value);
    const head = Buffer.alloc(6);
    head.writeUInt16LE(tag, 0);
    head.writeUInt32LE(body.length, 2);
    parts.push(head, body);
  }
  return Buffer.concat(parts);
}

/** Encodes one frame. */
export function encodeFrame(type: number, id: number, fields: readonly Field[]): Buffer {
  const payload = encodeFields(fields);
  if (payload.length > MAX_PAYLOAD_BYTES) throw new RangeError(`frame payload of ${payload.length} bytes exceeds ${MAX_PAYLOAD_BYTES}`);
  const head = Buffer.alloc(HEADER_BYTES);
  head.writeUInt32LE(payload.length, 0);
  head.writeUInt16LE(type, 4);
  head.writeUInt16LE(0, 6);
  head.writeUInt32LE(id >>> 0, 8);
  return Buffer.concat([head, payload]);
}

/** Read access to a decoded TLV payload. */
export class Fields {
  private readonly entries: Array<[number, Buffer]> = [];

  constructor(payload: Buffer) {
    let off = 0;
    while (off < payload.length) {
      if (off + 6 > payload.length) throw new Error('truncated field header');
      const tag = payload.readUInt16LE(off);
      const len = payload.readUInt32LE(off + 2);
      off += 6;
      if (off + len > payload.length) throw new Error('field overruns frame');
      this.entries.push([tag, payload.subarray(off, off + len)]);
      off += len;
    }
  }

  has(tag: number): boolean {
    return this.entries.some(([t]) => t === tag);
  }

  bytes(tag: number): Buffer | undefined {
    return this.entries.find(([t]) => t === tag)?.[1];
  }

  str(tag: number): string | undefined {
    return this.bytes(tag)?.toString('utf8');
  }

  num(tag: number): number | undefined {
    const b = this.bytes(tag);
    if (b === undefined) return undefined;
    if (b.length !== 8) throw new Error(`field ${tag} is not a u64`);
    return Number(b.readBigUInt64LE());
  }

  all(tag: number): Buffer[] {
    return this.entries.filter(([t]) => t === tag).map(([, b]) => b);
  }

  nested(tag: number): Fields[] {
    return this.all(tag).map((b) => new Fields(b));
  }
}

/** Splits a byte stream into frames; throws on a frame larger than the protocol allows. */
export class FrameReader {
  private chunks: Buffer[] = [];
  private buffered = 0;
  /** Bytes the frame being assembled needs in all (0 until its header is complete). */
  private need = 0;

  push(chunk: Buffer): Frame[] {
    this.chunks.push(chunk);
    this.buffered += chunk.length;
    const frames: Frame[] = [];
    for (;;) {
      if (this.need === 0) {
        if (this.buffered < HEADER_BYTES) break;
        const head = this.peek(HEADER_BYTES);
        const len = head.readUInt32LE(0);
        if (len > MAX_PAYLOAD_BYTES) throw new Error(`frame of ${len} bytes exceeds the protocol maximum`);
        this.need = HEADER_BYTES + len;
      }
      // Chunks are joined only once a whole frame is there, not on every read.
      if (this.buffered < this.need) break;
      const buf = this.take(this.need);
      this.need = 0;
      frames.push({ type: buf.readUInt16LE(4), id: buf.readUInt32LE(8), fields: new Fields(buf.subarray(HEADER_BYTES)) });
    }
    return frames;
  }

  private peek(n: number): Buffer {
    const first = this.chunks[0]!;
    if (first.length >= n) return first;
    // A header cut across reads: join the chunks it spans (not everything buffered).
    let k = 1;
    for (let len = first.length; len < n; k++) len += this.chunks[k]!.length;
    const joined = Buffer.concat(this.chunks.slice(0, k));
    this.chunks.splice(0, k, joined);
    return joined;
  }

  /** The first `n` buffered bytes: a view when they sit in one chunk, else a copy of those bytes only. */
  private take(n: number): Buffer {
    const first = this.chunks[0]!;
    this.buffered -= n;
    if (first.length >= n) {
      if (first.length === n) this.chunks.shift();
      else this.chunks[0] = first.subarray(n);
      return first.subarray(0, n);
    }
    const frame = Buffer.allocUnsafe(n);
    let at = 0;
    while (at < n) {
      const c = this.chunks[0]!;
      const k = Math.min(c.length, n - at);
      c.copy(frame, at, 0, k);
      at += k;
      if (k === c.length) this.chunks.shift();
      else this.chunks[0] = c.subarray(k);
    }
    return frame;
  }
}
