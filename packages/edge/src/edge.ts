// Edge: the node agent. Owns the layer store and the backends, keeps the node's sandboxes, and
// turns exec requests into results (or handles) over each sandbox's agent.
import { randomBytes } from 'node:crypto';
import { access, chmod, mkdir, readFile } from 'node:fs/promises';
import os, { hostname } from 'node:os';
import path from 'node:path';
import { DsecError, SYSCALL_NAMES, invalidArgument, normalizeNetworkPolicy } from '@dsec/protocol';
import type {
  BackendKind,
  DiffOptions,
  DiffResult,
  EdgeClient,
  EdgeExecOptions,
  EdgeSandbox,
  EgressLogEntryBody,
  EventSink,
  ExitInfo,
  NodeCapacity,
  NodeGarbageReport,
  RaisedEvent,
  ExecResult,
  ExecSpec,
  FileStat,
  LayerInfo,
  NetworkPolicy,
  ProcessInfo,
  SandboxClaim,
  SandboxNetwork,
  SandboxSpec,
  SandboxState,
  SandboxStats,
  VerifyRequest,
  VerifyResult,
} from '@dsec/protocol';
import type { Backend, BackendFactory, BackendHost, BackendPauseResult, BackendResumeResult, BackendSandbox, SandboxAgent } from './backend.js';
import { defaultBackends } from './backends/index.js';
import { fncallRunner } from './backends/fncall/index.js';
import type { CallRunner, CallRunnerFactory } from './backends/fncall/index.js';
import type { AgentExit, SpawnOptions } from './chronus/client.js';
import { EdgeProcessStream } from './process-stream.js';
import { Cgroups, detectCgroupMode } from './host/cgroups.js';
import type { IdShift } from './host/idmap.js';
import { prepareRuntimeNamespace, runDirFor } from './host/runtime-ns.js';
import type { RuntimeNamespace } from './host/runtime-ns.js';
import { ZramSwap } from './host/swap.js';
import { LayerStore } from './layers/index.js';
import { SecurityMonitor } from './host/security-monitor.js';
import { diffLayers, verifyLayers } from './diff.js';
import type { SandboxLayersView } from './diff.js';
import type { IdRange } from './host/id-ranges.js';
import type { SeccompProfile } from './backends/container/seccomp.js';
import { NodeNetwork } from './net/network.js';
import type { NetworkOptions } from './net/network.js';

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
  /**
   * Size in MiB of a zram swap device that paused sandboxes' memory is compressed into (see
   * host/swap.ts). Default none: a pause then drops only page cache. `shutdown` removes it;
   * `close` leaves it for the paused sandboxes that survive the edge.
   */
  zramSwapMiB?: number;
  /** Sandbox networking: address pool, static hosts, resolvers, proxy limits. */
  network?: NetworkOptions;
  /**
   * Runs each container sandbox in a user namespace of its own (root inside is an unprivileged
   * host uid from a range of 65,536 ids). Default true.
   */
  userNamespaces?: boolean;
  /** Replaces the containers' default seccomp profile (tests of the fail-closed path). */
  seccompProfile?: (spec: SandboxSpec) => SeccompProfile;
  /** Interval of the scan of every sandbox's OOM and pids-limit counters. Default {@link DEFAULT_COUNTER_SCAN_MS}; 0 turns it off. */
  counterScanMs?: number;
  /**
   * The backends this node runs, built once the host is prepared. Default
   * `defaultBackends()` configured from `outputCapBytes`, `userNamespaces` and `seccompProfile`.
   */
  backends?: BackendFactory[];
  /** The node's function calls. Default `fncallRunner()`. */
  calls?: CallRunnerFactory;
}

/** Longest a pause waits for agent calls already under way (file transfers, spawns) to finish. */
export const PAUSE_DRAIN_TIMEOUT_MS = 10_000;

/** What a pause did. */
export interface PauseResult extends BackendPauseResult {
  durationMs: number;
}

/** What a resume did. */
export interface ResumeResult extends BackendResumeResult {
  durationMs: number;
}

/** Default interval of the OOM and pids-limit counter scan (a command's exit also triggers one). */
export const DEFAULT_COUNTER_SCAN_MS = 3000;
/** After a command exits, how long its processes may take to go before the survivors are reported. */
export const SURVIVOR_GRACE_MS = 500;
/** Survivor pids remembered per sandbox (each is reported once). */
const MAX_REPORTED_SURVIVORS = 1024;

/** Default admission limit of a node (DSec runs up to 3,200 containers per node). */
export const DEFAULT_MAX_SANDBOXES = 4000;


/** Options of {@link Edge.snapshot}. */
export interface SnapshotOptions {
  /** Merged into the snapshot layer's labels. */
  labels?: Record<string, string>;
  /** Host ids `base + n` of a user-namespaced sandbox are stored as `n`; default none. */
  idShift?: IdShift;
  signal?: AbortSignal;
}

/** Label of a snapshot layer: its parent layers' digests, bottom first, comma-separated. */
export const SNAPSHOT_PARENTS_LABEL = 'dsec.snapshot.parents';
/** Label of a snapshot layer: the sandbox it was taken of. */
export const SNAPSHOT_SANDBOX_LABEL = 'dsec.snapshot.sandbox';

/** Options of {@link Edge.exec}. */
export type ExecOptions = EdgeExecOptions;

interface Entry {
  record: BackendSandbox;
  backend: Backend;
  state: SandboxState;
  /** The memory cgroup's OOM-kill count when each process started (to tell OOM kills apart). */
  oomAtSpawn: Map<number, number>;
  /** A destroy in progress (concurrent destroys share it). */
  destroying?: Promise<void>;
  /** Agent calls under way (spawns, file operations); a pause waits until none are. */
  busy: number;
  /** Called when `busy` drops to 0. */
  onIdle?: () => void;
  /** A pause or resume under way; new agent calls wait for it. */
  transition?: Promise<unknown>;
  /** Set on the first use of its agent (or a claim): a used sandbox is never claimed. */
  used: boolean;
  /** The last snapshot started: snapshots of one sandbox run one after another. */
  snapshotting?: Promise<unknown>;
  /** Counter values already reported as events. */
  seen: { oomKills: number; pidsLimitHits: number };
  /** Host pids already reported as outliving their command. */
  survivors: Set<number>;
  /** A survivor check waiting for its grace time. */
  survivorTimer?: NodeJS.Timeout;
}

/** Processes whose OOM baseline is remembered per sandbox. */
const MAX_OOM_BASELINES = 4096;

const ID_RE = /^[a-z0-9][a-z0-9-]{2,62}$/;

/** The node agent. */
export class Edge implements EdgeClient {
  private readonly sandboxes = new Map<string, Entry>();
  /** Ids being created (their folders and cgroups exist before they are in `sandboxes`). */
  private readonly creating = new Set<string>();
  private readonly eventSinks = new Set<EventSink>();
  private counterTimer: NodeJS.Timeout | undefined;
  private scanning = false;
  /** Sandbox ids by the host uid their user namespace starts at (to attribute kernel records). */
  private readonly idBases = new Map<number, string>();
  /** Seccomp denials and watched-path changes, raised as events. */
  private monitor!: SecurityMonitor;

  private constructor(
    readonly home: string,
    readonly nodeName: string,
    readonly layers: LayerStore,
    private readonly backends: Map<BackendKind, Backend>,
    private readonly runtimeNs: RuntimeNamespace,
    /** The cgroups of this node's sandboxes. */
    readonly cgroups: Cgroups,
    private readonly maxSandboxes: number,
    /** Stateless function calls (the fncall runner's pools). */
    readonly calls: CallRunner,
    /** Per-sandbox networks: links, policies, DNS stub, egress proxy, egress log. */
    readonly network: NodeNetwork,
    /** The zram swap this node set up for paused sandboxes (EdgeOptions.zramSwapMiB), if any. */
    readonly swap: ZramSwap | undefined,
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
    const cgroups = new Cgroups(mode, opts.cgroupParent ?? 'dsec');
    // Backends raise through the edge, which exists only once they do.
    let raise: EventSink = () => undefined;
    const host: BackendHost = { home, runDir: runDirFor(home), runtimeNs, layers, cgroups, agentBinary: opts.agentBinary, raise: (ev) => raise(ev) };
    const factories = opts.backends ?? defaultBackends({ ...(opts.outputCapBytes !== undefined ? { outputCapBytes: opts.outputCapBytes } : {}), ...(opts.userNamespaces !== undefined ? { userNamespaces: opts.userNamespaces } : {}), ...(opts.seccompProfile ? { seccompProfile: opts.seccompProfile } : {}) });
    const backends = new Map<BackendKind, Backend>();
    for (const factory of factories) {
      const backend = await factory(host);
      if (backends.has(backend.kind)) throw new DsecError('INVALID_ARGUMENT', `backends: ${backend.kind} is registered twice`, { field: 'backends' });
      backends.set(backend.kind, backend);
    }
    const calls = await (opts.calls ?? fncallRunner())(host);
    const network = new NodeNetwork(opts.network ?? {}, {
      home,
      nflogBinary: path.join(path.dirname(path.resolve(opts.agentBinary)), 'dsec-nflog'),
      netlinkBinary: path.join(path.dirname(path.resolve(opts.agentBinary)), 'dsec-netlink'),
      raise: (ev) => raise(ev),
    });
    const swap = opts.zramSwapMiB !== undefined ? await Edge.zramSwap(opts.zramSwapMiB) : undefined;
    const edge = new Edge(home, nodeNameOf(opts.nodeName ?? hostname()), layers, backends, runtimeNs, cgroups, opts.maxSandboxes ?? DEFAULT_MAX_SANDBOXES, calls, network, swap);
    raise = (ev) => edge.raise(ev);
    edge.monitor = new SecurityMonitor({
      raise: (ev) => edge.raise(ev),
      sandboxOfIdBase: (uid) => edge.idBases.get(uid),
      cgroupParent: cgroups.parent,
    });
    for (const backend of edge.backends.values()) {
      for (const record of await backend.recover()) {
        const { paused, ...rest } = record;
        edge.sandboxes.set(record.id, edge.newEntry(rest, backend, paused ? 'paused' : 'running'));
        edge.track(rest, backend);
        await network.recover(record.id, record.spec.network, () => edge.netnsPath(record.id)).catch((err: unknown) => {
          // Its network cannot be put back: it keeps none (closed), and the failure is told.
          edge.raise({ kind: 'sandbox.lost', severity: 'warning', sandboxId: record.id, message: `network of ${record.id} not restored: ${(err as Error).message}` });
        });
      }
    }
    // What a crashed edge left behind and recovery did not adopt: containers without a
    // folder, cgroups without a container, stale layer mounts. No call pool runs yet, so
    // function-call sandboxes left behind go too.
    const garbage = await edge.collectGarbage({ calls: true });
    edge.lastStartGarbage = garbage;
    const every = opts.counterScanMs ?? DEFAULT_COUNTER_SCAN_MS;
    if (every > 0) {
      edge.counterTimer = setInterval(() => edge.scanCounters(), every);
      edge.counterTimer.unref();
    }
    return edge;
  }

  /**
   * The node's zram swap: the one an earlier edge set up and left on, or a new one. A zram swap
   * the host configured itself is used as it is (and left alone).
   */
  private static async zramSwap(sizeMiB: number): Promise<ZramSwap | undefined> {
    const earlier = await ZramSwap.adopt();
    if (earlier) return earlier;
    if ((await ZramSwap.active()).some((d) => /^\/dev\/zram\d+$/.test(d))) return undefined;
    return ZramSwap.enable({ sizeMiB });
  }

  /** What the garbage collection at open removed. */
  lastStartGarbage: NodeGarbageReport | undefined;

  private newEntry(record: BackendSandbox, backend: Backend, state: 'running' | 'paused' = 'running'): Entry {
    const entry: Entry = { record, backend, state, oomAtSpawn: new Map(), busy: 0, used: false, seen: { oomKills: 0, pidsLimitHits: 0 }, survivors: new Set() };
    // Counts from before (a recovered sandbox) are not news.
    if (backend.counters) entry.seen = backend.counters.readNow(record.id);
    return entry;
  }

  /**
   * Removes what no live sandbox owns: runtime containers, cgroups with their processes, mounts
   * and folders of sandboxes this node does not know, and layer mounts nobody uses. `calls`
   * also removes function-call sandboxes (only safe while no call pool runs).
   */
  async collectGarbage(opts: { calls?: boolean } = {}): Promise<NodeGarbageReport> {
    const report: NodeGarbageReport = { containers: [], cgroups: [], processes: 0, mounts: 0, dirs: [], layerMounts: 0 };
    for (const backend of this.backends.values()) {
      if (!backend.garbage) continue;
      const r = await backend.garbage.collectGarbage({ keep: (id) => this.sandboxes.has(id) || this.creating.has(id), calls: opts.calls ?? false, ownerMark: this.home + '/' });
      report.containers.push(...r.containers);
      report.cgroups.push(...r.cgroups);
      report.processes += r.processes;
      report.mounts += r.mounts;
      report.dirs.push(...r.dirs);
    }
    report.layerMounts = await this.layers.unmountUnused();
    return report;
  }

  /**
   * Compares every sandbox's OOM and pids-limit counters with what was reported. The files are
   * read without blocking (thousands of sandboxes must not stall the event loop); one scan at
   * a time.
   */
  private scanCounters(): void {
    if (this.scanning) return;
    this.scanning = true;
    void (async () => {
      for (const id of [...this.sandboxes.keys()]) {
        const e = this.sandboxes.get(id);
        const counters = e?.backend.counters;
        if (!e || e.state !== 'running' || !counters) continue;
        const c = await counters.read(id);
        this.reportCounters(id, c.oomKills, c.pidsLimitHits);
      }
    })()
      .catch(() => undefined)
      .finally(() => (this.scanning = false));
  }

  /** Raises oom.kill and pids.limit-hit for counter increases since the last check (one sandbox, read at once). */
  private checkCounters(id: string, context?: { proc: number; pid: number }): void {
    const e = this.sandboxes.get(id);
    const counters = e?.backend.counters;
    if (!e || e.state !== 'running' || !counters) return;
    const c = counters.readNow(id);
    this.reportCounters(id, c.oomKills, c.pidsLimitHits, context);
  }

  private reportCounters(id: string, oom: number, hits: number, context?: { proc: number; pid: number }): void {
    const e = this.sandboxes.get(id);
    if (!e || e.state !== 'running') return;
    if (oom > e.seen.oomKills) {
      const count = oom - e.seen.oomKills;
      e.seen.oomKills = oom;
      const limitMiB = e.record.spec.resources?.memoryMiB;
      this.raise({
        kind: 'oom.kill',
        severity: 'warning',
        sandboxId: id,
        message: `sandbox ${id}: ${count} process${count === 1 ? '' : 'es'} killed at the memory limit${limitMiB ? ` (${limitMiB} MiB)` : ''}`,
        data: { count, total: oom, ...(limitMiB ? { memoryMiB: limitMiB } : {}), ...(context ? { proc: context.proc, pid: context.pid } : {}) },
      });
    }
    if (hits > e.seen.pidsLimitHits) {
      const count = hits - e.seen.pidsLimitHits;
      e.seen.pidsLimitHits = hits;
      const limit = e.record.spec.resources?.pids;
      this.raise({
        kind: 'pids.limit-hit',
        severity: 'warning',
        sandboxId: id,
        message: `sandbox ${id}: ${count} fork${count === 1 ? '' : 's'} refused at the process limit${limit ? ` (${limit})` : ''}`,
        data: { count, total: hits, ...(limit ? { pidsLimit: limit } : {}) },
      });
    }
  }

  /** Checks for survivors once a command's grace time is over (one pending check per sandbox). */
  private scheduleSurvivorCheck(id: string): void {
    const e = this.sandboxes.get(id);
    if (!e || e.survivorTimer || !e.backend.hostProcesses) return;
    e.survivorTimer = setTimeout(() => {
      delete e.survivorTimer;
      this.checkCounters(id);
      void this.checkSurvivors(id).catch(() => undefined);
    }, SURVIVOR_GRACE_MS);
    e.survivorTimer.unref();
  }

  /**
   * Raises process.survived-command for processes in the sandbox that belong to no running
   * command: chronus starts each command in a session of its own, so a process whose session
   * is not a running command's (nor the agent's) outlived the command that started it, or left
   * its session to escape it (a daemon).
   */
  private async checkSurvivors(id: string): Promise<void> {
    const e = this.sandboxes.get(id);
    const host = e?.backend.hostProcesses;
    if (!e || e.state !== 'running' || !host) return;
    // The agent alone (PID 1) is the common case: one file read.
    if (host.countNow(id) <= 1) {
      e.survivors.clear();
      return;
    }
    const candidates: Array<{ hostPid: number; pid: number; session: number; name: string }> = [];
    const present = new Set<number>();
    for (const hostPid of await host.hostPids(id)) {
      present.add(hostPid);
      const st = await readProcStatus(hostPid);
      if (!st || st.pid === 1 || st.session === 1 || st.zombie || e.survivors.has(hostPid)) continue;
      candidates.push({ hostPid, ...st });
    }
    for (const pid of e.survivors) if (!present.has(pid)) e.survivors.delete(pid);
    if (candidates.length === 0) return;
    // Sessions of running commands, read after the processes: a command started meanwhile
    // is listed here, so its processes are not taken for survivors.
    const running = new Set((await this.withAgent(id, (agent) => agent.list())).filter((p) => p.running).map((p) => p.pid));
    const survivors = [];
    for (const c of candidates) {
      if (running.has(c.session)) continue;
      const again = await readProcStatus(c.hostPid);
      if (!again || again.zombie || again.session !== c.session) continue;
      survivors.push(c);
    }
    if (survivors.length === 0) return;
    for (const s of survivors) if (e.survivors.size < MAX_REPORTED_SURVIVORS) e.survivors.add(s.hostPid);
    const shown = survivors.slice(0, 16);
    this.raise({
      kind: 'process.survived-command',
      severity: 'warning',
      sandboxId: id,
      message: `sandbox ${id}: ${survivors.length} process${survivors.length === 1 ? '' : 'es'} outlived their command: ${shown.map((s) => `${s.name} (pid ${s.pid})`).join(', ')}`,
      data: { count: survivors.length, processes: shown.map((s) => ({ pid: s.pid, name: s.name, session: s.session })) },
    });
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
  async create(spec: SandboxSpec, opts: { id?: string; signal?: AbortSignal } = {}): Promise<EdgeSandbox> {
    const kind = spec.backend ?? 'container';
    const backend = this.backends.get(kind);
    if (!backend) throw new DsecError('INVALID_ARGUMENT', `backend: ${kind} is not available on this node`, { field: 'backend' });
    for (const [i, name] of (spec.protect?.denySyscalls ?? []).entries()) {
      if (!SYSCALL_NAMES.has(name)) throw invalidArgument(`protect.denySyscalls.${i}`, `${name} is not a known system call`);
    }
    const id = opts.id ?? this.newId();
    if (!ID_RE.test(id)) throw invalidArgument('id', 'must be 3-63 characters of a-z, 0-9 and -');
    if (this.sandboxes.has(id) || this.creating.has(id)) throw new DsecError('CONFLICT', `sandbox ${id} already exists`, { sandboxId: id });
    if (this.sandboxes.size + this.creating.size >= this.maxSandboxes) {
      throw new DsecError('CAPACITY_EXHAUSTED', `node ${this.nodeName} is full (${this.maxSandboxes} sandboxes)`, { retryAfterMs: 1000 });
    }
    const layers: LayerInfo[] = [];
    const refs: Array<[string, string]> = [['image.base', spec.image.base]];
    if (spec.image.workspace) refs.push(['image.workspace', spec.image.workspace]);
    (spec.image.toolkits ?? []).forEach((t, i) => refs.push([`image.toolkits.${i}`, t]));
    (spec.snapshots ?? []).forEach((t, i) => refs.push([`snapshots.${i}`, t]));
    for (const [field, ref] of refs) {
      const layer = await this.layers.resolve(ref).catch((err: unknown) => {
        if (err instanceof DsecError) err.details.field = field;
        throw err;
      });
      layers.push(layer);
    }
    const networked = spec.network?.mode === 'allowlist';
    if (networked && !backend.network) throw invalidArgument('network.mode', `the ${kind} backend has no network; use mode none`);
    this.creating.add(id);
    let record: BackendSandbox;
    try {
      record = await backend.create({ id, spec, layers }, opts.signal);
      if (networked && spec.network) await this.joinNetwork(backend, id, normalizeNetworkPolicy(spec.network));
    } finally {
      this.creating.delete(id);
    }
    try {
      this.track(record, backend);
    } catch (err) {
      // A watch that was asked for and cannot be set up: no sandbox rather than an unwatched one.
      this.untrack(id);
      await backend.destroy(id).catch(() => undefined);
      await this.network.remove(id).catch(() => undefined);
      throw new DsecError('BACKEND_FAILED', `protect.watch: cannot watch the sandbox's writable layer: ${(err as Error).message}`, { sandboxId: id });
    }
    this.sandboxes.set(id, this.newEntry(record, backend));
    return this.info(id);
  }

  /** Starts attributing kernel records to a sandbox and watching its watched paths. */
  private track(record: BackendSandbox, backend: Backend): void {
    if (record.idRange) this.idBases.set(record.idRange.uid, record.id);
    const watch = record.spec.protect?.watch ?? [];
    if (watch.length > 0 && backend.writableLayer) this.monitor.watch(record.id, path.dirname(backend.writableLayer.upperDir(record.id)), watch);
  }

  private untrack(id: string): void {
    this.monitor.forget(id);
    for (const [uid, owner] of this.idBases) if (owner === id) this.idBases.delete(uid);
  }

  /**
   * Hands a sandbox created ahead of demand (a warm pool's) to its claimer: its commands get
   * the claimer's env from now on and it carries the claimer's labels, as if it had been created
   * with them. Refused (CONFLICT) for a sandbox that anything has used, or claimed, before.
   */
  async claim(id: string, claim: SandboxClaim): Promise<EdgeSandbox> {
    const e = this.entry(id);
    if (e.state !== 'running') throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${e.state}`, { sandboxId: id });
    if (e.used) throw new DsecError('CONFLICT', `sandbox ${id} was used before; it cannot be claimed`, { sandboxId: id });
    e.used = true;
    if (claim.env !== undefined || claim.labels !== undefined) {
      await e.backend.claim(id, claim);
      e.record = { ...e.record, spec: { ...e.record.spec, ...claim } };
    }
    return this.toInfo(e);
  }

  /** Puts a new sandbox on the network; a failure destroys it (no half-created sandbox). */
  private async joinNetwork(backend: Backend, id: string, policy: NetworkPolicy): Promise<void> {
    try {
      await this.network.apply(id, policy, () => this.netnsPathOf(backend, id));
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
    return this.netnsPathOf(this.entry(id).backend, id);
  }

  private netnsPathOf(backend: Backend, id: string): Promise<string> {
    if (!backend.network) throw invalidArgument('network.mode', `the ${backend.kind} backend has no network; use mode none`);
    return backend.network.netnsPath(id);
  }

  /**
   * Replaces a sandbox's network policy; in force for new connections when this returns. The
   * policy is put in its normal form here too (cheap, and the node's state must not depend on
   * the caller having done it).
   */
  async setNetwork(id: string, policy: NetworkPolicy): Promise<SandboxNetwork> {
    const e = this.entry(id);
    if (e.state !== 'running') throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${e.state}`, { sandboxId: id });
    const wasLinked = this.network.resolvConf(id) !== undefined;
    const normal = normalizeNetworkPolicy(policy);
    const applied = await this.network.apply(id, () => normal, () => this.netnsPath(id));
    e.record = { ...e.record, spec: { ...e.record.spec, network: applied } };
    if (!wasLinked) {
      const conf = this.network.resolvConf(id);
      // Through withAgent: a pause that begins meanwhile waits for the write.
      if (conf) await this.withAgent(id, (agent) => agent.writeFile('/etc/resolv.conf', conf, { mode: 0o644 })).catch(() => undefined);
    }
    return this.network.info(id);
  }

  /** A sandbox's network: policy, addresses, traffic and attempt counters. */
  async networkInfo(id: string): Promise<SandboxNetwork> {
    this.entry(id);
    return this.network.info(id);
  }

  /** The latest egress attempts of a sandbox (allowed and denied), oldest first. */
  async networkLog(id: string, limit?: number): Promise<EgressLogEntryBody[]> {
    this.entry(id);
    return this.network.log(id, limit);
  }

  private entry(id: string): Entry {
    const e = this.sandboxes.get(id);
    if (!e) throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${id} not found`, { sandboxId: id });
    return e;
  }

  private toInfo(e: Entry): EdgeSandbox {
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
  info(id: string): EdgeSandbox {
    return this.toInfo(this.entry(id));
  }

  /** Every sandbox on this node. */
  async list(): Promise<EdgeSandbox[]> {
    return [...this.sandboxes.values()].map((e) => this.toInfo(e));
  }

  /**
   * Waits while a pause or resume of the sandbox is under way. Callers must read the entry
   * again and act on it without awaiting anything in between (`while (e.transition)` in their
   * own body): a resolved promise reaches its caller a turn later, time enough for a pause to
   * begin, and a call that slipped in behind a freeze would hang until the resume.
   */
  private async afterTransition(e: Entry): Promise<void> {
    await e.transition?.catch(() => undefined);
  }

  /** The agent of a running sandbox. */
  async agent(id: string): Promise<SandboxAgent> {
    let e = this.entry(id);
    while (e.transition) {
      await this.afterTransition(e);
      e = this.entry(id);
    }
    if (e.state !== 'running') throw notRunning(id, e.state);
    e.used = true;
    return e.backend.agent(id);
  }

  /**
   * Runs one agent call with the sandbox held running: a pause waits for calls under way and
   * calls that arrive during a pause or resume wait for it. A paused sandbox's agent cannot
   * answer, so nothing is ever sent to it.
   */
  private async withAgent<T>(id: string, fn: (agent: SandboxAgent) => Promise<T>): Promise<T> {
    let e = this.entry(id);
    while (e.transition) {
      await this.afterTransition(e);
      e = this.entry(id);
    }
    if (e.state !== 'running') throw notRunning(id, e.state);
    e.used = true;
    e.busy++;
    try {
      return await fn(await e.backend.agent(id));
    } finally {
      if (--e.busy === 0) e.onIdle?.();
    }
  }

  /**
   * Pauses a sandbox: waits for agent calls under way, freezes every process and makes its
   * memory reclaimable. Commands keep their state (and their output offsets); attachments
   * simply see no output until the sandbox is resumed. Pausing a paused sandbox is a no-op.
   */
  async pause(id: string, opts: { reason?: string } = {}): Promise<PauseResult> {
    let e = this.entry(id);
    while (e.transition) {
      await this.afterTransition(e);
      e = this.entry(id);
    }
    const pausing = e.backend.pausing;
    if (!pausing) throw new DsecError('INVALID_ARGUMENT', `the ${e.backend.kind} backend cannot pause sandboxes`, { sandboxId: id });
    if (e.state === 'paused') {
      const m = await pausing.memory(id).catch(() => ({ usageBytes: 0, swapBytes: 0 }));
      return { memoryBeforeBytes: m.usageBytes, memoryAfterBytes: m.usageBytes, swapBytes: m.swapBytes, durationMs: 0 };
    }
    if (e.state !== 'running') throw notRunning(id, e.state);
    return this.transition(e, async () => {
      const t0 = performance.now();
      await drain(e, id);
      const r = await pausing.pause(id);
      e.state = 'paused';
      const result = { ...r, durationMs: performance.now() - t0 };
      this.raise({
        kind: 'sandbox.paused',
        severity: 'info',
        sandboxId: id,
        message: `sandbox ${id} paused (${opts.reason ?? 'api'}): memory ${mib(r.memoryBeforeBytes)} -> ${mib(r.memoryAfterBytes)} MiB`,
        data: { reason: opts.reason ?? 'api', ...result },
      });
      return result;
    });
  }

  /** Resumes a paused sandbox (prefetching its swapped-out memory unless `prefetch: false`). */
  async resume(id: string, opts: { reason?: string; prefetch?: boolean } = {}): Promise<ResumeResult> {
    let e = this.entry(id);
    while (e.transition) {
      await this.afterTransition(e);
      e = this.entry(id);
    }
    const pausing = e.backend.pausing;
    if (e.state === 'running') {
      const m = (await pausing?.memory(id).catch(() => undefined)) ?? { usageBytes: 0, swapBytes: 0 };
      return { memoryBeforeBytes: m.usageBytes, memoryAfterBytes: m.usageBytes, swapBytes: m.swapBytes, durationMs: 0 };
    }
    if (e.state !== 'paused' || !pausing) throw notRunning(id, e.state);
    return this.transition(e, async () => {
      const t0 = performance.now();
      const r = await pausing.resume(id, opts.prefetch === false ? { prefetch: false } : {});
      e.state = 'running';
      const result = { ...r, durationMs: performance.now() - t0 };
      this.raise({ kind: 'sandbox.resumed', severity: 'info', sandboxId: id, message: `sandbox ${id} resumed (${opts.reason ?? 'api'})`, data: { reason: opts.reason ?? 'api', ...result } });
      return result;
    });
  }

  /** Runs a pause or resume as the sandbox's one transition; agent calls wait for it. */
  private async transition<T>(e: Entry, fn: () => Promise<T>): Promise<T> {
    const run = fn();
    e.transition = run;
    try {
      return await run;
    } finally {
      if (e.transition === run) delete e.transition;
    }
  }

  /** Starts a command and returns its stream (output, stdin, kill, exit). */
  async spawn(id: string, spec: ExecSpec): Promise<EdgeProcessStream> {
    const proc = await this.start(id, spec);
    if (spec.stdin !== undefined) await writeStdinIgnoringExit(proc, spec.stdin, !spec.keepStdinOpen);
    return proc;
  }

  /** Starts a command, remembering the sandbox's OOM-kill count at its start. */
  private async start(id: string, spec: ExecSpec): Promise<EdgeProcessStream> {
    const e = this.entry(id);
    const oomBefore = e.backend.counters?.readNow(id).oomKills ?? 0;
    const netEnv = this.network.env(id);
    const att = await this.withAgent(id, (agent) => agent.spawn(toSpawnOptions(spec, netEnv ? { ...netEnv, ...e.record.spec.env } : e.record.spec.env)));
    if (e.oomAtSpawn.size >= MAX_OOM_BASELINES) e.oomAtSpawn.delete(e.oomAtSpawn.keys().next().value as number);
    e.oomAtSpawn.set(att.proc, oomBefore);
    const proc = new EdgeProcessStream(att, (exit) => this.exitInfo(id, exit));
    void att.exited.then(
      () => this.scheduleSurvivorCheck(id),
      () => undefined,
    );
    return proc;
  }

  /** Forgets an exited process (its output and exit report). */
  async release(id: string, proc: number): Promise<void> {
    this.sandboxes.get(id)?.oomAtSpawn.delete(proc);
    await this.withAgent(id, (agent) => agent.release(proc));
  }

  /** Runs a command to completion and collects its output. */
  async exec(id: string, spec: ExecSpec, opts: ExecOptions = {}): Promise<ExecResult> {
    const att = await this.start(id, spec);
    const max = opts.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES;
    const out = { stdout: [] as Uint8Array[], stderr: [] as Uint8Array[] };
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
      const result = await att.exited;
      opts.signal?.throwIfAborted();
      return { ...result, stdout: Buffer.concat(out.stdout).toString('utf8'), stderr: Buffer.concat(out.stderr).toString('utf8'), truncated };
    } finally {
      opts.signal?.removeEventListener('abort', onAbort);
      // Nobody reattaches to a command whose result was returned: free it without waiting.
      this.release(id, att.pid).catch(() => undefined);
    }
  }

  /** Converts an agent exit report, telling OOM kills from other SIGKILLs. */
  private exitInfo(id: string, exit: AgentExit): ExitInfo {
    let oomKilled = false;
    const e = this.sandboxes.get(id);
    // A shell reports a child's SIGKILL as status 137: check the counter for both. An OOM
    // kill in the sandbox since the process started is attributed to it.
    const killed = exit.signal === 'SIGKILL' || exit.exitCode === 137;
    const before = e?.oomAtSpawn.get(exit.proc);
    const counters = e?.backend.counters;
    if (killed && !exit.timedOut && before !== undefined && counters) {
      oomKilled = counters.readNow(id).oomKills > before;
      // Report it now rather than at the next scan, naming the command.
      if (oomKilled) this.checkCounters(id, { proc: exit.proc, pid: exit.pid });
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
    const list = await this.withAgent(id, (agent) => agent.list());
    const out: ProcessInfo[] = [];
    for (const p of list) {
      const info: ProcessInfo = { pid: p.proc, osPid: p.pid, argv: p.argv, state: p.running ? 'running' : 'exited', stdoutBytes: p.stdoutBytes, stderrBytes: p.stderrBytes };
      if (p.exit) info.exit = this.exitInfo(id, p.exit);
      out.push(info);
    }
    return out;
  }

  /** Reattaches to a process from byte offsets. */
  async attach(id: string, proc: number, from: { stdout?: number; stderr?: number } = {}): Promise<EdgeProcessStream> {
    // A connection holds one attachment per process; a reader that comes back gets a
    // connection of its own, closed when its attachment ends.
    let e = this.entry(id);
    while (e.transition) {
      await this.afterTransition(e);
      e = this.entry(id);
    }
    if (e.state !== 'running') throw notRunning(id, e.state);
    // Held like any agent call until the attachment is made (a pause waits for it); the
    // attachment itself then outlives pauses, seeing no output while the sandbox is frozen.
    e.used = true;
    e.busy++;
    let agent: SandboxAgent | undefined;
    try {
      agent = await e.backend.connectAgent(id);
      const att = await agent.attach(proc, from);
      const conn = agent;
      void att.exited.then(
        () => conn.close(),
        () => conn.close(),
      );
      att.onDetach(() => conn.close());
      return new EdgeProcessStream(att, (exit) => this.exitInfo(id, exit));
    } catch (err) {
      agent?.close();
      throw err;
    } finally {
      if (--e.busy === 0) e.onIdle?.();
    }
  }

  /** Writes to a running process's stdin (and closes it after when `eof`). */
  async writeStdin(id: string, proc: number, data: Uint8Array | string, eof = false): Promise<void> {
    await this.withAgent(id, (agent) => agent.writeStdin(proc, data, eof));
  }

  /** Sends a signal to a process's group. */
  async signal(id: string, proc: number, sig: string | number): Promise<void> {
    await this.withAgent(id, (agent) => agent.signal(proc, sig, true));
  }

  /** Resizes a process's terminal. */
  async resize(id: string, proc: number, rows: number, cols: number): Promise<void> {
    await this.withAgent(id, (agent) => agent.resize(proc, rows, cols));
  }

  /** Reads a file (or a byte range of it). */
  async readFile(id: string, file: string, opts: { offset?: number; length?: number } = {}): Promise<Buffer> {
    checkPath(file);
    return this.withAgent(id, (agent) => agent.readFile(file, { ...opts, maxBytes: MAX_FILE_READ_BYTES }));
  }

  /** Writes a whole file. */
  async writeFile(id: string, file: string, data: Uint8Array | string, opts: { mode?: number; append?: boolean } = {}): Promise<void> {
    checkPath(file);
    await this.withAgent(id, (agent) => agent.writeFile(file, data, opts));
  }

  /** Lists a directory. */
  async listDir(id: string, dir: string): Promise<FileStat[]> {
    checkPath(dir);
    return this.withAgent(id, (agent) => agent.listDir(dir));
  }

  /** Metadata of a path. */
  async stat(id: string, file: string): Promise<FileStat> {
    checkPath(file);
    return this.withAgent(id, (agent) => agent.stat(file, { followSymlinks: false }));
  }

  /** `mkdir -p`. */
  async mkdir(id: string, dir: string): Promise<void> {
    checkPath(dir);
    await this.withAgent(id, (agent) => agent.mkdir(dir, { parents: true }));
  }

  /** Removes a file or a directory tree. */
  async remove(id: string, file: string, opts: { recursive?: boolean } = {}): Promise<void> {
    checkPath(file);
    await this.withAgent(id, (agent) => agent.remove(file, opts));
  }

  /** Renames a path. */
  async rename(id: string, from: string, to: string): Promise<void> {
    checkPath(from);
    checkPath(to);
    await this.withAgent(id, (agent) => agent.rename(from, to));
  }

  /** Creates a symbolic link in a sandbox. */
  async symlink(id: string, link: string, target: string): Promise<void> {
    checkPath(link);
    if (target.length === 0 || target.length > 4096 || target.includes('\0')) throw invalidArgument('target', 'must be 1-4096 bytes without NUL');
    await this.withAgent(id, (agent) => agent.symlink(link, target));
  }

  /**
   * Host path of a sandbox's upper directory (its changes over its layers, deletions as
   * overlayfs whiteouts), for snapshots and diffs. Read it while the sandbox is frozen for a
   * consistent view.
   */
  upperDir(id: string): string {
    const e = this.entry(id);
    if (!e.backend.writableLayer) throw new DsecError('INVALID_ARGUMENT', `the ${e.backend.kind} backend has no host-side writable layer`, { sandboxId: id });
    return e.backend.writableLayer.upperDir(id);
  }

  /**
   * Packs a sandbox's writable layer into a new content-addressed layer of kind `snapshot`
   * ("pack diff"): the sandbox is frozen while its upper directory is read (a consistent
   * state) and thawed after, also on failure. A paused sandbox is read as it is and stays
   * paused. The layer holds only the changes, deletions as whiteouts; it sits above the
   * sandbox's layers, which its labels (and UUID) record.
   *
   * While the tree is read the snapshot is the sandbox's transition (as a pause or resume is):
   * a pause or resume waits for it, it waits for them, and agent calls wait rather than hang on
   * the frozen agent. The digest and the commit happen after, with the sandbox running again.
   */
  async snapshot(id: string, opts: SnapshotOptions = {}): Promise<LayerInfo> {
    const e = this.entry(id);
    if (e.state !== 'running' && e.state !== 'paused') throw notRunning(id, e.state);
    const upper = this.upperDir(id);
    const freezer = e.backend.pausing;
    if (!freezer) throw new DsecError('INVALID_ARGUMENT', `the ${e.backend.kind} backend cannot freeze sandboxes for a snapshot`, { sandboxId: id });
    const parents = e.record.layers.map((l) => l.digest);
    // A user-namespaced sandbox's files are owned by its host id range: stored as the ids it sees.
    const range = e.record.idRange;
    const idShift = opts.idShift ?? (range ? { uid: range.uid, gid: range.gid, count: range.size } : undefined);
    const labels = { ...opts.labels, [SNAPSHOT_PARENTS_LABEL]: parents.join(','), [SNAPSHOT_SANDBOX_LABEL]: id };
    const pack = async (): Promise<LayerInfo> => {
      opts.signal?.throwIfAborted();
      while (e.transition) await this.afterTransition(e);
      if (e.state !== 'running' && e.state !== 'paused') throw notRunning(id, e.state);
      // Taken with no await since the check above: no pause or resume can slip in between.
      let release: () => void = () => undefined;
      const held = new Promise<void>((r) => (release = r));
      e.transition = held;
      let frozen = false;
      // Frozen only while the tree is read: the digest and the commit happen with it running
      // (or paused, as it was).
      const thaw = async (): Promise<void> => {
        try {
          if (frozen) {
            frozen = false;
            await freezer.thaw(id);
          }
        } finally {
          if (e.transition === held) delete e.transition;
          release();
        }
      };
      try {
        // A paused sandbox is already frozen and stays so; a running one is frozen here.
        if (e.state === 'running' && !(await freezer.isFrozen(id))) {
          frozen = true;
          await freezer.freeze(id);
        }
        return await this.layers.build(
          { type: 'upper', dir: upper, parents, ...(idShift ? { idShift } : {}) },
          { kind: 'snapshot', labels, onSourceRead: thaw, ...(opts.signal ? { signal: opts.signal } : {}) },
        );
      } finally {
        await thaw();
      }
    };
    // One at a time per sandbox: a second snapshot must not be thawed under by the first.
    const run = (e.snapshotting ?? Promise.resolve()).then(pack, pack);
    e.snapshotting = run.catch(() => undefined);
    return run;
  }

  /**
   * What a sandbox added, changed and deleted against its layers, read from its writable layer
   * on the host (never through the sandbox's own programs), with sha256 of file contents, a page
   * at a time. Consistent when the sandbox is paused (`frozen` in the result); otherwise files
   * written during the walk may be listed half-written.
   */
  async diff(id: string, opts: DiffOptions = {}): Promise<DiffResult> {
    const e = this.entry(id);
    return diffLayers(this.layersView(id, e), {
      ...(opts.paths ? { paths: opts.paths } : {}),
      ...(opts.hash !== undefined ? { hash: opts.hash } : {}),
      ...(opts.limit !== undefined ? { limit: opts.limit } : {}),
      ...(opts.cursor !== undefined ? { cursor: opts.cursor } : {}),
      frozen: e.state === 'paused',
    });
  }

  /** Integrity check for graders: does each path hold a regular file with the expected sha256? */
  async verify(id: string, req: VerifyRequest): Promise<VerifyResult> {
    return verifyLayers(this.layersView(id, this.entry(id)), req.expected);
  }

  private layersView(id: string, e: Entry): SandboxLayersView {
    return {
      upper: this.upperDir(id),
      // Records list layers bottom first; overlayfs and the view want the topmost first.
      lowers: e.record.layers.map((l) => this.layers.mountDir(l.digest)).reverse(),
      ...(e.record.idRange ? { idRange: e.record.idRange } : {}),
    };
  }

  /**
   * Host ids that a sandbox's ids 0..size-1 map to (its user namespace), or undefined when it
   * shares the host's ids. Files in its upper directory are owned by these host ids.
   */
  idRange(id: string): IdRange | undefined {
    return this.entry(id).record.idRange;
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
      // A pause or resume under way finishes first (the runtime kills frozen processes too).
      await e.transition?.catch(() => undefined);
      e.state = 'stopped';
      clearTimeout(e.survivorTimer);
      // The watch holds an fd on the writable layer: let go of it before the unmount.
      this.monitor.forget(id);
      try {
        await e.backend.destroy(id);
      } catch (err) {
        e.state = 'failed';
        delete e.destroying;
        throw err;
      }
      this.untrack(id);
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
    clearInterval(this.counterTimer);
    this.counterTimer = undefined;
    for (const e of this.sandboxes.values()) clearTimeout(e.survivorTimer);
    // Calls keep no state: their pooled sandboxes go with this process.
    await this.calls.close();
    this.monitor.close();
    this.layers.detach();
    for (const b of this.backends.values()) await b.close();
    await this.network.close();
    // With no sandbox left nothing needs the node's mounts (layer mounts, the runtime namespace,
    // the home's shared bind mount): release them; the next open makes them again.
    if (this.sandboxes.size === 0) {
      await this.layers.close();
      await this.runtimeNs.destroy();
    }
  }

  /** Destroys every sandbox, unmounts every layer and removes the runtime namespace (tests). */
  async shutdown(): Promise<void> {
    for (const id of [...this.sandboxes.keys()]) await this.destroy(id).catch(() => undefined);
    await this.close();
    await this.network.shutdown();
    await this.layers.close();
    await this.cgroups.removeParent();
    await this.runtimeNs.destroy();
    await this.swap?.disable();
  }
}

function notRunning(id: string, state: SandboxState): DsecError {
  const hint = state === 'paused' ? ' (resume it first)' : '';
  return new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${state}${hint}`, { sandboxId: id, state });
}

function mib(bytes: number): string {
  return (bytes / 1048576).toFixed(1);
}

/** Waits until no agent call is under way in a sandbox (CONFLICT after PAUSE_DRAIN_TIMEOUT_MS). */
async function drain(e: Entry, id: string): Promise<void> {
  if (e.busy === 0) return;
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => {
      delete e.onIdle;
      reject(new DsecError('CONFLICT', `sandbox ${id}: agent calls still under way after ${PAUSE_DRAIN_TIMEOUT_MS} ms; retry the pause`, { sandboxId: id, retryAfterMs: 1000 }));
    }, PAUSE_DRAIN_TIMEOUT_MS);
    e.onIdle = () => {
      clearTimeout(timer);
      delete e.onIdle;
      resolve();
    };
  });
}

/** Longest node name: sandbox ids are `<node>-<16 hex>` and must stay short (crun ids, socket paths). */
const MAX_NODE_NAME = 40;

/** A node name usable in sandbox ids: lowercase letters, digits and `-`. */
function nodeNameOf(name: string): string {
  const clean = name.toLowerCase().replace(/[^a-z0-9-]/g, '-').replace(/^-+|-+$/g, '').slice(0, MAX_NODE_NAME);
  return clean.length >= 1 ? clean : 'node';
}

/** What the survivor check needs from /proc/<pid>/status, with pids as the sandbox sees them. */
async function readProcStatus(hostPid: number): Promise<{ pid: number; session: number; name: string; zombie: boolean } | undefined> {
  const text = await readFile(`/proc/${hostPid}/status`, 'utf8').catch(() => undefined);
  if (text === undefined) return undefined;
  const field = (name: string): string => new RegExp(`^${name}:\\s*(.*)$`, 'm').exec(text)?.[1]?.trim() ?? '';
  // NSpid and NSsid list the id in each nested pid namespace; the last is the sandbox's.
  const last = (name: string): number => Number(field(name).split(/\s+/).pop());
  return { pid: last('NSpid'), session: last('NSsid'), name: field('Name'), zombie: field('State').startsWith('Z') };
}

/** Writes stdin; a command that already exited (or closed stdin) is not an error here. */
async function writeStdinIgnoringExit(att: EdgeProcessStream, data: string | Uint8Array, eof: boolean): Promise<void> {
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
