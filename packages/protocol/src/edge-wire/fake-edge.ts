// An in-memory EdgeClient for the wire protocol's unit tests: deterministic answers derived from
// the arguments, processes whose output is pulled lazily (so back-pressure can be seen), and
// hooks to look at what reached the "node". Not exported from the package.
import { DsecError } from '../errors.js';
import type {
  EdgeCallOptions,
  EdgeCalls,
  EdgeClient,
  EdgeExecOptions,
  EdgeLayers,
  EdgeSandbox,
  EdgeScreen,
  LayerBuildOptions,
  LayerBuildSource,
  NodeCapacity,
  NodePauseResult,
  OutputEvent,
  ProcessStream,
} from '../edge-client.js';
import type { EventSink, RaisedEvent } from '../events.js';
import type { ExecResult, ExecSpec, ExitInfo } from '../exec.js';
import type { DiffResult, FileStat } from '../files.js';
import type { LayerInfo } from '../layers.js';
import type { SandboxSpec } from '../sandboxes.js';
import type { NetworkPolicy } from '../network.js';

/** Exit information of a fake process. */
export function fakeExit(exitCode: number | null, signal: string | null = null): ExitInfo {
  return { exitCode, signal, timedOut: false, oomKilled: false, durationMs: 5, cpuUserMs: 1, cpuSysMs: 1, peakMemoryKiB: 1024, stdoutBytes: 3, stderrBytes: 0 };
}

/** A process of the fake edge: `lines` chunks of stdout, produced only as they are pulled. */
export class FakeProcess {
  pulled = 0;
  detached = 0;
  killedWith: string | number | undefined;
  stdin: Array<Uint8Array | string> = [];
  stdinClosed = false;
  exit: ExitInfo | undefined;
  private exitWaiters: Array<(e: ExitInfo) => void> = [];

  constructor(
    readonly pid: number,
    readonly chunks: number,
  ) {}

  /** The data of chunk `i`. */
  static chunk(i: number): Uint8Array {
    return new TextEncoder().encode(`line ${i}\n`);
  }

  finish(exit: ExitInfo): void {
    if (this.exit) return;
    this.exit = exit;
    for (const w of this.exitWaiters.splice(0)) w(exit);
  }

  exited(): Promise<ExitInfo> {
    return this.exit ? Promise.resolve(this.exit) : new Promise((r) => this.exitWaiters.push(r));
  }

  /** A stream of this process's output from chunk `from`. */
  stream(from = 0): ProcessStream {
    return processStream(this, from);
  }
}

/** A stream of `proc`'s output from chunk `from`. */
function processStream(proc: FakeProcess, from: number): ProcessStream {
  let stopped = false;
  let wakeStop: (() => void) | undefined;
  const listeners: Array<() => void> = [];
  const ended = (): void => {
    for (const fn of listeners.splice(0)) fn();
  };
  async function* output(): AsyncGenerator<OutputEvent> {
    let offset = 0;
    for (let i = 0; i < from; i++) offset += FakeProcess.chunk(i).byteLength;
    try {
      for (let i = from; i < proc.chunks; i++) {
        if (stopped) return;
        proc.pulled++;
        const data = FakeProcess.chunk(i);
        yield { kind: 'data', stream: 'stdout', offset, data };
        offset += data.byteLength;
      }
      if (!proc.exit) proc.finish(fakeExit(0));
      // Like a real process stream, iteration ends after the exit, or at a detach.
      if (!stopped && proc.exit === undefined) await new Promise<void>((r) => (wakeStop = r));
    } finally {
      ended();
    }
  }
  const gen = output();
  return {
    pid: proc.pid,
    osPid: proc.pid + 1000,
    exited: proc.exited(),
    [Symbol.asyncIterator]: () => gen,
    write: async (data, eof) => {
      if (proc.stdinClosed) throw new DsecError('CONFLICT', 'stdin is closed');
      proc.stdin.push(data);
      if (eof) proc.stdinClosed = true;
    },
    closeStdin: async () => {
      proc.stdinClosed = true;
    },
    kill: async (signal = 'SIGKILL') => {
      proc.killedWith = signal;
      proc.finish(fakeExit(null, String(signal)));
    },
    detach: async () => {
      proc.detached++;
      stopped = true;
      wakeStop?.();
    },
    onDetach: (fn) => listeners.push(fn),
  };
}

/** What the fake edge saw of a call that waits for its signal. */
export interface HeldCall {
  signal: AbortSignal | undefined;
  aborted: Promise<unknown>;
}

/** An EdgeClient held in memory. */
export class FakeEdge implements EdgeClient {
  readonly nodeName = 'fake-node';
  cap: NodeCapacity = { cpu: 8, memoryMiB: 16384, sandboxes: 100, backends: ['container', 'fncall'] };
  readonly sinks = new Set<EventSink>();
  readonly procs = new Map<number, FakeProcess>();
  readonly files = new Map<string, Uint8Array>();
  /** Calls that wait for their signal, by the sandbox id they were given. */
  readonly held: HeldCall[] = [];
  uploaded: Uint8Array[] = [];
  private nextPid = 1;

  capacity(): NodeCapacity {
    return this.cap;
  }

  onEvent(sink: EventSink): () => void {
    this.sinks.add(sink);
    return () => void this.sinks.delete(sink);
  }

  raise(ev: RaisedEvent): void {
    for (const s of this.sinks) s(ev);
  }

  readonly layers: EdgeLayers = {
    resolve: async (ref) => {
      if (ref === 'missing') throw new DsecError('LAYER_NOT_FOUND', `layer ${ref} not found`, { layer: ref });
      return layerInfo(ref);
    },
    list: async (filter) => [layerInfo(`list-${filter?.kind ?? 'all'}`)],
    build: (source, opts) => this.build(source, opts),
    remove: async () => undefined,
  };

  readonly calls: EdgeCalls = {
    run: async (req, opts) => {
      if (req.code === 'hang') return this.hold(opts?.signal);
      return {
        exitCode: 0,
        signal: null,
        stdout: req.code ?? req.argv?.join(' ') ?? '',
        stderr: '',
        durationMs: 1,
        cpuMs: 1,
        peakMemoryKiB: 1,
        truncated: false,
        timedOut: false,
        oomKilled: false,
      };
    },
    runBatch: async (req) => ({
      results: req.calls.map((c, i) =>
        i % 2
          ? { error: { code: 'INTERNAL', message: `call ${i}` } }
          : {
              exitCode: 0,
              signal: null,
              stdout: c.code ?? '',
              stderr: '',
              durationMs: 1,
              cpuMs: 1,
              peakMemoryKiB: 1,
              truncated: false,
              timedOut: false,
              oomKilled: false,
            },
      ),
    }),
  };

  /** A 2x1 screen: capture answers fixed bytes, input counts, connect is a two-chunk stream. */
  readonly screen: EdgeScreen = {
    capture: async (id) => {
      if (id === 'no-screen') throw new DsecError('CONFLICT', 'sandbox no-screen has no screen');
      return { png: new Uint8Array([0x89, 0x50, 0x4e, 0x47]), width: 2, height: 1 };
    },
    input: async (_id, actions) => ({ performed: actions.length, width: 2, height: 1 }),
    connect: async () => {
      const proc = new FakeProcess(this.nextPid++, 2);
      this.procs.set(proc.pid, proc);
      return proc.stream();
    },
  };

  async create(spec: SandboxSpec, opts: { id?: string; signal?: AbortSignal } = {}): Promise<EdgeSandbox> {
    if (spec.labels?.['hold'] !== undefined) return this.hold(opts.signal);
    if (spec.labels?.['fail'] === 'internal') throw new TypeError('secret detail of the node');
    return sandbox(opts.id ?? 'sb-1', spec);
  }
  async claim(id: string, claim: { env?: Record<string, string>; labels?: Record<string, string> }): Promise<EdgeSandbox> {
    return sandbox(id, { image: { base: 'busybox' }, ...claim });
  }
  async destroy(id: string): Promise<void> {
    if (id === 'nope') throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${id} not found`, { sandboxId: id });
  }
  async list(): Promise<EdgeSandbox[]> {
    return [sandbox('sb-1', { image: { base: 'busybox' } })];
  }
  async stats(id: string) {
    return {
      cpuUsageMs: id.length,
      memoryBytes: 1,
      memoryPeakBytes: 2,
      memoryLimitBytes: 3,
      pids: 4,
      pidsLimit: 5,
      diskUsedBytes: 6,
      diskLimitBytes: 7,
      oomKills: 0,
    };
  }
  async pause(_id: string, opts?: EdgeCallOptions & { reason?: string }): Promise<NodePauseResult> {
    if (opts?.reason === 'hold') return this.hold(opts.signal);
    return { durationMs: opts?.reason?.length ?? 0, memoryBeforeBytes: 10, memoryAfterBytes: 5, swapBytes: 5 };
  }
  async resume(_id: string, opts?: { reason?: string; prefetch?: boolean }) {
    return { durationMs: opts?.prefetch ? 1 : 2, memoryBeforeBytes: 5, memoryAfterBytes: 10, swapBytes: 0 };
  }
  async snapshot(id: string, opts: { labels?: Record<string, string>; signal?: AbortSignal } = {}): Promise<LayerInfo> {
    return { ...layerInfo(`snap-${id}`), kind: 'snapshot', labels: opts.labels ?? {} };
  }
  async diff(_id: string, opts: { paths?: string[] }, call?: EdgeCallOptions): Promise<DiffResult> {
    if (opts.paths?.includes('/hold')) return this.hold(call?.signal);
    return {
      entries: (opts.paths ?? ['/']).map((path) => ({ path, change: 'added' as const, type: 'file' as const, size: 1 })),
      nextCursor: null,
      frozen: true,
    };
  }
  async verify(_id: string, req: { expected: Record<string, string> }) {
    return { ok: true, results: Object.entries(req.expected).map(([path, expected]) => ({ path, expected, actual: expected, ok: true })) };
  }
  async usage() {
    return { cpuUsageMs: 1.5, memoryBytes: 4096, sandboxes: 1 };
  }
  async collectGarbage(opts?: { calls?: boolean }) {
    return { containers: opts?.calls ? ['c'] : [], cgroups: [], processes: 0, mounts: 0, dirs: [], layerMounts: 0 };
  }

  async exec(_id: string, spec: ExecSpec, opts: EdgeExecOptions = {}): Promise<ExecResult> {
    if (spec.cmd === 'hang') return this.hold(opts.signal);
    const stdin = spec.stdin === undefined ? '' : typeof spec.stdin === 'string' ? spec.stdin : `bytes:${[...spec.stdin].join(',')}`;
    let offset = 0;
    for (let i = 0; i < 3; i++) {
      const data = FakeProcess.chunk(i);
      opts.onOutput?.({ kind: 'data', stream: i === 1 ? 'stderr' : 'stdout', offset, data });
      offset += data.byteLength;
    }
    opts.onOutput?.({ kind: 'gap', stream: 'stdout', offset, bytes: 10 });
    return { ...fakeExit(0), stdout: `${spec.cmd ?? spec.argv?.join(' ')}|${stdin}`, stderr: '', truncated: (opts.maxOutputBytes ?? Infinity) < 10 };
  }
  async spawn(_id: string, spec: ExecSpec): Promise<ProcessStream> {
    const proc = new FakeProcess(this.nextPid++, Number(spec.env?.['CHUNKS'] ?? 3));
    this.procs.set(proc.pid, proc);
    return proc.stream();
  }
  async processes() {
    return [...this.procs.values()].map((p) => ({
      pid: p.pid,
      osPid: p.pid + 1000,
      argv: ['sh'],
      state: p.exit ? ('exited' as const) : ('running' as const),
      stdoutBytes: 0,
      stderrBytes: 0,
      ...(p.exit ? { exit: p.exit } : {}),
    }));
  }
  async attach(_id: string, pid: number, from?: { stdout?: number }): Promise<ProcessStream> {
    const proc = this.procs.get(pid);
    if (!proc) throw new DsecError('PROCESS_NOT_FOUND', `process ${pid} not found`, { pid });
    return proc.stream(from?.stdout ?? 0);
  }
  async writeStdin(_id: string, pid: number, data: Uint8Array | string, eof?: boolean): Promise<void> {
    await this.procs.get(pid)?.stream().write(data, eof);
  }
  async signal(_id: string, pid: number, signal: string | number): Promise<void> {
    await this.procs.get(pid)?.stream().kill(signal);
  }
  async resize(): Promise<void> {}

  async readFile(_id: string, path: string, opts?: EdgeCallOptions & { offset?: number; length?: number }): Promise<Uint8Array> {
    if (path === '/hold') return this.hold(opts?.signal);
    const data = this.files.get(path);
    if (!data) throw new DsecError('FILE_NOT_FOUND', `${path}: no such file`, { path, errno: 'ENOENT' });
    const start = opts?.offset ?? 0;
    return data.subarray(start, opts?.length === undefined ? undefined : start + opts.length);
  }
  async writeFile(_id: string, path: string, data: Uint8Array | string, opts?: { append?: boolean }): Promise<void> {
    const bytes = typeof data === 'string' ? new TextEncoder().encode(data) : data;
    const old = opts?.append ? (this.files.get(path) ?? new Uint8Array()) : new Uint8Array();
    const out = new Uint8Array(old.byteLength + bytes.byteLength);
    out.set(old);
    out.set(bytes, old.byteLength);
    this.files.set(path, out);
  }
  async listDir(_id: string, path: string): Promise<FileStat[]> {
    return [...this.files.keys()].filter((p) => p.startsWith(path)).map((p) => stat(p));
  }
  /** Extended attributes by path (one prefix is enough for a fake). */
  readonly attrs = new Map<string, Record<string, string>>();
  async xattrs(_id: string, paths: string[], _prefix: string, opts?: { replace?: Record<string, string> }): Promise<Array<Record<string, string> | null>> {
    if (opts?.replace && paths[0] !== undefined) this.attrs.set(paths[0], { ...opts.replace });
    return paths.map((p) => (this.files.has(p) ? { ...(this.attrs.get(p) ?? {}) } : null));
  }
  async stat(_id: string, path: string): Promise<FileStat> {
    return stat(path);
  }
  async mkdir(): Promise<void> {}
  async remove(_id: string, path: string): Promise<void> {
    this.files.delete(path);
  }
  async rename(_id: string, from: string, to: string): Promise<void> {
    const d = this.files.get(from);
    if (d) this.files.set(to, d);
    this.files.delete(from);
  }
  async symlink(): Promise<void> {}
  async setNetwork(_id: string, policy: NetworkPolicy) {
    return { policy, stats: { bytesIn: 0, bytesOut: 0, connections: 0, totalConnections: 0, allowed: 0, denied: 0 } };
  }
  async networkInfo(id: string) {
    return this.setNetwork(id, { mode: 'none' });
  }
  async networkLog(sandboxId: string, limit: number) {
    return Array.from({ length: Math.min(limit, 2) }, (_, i) => ({ sandboxId, via: 'dns', host: `h${i}.example`, port: 53, verdict: 'denied' as const }));
  }

  private async build(source: LayerBuildSource, opts: LayerBuildOptions): Promise<LayerInfo> {
    if (source.type === 'tar' || source.type === 'oci-archive' || source.type === 'disk') {
      this.uploaded = [];
      for await (const chunk of source.stream) {
        this.uploaded.push(chunk);
        await new Promise((r) => setTimeout(r, 0));
      }
    } else if (source.type === 'debian') {
      for (const p of source.packages) opts.onProgress?.(`unpacking ${p}`);
    }
    const bytes = this.uploaded.reduce((n, c) => n + c.byteLength, 0);
    return { ...layerInfo(opts.name ?? source.type), kind: opts.kind, contentBytes: bytes, labels: opts.labels ?? {} };
  }

  /** Waits for `signal` and fails with its reason, as an edge does when its caller goes away. */
  private hold<T>(signal: AbortSignal | undefined): Promise<T> {
    return new Promise<T>((_, reject) => {
      const aborted = new Promise<unknown>((resolve) => signal?.addEventListener('abort', () => resolve(signal.reason), { once: true }));
      this.held.push({ signal, aborted });
      signal?.addEventListener('abort', () => reject(signal.reason as Error), { once: true });
    });
  }
}

function sandbox(id: string, spec: SandboxSpec): EdgeSandbox {
  return {
    id,
    node: 'fake-node',
    backend: spec.backend ?? 'container',
    state: 'running',
    spec,
    layers: ['sha256:' + 'a'.repeat(64)],
    createdAt: '2026-01-01T00:00:00.000Z',
  };
}

function layerInfo(name: string): LayerInfo {
  return {
    digest: 'sha256:' + 'b'.repeat(64),
    kind: 'base',
    names: [`${name}:latest`],
    labels: {},
    contentBytes: 0,
    metaBytes: 1,
    blobBytes: 2,
    files: 3,
    createdAt: '2026-01-01T00:00:00.000Z',
  };
}

function stat(path: string): FileStat {
  return { name: path.split('/').pop() ?? '', type: 'file', mode: 0o644, size: 1, mtimeMs: 0 };
}
