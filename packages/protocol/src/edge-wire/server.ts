// The serving side of the edge wire protocol: takes frames from one client, checks every call's
// arguments with the protocol's schemas, makes the call on the real edge and sends back its
// result, its output and its streams. One server per connection.
import { DsecError } from '../errors.js';
import type { EdgeClient, ProcessStream } from '../edge-client.js';
import type { ClientFrame, ServerFrame } from './frames.js';
import {
  DEFAULT_HEARTBEAT_MS,
  EDGE_WIRE_VERSION,
  MAX_UPLOAD_CHUNK_BYTES,
  STREAM_WINDOW_EVENTS,
  UPLOAD_WINDOW_CHUNKS,
  decodeClientFrame,
  encodeFrame,
} from './frames.js';
import type { CallContext, StreamMethodName, WireMethodName } from './methods.js';
import { STREAM_METHODS, SUBSCRIBE_METHOD, WIRE_METHODS, parseArgs } from './methods.js';
import type { FrameParts, Transport } from './transport.js';
import type { WireError, WireValue } from './values.js';
import { decodeValue, encodeValue, fromWireError, toWireError } from './values.js';

/** Options of {@link serveEdge}. */
export interface ServeEdgeOptions {
  /** Where the real messages of internal errors and protocol faults go (default: nowhere). */
  log?: (line: string) => void;
  /** Interval of the heartbeat that carries the node's capacity; 0 sends none. Default {@link DEFAULT_HEARTBEAT_MS}. */
  heartbeatMs?: number;
}

/** A served connection. */
export interface EdgeServer {
  /** Closes the connection: calls in flight are aborted, streams detached (their processes keep running). */
  close(): void;
  /** Resolves when the connection has ended, either way. */
  readonly closed: Promise<void>;
}

/** A process stream the client holds open. */
interface OpenStream {
  stream: ProcessStream;
  credit: number;
  wake: (() => void) | undefined;
  /** The connection ended: stop pulling output. */
  stopping: boolean;
  /** Detached by the client: send what the edge still yields (it ends soon), credit or not. */
  draining: boolean;
  ended: boolean;
  exitSent: boolean;
}

/** Serves `edge` to the client at the other end of `transport`; sends the hello at once. */
export function serveEdge(edge: EdgeClient, transport: Transport, opts: ServeEdgeOptions = {}): EdgeServer {
  const log = opts.log ?? (() => undefined);
  const heartbeatMs = opts.heartbeatMs ?? DEFAULT_HEARTBEAT_MS;
  const calls = new Map<number, { abort: AbortController; upload: UploadQueue | undefined }>();
  const streams = new Map<number, OpenStream>();
  const subscriptions = new Map<number, () => void>();
  let open = true;
  let resolveClosed!: () => void;
  const closed = new Promise<void>((r) => (resolveClosed = r));

  const send = (frame: ServerFrame, parts?: FrameParts): void => {
    if (open) transport.send(encodeFrame(frame), parts);
  };
  /** Sends the frame `make` builds around values encoded with this frame's parts. */
  const sendWith = (make: (encode: (v: unknown) => WireValue) => ServerFrame): void => {
    const parts: Uint8Array[] = [];
    const frame = make((v) => encodeValue(v, parts));
    send(frame, parts);
  };
  const sendError = (id: number, err: unknown): void => send({ t: 'error', id, error: toWireError(err, log) });

  send({ t: 'hello', version: EDGE_WIRE_VERSION, nodeName: edge.nodeName, capacity: edge.capacity(), heartbeatMs });
  const beat = (): void => {
    try {
      send({ t: 'heartbeat', capacity: edge.capacity() });
    } catch (err) {
      // An edge that is shutting down may not answer; the next beat tries again.
      log(`edge-wire: capacity for the heartbeat: ${err instanceof Error ? err.message : String(err)}`);
    }
  };
  const heartbeat = heartbeatMs > 0 ? setInterval(beat, heartbeatMs) : undefined;
  (heartbeat as { unref?: () => void } | undefined)?.unref?.();

  transport.onFrame((text, parts) => {
    let frame: ClientFrame;
    try {
      frame = decodeClientFrame(text);
    } catch (err) {
      log(`edge-wire: refused a frame: ${err instanceof Error ? err.message : String(err)}`);
      const id = idOf(text);
      if (id !== undefined) sendError(id, err);
      return;
    }
    switch (frame.t) {
      case 'call':
        onCall(frame, parts);
        return;
      case 'cancel': {
        calls.get(frame.id)?.abort.abort(new DsecError('CANCELLED', 'cancelled by the caller'));
        const unsubscribe = subscriptions.get(frame.id);
        if (unsubscribe) {
          subscriptions.delete(frame.id);
          unsubscribe();
          send({ t: 'reply', id: frame.id, value: null });
        }
        return;
      }
      case 'credit': {
        const s = streams.get(frame.id);
        if (s) {
          s.credit += frame.n;
          s.wake?.();
        }
        return;
      }
      case 'chunk': {
        const data = parts[0];
        if (parts.length !== 1 || !data || data.byteLength > MAX_UPLOAD_CHUNK_BYTES) {
          const err = new DsecError('INVALID_ARGUMENT', `an upload chunk is one part of at most ${MAX_UPLOAD_CHUNK_BYTES} bytes`, { field: 'frame.data' });
          log(`edge-wire: refused a frame: ${err.message}`);
          // The upload ends with the error and its call is stopped: the call's own reply (the
          // error) is then the one the client gets, and nothing waits for chunks that will not come.
          const call = calls.get(frame.id);
          if (call) {
            call.upload?.end(toWireError(err, log));
            call.abort.abort(err);
          } else sendError(frame.id, err);
          return;
        }
        calls.get(frame.id)?.upload?.push(data);
        return;
      }
      case 'chunk-end':
        calls.get(frame.id)?.upload?.end(frame.error);
        return;
    }
  });

  transport.onClose((err) => {
    open = false;
    if (heartbeat) clearInterval(heartbeat);
    const lost = new DsecError('UNAVAILABLE', `connection to the control plane ended${err ? `: ${err.message}` : ''}`);
    for (const c of calls.values()) {
      c.abort.abort(lost);
      c.upload?.end({ code: lost.code, message: lost.message });
    }
    for (const s of streams.values()) stopStream(s);
    for (const unsubscribe of subscriptions.values()) unsubscribe();
    calls.clear();
    streams.clear();
    subscriptions.clear();
    resolveClosed();
  });

  function onCall(frame: Extract<ClientFrame, { t: 'call' }>, parts: FrameParts): void {
    const { id, method } = frame;
    if (calls.has(id) || streams.has(id) || subscriptions.has(id)) {
      sendError(id, new DsecError('CONFLICT', `call id ${id} is in use`));
      return;
    }
    if (method === SUBSCRIBE_METHOD) {
      try {
        subscriptions.set(
          id,
          edge.onEvent((event) => {
            // A sink must not throw: an event with no wire form is logged, not sent.
            try {
              sendWith((encode) => ({ t: 'event', id, event: encode(event) }));
            } catch (err) {
              log(`edge-wire: event ${event.kind} not sent: ${err instanceof Error ? err.message : String(err)}`);
            }
          }),
        );
      } catch (err) {
        sendError(id, err);
      }
      return;
    }
    const streamOp = Object.hasOwn(STREAM_METHODS, method) ? STREAM_METHODS[method as StreamMethodName] : undefined;
    if (streamOp) {
      void settle(id, async () => {
        const args = parseArgs(
          method,
          streamOp.args,
          frame.args.map((a) => decodeValue(a, parts)),
        );
        const s = streams.get(args[0] as number);
        if (!s) throw new DsecError('PROCESS_NOT_FOUND', 'the process stream has ended');
        if (method === 'process.detach') {
          s.draining = true;
          s.wake?.();
        }
        await streamOp.run(s.stream, args);
        return null;
      });
      return;
    }
    const m = Object.hasOwn(WIRE_METHODS, method) ? WIRE_METHODS[method as WireMethodName] : undefined;
    if (!m) {
      sendError(id, new DsecError('INVALID_ARGUMENT', `unknown method ${JSON.stringify(method)}`, { field: 'method' }));
      return;
    }
    const abort = new AbortController();
    const upload = frame.upload ? new UploadQueue((n) => send({ t: 'credit', id, n })) : undefined;
    calls.set(id, { abort, upload });
    const ctx: CallContext = {};
    if (frame.signal) ctx.signal = abort.signal;
    if (frame.output) ctx.onOutput = (ev) => sendWith((encode) => ({ t: 'output', id, event: encode(ev) }));
    if (frame.progress) ctx.onProgress = (line) => send({ t: 'progress', id, line });
    if (upload) ctx.upload = upload;
    void (async () => {
      try {
        const args = parseArgs(
          method,
          m.args,
          frame.args.map((a) => decodeValue(a, parts)),
        );
        const value = await m.run(edge, args, ctx);
        if (m.stream) {
          const stream = value as ProcessStream;
          calls.delete(id);
          if (!open) {
            await stream.detach();
            return;
          }
          // Cancelled while it was being made: the caller holds no handle, so let go of it here.
          if (abort.signal.aborted) {
            await stream.detach().catch(() => undefined);
            throw abort.signal.reason as Error;
          }
          openStream(id, stream);
          send({ t: 'reply', id, value: { pid: stream.pid, osPid: stream.osPid } });
          void pump(id, streams.get(id) as OpenStream);
        } else sendWith((encode) => ({ t: 'reply', id, value: encode(value) }));
      } catch (err) {
        const cancelled = abort.signal.aborted && !(err instanceof DsecError);
        sendError(id, cancelled ? abort.signal.reason : err);
      } finally {
        calls.delete(id);
        upload?.end({ code: 'CANCELLED', message: 'the call has ended' });
      }
    })();
  }

  async function settle(id: number, fn: () => Promise<unknown>): Promise<void> {
    try {
      const value = await fn();
      sendWith((encode) => ({ t: 'reply', id, value: encode(value) }));
    } catch (err) {
      sendError(id, err);
    }
  }

  function openStream(id: number, stream: ProcessStream): void {
    const s: OpenStream = { stream, credit: STREAM_WINDOW_EVENTS, wake: undefined, stopping: false, draining: false, ended: false, exitSent: false };
    streams.set(id, s);
    const exit = (frame: ServerFrame): void => {
      s.exitSent = true;
      if (streams.get(id) !== s) return;
      send(frame);
      if (s.ended) streams.delete(id);
    };
    stream.exited.then(
      (info) => exit({ t: 'exit', id, exit: encodeValue(info) }),
      (err: unknown) => exit({ t: 'exit', id, error: toWireError(err, log) }),
    );
  }

  async function pump(id: number, s: OpenStream): Promise<void> {
    const it = s.stream[Symbol.asyncIterator]();
    let error: WireError | undefined;
    try {
      for (;;) {
        if (s.stopping) {
          await it.return?.();
          break;
        }
        if (s.credit <= 0 && !s.draining) {
          await new Promise<void>((resolve) => (s.wake = resolve));
          s.wake = undefined;
          continue;
        }
        const r = await it.next();
        if (r.done) break;
        s.credit--;
        sendWith((encode) => ({ t: 'output', id, event: encode(r.value) }));
      }
    } catch (err) {
      // A stream that was asked to stop may end any way it likes: that is the detach.
      if (!s.stopping && !s.draining) error = toWireError(err, log);
    }
    s.ended = true;
    send(error ? { t: 'end', id, error } : { t: 'end', id });
    // The exit follows when it is known; a detached stream's process may run on unknown.
    if (s.exitSent || s.stopping || s.draining) streams.delete(id);
  }

  function stopStream(s: OpenStream): void {
    s.stopping = true;
    s.wake?.();
    if (!s.ended) s.stream.detach().catch((err: unknown) => log(`edge-wire: detach on close: ${String(err)}`));
  }

  return {
    close: () => transport.close(),
    closed,
  };
}

/** The upload body of a layer build: chunks as the client sends them, credit as they are read. */
class UploadQueue implements AsyncIterable<Uint8Array> {
  private readonly chunks: Uint8Array[] = [];
  private done = false;
  private error: DsecError | undefined;
  private wake: (() => void) | undefined;
  private read = 0;

  constructor(private readonly grant: (n: number) => void) {}

  push(chunk: Uint8Array): void {
    if (this.done) return;
    this.chunks.push(chunk);
    this.wake?.();
  }

  end(error?: WireError): void {
    if (this.done) return;
    this.done = true;
    if (error) this.error = fromWireError(error);
    this.wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<Uint8Array> {
    for (;;) {
      const chunk = this.chunks.shift();
      if (chunk) {
        if (++this.read >= UPLOAD_WINDOW_CHUNKS / 2) {
          this.grant(this.read);
          this.read = 0;
        }
        yield chunk;
        continue;
      }
      if (this.error) throw this.error;
      if (this.done) return;
      await new Promise<void>((resolve) => (this.wake = resolve));
      this.wake = undefined;
    }
  }
}

function idOf(text: string): number | undefined {
  try {
    const v = JSON.parse(text) as { id?: unknown };
    return typeof v.id === 'number' && Number.isSafeInteger(v.id) && v.id >= 0 ? v.id : undefined;
  } catch {
    return undefined;
  }
}
