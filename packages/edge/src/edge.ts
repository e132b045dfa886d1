// Edge: the node agent. Keeps the node's registry of sandboxes and each one's state machine
// (creating, running, pausing, paused, destroying; agent calls counted so a pause drains them),
// raises the node's events, and routes each request to the sandbox's backend and agent. What a
// request needs besides (commands, counters, snapshots, networks, the host) lives beside it.
// Why it passes 600 lines: what is left is those four, and they share each sandbox's `Entry`
// (state, busy count, transition); split further, the entry would leave the class that guards it.
import { randomBytes } from 'node:crypto';
import { rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { DsecError, crashPoint, invalidArgument, normalizeNetworkPolicy } from '@dsec/protocol';
import type {
  BackendKind,
  PauseMemory,
  DiffOptions,
  DiffResult,
  EdgeCallOptions,
  EdgeClient,
  EdgeSandbox,
  EgressLogEntry,
  EventSink,
  LayerInfo,
  NetworkPolicy,
  NodeCapacity,
  NodeGarbageReport,
  NodeUsageReport,
  RaisedEvent,
  SandboxClaim,
  SandboxNetwork,
  SandboxSpec,
  SandboxState,
  SandboxStats,
  VerifyRequest,
  VerifyResult,
} from '@dsec/protocol';
import { untilAborted } from './abortable.js';
import type { Backend, BackendCreateRequest, BackendSandbox, DiskSnapshotFacet, GuestLayerFacet, MemoryImage, SandboxAgent } from './backend.js';
import type { CallRunner } from './backends/fncall/index.js';
import { diffLayers, verifyLayers } from './diff.js';
import { DEFAULT_MAX_SANDBOXES } from './edge-options.js';
import { NodeScreens } from './screens.js';
import type { EdgeOptions, EdgeParts, PauseResult, ResumeResult } from './edge-options.js';
import { nodeMarkFor } from './host/agent-mount.js';
import type { Cgroups } from './host/cgroups.js';
import type { IdRange } from './host/id-ranges.js';
import type { RuntimeNamespace } from './host/runtime-ns.js';
import { SecurityMonitor } from './host/security-monitor.js';
import type { ZramSwap } from './host/swap.js';
import type { LayerStore } from './layers/index.js';
import type { NodeNetwork } from './net/network.js';
import { joinNetwork, netnsOf, writeNetworkFiles } from './network-attach.js';
import { collectNodeGarbage, openParts } from './node-host.js';
import { DEFAULT_COUNTER_SCAN_MS, SandboxMonitor } from './sandbox-monitor.js';
import { AgentWatch } from './agent-watch.js';
import { SandboxCalls } from './sandbox-calls.js';
import { checkDeniedSyscalls, checkSandboxId, resolveSpecLayers } from './sandbox-spec.js';
import { diffPage, layersView, packDisk, packGuestLayer, packWritableLayer, snapshotLabels, snapshotRequest } from './snapshots.js';
import type { SnapshotHold, SnapshotOptions } from './snapshots.js';

/** Longest a pause waits for agent calls already under way (file transfers, spawns) to finish. */
export const PAUSE_DRAIN_TIMEOUT_MS = 10_000;

/** How often a stream cut by a pause to a file looks whether its sandbox runs again. */
const RUNNING_AGAIN_POLL_MS = 250;

/**
 * Events an edge keeps while nobody subscribes (those raised while it opens, adopting the
 * sandboxes of a previous run; a remote node's between two sessions): the oldest go past this.
 */
export const MAX_HELD_EVENTS = 1000;

interface Entry {
  record: BackendSandbox;
  backend: Backend;
  state: SandboxState;
  /** A destroy in progress (concurrent destroys share it). */
  destroying?: Promise<void>;
  /** Agent calls under way (spawns, file operations); a pause waits until none are. */
  busy: number;
  /** Called when `busy` drops to 0. */
  onIdle?: () => void;
  /** A pause, resume or snapshot read under way; new agent calls wait for it. */
  transition?: Promise<unknown>;
  /** Set on the first use of its agent (or a claim): a used sandbox is never claimed. */
  used: boolean;
  /** Set once its first command ended (the access profiles of its lazy layers are recorded then). */
  profiled?: boolean;
  /** The last snapshot started: snapshots of one sandbox run one after another. */
  snapshotting?: Promise<unknown>;
}

/** The node agent. */
export class Edge extends SandboxCalls implements EdgeClient {
  private readonly sandboxes = new Map<string, Entry>();
  /** Set by `close`: streams waiting for a resume stop waiting. */
  private closed = false;
  /** Ids being created (their folders and cgroups exist before they are in `sandboxes`). */
  private readonly creating = new Set<string>();
  private readonly eventSinks = new Set<EventSink>();
  /** Events raised while {@link eventSinks} was empty, for the next subscriber (at most {@link MAX_HELD_EVENTS}). */
  private readonly heldEvents: RaisedEvent[] = [];
  /** Sandbox ids by the host uid their user namespace starts at (to attribute kernel records). */
  private readonly idBases = new Map<number, string>();
  /** Seccomp denials and watched-path changes, raised as events. */
  private readonly security: SecurityMonitor;
  /** OOM kills, refused forks and survivors of commands, raised as events. */
  protected readonly monitor: SandboxMonitor;
  /** Agents that stop answering while commands wait on them (answered with TIMEOUT, raised as events). */
  protected readonly agentWatch: AgentWatch;
  /** The layers this node holds (the EdgeLayers of the interface). */
  readonly layers: LayerStore;
  /** The cgroups of this node's sandboxes. */
  readonly cgroups: Cgroups;
  readonly home: string;
  readonly nodeName: string;
  /** Stateless function calls (the fncall runner's pools). */
  readonly calls: CallRunner;
  /** Per-sandbox networks: links, policies, DNS stub, egress proxy, egress log. */
  readonly network: NodeNetwork;
  /** Screens, mice and keyboards of VMs (backends with the `screen` facet). */
  readonly screen = new NodeScreens((id) => this.entry(id));
  /** The zram swap this node set up for paused sandboxes (EdgeOptions.zramSwapMiB), if any. */
  readonly swap: ZramSwap | undefined;
  private readonly runtimeNs: Pick<RuntimeNamespace, 'destroy'>;
  /** The launch server the backends and calls share: closed after all of them. */
  private readonly launcher: EdgeParts['launcher'];
  private readonly backends: Map<BackendKind, Backend>;
  private readonly maxSandboxes: number;
  /** What the garbage collection at open removed. */
  lastStartGarbage: NodeGarbageReport | undefined;

  /**
   * A node of parts already made. `Edge.open` prepares the host and makes them; unit tests
   * give fakes of the node's own interfaces (a `Backend`, a `CallRunner`).
   */
  constructor(parts: EdgeParts) {
    super();
    ({
      layers: this.layers,
      cgroups: this.cgroups,
      home: this.home,
      nodeName: this.nodeName,
      calls: this.calls,
      network: this.network,
      runtimeNs: this.runtimeNs,
    } = parts);
    this.swap = parts.swap;
    this.launcher = parts.launcher;
    this.backends = new Map(parts.backends.map((b) => [b.kind, b]));
    this.maxSandboxes = parts.maxSandboxes ?? DEFAULT_MAX_SANDBOXES;
    this.security = new SecurityMonitor({
      raise: (ev) => this.raise(ev),
      sandboxOfIdBase: (uid) => this.idBases.get(uid),
      cgroupParent: parts.cgroups.parent,
      ...(parts.kernelLog === false ? { kernelLog: false } : {}),
    });
    this.monitor = new SandboxMonitor({
      raise: (ev) => this.raise(ev),
      isRunning: (id) => this.sandboxes.get(id)?.state === 'running',
      runningSessions: async (id) => new Set((await this.withAgent(id, (agent) => agent.list())).filter((p) => p.running).map((p) => p.pid)),
    });
    this.agentWatch = new AgentWatch({
      raise: (ev) => this.raise(ev),
      isRunning: (id) => {
        const e = this.sandboxes.get(id);
        return e?.state === 'running' && !e.transition && !e.destroying;
      },
      agent: (id) => this.entry(id).backend.agent(id),
    });
  }

  /** Opens the node: prepares the host, builds its backends, finds sandboxes that survived a restart. */
  static async open(opts: EdgeOptions): Promise<Edge> {
    // Backends raise through the edge, which exists only once they do: what they raise before
    // is raised by the edge once it exists (and held there for its first subscriber).
    const early: RaisedEvent[] = [];
    let raise: EventSink = (ev) => void early.push(ev);
    const edge = new Edge(await openParts(opts, (ev) => raise(ev)));
    raise = (ev) => edge.raise(ev);
    for (const ev of early) edge.raise(ev);
    await edge.adopt(opts.counterScanMs ?? DEFAULT_COUNTER_SCAN_MS);
    return edge;
  }

  /**
   * Takes up the sandboxes its backends recover (a restart), removes what a crashed edge left
   * and nothing adopted, then starts the monitor scanning every `counterScanMs`. Run once, by
   * `open` (unit tests call it on an edge of fakes). What it raises is held for the first subscriber.
   */
  async adopt(counterScanMs: number): Promise<void> {
    for (const backend of this.backends.values()) {
      for (const record of await backend.recover()) {
        const { paused, ...rest } = record;
        this.register(rest, backend, paused ? 'paused' : 'running');
        try {
          this.track(rest, backend);
        } catch (err) {
          // One sandbox whose protected paths cannot be followed (a watch that fails) does not stop the node.
          this.raise({
            kind: 'protected-path.write',
            severity: 'warning',
            sandboxId: record.id,
            message: `changes to the protected paths of ${record.id} cannot be followed, and are not raised: ${(err as Error).message}`,
            data: { unreadable: true },
          });
        }
        await this.network
          .recover(record.id, record.spec.network, () => netnsOf(backend, record.id))
          .catch((err: unknown) => {
            // Its network cannot be put back: it keeps none (closed), and the failure is told.
            this.raise({
              kind: 'sandbox.lost',
              severity: 'warning',
              sandboxId: record.id,
              message: `network of ${record.id} not restored: ${(err as Error).message}`,
            });
          });
      }
    }
    // Saved network policies of sandboxes that did not survive (an edge killed mid-teardown).
    await this.network.forgetSavedExcept((id) => this.sandboxes.has(id));
    // Lazy layers whose server died while this edge was down: their sandboxes cannot read them.
    await this.loseLayerUsers(this.layers.takeLostLayers());
    // What a crashed edge left behind and recovery did not adopt: containers without a
    // folder, cgroups without a container, stale layer mounts. No call pool runs yet, so
    // function-call sandboxes left behind go too.
    this.lastStartGarbage = await this.collectGarbage({ calls: true });
    this.monitor.start(counterScanMs);
  }

  /** What this node offers to the scheduler. */
  capacity(): NodeCapacity {
    const microvm = this.backends.get('microvm')?.capabilities;
    const vm = this.backends.get('vm')?.capabilities;
    return {
      cpu: os.cpus().length,
      memoryMiB: Math.floor(os.totalmem() / 1048576),
      sandboxes: this.maxSandboxes,
      backends: [...this.backends.keys()],
      ...(microvm ? { microvm } : {}),
      ...(vm ? { vm } : {}),
    };
  }

  /** Adds a sandbox to the registry (and to the monitor). */
  private register(record: BackendSandbox, backend: Backend, state: 'running' | 'paused' = 'running'): void {
    const entry: Entry = { record, backend, state, busy: 0, used: false };
    this.sandboxes.set(record.id, entry);
    this.monitor.add(record.id, backend, () => entry.record.spec);
  }

  /**
   * Removes what no live sandbox owns: runtime containers, cgroups with their processes, mounts
   * and folders of sandboxes this node does not know, and layer mounts nobody uses. `calls`
   * also removes function-call sandboxes (only safe while no call pool runs).
   */
  async collectGarbage(opts: { calls?: boolean } = {}): Promise<NodeGarbageReport> {
    return collectNodeGarbage(this.backends.values(), this.layers, {
      keep: (id) => this.sandboxes.has(id) || this.creating.has(id),
      calls: opts.calls ?? false,
      ownerMark: nodeMarkFor(this.home),
    });
  }

  /** What the node's sandboxes use together (its cgroup parent's counters). */
  async usage(opts: EdgeCallOptions = {}): Promise<NodeUsageReport> {
    opts.signal?.throwIfAborted();
    return { ...(await this.cgroups.parentUsage()), sandboxes: this.sandboxes.size };
  }

  /**
   * Subscribes to the events this node raises; returns the unsubscribe function. The events
   * raised while nobody subscribed (at open, adopting sandboxes; between a remote node's
   * sessions) are handed to this first subscriber after them, before `onEvent` returns.
   */
  onEvent(sink: EventSink): () => void {
    this.eventSinks.add(sink);
    for (const ev of this.heldEvents.splice(0)) deliver(sink, ev);
    return () => this.eventSinks.delete(sink);
  }

  /**
   * Raises an event to every subscriber (node name and time filled in); with none, holds it for
   * the next (the newest {@link MAX_HELD_EVENTS}). Never throws.
   */
  raise(ev: RaisedEvent): void {
    // A backend that lost a sandbox (a microVM whose QEMU died) has removed it: the node forgets it too.
    if (ev.kind === 'sandbox.lost' && ev.sandboxId && ev.data?.backend !== undefined) void this.forgetLost(ev.sandboxId);
    if (ev.kind === 'layer.server-lost') void this.loseLayerUsers(this.layers.takeLostLayers());
    const full: RaisedEvent = { ...ev, node: ev.node ?? this.nodeName, at: ev.at ?? new Date().toISOString() };
    if (this.eventSinks.size === 0) {
      if (this.heldEvents.push(full) > MAX_HELD_EVENTS) this.heldEvents.shift();
      return;
    }
    for (const sink of this.eventSinks) deliver(sink, full);
  }

  /** A new sandbox id that names this node. */
  newId(): string {
    return `${this.nodeName}-${randomBytes(8).toString('hex')}`;
  }

  /** Creates a sandbox and waits until its agent answers. */
  async create(spec: SandboxSpec, opts: { id?: string; signal?: AbortSignal } = {}): Promise<EdgeSandbox> {
    const kind = spec.backend ?? 'container';
    const backend = this.backends.get(kind);
    if (!backend) throw invalidArgument('backend', `${kind} is not available on this node`);
    checkDeniedSyscalls(spec);
    const id = opts.id ?? this.newId();
    checkSandboxId(id);
    if (this.sandboxes.has(id) || this.creating.has(id)) throw new DsecError('CONFLICT', `sandbox ${id} already exists`, { sandboxId: id });
    if (this.sandboxes.size + this.creating.size >= this.maxSandboxes) {
      throw new DsecError('CAPACITY_EXHAUSTED', `node ${this.nodeName} is full (${this.maxSandboxes} sandboxes)`, { retryAfterMs: 1000 });
    }
    const layers = await resolveSpecLayers(this.layers, spec, opts.signal);
    const network = spec.network?.mode === 'allowlist' ? spec.network : undefined;
    if (network && !backend.network) throw invalidArgument('network.mode', `the ${kind} backend has no network; use mode none`);
    this.creating.add(id);
    let record: BackendSandbox;
    let memory: MemoryImage | undefined;
    try {
      crashPoint('edge.create.layers');
      if (spec.memoryOf !== undefined) memory = await this.captureMemory(spec.memoryOf, { id, spec, layers }, backend, opts.signal);
      record = await backend.create({ id, spec, layers, ...(memory ? { memory } : {}) }, opts.signal);
      crashPoint('edge.create.backend');
      if (network) await joinNetwork(this.network, backend, id, normalizeNetworkPolicy(network));
      crashPoint('edge.create.network');
    } finally {
      this.creating.delete(id);
      if (memory) await rm(memory.dir, { recursive: true, force: true }).catch(() => undefined);
    }
    try {
      this.track(record, backend, true);
    } catch (err) {
      // A watch that was asked for and cannot be set up: no sandbox rather than an unwatched one.
      this.untrack(id);
      await backend.destroy(id).catch(() => undefined);
      await this.network.remove(id).catch(() => undefined);
      throw new DsecError('BACKEND_FAILED', `protect.watch: cannot watch the sandbox's writable layer: ${(err as Error).message}`, { sandboxId: id });
    }
    this.register(record, backend);
    return this.info(id);
  }

  /**
   * The memory and writable disks of sandbox `sourceId` (a VM of the same backend on this node)
   * copied for a fork with memory, the copy being the source's transition (as a snapshot is:
   * pauses, resumes and agent calls wait for it).
   */
  private async captureMemory(sourceId: string, fork: BackendCreateRequest, backend: Backend, signal?: AbortSignal): Promise<MemoryImage> {
    const e = this.sandboxes.get(sourceId);
    if (!e || e.backend !== backend) throw invalidArgument('memoryOf', `no ${backend.kind} sandbox ${sourceId} on node ${this.nodeName}`);
    const facet = backend.memoryFork;
    if (!facet) throw invalidArgument('memoryOf', `the ${backend.kind} backend does not fork with memory`);
    const hold = await this.holdStill(e, sourceId);
    try {
      signal?.throwIfAborted();
      return await facet.captureMemory(sourceId, fork, signal);
    } finally {
      hold.release();
    }
  }

  /** Starts attributing kernel records to a sandbox, watching its watched paths and reading its refused writes. */
  private track(record: BackendSandbox, backend: Backend, created = false): void {
    if (record.idRange) this.idBases.set(record.idRange.uid, record.id);
    const watch = record.spec.protect?.watch ?? [];
    if (watch.length > 0 && backend.writableLayer) this.security.watch(record.id, path.dirname(backend.writableLayer.upperDir(record.id)), watch);
    // A new log is read from its start; an adopted one from where the previous edge raised it to.
    const served = backend.protectedPaths;
    if (record.spec.protect?.readOnly?.length && served) {
      this.security.followRefusals(
        record.id,
        served.refusalLog(record.id),
        created,
        () => served.serving(record.id),
        () => served.restart(record.id),
      );
    }
  }

  /**
   * Sandboxes using a lazy layer whose server died (see LayerStore.dropDeadMount): their root
   * reads through a dead FUSE connection (ENOTCONN) that cannot be re-attached, so they are
   * destroyed and raised `sandbox.lost` (reason `layer-server-lost`) rather than left failing
   * reads for good. Never throws.
   */
  private async loseLayerUsers(digests: string[]): Promise<void> {
    if (digests.length === 0) return;
    const dead = new Set(digests);
    for (const [id, e] of [...this.sandboxes]) {
      const layer = (e.record.layers ?? []).find((l) => dead.has(l.digest));
      if (layer === undefined) continue;
      await this.destroy(id).catch(() => undefined);
      this.raise({
        kind: 'sandbox.lost',
        severity: 'warning',
        sandboxId: id,
        message: `sandbox ${id}: the lazy server of its layer ${layer.digest} died; its root cannot be read any more`,
        data: { backend: e.backend.kind, reason: 'layer-server-lost', layer: layer.digest },
      });
    }
  }

  /**
   * Forgets a sandbox its backend no longer has (lost, or gone before a destroy): its watches,
   * its network (link slot, DNS and proxy entries) and its entry go. Never throws.
   */
  private async forgetLost(id: string): Promise<void> {
    const e = this.sandboxes.get(id);
    if (!e) return;
    e.state = 'stopped';
    this.monitor.remove(id);
    this.agentWatch.remove(id);
    this.untrack(id);
    this.sandboxes.delete(id);
    await this.network.remove(id).catch(() => undefined);
  }

  private untrack(id: string): void {
    this.security.forget(id);
    for (const [uid, owner] of this.idBases) if (owner === id) this.idBases.delete(uid);
  }

  /**
   * Hands a sandbox created ahead of demand (a warm pool's) to its claimer: its commands get
   * the claimer's env from now on and it carries the claimer's labels, as if it had been created
   * with them. Refused (CONFLICT) for a sandbox that anything has used, or claimed, before.
   */
  async claim(id: string, claim: SandboxClaim, opts: EdgeCallOptions = {}): Promise<EdgeSandbox> {
    opts.signal?.throwIfAborted();
    const e = this.entry(id);
    if (e.state !== 'running') throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${e.state}`, { sandboxId: id });
    if (e.used) throw new DsecError('CONFLICT', `sandbox ${id} was used before; it cannot be claimed`, { sandboxId: id });
    e.used = true;
    if (claim.env !== undefined || claim.labels !== undefined) {
      // Once begun the claim completes (the sandbox is used either way); the caller may stop waiting.
      const applied = e.backend.claim(id, claim).then(() => {
        e.record = { ...e.record, spec: { ...e.record.spec, ...claim } };
      });
      await untilAborted(applied, opts.signal);
    }
    return this.toInfo(e);
  }

  /**
   * Replaces a sandbox's network policy; in force for new connections when this returns. The
   * policy is put in its normal form here too (cheap, and the node's state must not depend on
   * the caller having done it).
   */
  async setNetwork(id: string, policy: NetworkPolicy, opts: EdgeCallOptions = {}): Promise<SandboxNetwork> {
    opts.signal?.throwIfAborted();
    const e = this.entry(id);
    if (e.state !== 'running') throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${e.state}`, { sandboxId: id });
    const wasLinked = this.network.resolvConf(id) !== undefined;
    const normal = normalizeNetworkPolicy(policy);
    const applied = await this.network.apply(
      id,
      () => normal,
      () => netnsOf(this.entry(id).backend, id),
    );
    e.record = { ...e.record, spec: { ...e.record.spec, network: applied } };
    if (!wasLinked && this.network.resolvConf(id) !== undefined) {
      // Through withAgent: a pause that begins meanwhile waits for the write.
      await this.withAgent(id, (agent) => writeNetworkFiles(this.network, agent, id)).catch(() => undefined);
    }
    return this.network.info(id);
  }

  /** A sandbox's network: policy, addresses, traffic and attempt counters. */
  async networkInfo(id: string, opts: EdgeCallOptions = {}): Promise<SandboxNetwork> {
    opts.signal?.throwIfAborted();
    this.entry(id);
    return this.network.info(id);
  }

  /** The latest egress attempts of a sandbox (allowed and denied), oldest first. */
  async networkLog(id: string, limit?: number, opts: EdgeCallOptions = {}): Promise<EgressLogEntry[]> {
    opts.signal?.throwIfAborted();
    this.entry(id);
    return this.network.log(id, limit);
  }

  private entry(id: string): Entry {
    const e = this.sandboxes.get(id);
    if (!e) throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${id} not found`, { sandboxId: id });
    return e;
  }

  private toInfo(e: Entry): EdgeSandbox {
    const { record } = e;
    return {
      id: record.id,
      node: this.nodeName,
      backend: record.backend,
      state: e.state,
      spec: record.spec,
      layers: record.layers.map((l) => l.digest),
      createdAt: record.createdAt,
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
   * Waits while a pause or resume of the sandbox is under way and reads its entry again.
   * Callers loop on it in their own body (`while (e.transition) e = await ...`) and act on the
   * entry with no await after the check: a resolved promise reaches its caller a turn later,
   * time enough for a pause to begin, and a call that slipped in behind a freeze would hang
   * until the resume. With no transition under way nothing is awaited at all. An abort of
   * `signal` ends the wait (the transition goes on).
   */
  private async afterTransition(e: Entry, id: string, signal?: AbortSignal): Promise<Entry> {
    const under = e.transition;
    if (under)
      await untilAborted(
        under.catch(() => undefined),
        signal,
      );
    return this.entry(id);
  }

  /** The agent of a running sandbox. */
  async agent(id: string): Promise<SandboxAgent> {
    let e = this.entry(id);
    while (e.transition) e = await this.afterTransition(e, id);
    if (e.state !== 'running') throw notRunning(id, e.state);
    e.used = true;
    return e.backend.agent(id);
  }

  /**
   * Runs one agent call with the sandbox held running: a pause waits for calls under way and
   * calls that arrive during a pause or resume wait for it. A paused sandbox's agent cannot
   * answer, so nothing is ever sent to it. `connect` gives the call a connection of its own; an
   * abort of `signal` before the call is made (also while it waits for a transition) refuses it.
   */
  protected async withAgent<T>(
    id: string,
    fn: (agent: SandboxAgent) => Promise<T>,
    opts: { connect?: boolean; signal?: AbortSignal | undefined } = {},
  ): Promise<T> {
    const { connect = false, signal } = opts;
    signal?.throwIfAborted();
    let e = this.entry(id);
    while (e.transition) e = await this.afterTransition(e, id, signal);
    signal?.throwIfAborted();
    if (e.state !== 'running') throw notRunning(id, e.state);
    e.used = true;
    e.busy++;
    try {
      return await fn(await (connect ? e.backend.connectAgent(id) : e.backend.agent(id)));
    } finally {
      if (--e.busy === 0) e.onIdle?.();
    }
  }

  /**
   * Whether a sandbox whose agent connection was just lost runs again after a pause to a file:
   * waits out the transition under way, then for the resume (checked every 250 ms); false at once
   * when the sandbox is gone, this edge closed, or it was not paused to a file (a real loss).
   */
  protected async runningAgain(id: string, signal: AbortSignal): Promise<boolean> {
    let inFile = false;
    for (;;) {
      const e = this.sandboxes.get(id);
      if (!e || signal.aborted || this.closed) return false;
      if (e.transition) {
        await untilAborted(
          e.transition.catch(() => undefined),
          signal,
        ).catch(() => undefined);
        continue;
      }
      if (e.state === 'running') return inFile;
      if (e.state !== 'paused' || !e.backend.pausing?.inFile?.(id)) return false;
      inFile = true;
      await new Promise((r) => setTimeout(r, RUNNING_AGAIN_POLL_MS).unref());
    }
  }

  /** The environment a command starts with below its own: the network's, then the sandbox's. */
  protected commandEnv(id: string): Record<string, string> | undefined {
    const env = this.entry(id).record.spec.env;
    const netEnv = this.network.env(id);
    return netEnv ? { ...netEnv, ...env } : env;
  }

  /**
   * Pauses a sandbox: waits for agent calls under way, freezes every process and makes its
   * memory reclaimable. Commands keep their state (and their output offsets); attachments
   * simply see no output until the sandbox is resumed. Pausing a paused sandbox is a no-op.
   * An abort while it waits for a transition or for calls under way leaves the sandbox running;
   * once the freeze has begun the pause completes and only the caller's wait ends.
   */
  async pause(id: string, opts: EdgeCallOptions & { reason?: string; memory?: PauseMemory } = {}): Promise<PauseResult> {
    const { signal } = opts;
    signal?.throwIfAborted();
    let e = this.entry(id);
    while (e.transition) e = await this.afterTransition(e, id, signal);
    signal?.throwIfAborted();
    const pausing = e.backend.pausing;
    if (!pausing) throw new DsecError('INVALID_ARGUMENT', `the ${e.backend.kind} backend cannot pause sandboxes`, { sandboxId: id });
    const toFile = opts.memory === 'file' ? pausing.pauseToFile?.bind(pausing) : undefined;
    if (opts.memory === 'file' && !toFile) throw invalidArgument('memory', `the ${e.backend.kind} backend cannot write a paused sandbox's memory to a file`);
    if (e.state === 'paused' && toFile && !pausing.inFile?.(id))
      throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${id} is already paused with its memory kept; resume it, then pause with memory "file"`, {
        sandboxId: id,
        state: e.state,
      });
    if (e.state === 'paused') return unchanged(await pausing.memory(id).catch(() => undefined));
    if (e.state !== 'running') throw notRunning(id, e.state);
    const run = this.transition(e, async () => {
      const t0 = performance.now();
      await drain(e, id, signal);
      const r = toFile ? await toFile(id) : await pausing.pause(id);
      e.state = 'paused';
      const result = { ...r, durationMs: performance.now() - t0 };
      const reason = opts.reason ?? 'api';
      const message = `sandbox ${id} paused (${reason}${toFile ? ', memory to a file' : ''}): memory ${mib(r.memoryBeforeBytes)} -> ${mib(r.memoryAfterBytes)} MiB`;
      this.raise({ kind: 'sandbox.paused', severity: 'info', sandboxId: id, message, data: { reason, memory: toFile ? 'file' : 'keep', ...result } });
      return result;
    });
    return untilAborted(run, signal);
  }

  /** Resumes a paused sandbox (prefetching its swapped-out memory unless `prefetch: false`). */
  async resume(id: string, opts: EdgeCallOptions & { reason?: string; prefetch?: boolean } = {}): Promise<ResumeResult> {
    const { signal } = opts;
    signal?.throwIfAborted();
    let e = this.entry(id);
    while (e.transition) e = await this.afterTransition(e, id, signal);
    signal?.throwIfAborted();
    const pausing = e.backend.pausing;
    if (e.state === 'running') return unchanged(await pausing?.memory(id).catch(() => undefined));
    if (e.state !== 'paused' || !pausing) throw notRunning(id, e.state);
    // Once begun the resume completes (a half-thawed sandbox is in no known state).
    const run = this.transition(e, async () => {
      const t0 = performance.now();
      const r = await pausing.resume(id, opts.prefetch === false ? { prefetch: false } : {});
      e.state = 'running';
      const result = { ...r, durationMs: performance.now() - t0 };
      const reason = opts.reason ?? 'api';
      this.raise({ kind: 'sandbox.resumed', severity: 'info', sandboxId: id, message: `sandbox ${id} resumed (${reason})`, data: { reason, ...result } });
      return result;
    });
    return untilAborted(run, signal);
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
    const guest = e.backend.writableLayer ? undefined : e.backend.guestLayer;
    if (guest) return this.snapshotGuest(e, id, guest, opts);
    if (e.backend.diskSnapshot) return this.snapshotDisk(e, id, e.backend.diskSnapshot, opts);
    const upper = this.upperDir(id);
    const freezer = e.backend.pausing;
    if (!freezer) throw new DsecError('INVALID_ARGUMENT', `the ${e.backend.kind} backend cannot freeze sandboxes for a snapshot`, { sandboxId: id });
    const request = snapshotRequest(e.record, upper, freezer, opts);
    const pack = async (): Promise<LayerInfo> => {
      opts.signal?.throwIfAborted();
      return packWritableLayer(this.layers, { ...request, hold: await this.holdStill(e, id) });
    };
    // One at a time per sandbox: a second snapshot must not be thawed under by the first.
    return inTurn(e, pack);
  }

  /**
   * A snapshot of a writable layer inside a guest (a microVM): the sandbox is the transition
   * while the guest copies its upper directory out (its own writes wait on its frozen disk), then
   * the copy is packed with the sandbox running on. One at a time per sandbox, as any snapshot.
   */
  private snapshotGuest(e: Entry, id: string, guest: GuestLayerFacet, opts: SnapshotOptions): Promise<LayerInfo> {
    const pack = async (): Promise<LayerInfo> => {
      opts.signal?.throwIfAborted();
      return packGuestLayer(this.layers, guest, {
        id,
        kind: e.backend.kind,
        parents: e.record.layers.map((l) => l.digest),
        labels: snapshotLabels(e.record, opts.labels),
        hold: await this.holdStill(e, id),
        ...(opts.signal ? { signal: opts.signal } : {}),
      });
    };
    return inTurn(e, pack);
  }

  /**
   * A snapshot of a VM's disk: the sandbox is the transition while its disk is copied, then the
   * copy is flattened into a `disk` layer with the VM running on. One at a time per sandbox.
   */
  private snapshotDisk(e: Entry, id: string, disk: DiskSnapshotFacet, opts: SnapshotOptions): Promise<LayerInfo> {
    const pack = async (): Promise<LayerInfo> => {
      opts.signal?.throwIfAborted();
      return packDisk(this.layers, disk, {
        id,
        labels: snapshotLabels(e.record, opts.labels),
        hold: await this.holdStill(e, id),
        ...(opts.signal ? { signal: opts.signal } : {}),
      });
    };
    return inTurn(e, pack);
  }

  /** Makes the caller the sandbox's one transition once none is under way (running or paused only). */
  private async holdStill(e: Entry, id: string): Promise<SnapshotHold> {
    while (e.transition) await e.transition.catch(() => undefined);
    if (e.state !== 'running' && e.state !== 'paused') throw notRunning(id, e.state);
    // Taken with no await since the check above: no pause or resume can slip in between.
    let release: () => void = () => undefined;
    const held = new Promise<void>((r) => (release = r));
    e.transition = held;
    return {
      paused: e.state === 'paused',
      release: () => {
        if (e.transition === held) delete e.transition;
        release();
      },
    };
  }

  /**
   * What a sandbox added, changed and deleted against its layers, read from its writable layer
   * on the host (never through the sandbox's own programs), with sha256 of file contents, a page
   * at a time. Consistent when the sandbox is paused (`frozen` in the result); otherwise files
   * written during the walk may be listed half-written.
   */
  async diff(id: string, opts: DiffOptions = {}, call: EdgeCallOptions = {}): Promise<DiffResult> {
    const e = this.entry(id);
    return diffLayers(layersView(this.upperDir(id), e.record, this.layers), diffPage(opts, e.state === 'paused'), call.signal);
  }

  /** Integrity check for graders: does each path hold a regular file with the expected sha256? */
  async verify(id: string, req: VerifyRequest, opts: EdgeCallOptions = {}): Promise<VerifyResult> {
    return verifyLayers(layersView(this.upperDir(id), this.entry(id).record, this.layers), req.expected, opts.signal);
  }

  /**
   * Host ids that a sandbox's ids 0..size-1 map to (its user namespace), or undefined when it
   * shares the host's ids. Files in its upper directory are owned by these host ids.
   */
  idRange(id: string): IdRange | undefined {
    return this.entry(id).record.idRange;
  }

  /** The first command's end is where lazy layers' access profiles stop recording. */
  protected override commandEnded(id: string): void {
    const e = this.sandboxes.get(id);
    if (e === undefined || e.profiled === true) return;
    e.profiled = true;
    const lazy = (e.record.layers ?? []).map((l) => l.digest).filter((d) => this.layers.isLazy(d));
    if (lazy.length > 0) this.layers.recordProfiles(lazy).catch(() => undefined); // a profile is an optimization
  }

  /** Resource use of a sandbox. */
  async stats(id: string, opts: EdgeCallOptions = {}): Promise<SandboxStats> {
    opts.signal?.throwIfAborted();
    const e = this.entry(id);
    const stats = await untilAborted(e.backend.stats(id), opts.signal);
    const lazy = (e.record.layers ?? []).map((l) => l.digest).filter((d) => this.layers.isLazy(d));
    return lazy.length === 0 ? stats : { ...stats, layerBytesFetched: await this.layers.fetchedBytes(lazy) };
  }

  /**
   * Destroys a sandbox and everything it had. An abort before it begins leaves the sandbox; once
   * begun the destroy completes and only the caller's wait ends.
   */
  destroy(id: string, opts: EdgeCallOptions = {}): Promise<void> {
    if (opts.signal?.aborted) return Promise.reject(opts.signal.reason as Error);
    const e = this.entry(id);
    e.destroying ??= (async () => {
      // A pause or resume under way finishes first (the runtime kills frozen processes too).
      await e.transition?.catch(() => undefined);
      e.state = 'stopped';
      this.monitor.remove(id);
      this.agentWatch.remove(id);
      // The watch holds an fd on the writable layer: let go of it before the unmount.
      this.security.forget(id);
      crashPoint('edge.delete.begun');
      try {
        await e.backend.destroy(id);
      } catch (err) {
        // Already gone from its backend (a crashed microVM): what the node kept for it goes all the same.
        if (err instanceof DsecError && err.code === 'SANDBOX_NOT_FOUND') return this.forgetLost(id);
        e.state = 'failed';
        delete e.destroying;
        throw err;
      }
      crashPoint('edge.delete.backend');
      this.untrack(id);
      await this.network.remove(id);
      crashPoint('edge.delete.network');
      this.sandboxes.delete(id);
    })();
    return untilAborted(e.destroying, opts.signal);
  }

  /**
   * Lets go of this process's hold on the node: connections close, sandboxes keep running and
   * a later `Edge.open` on the same home finds them again.
   */
  async close(): Promise<void> {
    this.closed = true;
    this.monitor.close();
    // Calls keep no state: their pooled sandboxes go with this process.
    await this.calls.close();
    this.security.close();
    this.layers.detach();
    for (const b of this.backends.values()) await b.close();
    await this.launcher?.close();
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
    // close() releases the node's mounts once no sandbox is left; one that could not be destroyed
    // does not keep them here.
    const leftOver = this.sandboxes.size > 0;
    await this.close();
    await this.network.shutdown();
    if (leftOver) await this.layers.close();
    await this.cgroups.removeParent();
    if (leftOver) await this.runtimeNs.destroy();
    await this.swap?.disable();
  }
}

function notRunning(id: string, state: SandboxState): DsecError {
  const hint = state === 'paused' ? ' (resume it first)' : '';
  return new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${state}${hint}`, { sandboxId: id, state });
}

/** The result of a pause of a paused sandbox (or a resume of a running one): nothing changed. */
function unchanged(m: { usageBytes: number; swapBytes: number } | undefined): PauseResult {
  const { usageBytes, swapBytes } = m ?? { usageBytes: 0, swapBytes: 0 };
  return { memoryBeforeBytes: usageBytes, memoryAfterBytes: usageBytes, swapBytes, durationMs: 0 };
}

function mib(bytes: number): string {
  return (bytes / 1048576).toFixed(1);
}

/**
 * Waits until no agent call is under way in a sandbox (CONFLICT after PAUSE_DRAIN_TIMEOUT_MS,
 * the signal's reason when it aborts first).
 */
async function drain(e: Entry, id: string, signal?: AbortSignal): Promise<void> {
  if (e.busy === 0) return;
  signal?.throwIfAborted();
  await new Promise<void>((resolve, reject) => {
    const onAbort = (): void => {
      clearTimeout(timer);
      delete e.onIdle;
      reject(signal?.reason as Error);
    };
    signal?.addEventListener('abort', onAbort, { once: true });
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      delete e.onIdle;
      reject(
        new DsecError('CONFLICT', `sandbox ${id}: agent calls still under way after ${PAUSE_DRAIN_TIMEOUT_MS} ms; retry the pause`, {
          sandboxId: id,
          retryAfterMs: 1000,
        }),
      );
    }, PAUSE_DRAIN_TIMEOUT_MS);
    e.onIdle = () => {
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      delete e.onIdle;
      resolve();
    };
  });
}

/** Runs `pack` after the sandbox's snapshot under way, if any: one snapshot at a time per sandbox. */
function inTurn(e: Entry, pack: () => Promise<LayerInfo>): Promise<LayerInfo> {
  const run = (e.snapshotting ?? Promise.resolve()).then(pack, pack);
  e.snapshotting = run.catch(() => undefined);
  return run;
}

/** Hands an event to one subscriber. Never throws. */
function deliver(sink: EventSink, ev: RaisedEvent): void {
  try {
    sink(ev);
  } catch {
    // A sink's failure is its own; the node carries on.
  }
}
