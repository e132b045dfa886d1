// Binary framing of an exec's event stream (`application/vnd.dsec.exec-frames`): output bytes
// travel as they are, without the base64 and JSON of the ndjson form (a third more bytes, and an
// encode, a parse and a decode per chunk). A client asks for it in Accept; a server that does
// not know it answers ndjson, and the client reads whichever Content-Type comes back.
//
// A frame is a 5-byte header, the kind (1 byte) and the payload's length (uint32, big endian),
// then the payload. Kind 1 (stdout) and 2 (stderr): the output's byte offset in its stream
// (uint64, big endian) then the bytes. Kind 0: any other event as UTF-8 JSON, exactly as one
// ndjson line would carry it (start, gap, exit, error).
import type { ExecEvent } from './exec.js';

/** Media type of the binary exec stream. */
export const EXEC_FRAMES_MEDIA_TYPE = 'application/vnd.dsec.exec-frames';
/** Largest payload a decoder accepts (an output chunk is at most a few hundred KiB). */
export const MAX_EXEC_FRAME_BYTES = 16 * 1024 * 1024;

const HEADER_BYTES = 5;
const OFFSET_BYTES = 8;
const KIND_JSON = 0;
const KIND_STDOUT = 1;
const KIND_STDERR = 2;

/** An exec stream's event with its output as bytes (the ndjson form carries them as base64). */
export type ExecStreamEvent = Exclude<ExecEvent, { type: 'output' }> | { type: 'output'; stream: 'stdout' | 'stderr'; offset: number; data: Uint8Array };

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** The bytes of one event's frame, as pieces to write in order (output bytes are not copied). */
export function encodeExecFrame(ev: ExecStreamEvent): Uint8Array[] {
  if (ev.type === 'output') {
    const head = new Uint8Array(HEADER_BYTES + OFFSET_BYTES);
    const view = new DataView(head.buffer);
    view.setUint8(0, ev.stream === 'stdout' ? KIND_STDOUT : KIND_STDERR);
    view.setUint32(1, OFFSET_BYTES + ev.data.byteLength);
    view.setBigUint64(HEADER_BYTES, BigInt(ev.offset));
    return ev.data.byteLength > 0 ? [head, ev.data] : [head];
  }
  const json = encoder.encode(JSON.stringify(ev));
  const frame = new Uint8Array(HEADER_BYTES + json.byteLength);
  const view = new DataView(frame.buffer);
  view.setUint8(0, KIND_JSON);
  view.setUint32(1, json.byteLength);
  frame.set(json, HEADER_BYTES);
  return [frame];
}

/** Reads events back from a byte stream cut anywhere; throws on a malformed frame. */
export class ExecFrameDecoder {
  private pending: Uint8Array[] = [];
  private pendingBytes = 0;

  /** Adds bytes; returns the events they complete. */
  push(chunk: Uint8Array): ExecStreamEvent[] {
    if (chunk.byteLength > 0) {
      this.pending.push(chunk);
      this.pendingBytes += chunk.byteLength;
    }
    const out: ExecStreamEvent[] = [];
    while (this.pendingBytes >= HEADER_BYTES) {
      const head = this.peek(HEADER_BYTES);
      const view = new DataView(head.buffer, head.byteOffset, HEADER_BYTES);
      const kind = view.getUint8(0);
      const length = view.getUint32(1);
      if (kind > KIND_STDERR) throw new Error(`exec frames: unknown frame kind ${kind}`);
      if (length > MAX_EXEC_FRAME_BYTES) throw new Error(`exec frames: a frame of ${length} bytes (at most ${MAX_EXEC_FRAME_BYTES})`);
      if (kind !== KIND_JSON && length < OFFSET_BYTES) throw new Error('exec frames: an output frame without its offset');
      if (this.pendingBytes < HEADER_BYTES + length) break;
      this.take(HEADER_BYTES);
      const payload = this.take(length);
      if (kind === KIND_JSON) {
        out.push(JSON.parse(decoder.decode(payload)) as ExecStreamEvent);
      } else {
        const offset = new DataView(payload.buffer, payload.byteOffset, OFFSET_BYTES).getBigUint64(0);
        if (offset > BigInt(Number.MAX_SAFE_INTEGER)) throw new Error('exec frames: an offset past 2^53');
        out.push({ type: 'output', stream: kind === KIND_STDOUT ? 'stdout' : 'stderr', offset: Number(offset), data: payload.subarray(OFFSET_BYTES) });
      }
    }
    return out;
  }

  /** The stream ended: throws when it ended inside a frame. */
  end(): void {
    if (this.pendingBytes > 0) throw new Error(`exec frames: the stream ended inside a frame (${this.pendingBytes} bytes left)`);
  }

  /** The first `n` pending bytes in one piece, without consuming them (joins only the pieces they span). */
  private peek(n: number): Uint8Array {
    const first = this.pending[0]!;
    if (first.byteLength >= n) return first;
    let k = 1;
    for (let len = first.byteLength; len < n; k++) len += this.pending[k]!.byteLength;
    const joined = concat(this.pending.slice(0, k));
    this.pending.splice(0, k, joined);
    return joined;
  }

  /**
   * Consumes the first `n` pending bytes: a view when they sit in one piece, else a copy of
   * those bytes only (an output frame cut across socket reads is copied once, the bytes after
   * it not at all).
   */
  private take(n: number): Uint8Array {
    if (n === 0) return new Uint8Array(0);
    this.pendingBytes -= n;
    const first = this.pending[0]!;
    if (first.byteLength >= n) {
      if (first.byteLength === n) this.pending.shift();
      else this.pending[0] = first.subarray(n);
      return first.subarray(0, n);
    }
    const out = new Uint8Array(n);
    let at = 0;
    while (at < n) {
      const p = this.pending[0]!;
      const k = Math.min(p.byteLength, n - at);
      out.set(k === p.byteLength ? p : p.subarray(0, k), at);
      at += k;
      if (k === p.byteLength) this.pending.shift();
      else this.pending[0] = p.subarray(k);
    }
    return out;
  }
}

function concat(pieces: readonly Uint8Array[]): Uint8Array {
  let total = 0;
  for (const p of pieces) total += p.byteLength;
  const out = new Uint8Array(total);
  let at = 0;
  for (const p of pieces) {
    out.set(p, at);
    at += p.byteLength;
  }
  return out;
}

/** Events of a binary exec stream. */
export async function* readExecFrames(stream: AsyncIterable<Uint8Array>): AsyncGenerator<ExecStreamEvent> {
  const frames = new ExecFrameDecoder();
  for await (const chunk of stream) yield* frames.push(chunk);
  frames.end();
}
