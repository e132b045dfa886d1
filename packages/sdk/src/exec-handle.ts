// ExecHandle: a running process in a sandbox, its output as events, and its control.
import { StringDecoder } from 'node:string_decoder';
import { DsecError } from '@dsec/protocol';
import type { ExecEvent, ExecStreamEvent } from '@dsec/protocol';
import { streamedError } from './layers.js';
import { PushQueue } from './push-queue.js';
import type { ExitInfo } from './types.js';

/** One chunk of a process's output. */
export interface OutputEvent {
  stream: 'stdout' | 'stderr';
  data: Buffer;
  /** Byte offset of `data` in its stream; a jump past the previous chunk's end means lost bytes. */
  offset: number;
}

/** Bytes seen so far per stream: where to reattach from. */
export interface OutputOffsets {
  stdout: number;
  stderr: number;
}

/** Callbacks for output as it arrives, decoded as UTF-8 (split characters are held back). */
export interface OutputCallbacks {
  onStdout?: ((data: string) => void) | undefined;
  onStderr?: ((data: string) => void) | undefined;
}

/** A source of stream events that can be dropped: output as base64 (ndjson, WebSocket) or bytes (binary frames). */
export interface EventSource {
  events: AsyncIterable<ExecEvent | ExecStreamEvent>;
  /** Drops the connection; the process keeps running. */
  close(): void;
}

/** How a handle reaches its process. */
export interface ProcessControl {
  writeStdin(data: Buffer): Promise<void>;
  closeStdin(): Promise<void>;
  signal(name: string): Promise<void>;
  resize?(rows: number, cols: number): Promise<void>;
  /** Opens a new event source from the given offsets (after a dropped connection). */
  reconnect?(offsets: OutputOffsets): Promise<EventSource>;
}

/** Most unread output the async iterator holds; beyond it the oldest chunks are dropped. */
export const MAX_QUEUED_OUTPUT_BYTES = 16 * 1024 * 1024;
/** How often a dropped output stream is reopened before the handle gives up. */
const MAX_RECONNECTS = 3;

/**
 * A process started with `sandbox.spawn` or found again with `sandbox.attach`.
 * Iterate it for output events; callbacks see the same output as text. The iterator buffers up
 * to {@link MAX_QUEUED_OUTPUT_BYTES} of unread output. `disconnect()` drops the connection and
 * leaves the process running, to be attached again from {@link ExecHandle.offsets}.
 */
export class ExecHandle implements AsyncIterable<OutputEvent> {
  /** The process's handle in the sandbox (stable across reattaches). */
  readonly pid: number;
  /** Id of the sandbox the process runs in. */
  readonly sandboxId: string;
  /** Bytes lost per stream (no longer held by the agent when read). */
  readonly lostBytes: OutputOffsets = { stdout: 0, stderr: 0 };
  readonly #offsets: OutputOffsets;
  readonly #control: ProcessControl;
  readonly #callbacks: OutputCallbacks;
  readonly #decoders = { stdout: new StringDecoder('utf8'), stderr: new StringDecoder('utf8') };
  readonly #queue = new PushQueue<OutputEvent>();
  #queuedBytes = 0;
  #source: EventSource;
  #disconnected = false;
  #exit: ExitInfo | undefined;
  readonly #done: Promise<ExitInfo>;

  /** @internal Built by Sandbox.spawn / Sandbox.attach. */
  constructor(init: { sandboxId: string; pid: number; source: EventSource; control: ProcessControl; callbacks?: OutputCallbacks; offsets?: OutputOffsets }) {
    this.sandboxId = init.sandboxId;
    this.pid = init.pid;
    this.#source = init.source;
    this.#control = init.control;
    this.#callbacks = init.callbacks ?? {};
    this.#offsets = { stdout: init.offsets?.stdout ?? 0, stderr: init.offsets?.stderr ?? 0 };
    this.#done = this.#pump();
    // wait() may never be called; the outcome is still observed here.
    this.#done.catch(() => undefined);
  }

  /** Bytes of output seen so far per stream (pass to `sandbox.attach` to read on without loss). */
  get offsets(): OutputOffsets {
    return { ...this.#offsets };
  }

  /** How the process ended, once it has. */
  get exitInfo(): ExitInfo | undefined {
    return this.#exit;
  }

  /** Resolves when the process exits; rejects if the connection is lost for good or dropped. */
  wait(): Promise<ExitInfo> {
    return this.#done;
  }

  /** Sends a signal to the process (default SIGKILL). */
  async kill(signal = 'SIGKILL'): Promise<void> {
    await this.#control.signal(signal);
  }

  /** Writes to the process's stdin. */
  async writeStdin(data: string | Uint8Array): Promise<void> {
    await this.#control.writeStdin(typeof data === 'string' ? Buffer.from(data) : Buffer.from(data.buffer, data.byteOffset, data.byteLength));
  }

  /** Closes the process's stdin (EOF). */
  async closeStdin(): Promise<void> {
    await this.#control.closeStdin();
  }

  /** Resizes the terminal of a process started with `pty`. */
  async resize(rows: number, cols: number): Promise<void> {
    if (!this.#control.resize) throw new DsecError('INVALID_ARGUMENT', 'resize: the process has no terminal', { field: 'pty' });
    await this.#control.resize(rows, cols);
  }

  /** Drops the connection without stopping the process; wait() then rejects. */
  disconnect(): void {
    this.#disconnected = true;
    this.#source.close();
  }

  [Symbol.asyncIterator](): AsyncIterator<OutputEvent> {
    const inner = this.#queue[Symbol.asyncIterator]();
    return {
      next: async () => {
        const r = await inner.next();
        if (!r.done) this.#queuedBytes -= r.value.data.length;
        return r;
      },
      return: async () => inner.return?.() ?? { value: undefined, done: true },
    };
  }

  async #pump(): Promise<ExitInfo> {
    let reconnects = 0;
    try {
      for (;;) {
        let failure: unknown;
        try {
          for await (const ev of this.#source.events) {
            const exit = this.#handle(ev);
            if (exit) {
              this.#source.close();
              this.#exit = exit;
              return exit;
            }
            reconnects = 0;
          }
        } catch (err) {
          failure = err;
        }
        if (this.#disconnected)
          throw new DsecError('UNAVAILABLE', `process ${this.pid}: disconnected by the client`, { sandboxId: this.sandboxId, pid: this.pid });
        if (failure instanceof DsecError && failure.code !== 'UNAVAILABLE') throw failure;
        if (!this.#control.reconnect || reconnects >= MAX_RECONNECTS) {
          if (failure) throw failure as Error;
          throw new DsecError('UNAVAILABLE', `process ${this.pid}: output stream ended before the exit`, { sandboxId: this.sandboxId, pid: this.pid });
        }
        reconnects++;
        await new Promise((r) => setTimeout(r, 50 * reconnects));
        this.#source = await this.#control.reconnect(this.offsets);
      }
    } catch (err) {
      this.#queue.fail(err);
      throw err;
    } finally {
      for (const s of ['stdout', 'stderr'] as const) {
        const rest = this.#decoders[s].end();
        if (rest) this.#emitText(s, rest);
      }
      this.#queue.end();
    }
  }

  /** Applies one event; returns the exit info on the exit event. */
  #handle(ev: ExecEvent | ExecStreamEvent): ExitInfo | undefined {
    switch (ev.type) {
      case 'output': {
        let data = typeof ev.data === 'string' ? Buffer.from(ev.data, 'base64') : Buffer.from(ev.data.buffer, ev.data.byteOffset, ev.data.byteLength);
        let offset = ev.offset;
        const seen = this.#offsets[ev.stream];
        if (offset + data.length <= seen) return undefined; // already delivered (overlap after a reattach)
        if (offset < seen) {
          data = data.subarray(seen - offset);
          offset = seen;
        } else if (offset > seen) this.lostBytes[ev.stream] += offset - seen;
        this.#offsets[ev.stream] = offset + data.length;
        // Decoded to text only for a callback that takes it: a reader of bytes pays no UTF-8
        // decode (it was a large share of a streamed GiB's client time, issue 15).
        if (this.#wantsText(ev.stream)) {
          const text = this.#decoders[ev.stream].write(data);
          if (text) this.#emitText(ev.stream, text);
        }
        this.#enqueue({ stream: ev.stream, data, offset });
        return undefined;
      }
      case 'gap': {
        const end = ev.offset + ev.bytes;
        if (end > this.#offsets[ev.stream]) {
          this.lostBytes[ev.stream] += end - Math.max(ev.offset, this.#offsets[ev.stream]);
          this.#offsets[ev.stream] = end;
        }
        return undefined;
      }
      case 'exit': {
        const { type: _t, pid: _p, ...exit } = ev;
        return exit;
      }
      case 'error':
        throw streamedError(ev.error);
      default:
        return undefined;
    }
  }

  #wantsText(stream: 'stdout' | 'stderr'): boolean {
    return (stream === 'stdout' ? this.#callbacks.onStdout : this.#callbacks.onStderr) !== undefined;
  }

  #emitText(stream: 'stdout' | 'stderr', text: string): void {
    if (stream === 'stdout') this.#callbacks.onStdout?.(text);
    else this.#callbacks.onStderr?.(text);
  }

  #enqueue(ev: OutputEvent): void {
    this.#queue.push(ev);
    this.#queuedBytes += ev.data.length;
    while (this.#queuedBytes > MAX_QUEUED_OUTPUT_BYTES && this.#queue.length > 0) {
      const dropped = this.#queue.shift();
      if (dropped) this.#queuedBytes -= dropped.data.length;
    }
  }
}
