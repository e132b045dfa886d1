// Edge: the node agent. Owns the layer store and the backends, keeps the node's sandboxes, and
// turns exec requests into results (or handles) over each sandbox's agent.
import { randomBytes } from 'node:crypto';
import { access, mkdir } from 'node:fs/promises';
import os, { hostname } from 'node:os';
import path from 'node:path';
import { DsecError, ExecSpecSchema, NetworkPolicyPatchSchema, NetworkPolicySchema, SandboxSpecSchema, applyNetworkPatch, invalidArgument, normalizeNetworkPolicy } from '@dsec/protocol';
import type { BackendKind, EventSink, RaisedEvent, ExecResult, ExecSpec, FileStat, LayerInfo, NetworkPolicy, ProcessInfo, SandboxSpec, SandboxState, SandboxStats } from '@dsec/protocol';
import type { z } from 'zod';
import type { Backend, BackendSandbox, SandboxAgent } from './backend.js';
import { ContainerBackend } from './backends/container/backend.js';
import { FnCallBackend } from './backends/fncall/backend.js';
import type { AgentExit, Attachment, OutputEvent, SpawnOptions } from './chronus/client.js';
import { Cgroups, detectCgroupMode } from './host/cgroups.js';
import { prepareRuntimeNamespace, runDirFor } from './host/runtime-ns.js';
import type { RuntimeNamespace } from './host/runtime-ns.js';
import { LayerStore } from './layers/index.js';
import { NodeNetwork } from './net/network.js';
import type { NetworkOptions, SandboxNetworkInfo } from './net/network.js';
import type { EgressLogEntry } from './net/types.js';

/** Default cap on stdout and stderr collected into one ExecResult (each). */
export const DEFAULT_MAX_OUTPUT_BYTES = 16 * 1024 * 1024;
/** Largest file read in one call. */
export const MAX_FILE_READ_BYTES = 256 * 1024 * 1024;

/** Options of {@link Edge.open}. */
export interface EdgeOptions {
  /** State directory (layers, sandboxes). Default `/var/lib/dsec`. */
  home?: string;
  /** Host path of the static chronus binary. */
  agentBinary: string;
  /** Name of this node, encoded in sandbox ids. Default: the host name. */
  nodeName?: string;
  /** Bytes of output chronus keeps per stream. */
  outputCapBytes?: number;
  /** cgroup parent of the node's sandboxes. Default `dsec`. */
  cgroupParent?: string;
  /** Most sandboxes this node admits. Default {@link DEFAULT_MAX_SANDBOXES}. */
  maxSandboxes?: number;
  /** Sandbox networking: address pool, static hosts, resolvers, proxy limits. */
  network?: NetworkOptions;
}

/** Default admission limit of a node (DSec runs up to 3,200 containers per node). */
export const DEFAULT_MAX_SANDBOXES = 4000;

/** What a node offers, before over-commit. */
export interface NodeCapacity {
  cpu: number;
  memoryMiB: number;
  sandboxes: number;
  backends: BackendKind[];
}

/** A sandbox as edge reports it. */
export interface SandboxInfo {
  id: string;
  node: string;
  backend: BackendKind;
  state: SandboxState;
  spec: SandboxSpec;
  layers: string[];
  createdAt: string;
}

/** Options of {@link Edge.exec}. */
export interface ExecOptions {
  signal?: AbortSignal;
  /** Called with each chunk of output as it arrives. */
  onOutput?: (ev: OutputEvent) => void;
  /** Cap on collected stdout and stderr (each); the rest is drained and `truncated` set. */
  maxOutputBytes?: number;
}

interface Entry {
  record: BackendSandbox;
  backend: Backend;
  state: SandboxState;
  /** The memory cgroup's OOM-kill count when each process started (to tell OOM kills apart). */
  oomAtSpawn: Map<number, number>;
  /** A destroy in progress (concurrent destroys share it). */
  destroying?: Promise<void>;
}

/** Processes whose OOM baseline is remembered per sandbox. */
const MAX_OOM_BASELINES = 4096;

const ID_RE = /^[a-z0-9][a-z0-9-]{2,62}$/;

function parse<T>(schema: z.ZodType<T>, value: unknown, prefix: string): T {
  const res = schema.safeParse(value);
  if (res.success) return res.data;
  const issue = res.error.issues[0];
  const field = [prefix, ...(issue?.path ?? []).map(String)].filter(Boolean).join('.');
  throw invalidArgument(field || prefix, issue?.message ?? 'invalid');
}

/** The node agent. */
export class Edge {
  private readonly sandboxes = new Map<string, Entry>();
  private creating = 0;
  private readonly eventSinks = new Set<EventSink>();

  private constructor(
    readonly home: string,
    readonly nodeName: string,
    readonly layers: LayerStore,
    private readonly backends: Map<BackendKind, Backend>,
    private readonly runtimeNs: RuntimeNamespace,
    /** The cgroups of this node's sandboxes. */
    readonly cgroups: Cgroups,
    private readonly maxSandboxes: number,
    /** Stateless function calls (the fncall backend's pools). */
    readonly calls: FnCallBackend,
    /** Per-sandbox networks: links, policies, DNS stub, egress proxy, egress log. */
    readonly network: NodeNetwork,
  ) {}

  /** What this node offers to the scheduler. */
  capacity(): NodeCapacity {
    return {
      cpu: os.cpus().length,
      memoryMiB: Math.floor(os.totalmem() / 1048576),
      sandboxes: this.maxSandboxes,
      backends: [...this.backends.keys()],
    };
  }

  /** Opens the node: prepares the host, finds sandboxes that survived a restart. */
  static async open(opts: EdgeOptions): Promise<Edge> {
    const home = path.resolve(opts.home ?? '/var/lib/dsec');
    await access(opts.agentBinary).catch(() => {
      throw new DsecError('UNAVAILABLE', `chronus binary not found at ${opts.agentBinary} (run the install step: npm run setup)`);
    });
    await mkdir(home, { recursive: true, mode: 0o700 });
    const mode = await detectCgroupMode();
    const runtimeNs = await prepareRuntimeNamespace(home, mode);
    const layers = new LayerStore({ root: path.join(home, 'layers') });
    await layers.init();
    const sandboxesDir = path.join(home, 'sandboxes');
    await mkdir(sandboxesDir, { recursive: true });
    const crunRoot = path.join(runDirFor(home), 'crun');
    await mkdir(crunRoot, { recursive: true });
    const cgroups = new Cgroups(mode, opts.cgroupParent ?? 'dsec');
    const container = new ContainerBackend({
      sandboxesDir,
      crunRoot,
      runtimePrefix: runtimeNs.prefix,
      ...(runtimeNs.nsFile ? { runtimeNsFile: runtimeNs.nsFile } : {}),
      launcherBinary: path.join(path.dirname(path.resolve(opts.agentBinary)), 'dsec-launch'),
      layers,
      cgroups,
      agentBinary: path.resolve(opts.agentBinary),
      ...(opts.outputCapBytes !== undefined ? { outputCapBytes: opts.outputCapBytes } : {}),
    });
    const calls = new FnCallBackend({ dir: path.join(home, 'fncall'), crunRoot, runtimePrefix: runtimeNs.prefix, layers, cgroups, agentBinary: path.resolve(opts.agentBinary) });
    await calls.init();
    let raise: EventSink = () => undefined;
    const network = new NodeNetwork(opts.network ?? {}, {
      home,
      nflogBinary: path.join(path.dirname(path.resolve(opts.agentBinary)), 'dsec-nflog'),
      netlinkBinary: path.join(path.dirname(path.resolve(opts.agentBinary)), 'dsec-netlink'),
      raise: (ev) => raise(ev),
    });
    const edge = new Edge(home, nodeNameOf(opts.nodeName ?? hostname()), layers, new Map([['container', container]]), runtimeNs, cgroups, opts.maxSandboxes ?? DEFAULT_MAX_SANDBOXES, calls, network);
    raise = (ev) => edge.raise(ev);
    for (const backend of edge.backends.values()) {
      for (const record of await backend.recover()) {
        edge.sandboxes.set(record.id, { record, backend, state: 'running', oomAtSpawn: new Map() });
        await network.recover(record.id, record.spec.network, () => edge.netnsPath(record.id)).catch((err: unknown) => {
          // Its network cannot be put back: it keeps none (closed), and the failure is told.
          edge.raise({ kind: 'sandbox.lost', severity: 'warning', sandboxId: record.id, message: `network of ${record.id} not restored: ${(err as Error).message}` });
        });
      }
    }
    return edge;
  }

  /** Subscribes to the events this node raises; returns the unsubscribe function. */
  onEvent(sink: EventSink): () => void {
    this.eventSinks.add(sink);
    return () => this.eventSinks.delete(sink);
  }

  /** Raises an event to every subscriber (node name and time filled in). Never throws. */
  raise(ev: RaisedEvent): void {
    const full: RaisedEvent = { ...ev, node: ev.node ?? this.nodeName, at: ev.at ?? new Date().toISOString() };
    for (const sink of this.eventSinks) {
      try {
        sink(full);
      } catch {
        // A sink's failure is its own; the node carries on.
      }
    }
  }

  /** A new sandbox id that names this node. */
  newId(): string {
    return `${this.nodeName}-${randomBytes(8).toString('hex')}`;
  }

  /** Creates a sandbox and waits until its agent answers. */
  async create(input: unknown, opts: { id?: string; signal?: AbortSignal } = {}): Promise<SandboxInfo> {
    const spec = parse(SandboxSpecSchema, input, '');
    const kind = spec.backend ?? 'container';
    const backend = this.backends.get(kind);
    if (!backend) throw new DsecError('INVALID_ARGUMENT', `backend: ${kind} is not available on this node`, { field: 'backend' });
    const id = opts.id ?? this.newId();
    if (!ID_RE.test(id)) throw invalidArgument('id', 'must be 3-63 characters of a-z, 0-9 and -');
    if (this.sandboxes.has(id)) throw new DsecError('CONFLICT', `sandbox ${id} already exists`, { sandboxId: id });
    if (this.sandboxes.size + this.creating >= this.maxSandboxes) {
      throw new DsecError('CAPACITY_EXHAUSTED', `node ${this.nodeName} is full (${this.maxSandboxes} sandboxes)`, { retryAfterMs: 1000 });
    }
    const layers: LayerInfo[] = [];
    const refs: Array<[string, string]> = [['image.base', spec.image.base]];
    if (spec.image.workspace) refs.push(['image.workspace', spec.image.workspace]);
    (spec.image.toolkits ?? []).forEach((t, i) => refs.push([`image.toolkits.${i}`, t]));
    for (const [field, ref] of refs) {
      const layer = await this.layers.resolve(ref).catch((err: unknown) => {
        if (err instanceof DsecError) err.details.field = field;
        throw err;
      });
      layers.push(layer);
    }
    const networked = spec.network?.mode === 'allowlist';
    if (networked && !backend.netnsPath) throw invalidArgument('network.mode', `the ${kind} backend has no network; use mode none`);
    this.creating++;
    let record: BackendSandbox;
    try {
      record = await backend.create({ id, spec, layers }, opts.signal);
      if (networked) await this.joinNetwork(backend, id, normalizeNetworkPolicy(spec.network as NetworkPolicy));
    } finally {
      this.creating--;
    }
    this.sandboxes.set(id, { record, backend, state: 'running', oomAtSpawn: new Map() });
    return this.info(id);
  }

  /** Puts a new sandbox on the network; a failure destroys it (no half-created sandbox). */
  private async joinNetwork(backend: Backend, id: string, policy: NetworkPolicy): Promise<void> {
    try {
      await this.network.apply(id, policy, () => (backend.netnsPath as (id: string) => Promise<string>).call(backend, id));
      await this.writeResolvConf(backend, id);
    } catch (err) {
      await backend.destroy(id).catch(() => undefined);
      await this.network.remove(id).catch(() => undefined);
      throw err;
    }
  }

  /** Points a networked sandbox's resolver at the gateway's DNS stub. */
  private async writeResolvConf(backend: Backend, id: string): Promise<void> {
    const conf = this.network.resolvConf(id);
    if (conf) await (await backend.agent(id)).writeFile('/etc/resolv.conf', conf, { mode: 0o644 });
  }

  /** The network namespace of a running sandbox. */
  private netnsPath(id: string): Promise<string> {
    const e = this.entry(id);
    if (!e.backend.netnsPath) throw invalidArgument('network.mode', `the ${e.record.backend} backend has no network; use mode none`);
    return e.backend.netnsPath(id);
  }

  /** Replaces a sandbox's network policy; in force for new connections when this returns. */
  async setNetwork(id: string, input: unknown): Promise<SandboxNetworkInfo> {
    const policy = normalizeNetworkPolicy(parse(NetworkPolicySchema, input, 'network'));
    return this.changeNetwork(id, () => policy);
  }

  /** Patches a sandbox's network policy (add or remove rules, presets, addresses, mirrors). */
  async patchNetwork(id: string, input: unknown): Promise<SandboxNetworkInfo> {
    const patch = parse(NetworkPolicyPatchSchema, input, 'network');
    return this.changeNetwork(id, (current) => normalizeNetworkPolicy(parse(NetworkPolicySchema, applyNetworkPatch(current, patch), 'network')));
  }

  private async changeNetwork(id: string, next: (current: NetworkPolicy) => NetworkPolicy): Promise<SandboxNetworkInfo> {
    const e = this.entry(id);
    if (e.state !== 'running') throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${e.state}`, { sandboxId: id });
    const wasLinked = this.network.resolvConf(id) !== undefined;
    const policy = await this.network.apply(id, next, () => this.netnsPath(id));
    e.record = { ...e.record, spec: { ...e.record.spec, network: policy } };
    if (!wasLinked) await this.writeResolvConf(e.backend, id).catch(() => undefined);
    return this.network.info(id);
  }

  /** A sandbox's network: policy, addresses, traffic and attempt counters. */
  networkInfo(id: string): SandboxNetworkInfo {
    this.entry(id);
    return this.network.info(id);
  }

  /** The latest egress attempts of a sandbox (allowed and denied), oldest first. */
  networkLog(id: string, limit?: number): EgressLogEntry[] {
    this.entry(id);
    return this.network.log(id, limit);
  }

  private entry(id: string): Entry {
    const e = this.sandboxes.get(id);
    if (!e) throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${id} not found`, { sandboxId: id });
    return e;
  }

  private toInfo(e: Entry): SandboxInfo {
    return {
      id: e.record.id,
      node: this.nodeName,
      backend: e.record.backend,
      state: e.state,
      spec: e.record.spec,
      layers: e.record.layers.map((l) => l.digest),
      createdAt: e.record.createdAt,
    };
  }

  /** One sandbox. */
  info(id: string): SandboxInfo {
    return this.toInfo(this.entry(id));
  }

  /** Every sandbox on this node. */
  list(): SandboxInfo[] {
    return [...this.sandboxes.values()].map((e) => this.toInfo(e));
  }

  /** The agent of a running sandbox. */
  async agent(id: string): Promise<SandboxAgent> {
    const e = this.entry(id);
    if (e.state !== 'running') throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${e.state}`, { sandboxId: id });
    return e.backend.agent(id);
  }

  /** Starts a command and returns its attachment (output, stdin, kill, exit). */
  async spawn(id: string, input: unknown): Promise<Attachment> {
    const spec = parse(ExecSpecSchema, input, '');
    const att = await this.start(id, spec);
    if (spec.stdin !== undefined) await writeStdinIgnoringExit(att, spec.stdin, !spec.keepStdinOpen);
    return att;
  }

  /** Starts a command, remembering the sandbox's OOM-kill count at its start. */
  private async start(id: string, spec: ExecSpec): Promise<Attachment> {
    const e = this.entry(id);
    const agent = await this.agent(id);
    const oomBefore = e.backend instanceof ContainerBackend ? e.backend.oomKillsNow(id) : 0;
    const netEnv = this.network.env(id);
    const att = await agent.spawn(toSpawnOptions(spec, netEnv ? { ...netEnv, ...e.record.spec.env } : e.record.spec.env));
    if (e.oomAtSpawn.size >= MAX_OOM_BASELINES) e.oomAtSpawn.delete(e.oomAtSpawn.keys().next().value as number);
    e.oomAtSpawn.set(att.proc, oomBefore);
    return att;
  }

  /** Forgets an exited process (its output and exit report). */
  async release(id: string, proc: number): Promise<void> {
    this.sandboxes.get(id)?.oomAtSpawn.delete(proc);
    await (await this.agent(id)).release(proc);
  }

  /** Runs a command to completion and collects its output. */
  async exec(id: string, input: unknown, opts: ExecOptions = {}): Promise<ExecResult> {
    const spec = parse(ExecSpecSchema, input, '');
    const att = await this.start(id, spec);
    const max = opts.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES;
    const out = { stdout: [] as Buffer[], stderr: [] as Buffer[] };
    const size = { stdout: 0, stderr: 0 };
    let truncated = false;
    att.onOutput((ev) => {
      opts.onOutput?.(ev);
      if (ev.kind !== 'data') return;
      const room = max - size[ev.stream];
      if (room <= 0) {
        truncated = true;
        return;
      }
      const chunk = ev.data.length > room ? ev.data.subarray(0, room) : ev.data;
      if (chunk.length < ev.data.length) truncated = true;
      out[ev.stream].push(chunk);
      size[ev.stream] += chunk.length;
    });
    const onAbort = (): void => void att.kill('SIGKILL').catch(() => undefined);
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    try {
      if (spec.stdin !== undefined) await writeStdinIgnoringExit(att, spec.stdin, true);
      const exit = await att.exited;
      opts.signal?.throwIfAborted();
      const result = await this.exitInfo(id, exit);
      return { ...result, stdout: Buffer.concat(out.stdout).toString('utf8'), stderr: Buffer.concat(out.stderr).toString('utf8'), truncated };
    } finally {
      opts.signal?.removeEventListener('abort', onAbort);
      // Nobody reattaches to a command whose result was returned: free it without waiting.
      this.release(id, att.proc).catch(() => undefined);
    }
  }

  /** Converts an agent exit report, telling OOM kills from other SIGKILLs. */
  async exitInfo(id: string, exit: AgentExit): Promise<Omit<ExecResult, 'stdout' | 'stderr' | 'truncated'>> {
    let oomKilled = false;
    const e = this.sandboxes.get(id);
    // A shell reports a child's SIGKILL as status 137: check the counter for both. An OOM
    // kill in the sandbox since the process started is attributed to it.
    const killed = exit.signal === 'SIGKILL' || exit.exitCode === 137;
    const before = e?.oomAtSpawn.get(exit.proc);
    if (killed && !exit.timedOut && before !== undefined && e?.backend instanceof ContainerBackend) {
      oomKilled = e.backend.oomKillsNow(id) > before;
    }
    return {
      exitCode: exit.exitCode,
      signal: exit.signal,
      timedOut: exit.timedOut,
      oomKilled,
      durationMs: exit.durationMs,
      cpuUserMs: exit.cpuUserMs,
      cpuSysMs: exit.cpuSysMs,
      peakMemoryKiB: exit.peakMemoryKiB,
      stdoutBytes: exit.stdoutBytes,
      stderrBytes: exit.stderrBytes,
    };
  }

  /** Running and recently exited processes of a sandbox. */
  async processes(id: string): Promise<ProcessInfo[]> {
    const agent = await this.agent(id);
    const list = await agent.list();
    const out: ProcessInfo[] = [];
    for (const p of list) {
      const info: ProcessInfo = { id: p.proc, pid: p.pid, argv: p.argv, state: p.running ? 'running' : 'exited', stdoutBytes: p.stdoutBytes, stderrBytes: p.stderrBytes };
      if (p.exit) info.exit = await this.exitInfo(id, p.exit);
      out.push(info);
    }
    return out;
  }

  /** Reattaches to a process from byte offsets. */
  async attach(id: string, proc: number, from: { stdout?: number; stderr?: number } = {}): Promise<Attachment> {
    // A connection holds one attachment per process; a reader that comes back gets a
    // connection of its own, closed when its attachment ends.
    const e = this.entry(id);
    if (e.state !== 'running') throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${e.state}`, { sandboxId: id });
    const agent = await e.backend.connectAgent(id);
    try {
      const att = await agent.attach(proc, from);
      void att.exited.then(
        () => agent.close(),
        () => agent.close(),
      );
      att.onDetach(() => agent.close());
      return att;
    } catch (err) {
      agent.close();
      throw err;
    }
  }

  /** Writes to a running process's stdin (and closes it after when `eof`). */
  async writeStdin(id: string, proc: number, data: Uint8Array | string, eof = false): Promise<void> {
    await (await this.agent(id)).writeStdin(proc, data, eof);
  }

  /** Sends a signal to a process's group. */
  async signal(id: string, proc: number, sig: string | number): Promise<void> {
    await (await this.agent(id)).signal(proc, sig, true);
  }

  /** Resizes a process's terminal. */
  async resize(id: string, proc: number, rows: number, cols: number): Promise<void> {
    await (await this.agent(id)).resize(proc, rows, cols);
  }

  /** Reads a file (or a byte range of it). */
  async readFile(id: string, file: string, opts: { offset?: number; length?: number } = {}): Promise<Buffer> {
    checkPath(file);
    return (await this.agent(id)).readFile(file, { ...opts, maxBytes: MAX_FILE_READ_BYTES });
  }

  /** Writes a whole file. */
  async writeFile(id: string, file: string, data: Uint8Array | string, opts: { mode?: number; append?: boolean } = {}): Promise<void> {
    checkPath(file);
    await (await this.agent(id)).writeFile(file, data, opts);
  }

  /** Lists a directory. */
  async listDir(id: string, dir: string): Promise<FileStat[]> {
    checkPath(dir);
    return (await this.agent(id)).listDir(dir);
  }

  /** Metadata of a path. */
  async stat(id: string, file: string): Promise<FileStat> {
    checkPath(file);
    return (await this.agent(id)).stat(file, { followSymlinks: false });
  }

  /** `mkdir -p`. */
  async mkdir(id: string, dir: string): Promise<void> {
    checkPath(dir);
    await (await this.agent(id)).mkdir(dir, { parents: true });
  }

  /** Removes a file or a directory tree. */
  async remove(id: string, file: string, opts: { recursive?: boolean } = {}): Promise<void> {
    checkPath(file);
    await (await this.agent(id)).remove(file, opts);
  }

  /** Renames a path. */
  async rename(id: string, from: string, to: string): Promise<void> {
    checkPath(from);
    checkPath(to);
    await (await this.agent(id)).rename(from, to);
  }

  /** Creates a symbolic link in a sandbox. */
  async symlink(id: string, link: string, target: string): Promise<void> {
    checkPath(link);
    if (target.length === 0 || target.length > 4096 || target.includes('\0')) throw invalidArgument('target', 'must be 1-4096 bytes without NUL');
    await (await this.agent(id)).symlink(link, target);
  }

  /** Resource use of a sandbox. */
  async stats(id: string): Promise<SandboxStats> {
    const e = this.entry(id);
    return e.backend.stats(id);
  }

  /** Destroys a sandbox and everything it had. */
  destroy(id: string): Promise<void> {
    const e = this.entry(id);
    e.destroying ??= (async () => {
      e.state = 'stopped';
      try {
        await e.backend.destroy(id);
      } catch (err) {
        e.state = 'failed';
        delete e.destroying;
        throw err;
      }
      await this.network.remove(id);
      this.sandboxes.delete(id);
    })();
    return e.destroying;
  }

  /**
   * Lets go of this process's hold on the node: connections close, sandboxes keep running and
   * a later `Edge.open` on the same home finds them again.
   */
  async close(): Promise<void> {
    // Calls keep no state: their pooled sandboxes go with this process.
    await this.calls.close();
    for (const b of this.backends.values()) await b.close();
    await this.network.close();
  }

  /** Destroys every sandbox, unmounts every layer and removes the runtime namespace (tests). */
  async shutdown(): Promise<void> {
    for (const id of [...this.sandboxes.keys()]) await this.destroy(id).catch(() => undefined);
    await this.close();
    await this.network.shutdown();
    await this.layers.close();
    await this.cgroups.removeParent();
    await this.runtimeNs.destroy();
  }
}

/** Longest node name: sandbox ids are `<node>-<16 hex>` and must stay short (crun ids, socket paths). */
const MAX_NODE_NAME = 40;

/** A node name usable in sandbox ids: lowercase letters, digits and `-`. */
function nodeNameOf(name: string): string {
  const clean = name.toLowerCase().replace(/[^a-z0-9-]/g, '-').replace(/^-+|-+$/g, '').slice(0, MAX_NODE_NAME);
  return clean.length >= 1 ? clean : 'node';
}

/** Writes stdin; a command that already exited (or closed stdin) is not an error here. */
async function writeStdinIgnoringExit(att: Attachment, data: string | Uint8Array, eof: boolean): Promise<void> {
  try {
    await att.write(data, eof);
  } catch (err) {
    if (!(err instanceof DsecError && err.code === 'CONFLICT')) throw err;
  }
}

function checkPath(p: string): void {
  if (typeof p !== 'string' || !p.startsWith('/') || p.length > 4096 || p.includes('\0')) {
    throw invalidArgument('path', 'must be an absolute path of at most 4096 bytes without NUL');
  }
}

/** Environment every command starts with, below the sandbox's and the command's own. */
const BASE_ENV = { PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', HOME: '/root' };

function toSpawnOptions(spec: ExecSpec, sandboxEnv: Record<string, string> | undefined): SpawnOptions {
  const o: SpawnOptions = {};
  if (spec.cmd !== undefined) o.shell = spec.cmd;
  if (spec.argv !== undefined) o.argv = spec.argv;
  if (spec.env !== undefined || sandboxEnv !== undefined) o.env = { ...BASE_ENV, ...sandboxEnv, ...spec.env };
  if (spec.cwd !== undefined) o.cwd = spec.cwd;
  if (spec.uid !== undefined) o.uid = spec.uid;
  if (spec.gid !== undefined) o.gid = spec.gid;
  if (spec.stdin !== undefined || spec.keepStdinOpen) o.stdin = true;
  if (spec.pty !== undefined) {
    o.pty = spec.pty;
    // A terminal without TERM confuses most programs; default it as ssh and docker do.
    if (!o.env?.TERM) o.env = { ...BASE_ENV, ...sandboxEnv, TERM: 'xterm', ...spec.env };
  }
  if (spec.timeoutMs !== undefined) o.timeoutMs = spec.timeoutMs;
  return o;
}
