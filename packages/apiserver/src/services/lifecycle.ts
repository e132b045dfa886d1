// A sandbox's life after its create: routing requests to its node (resuming it when its lease
// says so), pause and resume, leases (idle, owner gone), expiry and destroy.
import { DsecError, KeyedSerialQueue, MAX_SANDBOX_TIMEOUT_MS } from '@dsec/protocol';
import type { EdgeClient, GrantedLease, PauseMemory, PauseResult, Sandbox, SandboxSpec } from '@dsec/protocol';
import { requireRole } from '../auth.js';
import type { Principal } from '../auth.js';
import { crashPoint } from '../crash-points.js';
import type { OwnerTable, SandboxTable } from '../db/schema.js';
import type { SandboxShareRow, StateStore } from '../db/store.js';
import { leaseOf, nextLeaseCheckMs, renewSpanMs } from '../leases.js';
import type { ActivityTracker, PauseReason } from '../leases.js';
import type { NodeRegistry, NodeShare } from '../nodes.js';
import { POOLED_STATE } from '../pools.js';
import { spreadOf } from '../scheduler.js';
import type { Placement } from '../scheduler.js';
import type { TrajectoryLog } from '../trajectory.js';
import { PAUSING, RESUMING, sandboxNotFound, toSandbox } from './common.js';
import type { PlatformCounters, SandboxRow, ServiceSinks } from './common.js';
import { SandboxRowEvents } from './sandbox-events.js';

/** States from which a sandbox may be destroyed. */
const DESTROYABLE_STATES = ['running', 'paused', 'failed', 'lost', POOLED_STATE];
/** States `onExpire: 'pause'` applies to at the end of the lifetime; the others are destroyed as with `kill`. */
const EXPIRE_PAUSE_STATES = new Set(['running', 'paused', PAUSING, RESUMING]);
/** Pause reasons that mean "the owner went away": the owner (or a new one) coming back resumes. */
export const OWNER_GONE_REASONS = ['owner-lost', 'owner-closed'];
/** Lost or closed owners that own nothing are forgotten this long after their last heartbeat. */
const STALE_OWNER_MS = 7 * 86_400_000;
const NO_CHANGE = { durationMs: 0, memoryBeforeBytes: 0, memoryAfterBytes: 0, swapBytes: 0 };

/** A sandbox's row and the node it runs on: where a request about it goes. */
export interface RoutedSandbox {
  row: SandboxTable;
  edge: EdgeClient;
}

/** Options of {@link LifecycleService.route}. */
export interface RouteOptions {
  /** `allow`: a paused sandbox is routed to as it is and the request is not activity. */
  paused?: 'resume' | 'allow';
}

/** Teardowns behind acknowledged deletes that run at once in this process (the rest queue, in order). */
export const CONCURRENT_TEARDOWNS = 16;

/**
 * How long a row may stay `stopping`, seen by this process and not torn down by it, before the
 * lease pass finishes it as abandoned (its replica died between the claim and the row's delete).
 * One teardown takes seconds (unmounts, cgroup removal, a VM's QEMU quitting); five minutes also
 * covers a burst of thousands of deletes queued behind another live replica's
 * {@link CONCURRENT_TEARDOWNS} at a time, so rows that replica still works on are left to it.
 */
export const ABANDONED_STOPPING_MS = 5 * 60_000;

/** Tasks run in the background, at most `limit` at a time, in the order they came. */
class BackgroundTasks {
  private running = 0;
  private readonly queued: Array<() => Promise<void>> = [];
  private readonly waiters: Array<() => void> = [];

  constructor(private readonly limit: number) {}

  /** Queues a task; it must not reject (it handles its own errors). */
  run(task: () => Promise<void>): void {
    this.queued.push(task);
    this.pump();
  }

  /** Resolves once nothing runs and nothing is queued. */
  idle(): Promise<void> {
    if (this.running === 0 && this.queued.length === 0) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  private pump(): void {
    while (this.running < this.limit && this.queued.length > 0) {
      const task = this.queued.shift()!;
      this.running++;
      void task().finally(() => {
        this.running--;
        this.pump();
        if (this.running === 0 && this.queued.length === 0) for (const w of this.waiters.splice(0)) w();
      });
    }
  }
}

/** What {@link LifecycleService} is built from. */
export interface LifecycleDeps {
  store: StateStore;
  nodes: NodeRegistry;
  placement: Placement;
  activity: ActivityTracker;
  trajectory: TrajectoryLog;
  counters: PlatformCounters;
  sinks: ServiceSinks;
  /** Capacity went back (a destroy): wake waiting creates, refill pools. */
  onCapacityFreed: () => void;
}

/** When a sandbox's owner counts as gone for it: now when closed or unknown, else its last heartbeat plus the grace. */
function ownerDeadline(owner: OwnerTable | undefined, lease: GrantedLease): number {
  if (!owner || owner.state === 'closed') return 0;
  return Date.parse(owner.heartbeat_at) + (lease.ownerGraceMs ?? owner.grace_ms);
}

/** Routing, pause and resume, leases, expiry and destroy. */
export class LifecycleService {
  /** Pauses and resumes under way in this process, by sandbox id: one at a time, requests wait. */
  private readonly transitions = new KeyedSerialQueue();
  /** When stale owner sessions were last deleted. */
  private ownersCollectedAt = 0;
  /** Events that follow the rows as lists show them (created, settled states, deleted). */
  readonly rowEvents: SandboxRowEvents;
  /** Teardowns of deletes already answered (see {@link destroy}). */
  private readonly teardowns = new BackgroundTasks(CONCURRENT_TEARDOWNS);
  /** Rows this process is claiming or has claimed for their destroy and not finished (queued or tearing down): claims under way, by id. */
  private readonly destroying = new Map<string, number>();
  /** `stopping` rows of other processes, by id: when this process first saw each (see {@link finishAbandonedStopping}). */
  private readonly stoppingSeen = new Map<string, number>();

  constructor(private readonly d: LifecycleDeps) {
    this.rowEvents = new SandboxRowEvents(d.sinks);
  }

  /** The CPU a row charges its node (best-effort sandboxes charge less). */
  cpuCharge(row: SandboxTable): number {
    const spec = JSON.parse(row.spec) as SandboxSpec;
    return this.d.placement.cpuCharge({ cpu: row.cpu, cpuClass: spec.resources?.cpuClass ?? 'latency-sensitive' });
  }

  /**
   * A row's share of its node as a recount counts it: a paused sandbox, or one paused before its
   * delete, holds no CPU.
   */
  shareOf(row: SandboxTable | SandboxShareRow): NodeShare {
    const paused = row.state === 'paused' || (row.state === 'stopping' && !!row.paused_at);
    // A full row's spec is parsed once; a share row has its two parts already.
    let labels: Record<string, string> | undefined;
    let cpuClass: string | null | undefined;
    if ('spec' in row) {
      const spec = JSON.parse(row.spec) as SandboxSpec;
      labels = spec.labels;
      cpuClass = spec.resources?.cpuClass;
    } else {
      labels = row.labels ? (JSON.parse(row.labels) as Record<string, string>) : undefined;
      cpuClass = row.cpu_class;
    }
    const cpu = paused ? 0 : this.d.placement.cpuCharge({ cpu: row.cpu, cpuClass: cpuClass === 'best-effort' ? 'best-effort' : 'latency-sensitive' });
    return { cpu, memoryMiB: row.memory_mib, spread: spreadOf(labels), backend: row.backend };
  }

  /**
   * Rebuilds node allocations from the stored sandboxes (after a restart). With `settle` (a
   * process alone on its store: what is in flight was cut short by a crash), a pause or resume
   * that a crash interrupted is settled by what the node reports (and raises its row event);
   * beside live replicas one may be under way there, and is counted as it stands (a gone
   * replica's is settled by the lease pass, reconcile.ts). The `stopping` and `creating` rows
   * it counts are remembered as counted (another process's, or a crashed one's, work under
   * way): whoever finishes one here gives its share back.
   */
  async loadAllocations(settle: boolean): Promise<void> {
    const inFlight = new Map<string, Map<string, NodeShare>>();
    if (settle) {
      const onNodes = new Map<string, string>();
      for (const n of this.d.nodes.all()) for (const s of await n.client.list()) onNodes.set(s.id, s.state);
      for (const row of await this.d.store.sandboxesInStates([PAUSING, RESUMING])) {
        const actual = onNodes.get(row.id) === 'paused' ? 'paused' : 'running';
        if (await this.d.store.transitionSandbox(row.id, [row.state], actual, actual === 'running' ? { paused_at: null, pause_reason: null } : {})) {
          if (row.pool_id === null) this.rowEvents.stateChanged(row, actual, row.state);
        }
      }
    }
    // What each row's share needs, not the rows in full (a cell's replica holds hundreds of thousands).
    for (const row of await this.d.store.sandboxShares()) {
      // A lost sandbox holds nothing on its node (every path that marks one lost released it).
      if (row.state === 'lost') continue;
      // One paused before its delete holds no CPU (as its teardown counts it).
      const share = this.shareOf(row);
      if (row.state === 'stopping' || row.state === 'creating') (inFlight.get(row.node) ?? inFlight.set(row.node, new Map()).get(row.node)!).set(row.id, share);
      this.d.nodes.chargeShare(row.node, share, 1);
    }
    for (const [node, shares] of inFlight) this.d.nodes.markRecounted(node, shares);
  }

  /** The API's view of a row. */
  toSandbox(row: SandboxRow): Sandbox {
    return toSandbox(row, this.d.activity);
  }

  /** A sandbox row the principal may see, or SANDBOX_NOT_FOUND. */
  async sandboxRow(p: Principal, id: string): Promise<SandboxRow> {
    const row = id.length <= 128 ? await this.d.store.sandbox(id) : undefined;
    // A pool's sandbox is nobody's until it is claimed; a deleted one (`stopping`: its teardown
    // runs behind the answer) is nobody's any more.
    if (!row || !p.visibleProjects.has(row.project_id) || row.pool_id !== null || row.state === 'stopping') throw sandboxNotFound(id);
    return row;
  }

  /**
   * A sandbox's row (with labels) by id alone, for a caller that authorises by other means
   * (the E2B data plane: the sandbox's access token). Pool members are nobody's.
   */
  async rowById(id: string): Promise<SandboxRow | undefined> {
    const row = id.length <= 128 ? await this.d.store.sandbox(id) : undefined;
    return row && row.pool_id === null ? row : undefined;
  }

  /**
   * The node client of a visible, running sandbox. The request counts as the sandbox's API
   * activity; a paused sandbox is resumed first when its lease says `autoResume` (else 409).
   * With `paused: 'allow'` (host-side reads: stats, diff, verify, network info and log, and
   * snapshots, which keep a paused sandbox paused), a paused sandbox is routed to as it is, and
   * the request is not activity.
   */
  async route(p: Principal, id: string, minRole: 'viewer' | 'member' = 'member', opts: RouteOptions = {}): Promise<RoutedSandbox> {
    requireRole(p, minRole);
    if (id.length > 128) throw sandboxNotFound(id);
    // Recorded before the read: an idle pause that claims the row after this read sees it.
    // Reading stats (host-side, `paused: 'allow'`) is not activity: monitoring never keeps a sandbox awake.
    const touched = opts.paused === 'allow' ? undefined : this.d.activity.touch(id);
    // The hot path (every exec and file operation): one indexed read, no labels, kept in memory
    // by the embedded store until a write may have changed it (db/sandbox-row-cache.ts).
    let row = await this.d.store.sandboxRouted(id);
    if (!row || !p.visibleProjects.has(row.project_id) || row.pool_id !== null || row.state === 'stopping') {
      if (touched !== undefined) this.d.activity.forget(id, touched);
      throw sandboxNotFound(id);
    }
    const node = this.d.nodes.get(row.node);
    if (!node) throw new DsecError('UNAVAILABLE', `node ${row.node} of sandbox ${id} is not reachable`, { sandboxId: id });
    if (row.state !== 'running' && !(opts.paused === 'allow' && [PAUSING, 'paused', RESUMING].includes(row.state))) row = await this.runningRow(row);
    return { row, edge: node.client };
  }

  /** A sandbox's row once it runs: waits for a pause or resume under way, resumes if its lease allows. */
  private async runningRow(start: SandboxTable): Promise<SandboxTable> {
    let row: SandboxTable | undefined = start;
    for (let attempt = 0; attempt < 3 && row; attempt++) {
      const pending = this.transitions.pending(row.id);
      if (pending) {
        await pending;
      } else if (row.state === 'running') {
        return row;
      } else if (row.state === 'paused' && leaseOf(row).autoResume) {
        await this.resumeRow(row, 'request');
      } else if (row.state === 'paused') {
        throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${row.id} is paused and its lease does not resume it on requests; resume it first`, {
          sandboxId: row.id,
          state: 'paused',
        });
      } else if (row.state === PAUSING || row.state === RESUMING) {
        throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${row.id} is being ${row.state === PAUSING ? 'paused' : 'resumed'}; retry`, {
          sandboxId: row.id,
          retryAfterMs: 200,
        });
      } else {
        throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${row.id} is ${row.state}`, { sandboxId: row.id, state: row.state });
      }
      row = await this.d.store.sandboxOnly(row.id);
    }
    if (!row) throw sandboxNotFound(start.id);
    if (row.state !== 'running')
      throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${row.id} is ${row.state}; retry`, { sandboxId: row.id, retryAfterMs: 200 });
    return row;
  }

  /**
   * Pauses a sandbox on its node (freeze, reclaim) and gives its CPU back to the node. With
   * `stillDue`, the pause is dropped (undefined) when it returns false once the row is
   * claimed: a request that came in meanwhile keeps an idle sandbox running.
   */
  async pauseRow(row: SandboxTable, reason: PauseReason, stillDue?: () => boolean, opts: { memory?: PauseMemory } = {}): Promise<PauseResult | undefined> {
    return this.transitions.run(row.id, async () => {
      const { store, nodes } = this.d;
      if (!(await store.transitionSandbox(row.id, ['running'], PAUSING))) {
        const now = await store.sandboxOnly(row.id);
        if (!now) throw sandboxNotFound(row.id);
        if (now.state === 'paused' && opts.memory === 'file') return this.pauseReply(now, await this.pausePausedToFile(now, reason));
        if (now.state === 'paused') return this.pauseReply(now, NO_CHANGE);
        throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${row.id} is ${now.state}`, { sandboxId: row.id, state: now.state, retryAfterMs: 1000 });
      }
      crashPoint('pause.pausing');
      const node = nodes.get(row.node);
      if (!node || (stillDue && !stillDue())) {
        await store.transitionSandbox(row.id, [PAUSING], 'running');
        if (!node) throw new DsecError('UNAVAILABLE', `node ${row.node} of sandbox ${row.id} is not reachable`, { sandboxId: row.id });
        return undefined;
      }
      let result: Omit<PauseResult, 'sandbox'>;
      try {
        result = await node.client.pause(row.id, { reason, ...(opts.memory ? { memory: opts.memory } : {}) });
      } catch (err) {
        await store.transitionSandbox(row.id, [PAUSING], 'running');
        throw err;
      }
      crashPoint('pause.node');
      await store.transitionSandbox(row.id, [PAUSING], 'paused', { paused_at: new Date().toISOString(), pause_reason: reason });
      this.rowEvents.stateChanged(row, 'paused', 'running');
      nodes.chargeCpu(row.node, this.cpuCharge(row), -1);
      this.d.counters.sandboxesPaused++;
      return this.pauseReply(row, result);
    });
  }

  /** Resumes a paused sandbox on its node and charges its CPU to the node again. */
  async resumeRow(row: SandboxTable, reason: string, opts: { prefetch?: boolean } = {}): Promise<PauseResult> {
    return this.transitions.run(row.id, async () => {
      const { store, nodes } = this.d;
      if (!(await store.transitionSandbox(row.id, ['paused'], RESUMING))) {
        const now = await store.sandboxOnly(row.id);
        if (!now) throw sandboxNotFound(row.id);
        if (now.state === 'running') return this.pauseReply(now, NO_CHANGE);
        throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${row.id} is ${now.state}`, { sandboxId: row.id, state: now.state, retryAfterMs: 1000 });
      }
      crashPoint('resume.resuming');
      const node = nodes.get(row.node);
      let result: Omit<PauseResult, 'sandbox'>;
      let renewal: Parameters<StateStore['updateSandbox']>[1] | undefined;
      try {
        renewal = await this.renewalOf(row.id);
        if (!node) throw new DsecError('UNAVAILABLE', `node ${row.node} of sandbox ${row.id} is not reachable`, { sandboxId: row.id });
        result = await node.client.resume(row.id, { reason, ...(opts.prefetch === false ? { prefetch: false } : {}) });
      } catch (err) {
        await store.transitionSandbox(row.id, [RESUMING], 'paused');
        throw err;
      }
      crashPoint('resume.node');
      if (renewal) await store.updateSandbox(row.id, renewal);
      // A sandbox whose owner went away is no longer held by that owner once someone resumes it.
      const current = await store.sandboxOnly(row.id);
      const ownerGone = current?.owner_id ? (await store.owner(current.owner_id))?.state !== 'active' : false;
      await store.transitionSandbox(row.id, [RESUMING], 'running', { paused_at: null, pause_reason: null, ...(ownerGone ? { owner_id: null } : {}) });
      this.rowEvents.stateChanged(row, 'running', 'paused');
      this.d.activity.touch(row.id);
      nodes.chargeCpu(row.node, this.cpuCharge(row), 1);
      this.d.counters.sandboxesResumed++;
      return this.pauseReply(row, result);
    });
  }

  /**
   * A sandbox paused at the end of its lifetime (`onExpire: 'pause'`) and resumed gets a new
   * lifetime of the length granted at creation from now (capped at the longest, counted from
   * creation), else the next watcher pass would pause it again: the lease and end to store, or
   * undefined when its lifetime has not ended. SANDBOX_NOT_RUNNING when the longest lifetime
   * leaves it no time (it stays paused until deleted).
   */
  private async renewalOf(id: string, now = Date.now()): Promise<Parameters<StateStore['updateSandbox']>[1] | undefined> {
    const row = await this.d.store.sandboxOnly(id);
    if (!row || Date.parse(row.expires_at) > now) return undefined;
    const lease = leaseOf(row);
    if (lease.onExpire !== 'pause') return undefined;
    const created = Date.parse(row.created_at);
    const renewMs = renewSpanMs(lease);
    const maxLifetimeMs = Math.min(MAX_SANDBOX_TIMEOUT_MS, now - created + renewMs);
    if (created + maxLifetimeMs <= now)
      throw new DsecError(
        'SANDBOX_NOT_RUNNING',
        `sandbox ${id} has lived the longest lifetime a sandbox may (${MAX_SANDBOX_TIMEOUT_MS} ms); it stays paused until deleted`,
        {
          sandboxId: id,
          state: 'paused',
        },
      );
    return { lease: JSON.stringify({ ...lease, maxLifetimeMs, renewMs }), expires_at: new Date(created + maxLifetimeMs).toISOString() };
  }

  /**
   * `memory: "file"` for a sandbox already paused goes to its node, which alone knows the answer:
   * 400 naming `memory` on a backend that cannot write memory to a file, no change for one
   * already in a file, 409 SANDBOX_NOT_RUNNING for one paused with its memory kept (resume first).
   */
  private async pausePausedToFile(row: SandboxTable, reason: PauseReason): Promise<Omit<PauseResult, 'sandbox'>> {
    const node = this.d.nodes.get(row.node);
    if (!node) throw new DsecError('UNAVAILABLE', `node ${row.node} of sandbox ${row.id} is not reachable`, { sandboxId: row.id });
    return node.client.pause(row.id, { reason, memory: 'file' });
  }

  private async pauseReply(row: SandboxTable, r: Omit<PauseResult, 'sandbox'>): Promise<PauseResult> {
    const now = await this.d.store.sandbox(row.id);
    if (!now) throw sandboxNotFound(row.id);
    return {
      sandbox: this.toSandbox(now),
      durationMs: r.durationMs,
      memoryBeforeBytes: r.memoryBeforeBytes,
      memoryAfterBytes: r.memoryAfterBytes,
      swapBytes: r.swapBytes,
    };
  }

  /** POST /v1/sandboxes/{id}/pause */
  async pause(p: Principal, id: string, opts: { memory?: PauseMemory | undefined } = {}): Promise<PauseResult> {
    requireRole(p, 'member');
    const row = await this.sandboxRow(p, id);
    return (await this.pauseRow(row, 'api', undefined, opts.memory ? { memory: opts.memory } : {})) as PauseResult;
  }

  /** POST /v1/sandboxes/{id}/resume */
  async resume(p: Principal, id: string, opts: { prefetch?: boolean | undefined }): Promise<PauseResult> {
    requireRole(p, 'member');
    const row = await this.sandboxRow(p, id);
    this.d.activity.touch(row.id);
    return this.resumeRow(row, 'api', opts.prefetch === false ? { prefetch: false } : {});
  }

  /**
   * One watcher pass over leases: owners past their grace are lost (owner.lost); running
   * sandboxes whose owner is gone (past the sandbox's grace, or closed) and idle ones get their
   * lease's action (pause or kill, lease.exceeded first). Errors are logged per sandbox.
   */
  async enforceLeases(log: (line: string) => void = () => undefined, now = Date.now()): Promise<void> {
    const { store, activity } = this.d;
    for (const o of await store.expiredOwners(now)) {
      if (!(await store.transitionOwner(o.id, ['active'], 'lost'))) continue;
      const count = await store.ownedCount(o.id);
      this.d.sinks.raise({
        kind: 'owner.lost',
        severity: 'warning',
        message: `owner ${o.id}${o.name ? ` (${o.name})` : ''} sent no heartbeat for ${o.grace_ms} ms; it holds ${count} sandboxes`,
        data: { owner: o.id, project: o.project_id, graceMs: o.grace_ms, heartbeatAt: o.heartbeat_at, sandboxes: count },
      });
    }
    if (now - this.ownersCollectedAt >= 60_000) {
      this.ownersCollectedAt = now;
      await store.deleteStaleOwners(new Date(now - STALE_OWNER_MS).toISOString());
    }
    // Judged on the few columns a lease needs, and only for the sandboxes whose idle check is
    // due or that have an owner (runningLeases); the full row is read only for one that is due.
    const leases = await store.runningLeases(now);
    const ownerIds = [...new Set(leases.map((r) => r.owner_id).filter((o): o is string => !!o))];
    const owners = new Map((await store.ownersByIds(ownerIds)).map((o) => [o.id, o]));
    // Not due: when to look again, per (time, lease) one write for all of them.
    const deferred = new Map<string, { at: number; lease: string | null; ids: string[] }>();
    for (const brief of leases) {
      const lease = leaseOf(brief);
      const owner = brief.owner_id ? owners.get(brief.owner_id) : undefined;
      const ownerDue = brief.owner_id ? ownerDeadline(owner, lease) <= now : false;
      const lastActive = activity.lastActiveOf(brief, now);
      const idleFor = now - lastActive;
      const idleDue = lease.idleTimeoutMs > 0 && idleFor >= lease.idleTimeoutMs;
      // A row with an owner is read every pass all the same: nothing to record for it.
      if (!idleDue && !brief.owner_id) {
        const at = nextLeaseCheckMs(lease, lastActive);
        const key = `${at} ${brief.lease ?? ''}`;
        (deferred.get(key) ?? deferred.set(key, { at, lease: brief.lease ?? null, ids: [] }).get(key)!).ids.push(brief.id);
      }
      if (!ownerDue && !idleDue) continue;
      const row = await store.sandboxOnly(brief.id);
      if (!row || row.state !== 'running') continue;
      const [which, action, reason]: [string, GrantedLease['onIdle'], PauseReason] = ownerDue
        ? ['ownerGraceMs', lease.onOwnerLost, owner?.state === 'closed' || !owner ? 'owner-closed' : 'owner-lost']
        : ['idleTimeoutMs', lease.onIdle, 'idle'];
      const why = ownerDue ? `owner ${row.owner_id} is gone` : `idle for ${idleFor} ms`;
      try {
        if (action === 'kill') {
          this.raiseLeaseExceeded(row, which, action, why);
          await this.destroyRow(row);
        } else {
          // Idle: a request that arrived since the decision keeps the sandbox running.
          const stillDue = (): boolean => ownerDue || now - activity.lastActiveOf(row) >= lease.idleTimeoutMs;
          const paused = await this.pauseRow(row, reason, stillDue);
          if (paused) this.raiseLeaseExceeded(row, which, action, why);
        }
      } catch (err) {
        log(`leases: ${action} of ${row.id} (${which}) failed: ${(err as Error).message}`);
      }
    }
    // Unwritten, they are only looked at again next pass.
    await store.deferLeaseChecks([...deferred.values()]).catch((err: unknown) => log(`leases: recording the next checks failed: ${(err as Error).message}`));
  }

  private raiseLeaseExceeded(row: SandboxTable, lease: string, action: string, why: string): void {
    this.d.sinks.raise({
      kind: 'lease.exceeded',
      severity: 'info',
      sandboxId: row.id,
      node: row.node,
      message: `sandbox ${row.id}: ${lease} exceeded (${why}); ${action}`,
      data: { lease, action, project: row.project_id },
    });
  }

  /**
   * Ends a sandbox whose maximum lifetime has passed (the watcher's expiry pass): destroys it,
   * or with `lease.onExpire: 'pause'` pauses a running one and keeps it paused (a paused one, or
   * one being paused or resumed, is left alone; a lost or failed one is destroyed all the same,
   * else it would hold its quota for ever).
   */
  async expireRow(row: SandboxTable): Promise<void> {
    // lease.exceeded for an elapsed lifetime is the watcher's (it raises it once per sandbox).
    if (leaseOf(row).onExpire === 'pause' && EXPIRE_PAUSE_STATES.has(row.state)) {
      if (row.state === 'running') await this.pauseRow(row, 'expired', () => Date.parse(row.expires_at) <= Date.now());
      return;
    }
    await this.destroyRow(row);
    this.d.counters.sandboxesExpired++;
  }

  /** Writes recorded API activity to the store. */
  async flushActivity(): Promise<void> {
    await this.d.activity.flush(this.d.store);
  }

  /**
   * DELETE /v1/sandboxes/{id}: destroys a sandbox on its node and forgets it. From the moment its
   * row is durably `stopping` the sandbox is gone for the API (not listed, not found, its id not
   * routed). By default the call returns once the teardown is done and the row deleted; with
   * `wait: false` (`Prefer: respond-async`) it returns right after the claim and the teardown
   * runs behind it ({@link teardowns}). A crash in between leaves a `stopping` row, which the
   * start-up reconcile finishes (reconcile.ts); a teardown the node refuses leaves the row
   * `failed` (listed again, deletable again), and its row event says so. The project's quota is
   * returned when the row is deleted, after the teardown.
   */
  async destroy(p: Principal, id: string, opts: { wait?: boolean } = {}): Promise<void> {
    requireRole(p, 'member');
    const claimed = await this.claimForDestroy(await this.sandboxRow(p, id));
    if (opts.wait !== false) return this.finishDestroy(claimed);
    this.teardowns.run(() => this.finishDestroy(claimed).catch((err: unknown) => this.d.sinks.log(`dsec: destroying ${id}: ${(err as Error).message}`)));
  }

  /** Waits until every teardown acknowledged by {@link destroy} has finished (close, tests, benches). */
  teardownsIdle(): Promise<void> {
    return this.teardowns.idle();
  }

  /** Destroys a pool's member if it is still ready; a member claimed meanwhile is left alone. */
  async destroyPooled(row: SandboxTable): Promise<void> {
    await this.destroyRow(row, [POOLED_STATE]).catch((err: unknown) => {
      if (!(err instanceof DsecError && (err.code === 'CONFLICT' || err.code === 'SANDBOX_NOT_FOUND'))) throw err;
    });
  }

  /** Destroys a sandbox by its row and waits for it (the watcher uses this for expiry and orphans). */
  async destroyRow(row: SandboxTable, states: string[] = DESTROYABLE_STATES): Promise<void> {
    await this.finishDestroy(await this.claimForDestroy(row, states));
  }

  /** Claims a row for its destroy: `stopping`, durably; returns it with the state it left. */
  private async claimForDestroy(row: SandboxTable, states: string[] = DESTROYABLE_STATES): Promise<{ row: SandboxTable; from: string }> {
    const { store } = this.d;
    // A pause or resume under way here finishes first.
    await this.transitions.idle(row.id);
    // Claim the row first: one destroyer per sandbox, and never one that is still being
    // created (its quota and node charge belong to the create until it finishes).
    const from = (await store.sandboxOnly(row.id))?.state;
    // Marked before the claim commits: the abandoned-row pass never takes a row claimed here.
    this.markDestroying(row.id, 1);
    let claimed = false;
    try {
      claimed = !!from && states.includes(from) && (await store.transitionSandbox(row.id, [from], 'stopping'));
    } finally {
      if (!claimed) this.markDestroying(row.id, -1);
    }
    if (!claimed || !from) {
      const now = await store.sandbox(row.id);
      if (!now || now.state === 'stopping') throw sandboxNotFound(row.id);
      throw new DsecError('CONFLICT', `sandbox ${row.id} is ${now.state}; retry when it is running`, { sandboxId: row.id, retryAfterMs: 1000 });
    }
    // From the claim on the API shows the row no more (404, not listed): live lists drop it now,
    // not when the teardown ends (a teardown the node refuses brings it back as `failed`).
    if (from !== POOLED_STATE) this.rowEvents.deleted(row, from);
    return { row, from };
  }

  /** Tears a claimed (`stopping`) sandbox down on its node, then deletes its row. */
  private async finishDestroy(claimed: { row: SandboxTable; from: string }): Promise<void> {
    try {
      await this.tearDown(claimed);
    } finally {
      this.markDestroying(claimed.row.id, -1);
    }
  }

  /** Counts a claim of this process on a row in (1) or out (-1): two DELETEs at once claim one row twice, one wins. */
  private markDestroying(id: string, by: 1 | -1): void {
    const n = (this.destroying.get(id) ?? 0) + by;
    if (n > 0) this.destroying.set(id, n);
    else this.destroying.delete(id);
  }

  private async tearDown({ row, from }: { row: SandboxTable; from: string }): Promise<void> {
    const { store, nodes } = this.d;
    crashPoint('delete.stopping');
    const node = nodes.get(row.node);
    // A lost sandbox on a node that is not back: nothing to reach; the node's reconcile
    // destroys it there if it ever returns.
    if (node && !(from === 'lost' && node.state !== 'ready')) {
      try {
        await node.client.destroy(row.id);
      } catch (err) {
        if (!(err instanceof DsecError && err.code === 'SANDBOX_NOT_FOUND')) {
          await store.setSandboxState(row.id, 'failed');
          if (from !== POOLED_STATE) this.rowEvents.stateChanged(row, 'failed', from);
          throw err;
        }
      }
      // A paused sandbox already gave its CPU back; a lost one gave back everything when it was
      // lost, unless a recount since counted it again as `stopping`.
      const recounted = nodes.takeRecounted(row.node, row.id);
      if (from !== 'lost' || recounted) {
        const paused = from === 'paused' || (from === 'lost' && !!row.paused_at);
        const share = this.shareOf(row);
        nodes.chargeShare(row.node, paused ? { ...share, cpu: 0 } : share, -1);
      }
    }
    crashPoint('delete.node');
    // Its `sandbox.deleted` was raised at the claim.
    await store.deleteSandbox(row);
    this.d.activity.forget(row.id);
    this.d.trajectory.end(row.id);
    this.d.counters.sandboxesDestroyed++;
    this.d.onCapacityFreed();
  }

  /**
   * A row another process had under way was settled `to` here (reconcile.ts, a gone replica's
   * work), `row` as it was read. Deleted (a `creating` or `stopping` row): its share of the node
   * goes back when this replica's recount counted it, and what this process kept about it is
   * forgotten. Lost (a `pausing` or `resuming` row its node no longer runs): its share goes back
   * as any lost sandbox's does (the recount counted it as on its node; a node this replica does
   * not reach holds no share here).
   */
  settledElsewhere(row: SandboxTable, to: string): void {
    const { nodes } = this.d;
    if (to === 'lost') {
      nodes.forgetRecounted(row.node, row.id);
      nodes.chargeShare(row.node, this.shareOf(row), -1);
      return;
    }
    if (to !== 'deleted') return;
    nodes.giveBackRecounted(row.node, row.id);
    this.stoppingSeen.delete(row.id);
    this.d.activity.forget(row.id);
    this.d.trajectory.end(row.id);
    this.d.onCapacityFreed();
  }

  /**
   * The lease pass's look at the `creating` and `stopping` rows this replica's recount counted
   * (another process's work under way on a node this replica reaches): a row deleted since
   * without this process taking it (another replica finished the delete, rolled the create back,
   * or settled a gone replica's row without reaching the node) gives its counted share back
   * here, so the node's allocation converges to its rows without waiting for the node's next
   * recount; a row whose work finished (out of those states) is forgotten as counted, as its own
   * create or loss would forget it. Every path of this process that deletes such a row takes it
   * first (or runs in this same pass); a row is only given back while still counted. Returns the
   * ids whose share went back.
   */
  async giveBackEndedElsewhere(): Promise<string[]> {
    const { nodes, store } = this.d;
    const counted = nodes.recounted();
    if (counted.length === 0) return [];
    const states = await store.sandboxStates(counted.map((c) => c.id));
    const given: string[] = [];
    for (const { node, id } of counted) {
      const state = states.get(id);
      if (state === undefined) {
        if (nodes.giveBackRecounted(node, id)) given.push(id);
      } else if (state !== 'creating' && state !== 'stopping') {
        nodes.forgetRecounted(node, id);
      }
    }
    if (given.length > 0) this.d.onCapacityFreed();
    return given;
  }

  /**
   * The lease pass's sweep of abandoned deletes: a `stopping` row that this process is not
   * destroying and has seen `stopping` for {@link ABANDONED_STOPPING_MS} or longer belongs to a
   * replica that died between the claim and the row's delete (invisible to the API, holding its
   * quota). It is finished as the start-up reconcile finishes one: destroyed on its node when
   * this process reaches the node and the node is ready (a sandbox the node no longer has is
   * fine; a node not reached here destroys it at its next session-open reconcile, where it has no
   * row), then its row deleted. Two replicas finishing one row at once is harmless: the node's
   * destroy is idempotent and only the delete that removes the row returns the quota and raises
   * `sandbox.deleted` (a second one when the dead replica had raised it at its claim). The
   * first-seen times live in memory: a restarted replica waits the bound again. The pass that
   * deletes the row gives its share of the node's allocation back when this replica's recount
   * counted it (a recount, when the node's session opens, counts `stopping` rows; a share this
   * replica charged at the create and never recounted stays until the node's next recount).
   * Returns the ids it finished.
   */
  async finishAbandonedStopping(log: (line: string) => void = () => undefined, now = Date.now(), boundMs = ABANDONED_STOPPING_MS): Promise<string[]> {
    const { store, nodes } = this.d;
    const rows = await store.sandboxesInStates(['stopping']);
    const present = new Set(rows.map((r) => r.id));
    for (const id of this.stoppingSeen.keys()) if (!present.has(id)) this.stoppingSeen.delete(id);
    const finished: string[] = [];
    for (const row of rows) {
      if (this.destroying.has(row.id)) {
        this.stoppingSeen.delete(row.id);
        continue;
      }
      const seen = this.stoppingSeen.get(row.id);
      if (seen === undefined) this.stoppingSeen.set(row.id, now);
      if (seen === undefined || now - seen < boundMs) continue;
      try {
        const node = nodes.get(row.node);
        if (node?.state === 'ready') {
          try {
            await node.client.destroy(row.id);
          } catch (err) {
            if (!(err instanceof DsecError && err.code === 'SANDBOX_NOT_FOUND')) throw err;
          }
        }
        this.stoppingSeen.delete(row.id);
        if (!(await store.deleteSandbox(row))) continue;
        nodes.giveBackRecounted(row.node, row.id);
        finished.push(row.id);
        log(`dsec: finished the abandoned delete of ${row.id} (stopping for ${now - seen} ms or more)`);
        if (row.pool_id === null) this.rowEvents.deleted(row, 'stopping');
        this.d.activity.forget(row.id);
        this.d.trajectory.end(row.id);
        this.d.counters.sandboxesDestroyed++;
        this.d.onCapacityFreed();
      } catch (err) {
        // The node refused: the row becomes failed (listed and deletable again), as a refused teardown does.
        log(`dsec: finishing the abandoned delete of ${row.id}: ${(err as Error).message}`);
        this.stoppingSeen.delete(row.id);
        if (await store.transitionSandbox(row.id, ['stopping'], 'failed')) {
          if (row.pool_id === null) this.rowEvents.stateChanged(row, 'failed', 'stopping');
        }
      }
    }
    return finished;
  }
}
