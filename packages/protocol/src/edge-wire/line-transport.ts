// The edge wire over a byte stream (an HTTP/2 stream inside mutual TLS between machines): one
// frame per line. A frame is JSON text, whose encoding never holds a raw newline.
import type { Transport } from './transport.js';

/** What {@link lineTransport} needs of a byte stream (a Node Duplex such as an HTTP/2 stream has it). */
export interface ByteDuplex {
  write(chunk: string): unknown;
  end(): unknown;
  destroy(err?: Error): unknown;
  on(event: 'data', listener: (chunk: Uint8Array) => void): unknown;
  on(event: 'close' | 'end', listener: () => void): unknown;
  on(event: 'error', listener: (err: Error) => void): unknown;
}

/** Largest frame accepted from the peer (a 256 KiB chunk as base64 plus its envelope, or a large reply). */
export const MAX_LINE_FRAME_BYTES = 64 * 1024 * 1024;

/** A Transport of newline-delimited frames over `duplex`; the duplex's end or error closes it. */
export function lineTransport(duplex: ByteDuplex): Transport {
  const decoder = new TextDecoder('utf-8', { fatal: true });
  const closeListeners: Array<(err?: Error) => void> = [];
  const early: string[] = [];
  let receiver: ((frame: string) => void) | undefined;
  let closed = false;
  let closeError: Error | undefined;

  const ended = (err?: Error): void => {
    if (closed) return;
    closed = true;
    closeError = err;
    for (const l of closeListeners.splice(0)) l(err);
  };
  const deliver = (frame: string): void => {
    if (receiver) receiver(frame);
    else early.push(frame);
  };
  // A frame's pieces until its newline comes: only each new chunk is searched (a frame of
  // megabytes arrives in thousands of chunks).
  let pieces: string[] = [];
  let pending = 0;
  duplex.on('data', (chunk) => {
    if (closed) return;
    let text: string;
    try {
      text = decoder.decode(chunk, { stream: true });
    } catch {
      duplex.destroy(new Error('the peer sent bytes that are not UTF-8'));
      return;
    }
    let start = 0;
    let nl: number;
    while ((nl = text.indexOf('\n', start)) >= 0) {
      pieces.push(text.slice(start, nl));
      const line = pieces.join('');
      pieces = [];
      pending = 0;
      start = nl + 1;
      if (line.length > 0) deliver(line);
    }
    if (start < text.length) {
      pieces.push(text.slice(start));
      pending += text.length - start;
    }
    if (pending > MAX_LINE_FRAME_BYTES) duplex.destroy(new Error(`a frame longer than ${MAX_LINE_FRAME_BYTES} bytes`));
  });
  duplex.on('error', (err) => ended(err));
  duplex.on('end', () => ended());
  duplex.on('close', () => ended(closeError ?? new Error('the stream closed')));

  return {
    send(frame: string): void {
      if (!closed) duplex.write(`${frame}\n`);
    },
    onFrame(r: (frame: string) => void): void {
      receiver = r;
      for (const f of early.splice(0)) r(f);
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
