// The control plane's logic, apart from HTTP: sandboxes (quota, placement, routing to their
// node), layers owned by projects, projects and keys.
import { randomBytes } from 'node:crypto';
import {
  CallBatchRequestSchema,
  CallRequestSchema,
  CreateKeyRequestSchema,
  CreateOwnerRequestSchema,
  CreateProjectRequestSchema,
  CreateSandboxRequestSchema,
  DEFAULT_OWNER_GRACE_MS,
  DEFAULT_CPU,
  DEFAULT_DISK_MIB,
  DEFAULT_MEMORY_MIB,
  DEFAULT_PAGE_SIZE,
  DEFAULT_PIDS,
  DsecError,
  ListSandboxesQuerySchema,
  OwnerIdSchema,
  ResumeRequestSchema,
  UpdateSandboxRequestSchema,
  invalidArgument,
} from '@dsec/protocol';
import type { ApiKey, CallBatchItem, CallBatchResult, CallRequest, CallResult, EventSink, GrantedLease, GrantedResources, Layer, LayerInfo, LayerKind, NodeBody, Owner, PauseResult, Project, Quota, RaisedEvent, Sandbox, SandboxSpec } from '@dsec/protocol';
import type { z } from 'zod';
import { newKeySecret, requireRole, roleAtLeast } from './auth.js';
import type { Authenticator, Principal } from './auth.js';
import type { ApiKeyTable, LayerTable, OwnerTable, ProjectTable, SandboxTable } from './db/schema.js';
import { newId, PUBLIC_PROJECT_ID, ROOT_PROJECT_ID } from './db/store.js';
import type { StateStore } from './db/store.js';
import type { EdgeClient, NodeEntry, NodeRegistry } from './nodes.js';
import type { Placement } from './scheduler.js';
import { ActivityTracker, grantLease, leaseOf, mergeLease, toOwner } from './leases.js';
import type { PauseReason } from './leases.js';

/** Parses `value` with a schema; the first issue becomes a 400 naming its field. */
export function parseInput<T>(schema: z.ZodType<T>, value: unknown, prefix = ''): T {
  const res = schema.safeParse(value);
  if (res.success) return res.data;
  const issue = res.error.issues[0];
  const field = [prefix, ...(issue?.path ?? []).map(String)].filter(Boolean).join('.');
  throw invalidArgument(field || prefix || 'body', issue?.message ?? 'invalid');
}

const DIGEST_RE = /^(sha256:)?[0-9a-f]{64}$/;
/** States from which a sandbox may be destroyed. */
const DESTROYABLE_STATES = ['running', 'paused', 'failed', 'lost'];
/**
 * Store-only states of a pause or resume under way (the API shows them as the state they
 * leave): the row is claimed so that one pause, resume or destroy acts at a time.
 */
const PAUSING = 'pausing';
const RESUMING = 'resuming';
/** Pause reasons that mean "the owner went away": the owner (or a new one) coming back resumes. */
const OWNER_GONE_REASONS = ['owner-lost', 'owner-closed'];
/** Most active owner sessions per project. */
export const MAX_OWNERS_PER_PROJECT = 10_000;
/** Lost or closed owners that own nothing are forgotten this long after their last heartbeat. */
const STALE_OWNER_MS = 7 * 86_400_000;

/** Normalizes a layer name to `name:tag`. */
export function layerName(ref: string): string {
  return ref.includes(':') ? ref : `${ref}:latest`;
}

/** When a sandbox's owner counts as gone for it: now when closed or unknown, else its last heartbeat plus the grace. */
function ownerDeadline(owner: OwnerTable | undefined, lease: GrantedLease): number {
  if (!owner || owner.state === 'closed') return 0;
  return Date.parse(owner.heartbeat_at) + (lease.ownerGraceMs ?? owner.grace_ms);
}

/** A sandbox row with its labels. */
export type SandboxRow = SandboxTable & { labels: Record<string, string> };

/** Counters the HTTP layer exports as metrics. */
export interface ControlPlaneCounters {
  sandboxesCreated: number;
  sandboxCreateFailures: number;
  sandboxesDestroyed: number;
  sandboxesExpired: number;
  sandboxesPaused: number;
  sandboxesResumed: number;
}

/** The control plane. */
export class ControlPlane {
  readonly counters: ControlPlaneCounters = { sandboxesCreated: 0, sandboxCreateFailures: 0, sandboxesDestroyed: 0, sandboxesExpired: 0, sandboxesPaused: 0, sandboxesResumed: 0 };
  /** Last API activity per sandbox (idle timeouts), written to the store about once a second. */
  readonly activity = new ActivityTracker();
  private readonly eventSinks = new Set<EventSink>();
  /** Pauses and resumes under way in this process, by sandbox id; requests wait for them. */
  private readonly transitions = new Map<string, Promise<unknown>>();
  /** When stale owner sessions were last deleted. */
  private ownersCollectedAt = 0;

  constructor(
    readonly store: StateStore,
    readonly auth: Authenticator,
    readonly nodes: NodeRegistry,
    readonly placement: Placement,
  ) {}

  /**
   * Rebuilds node allocations from the stored sandboxes (after a restart). A pause or resume
   * that a crash interrupted is settled by what the node reports.
   */
  async loadAllocations(): Promise<void> {
    const onNodes = new Map<string, string>();
    for (const n of this.nodes.all()) for (const s of n.client.list()) onNodes.set(s.id, s.state);
    for (const row of await this.store.allSandboxes()) {
      if (row.state === PAUSING || row.state === RESUMING) {
        const actual = onNodes.get(row.id) === 'paused' ? 'paused' : 'running';
        await this.store.transitionSandbox(row.id, [row.state], actual, actual === 'running' ? { paused_at: null, pause_reason: null } : {});
        row.state = actual;
      }
      this.nodes.charge(row.node, row.state === 'paused' ? 0 : this.cpuCharge(row), row.memory_mib, 1);
    }
  }

  // ---- events ----

  /** Subscribes to the events the control plane raises; returns the unsubscribe function. */
  onEvent(sink: EventSink): () => void {
    this.eventSinks.add(sink);
    return () => this.eventSinks.delete(sink);
  }

  /** Raises a lifecycle event (owner.lost, lease.exceeded) to every subscriber. Never throws. */
  raise(ev: RaisedEvent): void {
    const full: RaisedEvent = { ...ev, at: ev.at ?? new Date().toISOString() };
    for (const sink of this.eventSinks) {
      try {
        sink(full);
      } catch {
        // A sink's failure is its own.
      }
    }
  }

  private cpuCharge(row: SandboxTable): number {
    const spec = JSON.parse(row.spec) as SandboxSpec;
    return this.placement.cpuCharge({ cpu: row.cpu, cpuClass: spec.resources?.cpuClass ?? 'latency-sensitive' });
  }

  // ---- sandboxes ----

  /** Creates a sandbox: quota, placement, then the node; nothing is left behind on failure. */
  async createSandbox(p: Principal, body: unknown, signal?: AbortSignal): Promise<Sandbox> {
    requireRole(p, 'member');
    const req = parseInput(CreateSandboxRequestSchema, body);
    grantLease(req);
    if (req.owner) await this.liveOwner(p, req.owner, 'owner');
    const backend = req.backend ?? 'container';
    const image: SandboxSpec['image'] = { base: await this.resolveLayer(p.projectId, req.image.base, 'image.base') };
    if (req.image.workspace) image.workspace = await this.resolveLayer(p.projectId, req.image.workspace, 'image.workspace');
    if (req.image.toolkits?.length) {
      image.toolkits = [];
      for (const [i, t] of req.image.toolkits.entries()) image.toolkits.push(await this.resolveLayer(p.projectId, t, `image.toolkits.${i}`));
    }
    const resources: GrantedResources = {
      cpu: req.resources?.cpu ?? DEFAULT_CPU,
      memoryMiB: req.resources?.memoryMiB ?? DEFAULT_MEMORY_MIB,
      diskMiB: req.resources?.diskMiB ?? DEFAULT_DISK_MIB,
      pids: req.resources?.pids ?? DEFAULT_PIDS,
      cpuClass: req.resources?.cpuClass ?? 'latency-sensitive',
    };
    const spec: SandboxSpec = { backend, image, resources: { ...req.resources, ...resources } };
    if (req.env) spec.env = req.env;
    if (req.labels) spec.labels = req.labels;
    const reservation = { sandboxes: 1, cpu: resources.cpu, memoryMiB: resources.memoryMiB };
    await this.store.reserve(p.projectId, reservation);
    const refused = new Set<string>();
    try {
      for (;;) {
        const node = this.placement.place({ backend, cpu: resources.cpu, memoryMiB: resources.memoryMiB, cpuClass: resources.cpuClass }, this.nodes.all(), refused);
        if (!node) throw new DsecError('CAPACITY_EXHAUSTED', `no node has room for this sandbox (${backend}, ${resources.cpu} cpu, ${resources.memoryMiB} MiB)`, { retryAfterMs: 1000 });
        const created = await this.createOn(node as NodeEntry, p.projectId, req, spec, resources, signal);
        if (created) {
          this.counters.sandboxesCreated++;
          return created;
        }
        refused.add(node.name);
      }
    } catch (err) {
      this.counters.sandboxCreateFailures++;
      await this.store.unreserve(p.projectId, reservation);
      throw err;
    }
  }

  /** Creates on one node; undefined when the node refused for want of capacity. */
  private async createOn(node: NodeEntry, projectId: string, req: z.infer<typeof CreateSandboxRequestSchema>, spec: SandboxSpec, resources: GrantedResources, signal?: AbortSignal): Promise<Sandbox | undefined> {
    const id = `${node.name}-${randomBytes(8).toString('hex')}`;
    const createdAt = new Date();
    const lease = grantLease(req);
    const row: SandboxTable = {
      id,
      project_id: projectId,
      node: node.name,
      backend: spec.backend ?? 'container',
      state: 'creating',
      spec: JSON.stringify({ ...req, backend: spec.backend, resources }),
      layers: JSON.stringify([spec.image.base, spec.image.workspace, ...(spec.image.toolkits ?? [])].filter(Boolean)),
      cpu: resources.cpu,
      memory_mib: resources.memoryMiB,
      created_at: createdAt.toISOString(),
      expires_at: new Date(createdAt.getTime() + lease.maxLifetimeMs).toISOString(),
      owner_id: req.owner ?? null,
      lease: JSON.stringify(lease),
      last_active_at: createdAt.toISOString(),
      paused_at: null,
      pause_reason: null,
    };
    const charge = this.placement.cpuCharge(resources);
    this.nodes.charge(node.name, charge, resources.memoryMiB, 1);
    await this.store.insertSandbox(row, req.labels ?? {});
    try {
      await node.client.create(spec, signal ? { id, signal } : { id });
    } catch (err) {
      this.nodes.charge(node.name, charge, resources.memoryMiB, -1);
      await this.store.db.deleteFrom('sandboxes').where('id', '=', id).execute();
      if (err instanceof DsecError && err.code === 'CAPACITY_EXHAUSTED') return undefined;
      throw err;
    }
    row.state = 'running';
    await this.store.transitionSandbox(id, ['creating'], 'running');
    return this.toSandbox({ ...row, labels: req.labels ?? {} });
  }

  /** A sandbox row the principal may see, or SANDBOX_NOT_FOUND. */
  async sandboxRow(p: Principal, id: string): Promise<SandboxRow> {
    const row = typeof id === 'string' && id.length <= 128 ? await this.store.sandbox(id) : undefined;
    if (!row || !p.visibleProjects.has(row.project_id)) throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${id} not found`, { sandboxId: id });
    return row;
  }

  /**
   * The node client of a visible, running sandbox. The request counts as the sandbox's API
   * activity; a paused sandbox is resumed first when its lease says `autoResume` (else 409).
   * With `paused: 'allow'` (stats), a paused sandbox is routed to as it is, and the request is
   * not activity.
   */
  async route(p: Principal, id: string, minRole: 'viewer' | 'member' = 'member', opts: { paused?: 'resume' | 'allow' } = {}): Promise<{ row: SandboxTable; edge: EdgeClient }> {
    requireRole(p, minRole);
    if (typeof id !== 'string' || id.length > 128) throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${String(id)} not found`, { sandboxId: String(id) });
    // Recorded before the read: an idle pause that claims the row after this read sees it.
    // Reading stats (host-side, `paused: 'allow'`) is not activity: monitoring never keeps a sandbox awake.
    const touched = opts.paused === 'allow' ? undefined : this.activity.touch(id);
    // The hot path (every exec and file operation): one indexed read, no labels.
    let row = await this.store.sandboxOnly(id);
    if (!row || !p.visibleProjects.has(row.project_id)) {
      if (touched !== undefined) this.activity.forget(id, touched);
      throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${id} not found`, { sandboxId: id });
    }
    const node = this.nodes.get(row.node);
    if (!node) throw new DsecError('UNAVAILABLE', `node ${row.node} of sandbox ${id} is not reachable`, { sandboxId: id });
    if (row.state !== 'running' && !(opts.paused === 'allow' && [PAUSING, 'paused', RESUMING].includes(row.state))) row = await this.runningRow(row);
    return { row, edge: node.client };
  }

  /** A sandbox's row once it runs: waits for a pause or resume under way, resumes if its lease allows. */
  private async runningRow(start: SandboxTable): Promise<SandboxTable> {
    let row: SandboxTable | undefined = start;
    for (let attempt = 0; attempt < 3 && row; attempt++) {
      const pending = this.transitions.get(row.id);
      if (pending) {
        await pending.catch(() => undefined);
      } else if (row.state === 'running') {
        return row;
      } else if (row.state === 'paused' && leaseOf(row).autoResume) {
        await this.resumeRow(row, 'request');
      } else if (row.state === 'paused') {
        throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${row.id} is paused and its lease does not resume it on requests; resume it first`, { sandboxId: row.id, state: 'paused' });
      } else if (row.state === PAUSING || row.state === RESUMING) {
        throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${row.id} is being ${row.state === PAUSING ? 'paused' : 'resumed'}; retry`, { sandboxId: row.id, retryAfterMs: 200 });
      } else {
        throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${row.id} is ${row.state}`, { sandboxId: row.id, state: row.state });
      }
      row = await this.store.sandboxOnly(row.id);
    }
    if (!row) throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${start.id} not found`, { sandboxId: start.id });
    if (row.state !== 'running') throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${row.id} is ${row.state}; retry`, { sandboxId: row.id, retryAfterMs: 200 });
    return row;
  }

  // ---- pause, resume, leases ----

  /** Runs a pause or resume of one sandbox as this process's only transition of it. */
  private async exclusive<T>(id: string, fn: () => Promise<T>): Promise<T> {
    for (let pending = this.transitions.get(id); pending; pending = this.transitions.get(id)) await pending.catch(() => undefined);
    const run = fn();
    this.transitions.set(id, run);
    try {
      return await run;
    } finally {
      if (this.transitions.get(id) === run) this.transitions.delete(id);
    }
  }

  /**
   * Pauses a sandbox on its node (freeze, reclaim) and gives its CPU back to the node. With
   * `stillDue`, the pause is dropped (undefined) when it returns false once the row is
   * claimed: a request that came in meanwhile keeps an idle sandbox running.
   */
  async pauseRow(row: SandboxTable, reason: PauseReason, stillDue?: () => boolean): Promise<PauseResult | undefined> {
    return this.exclusive(row.id, async () => {
      if (!(await this.store.transitionSandbox(row.id, ['running'], PAUSING))) {
        const now = await this.store.sandboxOnly(row.id);
        if (!now) throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${row.id} not found`, { sandboxId: row.id });
        if (now.state === 'paused') return this.pauseReply(now, { durationMs: 0, memoryBeforeBytes: 0, memoryAfterBytes: 0, swapBytes: 0 });
        throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${row.id} is ${now.state}`, { sandboxId: row.id, state: now.state, retryAfterMs: 1000 });
      }
      const node = this.nodes.get(row.node);
      if (!node || (stillDue && !stillDue())) {
        await this.store.transitionSandbox(row.id, [PAUSING], 'running');
        if (!node) throw new DsecError('UNAVAILABLE', `node ${row.node} of sandbox ${row.id} is not reachable`, { sandboxId: row.id });
        return undefined;
      }
      let result: Omit<PauseResult, 'sandbox'>;
      try {
        result = await node.client.pause(row.id, { reason });
      } catch (err) {
        await this.store.transitionSandbox(row.id, [PAUSING], 'running');
        throw err;
      }
      await this.store.transitionSandbox(row.id, [PAUSING], 'paused', { paused_at: new Date().toISOString(), pause_reason: reason });
      this.nodes.chargeCpu(row.node, this.cpuCharge(row), -1);
      this.counters.sandboxesPaused++;
      return this.pauseReply(row, result);
    });
  }

  /** Resumes a paused sandbox on its node and charges its CPU to the node again. */
  async resumeRow(row: SandboxTable, reason: string, opts: { prefetch?: boolean } = {}): Promise<PauseResult> {
    return this.exclusive(row.id, async () => {
      if (!(await this.store.transitionSandbox(row.id, ['paused'], RESUMING))) {
        const now = await this.store.sandboxOnly(row.id);
        if (!now) throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${row.id} not found`, { sandboxId: row.id });
        if (now.state === 'running') return this.pauseReply(now, { durationMs: 0, memoryBeforeBytes: 0, memoryAfterBytes: 0, swapBytes: 0 });
        throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${row.id} is ${now.state}`, { sandboxId: row.id, state: now.state, retryAfterMs: 1000 });
      }
      const node = this.nodes.get(row.node);
      let result: Omit<PauseResult, 'sandbox'>;
      try {
        if (!node) throw new DsecError('UNAVAILABLE', `node ${row.node} of sandbox ${row.id} is not reachable`, { sandboxId: row.id });
        result = await node.client.resume(row.id, { reason, ...(opts.prefetch === false ? { prefetch: false } : {}) });
      } catch (err) {
        await this.store.transitionSandbox(row.id, [RESUMING], 'paused');
        throw err;
      }
      // A sandbox whose owner went away is no longer held by that owner once someone resumes it.
      const current = await this.store.sandboxOnly(row.id);
      const ownerGone = current?.owner_id ? !(await this.ownerIsActive(current.owner_id)) : false;
      await this.store.transitionSandbox(row.id, [RESUMING], 'running', { paused_at: null, pause_reason: null, ...(ownerGone ? { owner_id: null } : {}) });
      this.activity.touch(row.id);
      this.nodes.chargeCpu(row.node, this.cpuCharge(row), 1);
      this.counters.sandboxesResumed++;
      return this.pauseReply(row, result);
    });
  }

  private async pauseReply(row: SandboxTable, r: Omit<PauseResult, 'sandbox'>): Promise<PauseResult> {
    const now = await this.store.sandbox(row.id);
    if (!now) throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${row.id} not found`, { sandboxId: row.id });
    return { sandbox: this.toSandbox(now), durationMs: r.durationMs, memoryBeforeBytes: r.memoryBeforeBytes, memoryAfterBytes: r.memoryAfterBytes, swapBytes: r.swapBytes };
  }

  private async ownerIsActive(id: string): Promise<boolean> {
    return (await this.store.owner(id))?.state === 'active';
  }

  /** POST /v1/sandboxes/{id}/pause */
  async pauseSandbox(p: Principal, id: string): Promise<PauseResult> {
    requireRole(p, 'member');
    const row = await this.sandboxRow(p, id);
    return (await this.pauseRow(row, 'api')) as PauseResult;
  }

  /** POST /v1/sandboxes/{id}/resume */
  async resumeSandbox(p: Principal, id: string, body: unknown): Promise<PauseResult> {
    requireRole(p, 'member');
    const req = parseInput(ResumeRequestSchema, body);
    const row = await this.sandboxRow(p, id);
    this.activity.touch(row.id);
    return this.resumeRow(row, 'api', req.prefetch === false ? { prefetch: false } : {});
  }

  /**
   * PATCH /v1/sandboxes/{id}: changes the lease (fields given replace the granted ones; a new
   * maxLifetimeMs counts from creation) or the owner. A new owner taking over a sandbox that
   * was paused because its old owner went away resumes it.
   */
  async updateSandbox(p: Principal, id: string, body: unknown): Promise<Sandbox> {
    requireRole(p, 'member');
    const req = parseInput(UpdateSandboxRequestSchema, body);
    const row = await this.sandboxRow(p, id);
    const set: Parameters<StateStore['updateSandbox']>[1] = {};
    if (req.lease) {
      const lease = mergeLease(leaseOf(row), req.lease);
      set.lease = JSON.stringify(lease);
      set.expires_at = new Date(Date.parse(row.created_at) + lease.maxLifetimeMs).toISOString();
    }
    if (req.owner !== undefined) {
      if (req.owner !== null) await this.liveOwner(p, req.owner, 'owner');
      set.owner_id = req.owner;
    }
    await this.store.updateSandbox(row.id, set);
    if (req.owner && row.state === 'paused' && OWNER_GONE_REASONS.includes(row.pause_reason ?? '')) await this.resumeRow(row, 'owner-reattached');
    return this.getSandbox(p, row.id);
  }

  /**
   * One watcher pass over leases: owners past their grace are lost (owner.lost); running
   * sandboxes whose owner is gone (past the sandbox's grace, or closed) and idle ones get their
   * lease's action (pause or kill, lease.exceeded first). Errors are logged per sandbox.
   */
  async enforceLeases(log: (line: string) => void = () => undefined, now = Date.now()): Promise<void> {
    for (const o of await this.store.expiredOwners(now)) {
      if (!(await this.store.transitionOwner(o.id, ['active'], 'lost'))) continue;
      const count = await this.store.ownedCount(o.id);
      this.raise({ kind: 'owner.lost', severity: 'warning', message: `owner ${o.id}${o.name ? ` (${o.name})` : ''} sent no heartbeat for ${o.grace_ms} ms; it holds ${count} sandboxes`, data: { owner: o.id, project: o.project_id, graceMs: o.grace_ms, heartbeatAt: o.heartbeat_at, sandboxes: count } });
    }
    if (now - this.ownersCollectedAt >= 60_000) {
      this.ownersCollectedAt = now;
      await this.store.deleteStaleOwners(new Date(now - STALE_OWNER_MS).toISOString());
    }
    const rows = await this.store.sandboxesInStates(['running']);
    const ownerIds = [...new Set(rows.map((r) => r.owner_id).filter((o): o is string => !!o))];
    const owners = new Map((await this.store.ownersByIds(ownerIds)).map((o) => [o.id, o]));
    for (const row of rows) {
      const lease = leaseOf(row);
      const owner = row.owner_id ? owners.get(row.owner_id) : undefined;
      const ownerDue = row.owner_id ? ownerDeadline(owner, lease) <= now : false;
      const idleFor = now - this.activity.lastActiveOf(row, now);
      const idleDue = lease.idleTimeoutMs > 0 && idleFor >= lease.idleTimeoutMs;
      if (!ownerDue && !idleDue) continue;
      const [which, action, reason]: [string, GrantedLease['onIdle'], PauseReason] = ownerDue
        ? ['ownerGraceMs', lease.onOwnerLost, owner?.state === 'closed' || !owner ? 'owner-closed' : 'owner-lost']
        : ['idleTimeoutMs', lease.onIdle, 'idle'];
      try {
        if (action === 'kill') {
          this.raiseLeaseExceeded(row, which, action, ownerDue ? `owner ${row.owner_id} is gone` : `idle for ${idleFor} ms`);
          await this.destroyRow(row);
        } else {
          // Idle: a request that arrived since the decision keeps the sandbox running.
          const stillDue = (): boolean => ownerDue || now - this.activity.lastActiveOf(row) >= lease.idleTimeoutMs;
          const paused = await this.pauseRow(row, reason, stillDue);
          if (paused) this.raiseLeaseExceeded(row, which, action, ownerDue ? `owner ${row.owner_id} is gone` : `idle for ${idleFor} ms`);
        }
      } catch (err) {
        log(`leases: ${action} of ${row.id} (${which}) failed: ${(err as Error).message}`);
      }
    }
  }

  private raiseLeaseExceeded(row: SandboxTable, lease: string, action: string, why: string): void {
    this.raise({ kind: 'lease.exceeded', severity: 'info', sandboxId: row.id, node: row.node, message: `sandbox ${row.id}: ${lease} exceeded (${why}); ${action}`, data: { lease, action, project: row.project_id } });
  }

  /** Destroys a sandbox whose maximum lifetime has passed (the watcher's expiry pass). */
  async expireRow(row: SandboxTable): Promise<void> {
    this.raiseLeaseExceeded(row, 'maxLifetimeMs', 'kill', `lifetime ended at ${row.expires_at}`);
    await this.destroyRow(row);
    this.counters.sandboxesExpired++;
  }

  /** Writes recorded API activity to the store. */
  async flushActivity(): Promise<void> {
    await this.activity.flush(this.store);
  }

  // ---- owners ----

  /** An owner the principal may use: visible, and neither lost nor closed. */
  private async liveOwner(p: Principal, id: string, field: string): Promise<OwnerTable> {
    const owner = await this.ownerRow(p, id, field);
    if (owner.state !== 'active') throw new DsecError('CONFLICT', `${field}: owner ${id} is ${owner.state}`, { field });
    return owner;
  }

  private async ownerRow(p: Principal, id: string, field = 'id'): Promise<OwnerTable> {
    const row = OwnerIdSchema.safeParse(id).success ? await this.store.owner(id) : undefined;
    if (!row || !p.visibleProjects.has(row.project_id)) throw new DsecError('NOT_FOUND', `owner ${id} not found`, { field });
    return row;
  }

  /** POST /v1/owners: opens an owner session in the caller's project. */
  async createOwner(p: Principal, body: unknown): Promise<Owner> {
    requireRole(p, 'member');
    const req = parseInput(CreateOwnerRequestSchema, body);
    if ((await this.store.activeOwnerCount(p.projectId)) >= MAX_OWNERS_PER_PROJECT) {
      throw new DsecError('QUOTA_EXCEEDED', `project ${p.projectId} has ${MAX_OWNERS_PER_PROJECT} active owner sessions; close some`, { retryAfterMs: 1000 });
    }
    const now = new Date().toISOString();
    const row: OwnerTable = { id: newId('own'), project_id: p.projectId, name: req.name ?? null, grace_ms: req.graceMs ?? DEFAULT_OWNER_GRACE_MS, state: 'active', created_at: now, heartbeat_at: now, closed_at: null };
    await this.store.insertOwner(row);
    return toOwner(row, 0);
  }

  /** GET /v1/owners/{id} */
  async getOwner(p: Principal, id: string): Promise<Owner> {
    requireRole(p, 'viewer');
    const row = await this.ownerRow(p, id);
    return toOwner(row, await this.store.ownedCount(row.id));
  }

  /**
   * POST /v1/owners/{id}/heartbeat. An owner that was lost is active again, and its sandboxes
   * that were paused because it was lost are resumed.
   */
  async heartbeatOwner(p: Principal, id: string): Promise<Owner> {
    requireRole(p, 'member');
    const before = await this.ownerRow(p, id);
    if (before.state === 'closed') throw new DsecError('CONFLICT', `owner ${id} is closed`, { field: 'id' });
    const row = await this.store.heartbeatOwner(id, new Date().toISOString());
    if (!row) throw new DsecError('CONFLICT', `owner ${id} is closed`, { field: 'id' });
    if (before.state === 'lost') {
      for (const s of await this.store.sandboxesOfOwner(id)) {
        if (s.state === 'paused' && s.pause_reason === 'owner-lost') await this.resumeRow(s, 'owner-returned').catch(() => undefined);
      }
    }
    return toOwner(row, await this.store.ownedCount(id));
  }

  /**
   * DELETE /v1/owners/{id}: the owner is gone now rather than after its grace. Its sandboxes
   * get their `onOwnerLost` action on the watcher's next pass (pause by default: a client
   * that closes and later comes back finds them).
   */
  async closeOwner(p: Principal, id: string): Promise<void> {
    requireRole(p, 'member');
    await this.ownerRow(p, id);
    await this.store.transitionOwner(id, ['active', 'lost'], 'closed', new Date().toISOString());
  }

  async getSandbox(p: Principal, id: string): Promise<Sandbox> {
    return this.toSandbox(await this.sandboxRow(p, id));
  }

  async listSandboxes(p: Principal, query: unknown): Promise<{ items: Sandbox[]; nextCursor: string | null }> {
    const q = parseInput(ListSandboxesQuerySchema, query, 'query');
    const limit = q.limit ?? DEFAULT_PAGE_SIZE;
    const labels = (q.label ?? []).map((l) => {
      const i = l.indexOf('=');
      return [l.slice(0, i), l.slice(i + 1)] as [string, string];
    });
    let after: string | undefined;
    if (q.cursor) {
      after = Buffer.from(q.cursor, 'base64url').toString('utf8');
      if (!/^[a-z0-9-]{1,128}$/.test(after)) throw invalidArgument('query.cursor', 'not a cursor from this API');
    }
    const rows = await this.store.listSandboxes({ projectIds: [...p.visibleProjects], labels, ...(q.state ? { state: q.state } : {}), limit: limit + 1, ...(after ? { after } : {}) });
    const page = rows.slice(0, limit);
    const last = page[page.length - 1];
    return { items: page.map((r) => this.toSandbox(r)), nextCursor: rows.length > limit && last ? Buffer.from(last.id).toString('base64url') : null };
  }

  /** Destroys a sandbox on its node and forgets it. */
  async deleteSandbox(p: Principal, id: string): Promise<void> {
    requireRole(p, 'member');
    const row = await this.sandboxRow(p, id);
    await this.destroyRow(row);
  }

  /** Destroys a sandbox by its row (the watcher uses this for expiry and orphans). */
  async destroyRow(row: SandboxTable): Promise<void> {
    // A pause or resume under way here finishes first.
    await this.transitions.get(row.id)?.catch(() => undefined);
    // Claim the row first: one destroyer per sandbox, and never one that is still being
    // created (its quota and node charge belong to the create until it finishes).
    const from = (await this.store.sandboxOnly(row.id))?.state;
    if (!from || !DESTROYABLE_STATES.includes(from) || !(await this.store.transitionSandbox(row.id, [from], 'stopping'))) {
      const now = await this.store.sandbox(row.id);
      if (!now) throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${row.id} not found`, { sandboxId: row.id });
      throw new DsecError('CONFLICT', `sandbox ${row.id} is ${now.state}; retry when it is running`, { sandboxId: row.id, retryAfterMs: 1000 });
    }
    const node = this.nodes.get(row.node);
    if (node) {
      try {
        await node.client.destroy(row.id);
      } catch (err) {
        if (!(err instanceof DsecError && err.code === 'SANDBOX_NOT_FOUND')) {
          await this.store.setSandboxState(row.id, 'failed');
          throw err;
        }
      }
      // A paused sandbox already gave its CPU back.
      this.nodes.charge(row.node, from === 'paused' ? 0 : this.cpuCharge(row), row.memory_mib, -1);
    }
    await this.store.deleteSandbox(row);
    this.activity.forget(row.id);
    this.counters.sandboxesDestroyed++;
  }

  toSandbox(row: SandboxRow): Sandbox {
    const spec = JSON.parse(row.spec) as z.infer<typeof CreateSandboxRequestSchema> & { resources: GrantedResources };
    // A pause or resume under way shows as the state it leaves.
    const state = row.state === PAUSING ? 'running' : row.state === RESUMING ? 'paused' : row.state;
    return {
      id: row.id,
      project: row.project_id,
      node: row.node,
      backend: row.backend as Sandbox['backend'],
      state: state as Sandbox['state'],
      image: spec.image,
      layers: JSON.parse(row.layers) as string[],
      resources: spec.resources,
      labels: row.labels,
      envKeys: Object.keys(spec.env ?? {}),
      createdAt: row.created_at,
      expiresAt: row.expires_at,
      lease: leaseOf(row),
      owner: row.owner_id ?? null,
      lastActiveAt: new Date(this.activity.lastActiveOf(row)).toISOString(),
      pausedAt: row.paused_at ?? null,
      pauseReason: row.pause_reason ?? null,
    };
  }

  // ---- layers ----

  /** Projects whose layers a project may use: itself, its ancestors, then the public ones. */
  private async layerScope(projectId: string): Promise<string[]> {
    return [...(await this.store.ancestry(projectId)), PUBLIC_PROJECT_ID];
  }

  /** Resolves a layer reference for a project to a `sha256:` digest. */
  async resolveLayer(projectId: string, ref: string, field: string): Promise<string> {
    const scope = await this.layerScope(projectId);
    const rows = await this.store.layers(scope);
    let match: LayerTable | undefined;
    if (DIGEST_RE.test(ref)) {
      const digest = ref.startsWith('sha256:') ? ref : `sha256:${ref}`;
      match = rows.find((r) => r.digest === digest);
    } else {
      const name = layerName(ref);
      const named = rows.filter((r) => r.name === name);
      match = scope.map((s) => named.find((r) => r.project_id === s)).find(Boolean);
    }
    if (!match) throw new DsecError('LAYER_NOT_FOUND', `${field}: layer ${ref} not found`, { field, layer: ref });
    return match.digest;
  }

  /** Records a layer built on the nodes as owned by a project (public for built-ins). */
  async registerLayer(projectId: string, info: LayerInfo, name: string | null): Promise<Layer> {
    const row = await this.store.addLayer({ projectId, digest: info.digest, kind: info.kind, name: name === null ? null : layerName(name) });
    return this.toLayer(row, info);
  }

  private toLayer(row: LayerTable, info?: LayerInfo): Layer {
    return {
      digest: row.digest,
      kind: row.kind as LayerKind,
      names: row.name ? [row.name] : [],
      project: row.project_id,
      contentBytes: info?.contentBytes ?? 0,
      files: info?.files ?? 0,
      createdAt: row.created_at,
    };
  }

  /** Layers a principal can see. */
  async listLayers(p: Principal, kind?: LayerKind): Promise<Layer[]> {
    const rows = await this.store.layers([...p.visibleProjects, ...(await this.store.ancestry(p.projectId)), PUBLIC_PROJECT_ID]);
    const out: Layer[] = [];
    const edge = this.anyEdge();
    for (const row of rows) {
      if (kind && row.kind !== kind) continue;
      const info = await edge.layers.resolve(row.digest).catch(() => undefined);
      out.push(this.toLayer(row, info));
    }
    return out;
  }

  /** One layer a principal can see. */
  async getLayer(p: Principal, ref: string): Promise<Layer> {
    const digest = await this.resolveLayer(p.projectId, ref, 'ref');
    const rows = (await this.store.layerRowsForDigest(digest)).filter((r) => r.project_id === PUBLIC_PROJECT_ID || p.visibleProjects.has(r.project_id) || r.project_id === p.projectId);
    const info = await this.anyEdge().layers.resolve(digest).catch(() => undefined);
    const row = rows[0];
    if (!row) throw new DsecError('LAYER_NOT_FOUND', `layer ${ref} not found`, { layer: ref });
    return { ...this.toLayer(row, info), names: rows.map((r) => r.name).filter((n): n is string => n !== null) };
  }

  /** Drops a project's reference to a layer; the bytes go when nothing else refers to them. */
  async deleteLayer(p: Principal, ref: string): Promise<void> {
    requireRole(p, 'member');
    const digest = await this.resolveLayer(p.projectId, ref, 'ref');
    const all = await this.store.layerRowsForDigest(digest);
    const mine = all.filter((r) => p.visibleProjects.has(r.project_id) && (DIGEST_RE.test(ref) || r.name === layerName(ref)));
    if (mine.length === 0) throw new DsecError('PERMISSION_DENIED', `layer ${ref} is not owned by this project`, { layer: ref });
    if (mine.length === all.length && (await this.store.layerDigestInUse(digest))) {
      throw new DsecError('CONFLICT', `layer ${ref} is used by a sandbox`, { layer: ref });
    }
    await this.store.removeLayerRows(mine.map((r) => r.id));
    if (mine.length === all.length) {
      for (const n of this.nodes.all()) await n.client.layers.remove(digest).catch(() => undefined);
    }
  }

  // ---- function calls ----

  /** Runs one stateless call on a healthy node (counts against nothing but the key's rate limit). */
  async runCall(p: Principal, body: unknown, signal?: AbortSignal): Promise<CallResult> {
    requireRole(p, 'member');
    const spec = await this.resolveCall(p, parseInput(CallRequestSchema, body), '');
    return this.callNode().calls.run(spec, signal ? { signal } : {});
  }

  /** Runs up to 1,000 calls; results come back in request order. */
  async runCalls(p: Principal, body: unknown, signal?: AbortSignal): Promise<CallBatchResult> {
    requireRole(p, 'member');
    const { calls } = parseInput(CallBatchRequestSchema, body);
    const resolved: CallRequest[] = [];
    for (const [i, c] of calls.entries()) resolved.push(await this.resolveCall(p, c, `calls.${i}.`));
    const reply = await this.callNode().calls.runBatch({ calls: resolved }, signal ? { signal } : {});
    return { results: reply.results as CallBatchItem[] };
  }

  /** A call with its image's layer references resolved to digests in the caller's project. */
  private async resolveCall(p: Principal, spec: CallRequest, prefix: string): Promise<CallRequest> {
    if (!spec.image) return spec;
    const image: NonNullable<CallRequest['image']> = { base: await this.resolveLayer(p.projectId, spec.image.base, `${prefix}image.base`) };
    if (spec.image.workspace) image.workspace = await this.resolveLayer(p.projectId, spec.image.workspace, `${prefix}image.workspace`);
    if (spec.image.toolkits?.length) {
      image.toolkits = [];
      for (const [i, t] of spec.image.toolkits.entries()) image.toolkits.push(await this.resolveLayer(p.projectId, t, `${prefix}image.toolkits.${i}`));
    }
    return { ...spec, image };
  }

  /** A healthy node for a call: calls hold no state, so any node will do. */
  private callNode(): EdgeClient {
    const healthy = this.nodes.all().filter((n) => n.healthy);
    const n = healthy[Math.floor(Math.random() * healthy.length)];
    if (!n) throw new DsecError('CAPACITY_EXHAUSTED', 'no healthy node can run calls', { retryAfterMs: 1000 });
    return n.client;
  }

  /** An edge that holds layers (every node builds the same layers in this single-node form). */
  anyEdge(): EdgeClient {
    const n = this.nodes.all()[0];
    if (!n) throw new DsecError('UNAVAILABLE', 'no node is registered');
    return n.client;
  }

  // ---- projects and keys ----

  private toProject(r: ProjectTable): Project {
    return {
      id: r.id,
      name: r.name,
      parent: r.parent_id,
      quota: { sandboxes: r.quota_sandboxes, cpu: r.quota_cpu, memoryMiB: r.quota_memory_mib },
      usage: { sandboxes: r.used_sandboxes, cpu: r.used_cpu, memoryMiB: r.used_memory_mib },
      createdAt: r.created_at,
    };
  }

  async createProject(p: Principal, body: unknown): Promise<Project> {
    requireRole(p, 'admin');
    const req = parseInput(CreateProjectRequestSchema, body);
    const parentId = req.parent ?? p.projectId;
    if (!p.visibleProjects.has(parentId)) throw new DsecError('NOT_FOUND', `project ${parentId} not found`, { field: 'parent' });
    const parent = await this.store.project(parentId);
    if (!parent) throw new DsecError('NOT_FOUND', `project ${parentId} not found`, { field: 'parent' });
    const cap: Quota = { sandboxes: parent.quota_sandboxes, cpu: parent.quota_cpu, memoryMiB: parent.quota_memory_mib };
    const quota: Quota = {
      sandboxes: req.quota?.sandboxes ?? cap.sandboxes,
      cpu: req.quota?.cpu ?? cap.cpu,
      memoryMiB: req.quota?.memoryMiB ?? cap.memoryMiB,
    };
    for (const k of ['sandboxes', 'cpu', 'memoryMiB'] as const) {
      if (quota[k] > cap[k]) throw new DsecError('PERMISSION_DENIED', `quota.${k}: ${quota[k]} exceeds the parent's ${cap[k]}`, { field: `quota.${k}` });
    }
    const row = await this.store.createProject({ name: req.name, parentId, quota });
    this.auth.invalidate();
    return this.toProject(row);
  }

  async listProjects(p: Principal): Promise<Project[]> {
    return (await this.store.projects()).filter((r) => p.visibleProjects.has(r.id)).map((r) => this.toProject(r));
  }

  async getProject(p: Principal, id: string): Promise<Project> {
    const row = p.visibleProjects.has(id) ? await this.store.project(id) : undefined;
    if (!row) throw new DsecError('NOT_FOUND', `project ${id} not found`);
    return this.toProject(row);
  }

  private toKey(r: ApiKeyTable, secret?: string): ApiKey {
    const k: ApiKey = { id: r.id, name: r.name, role: r.role, project: r.project_id, createdAt: r.created_at, revokedAt: r.revoked_at };
    if (secret) k.key = secret;
    return k;
  }

  /** Creates a key in the caller's project (or a descendant) with a role no stronger than its own. */
  async createKey(p: Principal, body: unknown): Promise<ApiKey> {
    requireRole(p, 'admin');
    const req = parseInput(CreateKeyRequestSchema, body);
    const project = req.project ?? p.projectId;
    if (!p.visibleProjects.has(project)) throw new DsecError('NOT_FOUND', `project ${project} not found`, { field: 'project' });
    if (!roleAtLeast(p.role, req.role)) throw new DsecError('PERMISSION_DENIED', `role: cannot grant ${req.role} with a ${p.role} key`, { field: 'role' });
    return this.issueKey(project, req.name, req.role);
  }

  /** Creates a key without a caller (the first admin key). */
  async issueKey(projectId: string, name: string, role: ApiKey['role']): Promise<ApiKey> {
    const { secret, hash } = newKeySecret();
    const row = await this.store.createKey({ projectId, name, role, keyHash: hash });
    return this.toKey(row, secret);
  }

  async listKeys(p: Principal): Promise<ApiKey[]> {
    requireRole(p, 'admin');
    return (await this.store.keys([...p.visibleProjects])).map((r) => this.toKey(r));
  }

  async revokeKey(p: Principal, id: string): Promise<void> {
    requireRole(p, 'admin');
    const row = await this.store.key(id);
    if (!row || !p.visibleProjects.has(row.project_id)) throw new DsecError('NOT_FOUND', `key ${id} not found`);
    await this.store.revokeKey(id);
    this.auth.invalidate();
  }

  // ---- nodes ----

  listNodes(p: Principal): NodeBody[] {
    requireRole(p, 'viewer');
    return this.nodes.all().map((n) => ({
      name: n.name,
      healthy: n.healthy,
      backends: [...n.backends],
      capacity: { ...n.capacity },
      allocatable: this.placement.allocatable(n),
      allocated: { ...n.allocated },
    }));
  }

  /** The root project's id. */
  get rootProjectId(): string {
    return ROOT_PROJECT_ID;
  }
}
