// An in-memory EdgeClient for unit tests of the services and routes: sandboxes are records,
// files a map, commands echo their command line. Only what the machine cannot do without root
// is faked; the store and everything above it are real.
import { createHash } from 'node:crypto';
import { DsecError } from '@dsec/protocol';
import type {
  EdgeScreen,
  EdgeCallOptions,
  EdgeCalls,
  EdgeClient,
  EdgeExecOptions,
  EdgeLayers,
  EdgeSandbox,
  EventSink,
  ExecResult,
  ExecSpec,
  ExitInfo,
  FileStat,
  LayerInfo,
  NetworkPolicy,
  NodeCapacity,
  NodeGarbageReport,
  NodeUsageReport,
  NodePauseResult,
  OutputEvent,
  ProcessInfo,
  ProcessStream,
  SandboxNetwork,
  SandboxSpec,
  SandboxStats,
} from '@dsec/protocol';

const NO_CHANGE: NodePauseResult = { durationMs: 0, memoryBeforeBytes: 0, memoryAfterBytes: 0, swapBytes: 0 };

/** What a fake command prints: its command line and a newline. */
export function fakeOutput(spec: ExecSpec): string {
  return `${spec.cmd ?? spec.argv?.join(' ') ?? ''}\n`;
}

function exitOf(code: number): ExitInfo {
  return {
    exitCode: code,
    signal: null,
    timedOut: false,
    oomKilled: false,
    durationMs: 1,
    cpuUserMs: 0,
    cpuSysMs: 0,
    peakMemoryKiB: 0,
    stdoutBytes: 0,
    stderrBytes: 0,
  };
}

/** A layer as a fake node holds it. */
export function fakeLayer(seed: string, kind: LayerInfo['kind'] = 'base'): LayerInfo {
  const digest = `sha256:${createHash('sha256').update(seed).digest('hex')}`;
  return { digest, kind, names: [], labels: {}, contentBytes: 1, metaBytes: 1, blobBytes: 1, files: 1, createdAt: new Date(0).toISOString() };
}

/** A process stream that prints its output, then exits with `code`. */
function fakeStream(pid: number, output: string, code: number): ProcessStream {
  let detached: (() => void) | undefined;
  const data = Buffer.from(output);
  const events: OutputEvent[] = data.length > 0 ? [{ kind: 'data', stream: 'stdout', offset: 0, data }] : [];
  return {
    pid,
    osPid: pid + 1000,
    exited: Promise.resolve({ ...exitOf(code), stdoutBytes: data.length }),
    async *[Symbol.asyncIterator]() {
      yield* events;
    },
    write: async () => undefined,
    closeStdin: async () => undefined,
    kill: async () => undefined,
    detach: async () => detached?.(),
    onDetach: (fn) => {
      detached = fn;
    },
  };
}

/** An in-memory node. */
export class FakeEdge implements EdgeClient {
  readonly sandboxes = new Map<string, EdgeSandbox & { files: Map<string, Uint8Array>; policy: NetworkPolicy }>();
  readonly layerInfos = new Map<string, LayerInfo>();
  /** Errors to throw from the next call of a method, by method name. */
  readonly failNext = new Map<string, Error>();
  private nextPid = 1;
  private readonly sinks = new Set<EventSink>();

  constructor(readonly nodeName = 'fake') {}

  /** The signal the latest call of each method got (undefined: none), by method name. */
  readonly signals = new Map<string, AbortSignal | undefined>();

  /** Notes a call's signal and, as a node does, refuses the call when it is already aborted. */
  private called(method: string, opts: EdgeCallOptions | undefined): void {
    this.signals.set(method, opts?.signal);
    opts?.signal?.throwIfAborted();
  }

  private maybeFail(method: string): void {
    const err = this.failNext.get(method);
    if (err) {
      this.failNext.delete(method);
      throw err;
    }
  }

  private entry(id: string) {
    const sb = this.sandboxes.get(id);
    if (!sb) throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${id} not found`, { sandboxId: id });
    return sb;
  }

  capacity(): NodeCapacity {
    return { cpu: 8, memoryMiB: 16_384, sandboxes: 100, backends: ['container', 'fncall'] };
  }

  onEvent(sink: EventSink): () => void {
    this.sinks.add(sink);
    return () => this.sinks.delete(sink);
  }

  readonly layers: EdgeLayers = {
    resolve: async (ref) => {
      const info = this.layerInfos.get(ref) ?? [...this.layerInfos.values()].find((l) => l.names.includes(ref));
      if (!info) throw new DsecError('LAYER_NOT_FOUND', `layer ${ref} not found`, { layer: ref });
      return info;
    },
    list: async () => [...this.layerInfos.values()],
    build: async (source, opts) => {
      const info = fakeLayer(`${source.type}:${this.layerInfos.size}`, opts.kind);
      this.layerInfos.set(info.digest, info);
      return info;
    },
    remove: async (ref) => void this.layerInfos.delete(ref),
  };

  readonly calls: EdgeCalls = {
    run: async () => ({ ...exitOf(0), stdout: '', stderr: '', truncated: false }) as never,
    runBatch: async (req) => ({ results: req.calls.map(() => ({ ...exitOf(0), stdout: '', stderr: '', truncated: false })) }) as never,
  };

  /** No simulated sandbox has a screen (none is a VM). */
  readonly screen: EdgeScreen = {
    capture: (id) => Promise.reject(noScreen(id)),
    input: (id) => Promise.reject(noScreen(id)),
    connect: (id) => Promise.reject(noScreen(id)),
  };

  async create(spec: SandboxSpec, opts: { id?: string } = {}): Promise<EdgeSandbox> {
    this.maybeFail('create');
    const id = opts.id ?? `${this.nodeName}-${this.sandboxes.size}`;
    const layers = [spec.image.base, spec.image.workspace, ...(spec.image.toolkits ?? []), ...(spec.snapshots ?? [])].filter((l): l is string => !!l);
    const sb = {
      id,
      node: this.nodeName,
      backend: spec.backend ?? 'container',
      state: 'running' as const,
      spec,
      layers,
      createdAt: new Date().toISOString(),
      files: new Map<string, Uint8Array>(),
      policy: spec.network ?? { mode: 'none' as const },
    };
    this.sandboxes.set(id, sb);
    return sb;
  }

  async claim(id: string, _claim: unknown, opts?: EdgeCallOptions): Promise<EdgeSandbox> {
    this.called('claim', opts);
    return this.entry(id);
  }

  async destroy(id: string, opts?: EdgeCallOptions): Promise<void> {
    this.called('destroy', opts);
    this.sandboxes.delete(id);
  }

  async list(): Promise<EdgeSandbox[]> {
    return [...this.sandboxes.values()];
  }

  async stats(id: string, opts?: EdgeCallOptions): Promise<SandboxStats> {
    this.called('stats', opts);
    this.maybeFail('stats');
    this.entry(id);
    return { cpuUsageMs: 0, memoryBytes: 0 } as unknown as SandboxStats;
  }

  async pause(id: string, opts?: EdgeCallOptions): Promise<NodePauseResult> {
    this.called('pause', opts);
    this.maybeFail('pause');
    this.entry(id).state = 'paused';
    return NO_CHANGE;
  }

  async resume(id: string, opts?: EdgeCallOptions): Promise<NodePauseResult> {
    this.called('resume', opts);
    this.entry(id).state = 'running';
    return NO_CHANGE;
  }

  async snapshot(id: string): Promise<LayerInfo> {
    const info = fakeLayer(`snapshot:${id}:${this.layerInfos.size}`, 'snapshot');
    this.layerInfos.set(info.digest, info);
    return info;
  }

  async diff(_id: string, _opts: unknown, call?: EdgeCallOptions): Promise<never> {
    this.called('diff', call);
    return { items: [], nextCursor: null } as never;
  }

  async verify(_id: string, _req: unknown, opts?: EdgeCallOptions): Promise<never> {
    this.called('verify', opts);
    return { ok: true, mismatches: [] } as never;
  }

  async usage(): Promise<NodeUsageReport> {
    return { cpuUsageMs: 0, memoryBytes: 0, sandboxes: this.sandboxes.size };
  }

  async collectGarbage(): Promise<NodeGarbageReport> {
    return { containers: [], cgroups: [], processes: 0, mounts: 0, dirs: [], layerMounts: 0 };
  }

  async exec(id: string, spec: ExecSpec, opts: EdgeExecOptions = {}): Promise<ExecResult> {
    this.entry(id);
    this.maybeFail('exec');
    const out = fakeOutput(spec);
    opts.onOutput?.({ kind: 'data', stream: 'stdout', offset: 0, data: Buffer.from(out) });
    const code = spec.cmd === 'false' ? 1 : 0;
    return { ...exitOf(code), stdout: out, stderr: '', truncated: false, stdoutBytes: out.length };
  }

  async spawn(id: string, spec: ExecSpec, opts?: EdgeCallOptions): Promise<ProcessStream> {
    this.called('spawn', opts);
    this.entry(id);
    return fakeStream(this.nextPid++, fakeOutput(spec), 0);
  }

  async processes(id: string, opts?: EdgeCallOptions): Promise<ProcessInfo[]> {
    this.called('processes', opts);
    this.entry(id);
    return [];
  }

  async attach(id: string, pid: number, _from?: unknown, opts?: EdgeCallOptions): Promise<ProcessStream> {
    this.called('attach', opts);
    this.entry(id);
    if (pid >= this.nextPid) throw new DsecError('PROCESS_NOT_FOUND', `process ${pid} not found`, { pid });
    return fakeStream(pid, '', 0);
  }

  async writeStdin(id: string, _pid: number, _data: unknown, _eof?: boolean, opts?: EdgeCallOptions): Promise<void> {
    this.called('writeStdin', opts);
    this.entry(id);
  }

  async signal(id: string): Promise<void> {
    this.entry(id);
  }

  async resize(id: string): Promise<void> {
    this.entry(id);
  }

  async readFile(id: string, path: string, opts?: EdgeCallOptions): Promise<Uint8Array> {
    this.called('readFile', opts);
    const data = this.entry(id).files.get(path);
    if (!data) throw new DsecError('FILE_NOT_FOUND', `${path} not found`, { path });
    return data;
  }

  async writeFile(id: string, path: string, data: Uint8Array | string, opts: EdgeCallOptions & { append?: boolean } = {}): Promise<void> {
    this.called('writeFile', opts);
    const files = this.entry(id).files;
    const bytes = typeof data === 'string' ? Buffer.from(data) : Buffer.from(data);
    files.set(path, opts.append ? Buffer.concat([files.get(path) ?? Buffer.alloc(0), bytes]) : bytes);
  }

  async listDir(id: string, path: string, opts?: EdgeCallOptions): Promise<FileStat[]> {
    this.called('listDir', opts);
    const prefix = path.endsWith('/') ? path : `${path}/`;
    return [...this.entry(id).files.entries()]
      .filter(([p]) => p.startsWith(prefix))
      .map(([p, d]) => ({ name: p.slice(prefix.length), path: p, type: 'file', size: d.length }) as unknown as FileStat);
  }

  async stat(id: string, path: string, opts?: EdgeCallOptions): Promise<FileStat> {
    this.called('stat', opts);
    const data = this.entry(id).files.get(path);
    if (!data) throw new DsecError('FILE_NOT_FOUND', `${path} not found`, { path });
    return { name: path.split('/').pop(), path, type: 'file', size: data.length } as unknown as FileStat;
  }

  async mkdir(id: string, _path?: string, opts?: EdgeCallOptions): Promise<void> {
    this.called('mkdir', opts);
    this.entry(id);
  }

  async remove(id: string, path: string, opts?: EdgeCallOptions): Promise<void> {
    this.called('remove', opts);
    this.entry(id).files.delete(path);
  }

  async rename(id: string, from: string, to: string, opts?: EdgeCallOptions): Promise<void> {
    this.called('rename', opts);
    const files = this.entry(id).files;
    const data = files.get(from);
    if (!data) throw new DsecError('FILE_NOT_FOUND', `${from} not found`, { path: from });
    files.delete(from);
    files.set(to, data);
  }

  /** Extended attributes kept per sandbox and path (names with their prefix). */
  readonly attrs = new Map<string, Map<string, Record<string, string>>>();

  async xattrs(
    id: string,
    paths: string[],
    prefix: string,
    opts: EdgeCallOptions & { replace?: Record<string, string> } = {},
  ): Promise<Array<Record<string, string> | null>> {
    this.called('xattrs', opts);
    const files = this.entry(id).files;
    const attrs = this.attrs.get(id) ?? new Map<string, Record<string, string>>();
    this.attrs.set(id, attrs);
    if (opts.replace && paths[0] !== undefined) attrs.set(`${prefix}${paths[0]}`, { ...opts.replace });
    return paths.map((p) => (files.has(p) ? { ...(attrs.get(`${prefix}${p}`) ?? {}) } : null));
  }

  async symlink(id: string, _path?: string, _target?: string, opts?: EdgeCallOptions): Promise<void> {
    this.called('symlink', opts);
    this.entry(id);
  }

  async setNetwork(id: string, policy: NetworkPolicy): Promise<SandboxNetwork> {
    this.entry(id).policy = policy;
    return this.networkInfo(id);
  }

  async networkInfo(id: string): Promise<SandboxNetwork> {
    return { policy: this.entry(id).policy } as unknown as SandboxNetwork;
  }

  async networkLog(id: string): Promise<never[]> {
    this.entry(id);
    return [];
  }
}

function noScreen(id: string): DsecError {
  return new DsecError('CONFLICT', `sandbox ${id} has no screen: only backend vm has one`, { sandboxId: id });
}
