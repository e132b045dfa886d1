// The edge wire over a byte stream (an HTTP/2 stream inside mutual TLS between machines): each
// frame is its length-prefixed JSON text followed by its byte parts, raw. An output event or a
// file's bytes cross as they are, not as base64 inside the JSON (docs/edge-wire.md, "Framing").
import type { FrameParts, Transport } from './transport.js';
import { MAX_FRAME_PARTS } from './values.js';

/** What {@link framedTransport} needs of a byte stream (a Node Duplex such as an HTTP/2 stream has it). */
export interface ByteDuplex {
  write(chunk: Uint8Array): unknown;
  cork(): void;
  uncork(): void;
  end(): unknown;
  destroy(err?: Error): unknown;
  on(event: 'data', listener: (chunk: Buffer) => void): unknown;
  on(event: 'close' | 'end', listener: () => void): unknown;
  on(event: 'error', listener: (err: Error) => void): unknown;
}

/** Largest frame accepted from the peer, text and parts together (a large file's reply). */
export const MAX_WIRE_FRAME_BYTES = 64 * 1024 * 1024;

/** Bytes of a frame's fixed head: the text's length and the number of parts (u32 big-endian each). */
const HEAD_BYTES = 8;
const NO_BYTES = Buffer.alloc(0);

/**
 * A Transport of length-prefixed frames over `duplex`; the duplex's end or error closes it.
 * A frame is `u32 textBytes, u32 parts, u32 partBytes × parts, text (UTF-8), part × parts`.
 */
export function framedTransport(duplex: ByteDuplex): Transport {
  const decoder = new TextDecoder('utf-8', { fatal: true });
  const closeListeners: Array<(err?: Error) => void> = [];
  const early: Array<[string, FrameParts]> = [];
  let receiver: ((frame: string, parts: FrameParts) => void) | undefined;
  let closed = false;
  let closeError: Error | undefined;

  const ended = (err?: Error): void => {
    if (closed) return;
    closed = true;
    closeError = err;
    for (const l of closeListeners.splice(0)) l(err);
  };

  // What has arrived and not yet been taken, in order; a part inside one read is a view of it.
  const queue: Buffer[] = [];
  let queued = 0;
  const take = (n: number): Buffer => {
    if (n === 0) return NO_BYTES;
    queued -= n;
    const first = queue[0] as Buffer;
    if (first.length >= n) {
      if (first.length === n) queue.shift();
      else queue[0] = first.subarray(n);
      return first.subarray(0, n);
    }
    const out = Buffer.allocUnsafe(n);
    let at = 0;
    while (at < n) {
      const b = queue[0] as Buffer;
      const k = Math.min(b.length, n - at);
      b.copy(out, at, 0, k);
      at += k;
      if (k === b.length) queue.shift();
      else queue[0] = b.subarray(k);
    }
    return out;
  };
  // The frame being read: its head once that came, then its part lengths and its body's size.
  let head: { textBytes: number; count: number } | undefined;
  let lengths: number[] | undefined;
  let bodyBytes = 0;
  /** Takes every whole frame out of the queue; throws when the peer broke the framing. */
  const readFrames = (out: Array<[string, FrameParts]>): void => {
    for (;;) {
      if (!head) {
        if (queued < HEAD_BYTES) return;
        const b = take(HEAD_BYTES);
        head = { textBytes: b.readUInt32BE(0), count: b.readUInt32BE(4) };
        if (head.count > MAX_FRAME_PARTS) throw new Error(`a frame of ${head.count} parts (at most ${MAX_FRAME_PARTS})`);
      }
      if (!lengths) {
        if (queued < 4 * head.count) return;
        const b = take(4 * head.count);
        lengths = Array.from({ length: head.count }, (_, i) => b.readUInt32BE(4 * i));
        bodyBytes = lengths.reduce((sum, n) => sum + n, head.textBytes);
        if (bodyBytes > MAX_WIRE_FRAME_BYTES) throw new Error(`a frame of ${bodyBytes} bytes (at most ${MAX_WIRE_FRAME_BYTES})`);
      }
      if (queued < bodyBytes) return;
      const text = decoder.decode(take(head.textBytes));
      const parts = lengths.map((n) => take(n));
      head = undefined;
      lengths = undefined;
      out.push([text, parts]);
    }
  };
  duplex.on('data', (chunk) => {
    if (closed) return;
    queue.push(chunk);
    queued += chunk.length;
    const frames: Array<[string, FrameParts]> = [];
    let broken: Error | undefined;
    try {
      readFrames(frames);
    } catch (err) {
      broken = err instanceof Error ? err : new Error(String(err));
    }
    for (const [text, parts] of frames) {
      if (closed) return;
      if (receiver) receiver(text, parts);
      else early.push([text, parts]);
    }
    if (broken !== undefined) duplex.destroy(new Error(`the peer broke the framing: ${broken.message}`));
  });
  duplex.on('error', (err) => ended(err));
  duplex.on('end', () => ended());
  duplex.on('close', () => ended(closeError ?? new Error('the stream closed')));

  return {
    send(frame: string, parts: FrameParts = []): void {
      if (closed) return;
      const textBytes = Buffer.byteLength(frame);
      const head = Buffer.allocUnsafe(HEAD_BYTES + 4 * parts.length + textBytes);
      head.writeUInt32BE(textBytes, 0);
      head.writeUInt32BE(parts.length, 4);
      parts.forEach((p, i) => head.writeUInt32BE(p.byteLength, HEAD_BYTES + 4 * i));
      head.write(frame, HEAD_BYTES + 4 * parts.length);
      if (parts.length === 0) {
        duplex.write(head);
        return;
      }
      // One write of the head and the parts as they are (no copy of the parts).
      duplex.cork();
      duplex.write(head);
      for (const p of parts) duplex.write(p);
      duplex.uncork();
    },
    onFrame(r: (frame: string, parts: FrameParts) => void): void {
      receiver = r;
      for (const [f, p] of early.splice(0)) r(f, p);
    },
    onClose(listener: (err?: Error) => void): void {
      if (closed) queueMicrotask(() => listener(closeError));
      else closeListeners.push(listener);
    },
    close(err?: Error): void {
      if (closed) return;
      if (err) duplex.destroy(err);
      else duplex.end();
      // A graceful end closes this side at once; the peer sees the end of its stream.
      ended(err);
    },
  };
}
