// The calling side of the edge wire protocol: an EdgeClient whose every call, stream and event
// crosses a Transport as frames. The control plane uses it exactly as it uses an in-process edge.
import type { EventSink, RaisedEvent } from '../events.js';
import { DsecError } from '../errors.js';
import type {
  EdgeScreen,
  EdgeCallOptions,
  EdgeCalls,
  EdgeClient,
  EdgeExecOptions,
  EdgeLayers,
  EdgeCreateItem,
  EdgeCreateResult,
  EdgeSandbox,
  LayerBuildOptions,
  LayerBuildSource,
  NodeCapacity,
  NodeGarbageReport,
  NodeUsageReport,
  NodePauseResult,
  OutputEvent,
  ProcessStream,
} from '../edge-client.js';
import type { CallBatchRequest, CallBatchResult, CallRequest, CallResult } from '../calls.js';
import type { ProcessInfo } from '../exec.js';
import type { DiffOptions, DiffResult, VerifyRequest, VerifyResult } from '../files.js';
import type { EgressLogEntry, SandboxNetwork } from '../network.js';
import type { NetworkPolicy } from '../network.js';
import type { ExecResult, ExecSpec, ExitInfo } from '../exec.js';
import type { FileStat } from '../files.js';
import type { LayerInfo, LayerKind } from '../layers.js';
import type { PauseMemory, SandboxClaim, SandboxSpec, SandboxStats } from '../sandboxes.js';
import type { ClientFrame, ServerFrame } from './frames.js';
import { EDGE_WIRE_VERSION, MAX_UPLOAD_CHUNK_BYTES, STREAM_WINDOW_EVENTS, UPLOAD_WINDOW_CHUNKS, decodeServerFrame, encodeFrame } from './frames.js';
import { SUBSCRIBE_METHOD } from './methods.js';
import type { StreamMethodName, WireMethodName } from './methods.js';
import type { FrameParts, Transport } from './transport.js';
import type { WireError, WireValue } from './values.js';
import { decodeValue, encodeValue, fromWireError, toWireError } from './values.js';

/** Options of {@link WireEdgeClient.connect}. */
export interface WireEdgeClientOptions {
  /** How long to wait for the server's hello. Default 10 000 ms. */
  helloTimeoutMs?: number;
  /** Treat the connection as lost when no frame came for this long (a few heartbeats). Default: never. */
  silenceTimeoutMs?: number;
  /** Where callback failures and protocol faults go (default: nowhere). */
  log?: (line: string) => void;
}

/** Default wait for the server's hello. */
export const DEFAULT_HELLO_TIMEOUT_MS = 10_000;

interface Pending {
  resolve(value: unknown): void;
  reject(err: Error): void;
  signal: AbortSignal | undefined;
  onOutput: ((ev: OutputEvent) => void) | undefined;
  onProgress: ((line: string) => void) | undefined;
  /** Spawn and attach: the reply opens stream `id`. */
  stream: boolean;
}

interface CallExtras {
  signal?: AbortSignal | undefined;
  onOutput?: ((ev: OutputEvent) => void) | undefined;
  onProgress?: ((line: string) => void) | undefined;
  upload?: AsyncIterable<Uint8Array> | undefined;
  stream?: boolean;
}

const noop = (): void => undefined;

/** What a caller aborted with (an Error, as a rejection should be). */
function abortReason(signal: AbortSignal): Error {
  const reason: unknown = signal.reason;
  return reason instanceof Error ? reason : new DsecError('CANCELLED', `aborted: ${String(reason)}`);
}

/**
 * An EdgeClient over a {@link Transport}. `nodeName` and the first `capacity()` come from the
 * server's hello (so construction is `await WireEdgeClient.connect(transport)`); `capacity()`
 * then returns what the latest heartbeat said.
 */
/**
 * Output events of one stream held unread at most: the edge sends against credit (a window of
 * STREAM_WINDOW_EVENTS), so more means the edge ignores it, and its session is cut.
 */
const MAX_UNREAD_EVENTS = 2 * STREAM_WINDOW_EVENTS;

export class WireEdgeClient implements EdgeClient {
  readonly layers: EdgeLayers;
  readonly calls: EdgeCalls;
  readonly screen: EdgeScreen;
  private name = '';
  private cap: NodeCapacity = { cpu: 0, memoryMiB: 0, sandboxes: 0, backends: [] };
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  private readonly streams = new Map<number, WireProcessStream>();
  private readonly uploads = new Map<number, Upload>();
  private readonly subscriptions = new Map<number, EventSink>();
  private lost: DsecError | undefined;
  private hello: { resolve(): void; reject(err: unknown): void } | undefined;
  private silence: ReturnType<typeof setTimeout> | undefined;
  private readonly log: (line: string) => void;

  private constructor(
    private readonly transport: Transport,
    private readonly opts: WireEdgeClientOptions,
  ) {
    this.log = opts.log ?? noop;
    this.layers = {
      resolve: (ref) => this.call('layers.resolve', [ref]),
      list: (filter?: { kind?: LayerKind }) => this.call('layers.list', [filter]),
      build: (source, o) => this.build(source, o),
      remove: (ref) => this.call('layers.remove', [ref]),
      cacheStats: () => this.call('layers.cacheStats', []),
      readDisk: (ref, o) => this.call('layers.readDisk', [ref, o]),
    };
    this.calls = {
      run: (req: CallRequest, o?: { signal?: AbortSignal }): Promise<CallResult> => this.call('calls.run', [req], { signal: o?.signal }),
      runBatch: (req: CallBatchRequest, o?: { signal?: AbortSignal }): Promise<CallBatchResult> => this.call('calls.runBatch', [req], { signal: o?.signal }),
    };
    this.screen = {
      capture: (id, o) => this.call('screen.capture', [id], { signal: o?.signal }),
      input: (id, actions, o) => this.call('screen.input', [id, actions], { signal: o?.signal }),
      connect: (id, o) => this.call('screen.connect', [id], { signal: o?.signal, stream: true }),
    };
    transport.onFrame((text, parts) => this.receive(text, parts));
    transport.onClose((err) => this.connectionEnded(err));
  }

  /** Connects over `transport`: resolves once the server's hello has come. */
  static async connect(transport: Transport, opts: WireEdgeClientOptions = {}): Promise<WireEdgeClient> {
    const client = new WireEdgeClient(transport, opts);
    const timeoutMs = opts.helloTimeoutMs ?? DEFAULT_HELLO_TIMEOUT_MS;
    let timer: ReturnType<typeof setTimeout> | undefined;
    try {
      await new Promise<void>((resolve, reject) => {
        client.hello = { resolve, reject };
        timer = setTimeout(() => reject(new DsecError('UNAVAILABLE', `no hello from the edge within ${timeoutMs} ms`)), timeoutMs);
      });
    } catch (err) {
      transport.close();
      throw err;
    } finally {
      clearTimeout(timer);
      client.hello = undefined;
    }
    return client;
  }

  get nodeName(): string {
    return this.name;
  }

  capacity(): NodeCapacity {
    return this.cap;
  }

  /** Closes the connection: calls in flight reject with UNAVAILABLE, streams end (their processes keep running). */
  close(): void {
    this.transport.close();
  }

  onEvent(sink: EventSink): () => void {
    const id = this.nextId++;
    this.subscriptions.set(id, sink);
    const ended = (): void => void this.subscriptions.delete(id);
    this.pending.set(id, {
      resolve: ended,
      reject: (err) => (ended(), this.log(`edge-wire: event subscription ended: ${String(err)}`)),
      signal: undefined,
      onOutput: undefined,
      onProgress: undefined,
      stream: false,
    });
    if (this.lost) this.pending.get(id)?.reject(this.lost);
    else this.send({ t: 'call', id, method: SUBSCRIBE_METHOD, args: [] });
    return () => {
      if (!this.subscriptions.delete(id)) return;
      this.send({ t: 'cancel', id });
    };
  }

  create(spec: SandboxSpec, opts: EdgeCallOptions & { id?: string } = {}): Promise<EdgeSandbox> {
    const { signal, ...rest } = opts;
    return this.call('create', [spec, rest], { signal });
  }
  async createMany(items: readonly EdgeCreateItem[], opts: EdgeCallOptions = {}): Promise<EdgeCreateResult[]> {
    const out = await this.call<Array<{ sandbox: EdgeSandbox } | { error: WireError }>>('createMany', [items, {}], opts);
    return out.map((r) => ('sandbox' in r ? r : { error: fromWireError(r.error) }));
  }
  claim(id: string, claim: SandboxClaim, opts: EdgeCallOptions = {}): Promise<EdgeSandbox> {
    return this.call('claim', [id, claim], opts);
  }
  destroy(id: string, opts: EdgeCallOptions = {}): Promise<void> {
    return this.call('destroy', [id], opts);
  }
  list(): Promise<EdgeSandbox[]> {
    return this.call('list', []);
  }
  stats(id: string, opts: EdgeCallOptions = {}): Promise<SandboxStats> {
    return this.call('stats', [id], opts);
  }
  pause(id: string, opts: EdgeCallOptions & { reason?: string; memory?: PauseMemory } = {}): Promise<NodePauseResult> {
    const { signal, ...rest } = opts;
    return this.call('pause', [id, rest], { signal });
  }
  resume(id: string, opts: EdgeCallOptions & { reason?: string; prefetch?: boolean } = {}): Promise<NodePauseResult> {
    const { signal, ...rest } = opts;
    return this.call('resume', [id, rest], { signal });
  }
  snapshot(id: string, opts: EdgeCallOptions & { labels?: Record<string, string> } = {}): Promise<LayerInfo> {
    const { signal, ...rest } = opts;
    return this.call('snapshot', [id, rest], { signal });
  }
  diff(id: string, opts: DiffOptions, call: EdgeCallOptions = {}): Promise<DiffResult> {
    return this.call('diff', [id, opts], call);
  }
  verify(id: string, req: VerifyRequest, opts: EdgeCallOptions = {}): Promise<VerifyResult> {
    return this.call('verify', [id, req], opts);
  }
  collectGarbage(opts?: { calls?: boolean }): Promise<NodeGarbageReport> {
    return this.call('collectGarbage', [opts]);
  }
  usage(opts: EdgeCallOptions = {}): Promise<NodeUsageReport> {
    return this.call('usage', [], opts);
  }

  exec(id: string, spec: ExecSpec, opts: EdgeExecOptions = {}): Promise<ExecResult> {
    const { signal, onOutput, ...rest } = opts;
    return this.call('exec', [id, spec, rest], { signal, onOutput });
  }
  spawn(id: string, spec: ExecSpec, opts: EdgeCallOptions = {}): Promise<ProcessStream> {
    return this.call('spawn', [id, spec], { signal: opts.signal, stream: true });
  }
  processes(id: string, opts: EdgeCallOptions = {}): Promise<ProcessInfo[]> {
    return this.call('processes', [id], opts);
  }
  attach(id: string, pid: number, from?: { stdout?: number; stderr?: number }, opts: EdgeCallOptions = {}): Promise<ProcessStream> {
    return this.call('attach', [id, pid, from], { signal: opts.signal, stream: true });
  }
  writeStdin(id: string, pid: number, data: Uint8Array | string, eof?: boolean, opts: EdgeCallOptions = {}): Promise<void> {
    return this.call('writeStdin', [id, pid, data, eof], opts);
  }
  signal(id: string, pid: number, signal: string | number, opts: EdgeCallOptions = {}): Promise<void> {
    return this.call('signal', [id, pid, signal], opts);
  }
  resize(id: string, pid: number, rows: number, cols: number, opts: EdgeCallOptions = {}): Promise<void> {
    return this.call('resize', [id, pid, rows, cols], opts);
  }

  readFile(id: string, path: string, opts: EdgeCallOptions & { offset?: number; length?: number } = {}): Promise<Uint8Array> {
    const { signal, ...rest } = opts;
    return this.call('readFile', [id, path, rest], { signal });
  }
  writeFile(id: string, path: string, data: Uint8Array | string, opts: EdgeCallOptions & { mode?: number; append?: boolean } = {}): Promise<void> {
    const { signal, ...rest } = opts;
    return this.call('writeFile', [id, path, data, rest], { signal });
  }
  listDir(id: string, path: string, opts: EdgeCallOptions = {}): Promise<FileStat[]> {
    return this.call('listDir', [id, path], opts);
  }
  xattrs(
    id: string,
    paths: string[],
    prefix: string,
    opts: EdgeCallOptions & { replace?: Record<string, string> } = {},
  ): Promise<Array<Record<string, string> | null>> {
    const { signal, ...rest } = opts;
    return this.call('xattrs', [id, paths, prefix, rest], { signal });
  }
  stat(id: string, path: string, opts: EdgeCallOptions = {}): Promise<FileStat> {
    return this.call('stat', [id, path], opts);
  }
  mkdir(id: string, path: string, opts: EdgeCallOptions = {}): Promise<void> {
    return this.call('mkdir', [id, path], opts);
  }
  remove(id: string, path: string, opts: EdgeCallOptions & { recursive?: boolean } = {}): Promise<void> {
    const { signal, ...rest } = opts;
    return this.call('remove', [id, path, rest], { signal });
  }
  rename(id: string, from: string, to: string, opts: EdgeCallOptions = {}): Promise<void> {
    return this.call('rename', [id, from, to], opts);
  }
  symlink(id: string, path: string, target: string, opts: EdgeCallOptions = {}): Promise<void> {
    return this.call('symlink', [id, path, target], opts);
  }

  setNetwork(id: string, policy: NetworkPolicy, opts: EdgeCallOptions = {}): Promise<SandboxNetwork> {
    return this.call('setNetwork', [id, policy], opts);
  }
  networkInfo(id: string, opts: EdgeCallOptions = {}): Promise<SandboxNetwork> {
    return this.call('networkInfo', [id], opts);
  }
  networkLog(id: string, limit: number, opts: EdgeCallOptions = {}): Promise<EgressLogEntry[]> {
    return this.call('networkLog', [id, limit], opts);
  }

  private build(source: LayerBuildSource, opts: LayerBuildOptions): Promise<LayerInfo> {
    const { signal, onProgress, ...rest } = opts;
    if (source.type === 'tar' || source.type === 'oci-archive' || source.type === 'disk') {
      return this.call('layers.build', [{ type: source.type, upload: true }, rest], { signal, onProgress, upload: source.stream });
    }
    return this.call('layers.build', [source, rest], { signal, onProgress });
  }

  /** Sends a call; `args` may end in `undefined`s (left off) and hold bytes (encoded). */
  private call<T>(method: WireMethodName | StreamMethodName, args: unknown[], extras: CallExtras = {}): Promise<T> {
    if (this.lost) return Promise.reject(this.lost);
    const { signal } = extras;
    if (signal?.aborted) return Promise.reject(abortReason(signal));
    let wireArgs: WireValue[];
    const parts: Uint8Array[] = [];
    try {
      while (args.length > 0 && args[args.length - 1] === undefined) args.pop();
      wireArgs = args.map((a) => encodeValue(a, parts));
    } catch (err) {
      return Promise.reject(new DsecError('INVALID_ARGUMENT', `${method}: ${err instanceof Error ? err.message : String(err)}`));
    }
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      const onAbort = (): void => this.send({ t: 'cancel', id });
      const done = (): void => {
        signal?.removeEventListener('abort', onAbort);
        this.uploads.get(id)?.stop();
        this.uploads.delete(id);
      };
      this.pending.set(id, {
        resolve: (v) => (done(), resolve(v as T)),
        reject: (e) => (done(), reject(e)),
        signal,
        onOutput: extras.onOutput,
        onProgress: extras.onProgress,
        stream: extras.stream ?? false,
      });
      signal?.addEventListener('abort', onAbort, { once: true });
      const frame: ClientFrame = { t: 'call', id, method, args: wireArgs };
      if (signal) frame.signal = true;
      if (extras.onOutput) frame.output = true;
      if (extras.onProgress) frame.progress = true;
      if (extras.upload) frame.upload = true;
      try {
        this.send(frame, parts);
      } catch (err) {
        // Too large for one message (PAYLOAD_TOO_LARGE): this call fails, the session stays.
        this.pending.get(id)?.reject(err instanceof Error ? err : new Error(String(err)));
        this.pending.delete(id);
        return;
      }
      if (extras.upload) {
        const upload = new Upload(id, extras.upload, (f, p) => this.send(f, p));
        this.uploads.set(id, upload);
        void upload.run();
      }
    });
  }

  /** Sends a frame; a frame sent after the loss goes nowhere (the loss already rejected its call). */
  private send(frame: ClientFrame, parts?: FrameParts): void {
    if (!this.lost) this.transport.send(encodeFrame(frame), parts);
  }

  private receive(text: string, parts: FrameParts): void {
    this.heard();
    try {
      this.handle(decodeServerFrame(text), parts);
    } catch (err) {
      this.log(`edge-wire: refused a frame from the edge: ${err instanceof Error ? err.message : String(err)}`);
    }
  }

  private handle(frame: ServerFrame, parts: FrameParts): void {
    switch (frame.t) {
      case 'hello':
        if (frame.version !== EDGE_WIRE_VERSION) {
          this.hello?.reject(new DsecError('UNAVAILABLE', `the edge speaks wire version ${frame.version}, this client ${EDGE_WIRE_VERSION}`));
          return;
        }
        this.name = frame.nodeName;
        this.cap = frame.capacity;
        this.hello?.resolve();
        return;
      case 'heartbeat':
        this.cap = frame.capacity;
        return;
      case 'reply': {
        const p = this.pending.get(frame.id);
        if (!p) return;
        this.pending.delete(frame.id);
        if (p.stream) {
          const { pid, osPid } = frame.value as { pid: number; osPid: number };
          const s = new WireProcessStream(
            { call: (method, args) => this.call(method, args), send: (f) => this.send(f), forget: () => this.streams.delete(frame.id) },
            frame.id,
            pid,
            osPid,
          );
          this.streams.set(frame.id, s);
          p.resolve(s);
        } else {
          let value: unknown;
          try {
            value = decodeValue(frame.value, parts);
          } catch (err) {
            p.reject(err as Error);
            return;
          }
          p.resolve(value);
        }
        return;
      }
      case 'error': {
        const p = this.pending.get(frame.id);
        if (!p) return;
        this.pending.delete(frame.id);
        const err = fromWireError(frame.error);
        // The caller's own abort comes back as what it aborted with, as it would in process.
        p.reject(p.signal?.aborted && err.code === 'CANCELLED' ? abortReason(p.signal) : err);
        return;
      }
      case 'output': {
        const ev = decodeValue(frame.event, parts) as OutputEvent;
        const s = this.streams.get(frame.id);
        if (s && s.unread >= MAX_UNREAD_EVENTS) {
          // The edge sends a stream's output only against credit: one that does not is cut off,
          // rather than queued here without bound.
          this.transport.close(new Error(`stream ${frame.id}: the edge sent more output than its credit allows`));
          return;
        }
        if (s) s.push(ev);
        else this.callback(() => this.pending.get(frame.id)?.onOutput?.(ev));
        return;
      }
      case 'exit':
        this.streams.get(frame.id)?.exit(frame.exit === undefined ? undefined : (decodeValue(frame.exit, parts) as ExitInfo), frame.error);
        return;
      case 'end':
        this.streams.get(frame.id)?.end(frame.error ? fromWireError(frame.error) : undefined);
        return;
      case 'progress':
        this.callback(() => this.pending.get(frame.id)?.onProgress?.(frame.line));
        return;
      case 'event': {
        const sink = this.subscriptions.get(frame.id);
        if (sink) {
          const ev = decodeValue(frame.event, parts) as RaisedEvent;
          this.callback(() => sink(ev));
        }
        return;
      }
      case 'credit':
        this.uploads.get(frame.id)?.grant(frame.n);
        return;
    }
  }

  private callback(fn: () => void): void {
    try {
      fn();
    } catch (err) {
      this.log(`edge-wire: a callback threw: ${err instanceof Error ? err.message : String(err)}`);
    }
  }

  private heard(): void {
    const ms = this.opts.silenceTimeoutMs;
    if (!ms) return;
    clearTimeout(this.silence);
    this.silence = setTimeout(() => this.transport.close(new Error(`no frame from the edge for ${ms} ms`)), ms);
    (this.silence as { unref?: () => void }).unref?.();
  }

  private connectionEnded(err?: Error): void {
    clearTimeout(this.silence);
    const name = this.name ? `edge ${this.name}` : 'edge';
    this.lost = new DsecError('UNAVAILABLE', `${name}: connection ${err ? `lost: ${err.message}` : 'closed'}`);
    this.hello?.reject(this.lost);
    for (const p of this.pending.values()) p.reject(this.lost);
    for (const s of this.streams.values()) s.end(this.lost);
    for (const u of this.uploads.values()) u.stop();
    this.pending.clear();
    this.streams.clear();
    this.uploads.clear();
    this.subscriptions.clear();
  }
}

/** What a process stream needs of its client's connection. */
interface StreamConnection {
  call(method: StreamMethodName, args: unknown[]): Promise<void>;
  send(frame: ClientFrame): void;
  /** The stream is done with: later frames for it are ignored. */
  forget(): void;
}

/** A process stream whose output, exit and stdin cross the wire; credit is granted as output is read. */
class WireProcessStream implements ProcessStream {
  readonly exited: Promise<ExitInfo>;
  private resolveExit!: (info: ExitInfo) => void;
  private rejectExit!: (err: unknown) => void;
  private exitKnown = false;
  private readonly queue: OutputEvent[] = [];
  private finished = false;
  private error: Error | undefined;
  private detached = false;
  private wake: (() => void) | undefined;
  private read = 0;
  private readonly detachListeners: Array<() => void> = [];
  private endTold = false;

  constructor(
    private readonly conn: StreamConnection,
    private readonly id: number,
    readonly pid: number,
    readonly osPid: number,
  ) {
    this.exited = new Promise<ExitInfo>((resolve, reject) => {
      this.resolveExit = resolve;
      this.rejectExit = reject;
    });
    // A caller that only reads the output must not crash the process when the stream is lost.
    this.exited.catch(noop);
  }

  /** Events received and not yet read. */
  get unread(): number {
    return this.queue.length;
  }

  push(ev: OutputEvent): void {
    this.queue.push(ev);
    this.wake?.();
  }

  exit(info: ExitInfo | undefined, error: WireError | undefined): void {
    if (this.exitKnown) return;
    this.exitKnown = true;
    if (info) this.resolveExit(info);
    else this.rejectExit(error ? fromWireError(error) : new DsecError('INTERNAL', 'the edge sent an exit without its information'));
    if (this.finished) {
      this.conn.forget();
      // A stream that ended before its exit arrived tells its end now, after the exit's handlers.
      this.tellEndAfterExit();
    }
  }

  /** The stream ended: after the queued output the iteration ends (throwing `error` if given). */
  end(error?: Error): void {
    if (this.finished) return;
    this.finished = true;
    this.error = error;
    this.wake?.();
    if (!this.exitKnown && (error || this.detached)) {
      // Lost or detached: no exit will come; the end is told at once.
      this.exitKnown = true;
      this.rejectExit(error ?? new DsecError('CANCELLED', `process ${this.pid}: detached before it exited`));
      this.conn.forget();
      this.tellEnd();
      return;
    }
    // A stream that simply ran out has its exit here or on the way (the edge sends it once known):
    // its end is told after the exit's own handlers ran, so that a listener hearing of both takes
    // the exit (as with an in-process stream).
    if (this.exitKnown) {
      this.conn.forget();
      this.tellEndAfterExit();
    }
  }

  private tellEnd(): void {
    this.endTold = true;
    for (const fn of this.detachListeners.splice(0)) fn();
  }

  /** Exit and end may arrive in one read: the exit's handlers (promise reactions) run first. */
  private tellEndAfterExit(): void {
    setTimeout(() => this.tellEnd(), 0);
  }

  async write(data: Uint8Array | string, eof?: boolean): Promise<void> {
    await this.conn.call('process.write', [this.id, data, eof]);
  }

  async closeStdin(): Promise<void> {
    await this.conn.call('process.closeStdin', [this.id]);
  }

  async kill(signal?: string | number): Promise<void> {
    // A process known to have exited has nothing left to signal.
    if (this.finished && this.exitKnown) return;
    await this.conn.call('process.kill', [this.id, signal]);
  }

  async detach(): Promise<void> {
    if (this.finished || this.detached) return;
    this.detached = true;
    // The output the edge still holds follows, then the end (which rejects `exited`).
    try {
      await this.conn.call('process.detach', [this.id]);
    } catch (err) {
      // The stream ended on its own while the detach was on its way: nothing left to stop.
      if (!this.finished) throw err;
    }
  }

  onDetach(fn: () => void): void {
    if (this.endTold) queueMicrotask(fn);
    else this.detachListeners.push(fn);
  }

  [Symbol.asyncIterator](): AsyncIterator<OutputEvent> {
    return {
      next: async (): Promise<IteratorResult<OutputEvent>> => {
        for (;;) {
          const ev = this.queue.shift();
          if (ev) {
            if (!this.finished && ++this.read >= STREAM_WINDOW_EVENTS / 2) {
              this.conn.send({ t: 'credit', id: this.id, n: this.read });
              this.read = 0;
            }
            return { done: false, value: ev };
          }
          if (this.finished) {
            if (this.error) throw this.error;
            return { done: true, value: undefined };
          }
          await new Promise<void>((resolve) => (this.wake = resolve));
          this.wake = undefined;
        }
      },
      // Leaving the loop early stops the stream and leaves the process running, as detach does.
      return: async (): Promise<IteratorResult<OutputEvent>> => {
        await this.detach().catch(noop);
        return { done: true, value: undefined };
      },
    };
  }
}

/** The upload body of one layer build, sent in chunks as the server grants credit. */
class Upload {
  private credit = UPLOAD_WINDOW_CHUNKS;
  private stopped = false;
  private wake: (() => void) | undefined;

  constructor(
    private readonly id: number,
    private readonly body: AsyncIterable<Uint8Array>,
    private readonly send: (frame: ClientFrame, parts: FrameParts) => void,
  ) {}

  grant(n: number): void {
    this.credit += n;
    this.wake?.();
  }

  stop(): void {
    this.stopped = true;
    this.wake?.();
  }

  async run(): Promise<void> {
    try {
      for await (const chunk of this.body) {
        for (let off = 0; off < chunk.byteLength; off += MAX_UPLOAD_CHUNK_BYTES) {
          while (this.credit <= 0 && !this.stopped) {
            await new Promise<void>((resolve) => (this.wake = resolve));
            this.wake = undefined;
          }
          if (this.stopped) return;
          this.credit--;
          this.send({ t: 'chunk', id: this.id }, [chunk.subarray(off, off + MAX_UPLOAD_CHUNK_BYTES)]);
        }
        if (this.stopped) return;
      }
      if (!this.stopped) this.send({ t: 'chunk-end', id: this.id }, []);
    } catch (err) {
      // The body failed on this side (too large, the request went away): the build fails with it.
      if (!this.stopped) this.send({ t: 'chunk-end', id: this.id, error: toWireError(err, noop) }, []);
    }
  }
}
