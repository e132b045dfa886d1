// The edge wire over a byte stream (an HTTP/2 stream inside mutual TLS between machines): each
// frame is its length-prefixed JSON text followed by its byte parts, raw. An output event or a
// file's bytes cross as they are, not as base64 inside the JSON (docs/edge-wire.md, "Framing").
import { DsecError } from '../errors.js';
import type { FrameParts, Transport } from './transport.js';
import { MAX_FRAME_PARTS } from './values.js';

/** What {@link framedTransport} needs of a byte stream (a Node Duplex such as an HTTP/2 stream has it). */
export interface ByteDuplex {
  /** Bytes written and not yet taken by the peer (a Node Writable's count). */
  readonly writableLength?: number;
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

/**
 * A part smaller than this that is a view of a larger read is copied out of it: an output event
 * kept in a slow reader's queue must not keep the whole read (64 KiB) alive.
 */
const COPY_PART_BELOW = 16 * 1024;

/**
 * Bytes written and not yet taken by the peer at most: a session whose peer stops reading is cut
 * (its calls fail as the session's loss does) rather than buffering calls, file bytes and events
 * without bound. Four of the largest frames.
 */
export const MAX_UNSENT_BYTES = 4 * MAX_WIRE_FRAME_BYTES;

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

  // What has arrived and not yet been taken, in order: only the heads of frames wait here (at most
  // 8 + 4 x MAX_FRAME_PARTS bytes), and whole frames inside one read, which are taken at once. A
  // frame that spans reads is copied into a body of its own as its bytes come: a peer sending a
  // frame a byte at a time costs its size, not a buffer object per byte.
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
  // The frame being read: its head once that came, then its part lengths and its body's size;
  // `body` while its bytes span reads.
  let head: { textBytes: number; count: number } | undefined;
  let lengths: number[] | undefined;
  let bodyBytes = 0;
  let body: Buffer | undefined;
  let bodyAt = 0;
  /** The frame whose text and parts are `bytes` (its body), in order. */
  const frameOf = (bytes: Buffer): [string, FrameParts] => {
    const h = head as { textBytes: number };
    const text = decoder.decode(bytes.subarray(0, h.textBytes));
    let at = h.textBytes;
    const parts = (lengths as number[]).map((n) => {
      const part = bytes.subarray(at, (at += n));
      return part.length < COPY_PART_BELOW && part.buffer.byteLength > 2 * part.length ? Buffer.from(part) : part;
    });
    head = undefined;
    lengths = undefined;
    return [text, parts];
  };
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
      if (queued < bodyBytes) {
        // Its body spans reads: what came of it is copied into a body of its own, the rest follows.
        body = Buffer.allocUnsafe(bodyBytes);
        bodyAt = 0;
        for (const b of queue.splice(0)) bodyAt += b.copy(body, bodyAt);
        queued = 0;
        return;
      }
      out.push(frameOf(take(bodyBytes)));
    }
  };
  duplex.on('data', (chunk) => {
    if (closed) return;
    const frames: Array<[string, FrameParts]> = [];
    let broken: Error | undefined;
    // Whatever the peer sent (text that is not UTF-8 too) cuts it off: nothing throws out of here.
    try {
      let rest: Buffer = chunk;
      if (body) {
        const k = chunk.copy(body, bodyAt);
        bodyAt += k;
        if (bodyAt < body.length) return;
        const whole = body;
        body = undefined;
        frames.push(frameOf(whole));
        rest = chunk.subarray(k);
      }
      if (rest.length > 0) {
        queue.push(rest);
        queued += rest.length;
        readFrames(frames);
      }
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
  // An end inside a frame is the peer's failure, not a graceful close.
  duplex.on('end', () => ended(head || body || queued > 0 ? new Error('the stream ended inside a frame') : undefined));
  duplex.on('close', () => ended(closeError ?? new Error('the stream closed')));

  return {
    send(frame: string, parts: FrameParts = []): void {
      if (closed) return;
      const textBytes = Buffer.byteLength(frame);
      // Refused here, whole, rather than sent for the peer to cut the session over (which would
      // end every call and stream of the node, not this one).
      const total = parts.reduce((sum, p) => sum + p.byteLength, textBytes);
      if (total > MAX_WIRE_FRAME_BYTES)
        throw new DsecError('PAYLOAD_TOO_LARGE', `a message of ${total} bytes: the node protocol carries at most ${MAX_WIRE_FRAME_BYTES}`);
      if ((duplex.writableLength ?? 0) > MAX_UNSENT_BYTES) {
        duplex.destroy(new Error(`the peer has not taken ${duplex.writableLength} bytes sent to it`));
        return;
      }
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
