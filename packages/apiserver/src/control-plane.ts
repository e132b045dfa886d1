// The control plane's logic, apart from HTTP: sandboxes (quota, placement, routing to their
// node), layers owned by projects, projects and keys.
import { randomBytes } from 'node:crypto';
import {
  CreateSandboxBatchRequestSchema,
  DEFAULT_POOL_IDLE_TIMEOUT_MS,
  IDEMPOTENCY_KEY_HEADER,
  IdempotencyKeySchema,
  MAX_POOLS_PER_PROJECT,
  MAX_SANDBOX_TIMEOUT_MS,
  PoolNameSchema,
  PutPoolRequestSchema,
  SandboxRequestSchema,
  CallBatchRequestSchema,
  CallRequestSchema,
  CreateKeyRequestSchema,
  CreateOwnerRequestSchema,
  CreateProjectRequestSchema,
  ApplyNetworkRequestSchema,
  NetworkPolicyPatchSchema,
  NetworkPolicySchema,
  applyNetworkPatch,
  normalizeNetworkPolicy,
  withDeniedNames,
  CreateSandboxRequestSchema,
  DEFAULT_OWNER_GRACE_MS,
  DEFAULT_NETWORK_LOG_LIMIT,
  DEFAULT_NETWORK_POLICY,
  MAX_NETWORK_APPLY_SANDBOXES,
  NetworkLogQuerySchema,
  DEFAULT_CPU,
  DEFAULT_DISK_MIB,
  DEFAULT_MEMORY_MIB,
  DEFAULT_PAGE_SIZE,
  DEFAULT_PIDS,
  DsecError,
  ForkRequestSchema,
  ListSandboxesQuerySchema,
  MAX_PAGE_SIZE,
  OwnerIdSchema,
  ResumeRequestSchema,
  UpdateSandboxRequestSchema,
  MAX_SNAPSHOT_DEPTH,
  ReplayRequestSchema,
  SandboxStateSchema,
  SnapshotRequestSchema,
  TrajectoryQuerySchema,
  invalidArgument,
} from '@dsec/protocol';
import type {
  Admission,
  ApiKey,
  BackendKind,
  BatchItemResult,
  CallBatchItem,
  CallBatchResult,
  CallRequest,
  CallResult,
  ApplyNetworkResult,
  CreateSandboxBatchResult,
  EgressLogEntryBody,
  EventSink,
  ForkResult,
  GrantedLease,
  GrantedResources,
  ImageSpec,
  ItemError,
  Layer,
  NetworkPolicy,
  LayerInfo,
  LayerKind,
  NodeBody,
  Owner,
  PauseResult,
  Pool,
  Project,
  Quota,
  ReplayEvent,
  ReplayResult,
  ReplayStep,
  Sandbox,
  SandboxNetwork,
  SandboxRequest,
  SandboxSpec,
  Trajectory,
  TrajectoryStep,
} from '@dsec/protocol';
import { normalizeLayerName } from '@dsec/edge';
import type { z } from 'zod';
import { AdmissionQueue } from './admission.js';
import type { Admitted } from './admission.js';
import { newKeySecret, requireRole, roleAtLeast } from './auth.js';
import type { Authenticator, Principal } from './auth.js';
import type { ApiKeyTable, IdempotencyKeyTable, LayerTable, OwnerTable, PoolTable, ProjectTable, SandboxTable, SnapshotTable } from './db/schema.js';
import { newId, PUBLIC_PROJECT_ID, ROOT_PROJECT_ID } from './db/store.js';
import type { Reservation, StateStore } from './db/store.js';
import { IdempotencyKeys, hashOf } from './idempotency.js';
import { ActivityTracker, grantLease, leaseOf, mergeLease, toOwner } from './leases.js';
import type { PauseReason } from './leases.js';
import type { EdgeClient, NodeEntry, NodeRegistry } from './nodes.js';
import { POOLED_STATE, PoolManager, poolIsIdle } from './pools.js';
import type { PoolHost } from './pools.js';
import type { Placement, PlacementRequest } from './scheduler.js';
import { replayStep, summarize } from './replay.js';
import { TrajectoryLog } from './trajectory.js';
import type { TrajectoryHeader, TrajectoryOptions, TrajectorySpec } from './trajectory.js';

/** Creates a fork runs at once. */
const FORK_CONCURRENCY = 4;
/** Most bytes of steps one trajectory page carries (at least one step is always sent). */
const MAX_TRAJECTORY_PAGE_BYTES = 8 * 1024 * 1024;

/** Parses `value` with a schema; the first issue becomes a 400 naming its field. */
export function parseInput<T>(schema: z.ZodType<T>, value: unknown, prefix = ''): T {
  const res = schema.safeParse(value);
  if (res.success) return res.data;
  const issue = res.error.issues[0];
  const field = [prefix, ...(issue?.path ?? []).map(String)].filter(Boolean).join('.');
  throw invalidArgument(field || prefix || 'body', issue?.message ?? 'invalid');
}

const DIGEST_RE = /^(sha256:)?[0-9a-f]{64}$/;
/** Sandboxes whose policy `network:apply` changes at once. */
const NETWORK_APPLY_CONCURRENCY = 8;
/** States from which a sandbox may be destroyed. */
const DESTROYABLE_STATES = ['running', 'paused', 'failed', 'lost', POOLED_STATE];
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
/** Creates of one batch that run at once (the node's cores, not the batch size, set the pace). */
export const DEFAULT_BATCH_CONCURRENCY = 16;
/** Fields of a create request a pool claim applies; every other field must match the pool's spec. */
const CLAIM_FIELDS = ['env', 'labels', 'timeoutMs', 'lease', 'owner'] as const;

/** A create request, validated and resolved: what the create pipeline works on. */
interface CreateItem {
  /** The request as given (no admission option). */
  req: SandboxRequest;
  /** What edge creates: layers as digests, resources granted, env and labels. */
  spec: SandboxSpec;
  resources: GrantedResources;
  backend: BackendKind;
  /** The lease granted (defaults filled in); a claimed pool member gets it too. */
  lease: GrantedLease;
  /** Hash of what the sandbox is, less what a claim applies: pools match on it. */
  poolKey: string;
  /** Hash of the whole request: idempotency keys match on it. */
  requestHash: string;
}

/** Capacity held for one create: its quota reservation and a charge on its node. */
interface Ticket extends Admitted {
  node: NodeEntry;
  reservation: Reservation;
}

/** Options of {@link ControlPlane.createSandbox}. */
export interface CreateSandboxOptions {
  /** The `Idempotency-Key` header. */
  idempotencyKey?: string | undefined;
  /** Called when the reply is a replay of an earlier request with the same key. */
  onReplay?: () => void;
}

/** Options of {@link ControlPlane.createSandboxes}. */
export interface CreateBatchOptions {
  signal?: AbortSignal | undefined;
  /** The batch's `Idempotency-Key`: item i is created under `<key>#<i>`. */
  idempotencyKey?: string | undefined;
  /** Called with each item as it finishes (in completion order). */
  onItem?: (item: BatchItemResult) => void;
  /** Creates that run at once; default {@link DEFAULT_BATCH_CONCURRENCY}. */
  concurrency?: number;
  /** Called once the batch as a whole is accepted (before any item is created). */
  onStart?: () => void;
}

/** The header's name, used as the field of its errors. */
const IDEMPOTENCY_FIELD = IDEMPOTENCY_KEY_HEADER;

function reservationOf(item: CreateItem): Reservation {
  return { sandboxes: 1, cpu: item.resources.cpu, memoryMiB: item.resources.memoryMiB };
}

function placementOf(item: CreateItem): PlacementRequest {
  return { backend: item.backend, cpu: item.resources.cpu, memoryMiB: item.resources.memoryMiB, cpuClass: item.resources.cpuClass };
}

function capacityError(item: CreateItem): DsecError {
  const r = item.resources;
  return new DsecError('CAPACITY_EXHAUSTED', `no node has room for this sandbox (${item.backend}, ${r.cpu} cpu, ${r.memoryMiB} MiB)`, { retryAfterMs: 1000 });
}

/** The sandbox spec JSON kept in a row: the request with its backend and granted resources. */
function rowSpecOf(item: CreateItem): string {
  return JSON.stringify({ ...item.req, backend: item.backend, resources: item.resources, ...(item.spec.protect ? { protect: item.spec.protect } : {}) });
}

/** Finds a layer reference among the rows of a project's layer scope (nearest project first). */
function matchLayer(rows: LayerTable[], scope: string[], ref: string, field: string): string {
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
  /** Creates answered by a warm pool's sandbox. */
  poolClaims: number;
  /** Creates answered by replaying an earlier request with the same idempotency key. */
  idempotentReplays: number;
  sandboxesPaused: number;
  sandboxesResumed: number;
}

/** Options of {@link ControlPlane}. */
export interface ControlPlaneOptions {
  /** Limits and retention of the trajectory log. */
  trajectory?: TrajectoryOptions;
  /** Where internal errors are logged. */
  log?: (line: string) => void;
}

/** The control plane. */
export class ControlPlane implements PoolHost {
  readonly counters: ControlPlaneCounters = { sandboxesCreated: 0, sandboxCreateFailures: 0, sandboxesDestroyed: 0, sandboxesExpired: 0, poolClaims: 0, idempotentReplays: 0, sandboxesPaused: 0, sandboxesResumed: 0 };
  /** Creates waiting for quota or node capacity. */
  readonly admission = new AdmissionQueue();
  /** Idempotency keys of creates. */
  readonly idempotency: IdempotencyKeys;
  /** Keeps warm pools full (started by the platform). */
  readonly pools: PoolManager;
  /** Every sandbox's steps (commands and file changes), kept beyond the sandbox's life. */
  readonly trajectory: TrajectoryLog;
  private readonly log: (line: string) => void;
  /** Last API activity per sandbox (idle timeouts), written to the store about once a second. */
  readonly activity = new ActivityTracker();
  /** Pauses and resumes under way in this process, by sandbox id; requests wait for them. */
  private readonly transitions = new Map<string, Promise<unknown>>();
  /** When stale owner sessions were last deleted. */
  private ownersCollectedAt = 0;
  /**
   * Where the control plane raises events: owner.lost, and lease.exceeded of idle and owner
   * leases (the watcher raises it for an elapsed lifetime). startPlatform points it at the
   * watcher's pipeline.
   */
  raise: EventSink = () => undefined;
  /** Merges run-time rules (deny-path, deny-syscall, deny-domain) into a new sandbox's spec. */
  tighten: ((projectId: string, spec: SandboxSpec) => Promise<SandboxSpec>) | undefined;
  /** Names run-time deny-domain rules refuse to a project's sandboxes: kept through every policy change. */
  deniedNames: ((projectId: string) => Promise<string[]>) | undefined;

  constructor(
    readonly store: StateStore,
    readonly auth: Authenticator,
    readonly nodes: NodeRegistry,
    readonly placement: Placement,
    opts: ControlPlaneOptions = {},
  ) {
    this.log = opts.log ?? (() => undefined);
    this.idempotency = new IdempotencyKeys(store);
    this.pools = new PoolManager(this, this.log);
    this.trajectory = new TrajectoryLog(store, (id) => this.headerFromRow(id), opts.trajectory);
  }

  /**
   * Rebuilds node allocations from the stored sandboxes (after a restart). A pause or resume
   * that a crash interrupted is settled by what the node reports.
   */
  async loadAllocations(): Promise<void> {
    const onNodes = new Map<string, string>();
    for (const n of this.nodes.all()) for (const s of await n.client.list()) onNodes.set(s.id, s.state);
    for (const row of await this.store.allSandboxes()) {
      if (row.state === PAUSING || row.state === RESUMING) {
        const actual = onNodes.get(row.id) === 'paused' ? 'paused' : 'running';
        await this.store.transitionSandbox(row.id, [row.state], actual, actual === 'running' ? { paused_at: null, pause_reason: null } : {});
        row.state = actual;
      }
      this.nodes.charge(row.node, row.state === 'paused' ? 0 : this.cpuCharge(row), row.memory_mib, 1);
    }
  }

  private cpuCharge(row: SandboxTable): number {
    const spec = JSON.parse(row.spec) as SandboxSpec;
    return this.placement.cpuCharge({ cpu: row.cpu, cpuClass: spec.resources?.cpuClass ?? 'latency-sensitive' });
  }

  // ---- sandboxes ----

  private chargeNode(node: NodeEntry, item: CreateItem, sign: 1 | -1): void {
    this.nodes.charge(node.name, this.placement.cpuCharge(item.resources), item.resources.memoryMiB, sign);
  }

  /** A resolver of layer references in a project (one read of its layer scope for many refs). */
  private async layerResolver(projectId: string): Promise<(ref: string, field: string) => string> {
    const scope = await this.layerScope(projectId);
    const rows = await this.store.layers(scope);
    return (ref, field) => matchLayer(rows, scope, ref, field);
  }

  /** Resolves a validated request: layers to digests, resources granted, the pool and request hashes. */
  private async prepare(projectId: string, req: SandboxRequest, prefix: string, resolve: (ref: string, field: string) => string, p?: Principal): Promise<CreateItem> {
    const at = (f: string): string => (prefix ? `${prefix}.${f}` : f);
    const requestHash = hashOf(req);
    const lease = grantLease(req, at);
    if (req.owner !== undefined) {
      // Only a caller's own request names an owner (pool members get theirs at claim).
      if (!p) throw invalidArgument(at('owner'), 'an owner is given at claim, not in a pool');
      await this.liveOwner(p, req.owner, at('owner'));
    }
    const backend = req.backend ?? 'container';
    if ((req.image === undefined) === (req.snapshot === undefined)) throw invalidArgument(at('image'), 'give exactly one of image or snapshot');
    let image: SandboxSpec['image'];
    let snapshots: string[] = [];
    if (req.snapshot !== undefined) {
      // A snapshot brings its parents: the image it was taken over, and older snapshots.
      const snap = await this.resolveSnapshot(projectId, req.snapshot, at('snapshot'));
      image = JSON.parse(snap.image) as ImageSpec;
      snapshots = [...chainOf(snap), snap.digest];
      req = { ...req, image, snapshot: snap.digest };
    } else {
      const asked = req.image as ImageSpec;
      image = { base: resolve(asked.base, at('image.base')) };
      if (asked.workspace) image.workspace = resolve(asked.workspace, at('image.workspace'));
      if (asked.toolkits?.length) image.toolkits = asked.toolkits.map((t, i) => resolve(t, at(`image.toolkits.${i}`)));
    }
    const resources: GrantedResources = {
      cpu: req.resources?.cpu ?? DEFAULT_CPU,
      memoryMiB: req.resources?.memoryMiB ?? DEFAULT_MEMORY_MIB,
      diskMiB: req.resources?.diskMiB ?? DEFAULT_DISK_MIB,
      pids: req.resources?.pids ?? DEFAULT_PIDS,
      cpuClass: req.resources?.cpuClass ?? 'latency-sensitive',
    };
    let spec: SandboxSpec = { backend, image, resources: { ...req.resources, ...resources } };
    if (snapshots.length > 0) spec.snapshots = snapshots;
    if (req.env) spec.env = req.env;
    if (req.labels) spec.labels = req.labels;
    if (req.protect) spec.protect = req.protect;
    if (req.security) spec.security = req.security;
    if (req.network) spec.network = req.network;
    if (this.tighten) spec = await this.tighten(projectId, spec);
    const rest: Record<string, unknown> = { ...req };
    for (const f of CLAIM_FIELDS) delete rest[f];
    const poolKey = hashOf({ ...rest, backend, image, resources: spec.resources });
    return { req, spec, resources, backend, lease, poolKey, requestHash };
  }

  /**
   * Creates a sandbox: claimed from a warm pool of the project when one matches, else admitted
   * (quota, node capacity; refused or queued as the request asks), placed and created on its
   * node. With an idempotency key, a retry gets the first request's sandbox. Nothing is left
   * behind on failure.
   */
  async createSandbox(p: Principal, body: unknown, signal?: AbortSignal, opts: CreateSandboxOptions = {}): Promise<Sandbox> {
    requireRole(p, 'member');
    const { admission, ...req } = parseInput(CreateSandboxRequestSchema, body);
    const key = opts.idempotencyKey === undefined ? undefined : parseInput(IdempotencyKeySchema, opts.idempotencyKey, IDEMPOTENCY_FIELD);
    const item = await this.prepare(p.projectId, req, '', await this.layerResolver(p.projectId), p);
    if (key !== undefined) {
      const held = await this.idempotency.acquire(p.projectId, key, item.requestHash, signal);
      if (!held.owned) {
        opts.onReplay?.();
        return this.replayIdempotent(held.row);
      }
    }
    return this.createHeld(p.projectId, item, admission ?? {}, signal, key);
  }

  /** Creates one item whose idempotency key (if any) the caller holds; completes or releases it. */
  private async createHeld(projectId: string, item: CreateItem, admission: Admission, signal: AbortSignal | undefined, key: string | undefined, ticket?: Ticket): Promise<Sandbox> {
    try {
      let sb: Sandbox | undefined;
      if (!ticket) sb = await this.claimFromPool(projectId, item);
      if (!sb) {
        const held = ticket ?? (await this.admission.admit(projectId, () => this.reserveAndPlace(projectId, item), { wait: admission.wait, timeoutMs: admission.timeoutMs, signal }));
        sb = await this.createWithTicket(projectId, item, held, signal);
      }
      if (key !== undefined) await this.idempotency.complete(projectId, key, sb);
      return sb;
    } catch (err) {
      if (key !== undefined) await this.idempotency.release(projectId, key);
      throw err;
    }
  }

  /** The reply to a retry: the sandbox as it is now, or the first reply if it is gone. */
  private async replayIdempotent(row: IdempotencyKeyTable): Promise<Sandbox> {
    this.counters.idempotentReplays++;
    const now = row.sandbox_id ? await this.store.sandbox(row.sandbox_id) : undefined;
    if (now && now.project_id === row.project_id && now.pool_id === null) return this.toSandbox(now);
    if (row.response) return JSON.parse(row.response) as Sandbox;
    throw new DsecError('CONFLICT', `${IDEMPOTENCY_FIELD} ${row.key} belongs to a batch, not to one sandbox`, { field: IDEMPOTENCY_FIELD });
  }

  /** Reserves quota and a node for one create (the admission attempt); throws a capacity refusal. */
  private async reserveAndPlace(projectId: string, item: CreateItem): Promise<Ticket> {
    const reservation = reservationOf(item);
    await this.store.reserve(projectId, reservation);
    const node = this.placement.place(placementOf(item), this.nodes.all()) as NodeEntry | undefined;
    if (!node) {
      await this.store.unreserve(projectId, reservation);
      throw capacityError(item);
    }
    this.chargeNode(node, item, 1);
    return this.ticket(projectId, item, node, reservation);
  }

  private ticket(projectId: string, item: CreateItem, node: NodeEntry, reservation: Reservation): Ticket {
    return {
      node,
      reservation,
      release: async () => {
        this.chargeNode(node, item, -1);
        await this.store.unreserve(projectId, reservation);
        this.capacityFreed();
      },
    };
  }

  /** Capacity went back to the pool of quota and nodes: wake waiters, refill pools. */
  private capacityFreed(): void {
    this.admission.notify();
    this.pools.kick();
  }

  /**
   * Creates a sandbox with the capacity a ticket holds; a node that refuses is excluded and
   * placement runs again. On failure the reservation is returned and nothing is left behind.
   */
  private async createWithTicket(projectId: string, item: CreateItem, ticket: Ticket, signal: AbortSignal | undefined, pool?: PoolTable): Promise<Sandbox> {
    let node = ticket.node;
    const refused = new Set<string>();
    try {
      for (;;) {
        const created = await this.createOn(node, projectId, item, signal, pool);
        if (created) {
          this.counters.sandboxesCreated++;
          return created;
        }
        refused.add(node.name);
        const next = this.placement.place(placementOf(item), this.nodes.all(), refused) as NodeEntry | undefined;
        if (!next) throw capacityError(item);
        this.chargeNode(next, item, 1);
        node = next;
      }
    } catch (err) {
      this.counters.sandboxCreateFailures++;
      await this.store.unreserve(projectId, ticket.reservation);
      this.capacityFreed();
      throw err;
    }
  }

  /**
   * Creates on one node that is already charged for it; undefined when the node refused for
   * want of capacity. On any failure the node's charge and the row are undone. A pool's member
   * is created without env or labels and is left `pooled`.
   */
  private async createOn(node: NodeEntry, projectId: string, item: CreateItem, signal: AbortSignal | undefined, pool?: PoolTable): Promise<Sandbox | undefined> {
    const id = `${node.name}-${randomBytes(8).toString('hex')}`;
    const createdAt = new Date();
    const lifetimeMs = pool ? MAX_SANDBOX_TIMEOUT_MS : item.lease.maxLifetimeMs;
    const row: SandboxTable = {
      id,
      project_id: projectId,
      node: node.name,
      backend: item.backend,
      state: 'creating',
      spec: rowSpecOf(item),
      layers: JSON.stringify([item.spec.image.base, item.spec.image.workspace, ...(item.spec.image.toolkits ?? []), ...(item.spec.snapshots ?? [])].filter(Boolean)),
      cpu: item.resources.cpu,
      memory_mib: item.resources.memoryMiB,
      created_at: createdAt.toISOString(),
      expires_at: new Date(createdAt.getTime() + lifetimeMs).toISOString(),
      pool_id: pool?.id ?? null,
      // A pool's member gets its lease and owner when it is claimed.
      owner_id: pool ? null : (item.req.owner ?? null),
      lease: pool ? null : JSON.stringify(item.lease),
      last_active_at: createdAt.toISOString(),
      paused_at: null,
      pause_reason: null,
    };
    await this.store.insertSandbox(row, item.req.labels ?? {});
    try {
      await node.client.create(item.spec, signal ? { id, signal } : { id });
    } catch (err) {
      this.chargeNode(node, item, -1);
      await this.store.db.deleteFrom('sandboxes').where('id', '=', id).execute();
      if (err instanceof DsecError && err.code === 'CAPACITY_EXHAUSTED') return undefined;
      throw err;
    }
    row.state = pool ? POOLED_STATE : 'running';
    await this.store.transitionSandbox(id, ['creating'], row.state);
    if (!pool) this.openTrajectory(row, item);
    return this.toSandbox({ ...row, labels: item.req.labels ?? {} });
  }

  /** Starts the trajectory of a sandbox its caller now holds (created, or claimed from a pool). */
  private openTrajectory(row: SandboxTable, item: CreateItem): void {
    this.trajectory.open({ sandboxId: row.id, projectId: row.project_id, spec: trajectorySpec(item.req, item.spec), layers: JSON.parse(row.layers) as string[], createdAt: row.created_at });
  }

  /**
   * Claims a ready sandbox from one of the project's pools whose spec matches, in one
   * transaction, and hands it over on its node (env, labels). Undefined when none is ready.
   */
  private async claimFromPool(projectId: string, item: CreateItem): Promise<Sandbox | undefined> {
    const now = new Date();
    const labels = item.req.labels ?? {};
    const row = await this.store.claimPooled({
      projectId,
      specKey: item.poolKey,
      spec: rowSpecOf(item),
      labels,
      createdAt: now.toISOString(),
      expiresAt: new Date(now.getTime() + item.lease.maxLifetimeMs).toISOString(),
      lease: JSON.stringify(item.lease),
      ownerId: item.req.owner ?? null,
    });
    if (!row) return undefined;
    this.pools.claimed();
    try {
      const node = this.nodes.get(row.node);
      if (!node) throw new DsecError('UNAVAILABLE', `node ${row.node} is not reachable`);
      await node.client.claim(row.id, { ...(item.req.env ? { env: item.req.env } : {}), ...(item.req.labels ? { labels } : {}) });
    } catch {
      // The member cannot be handed over (its node or sandbox is gone, or it was used): it is
      // dropped, and this create goes on without the pool. Nobody has seen its id yet.
      await this.discardClaimed(row);
      return undefined;
    }
    this.counters.poolClaims++;
    this.openTrajectory(row, item);
    return this.toSandbox({ ...row, labels });
  }

  /** Removes a claimed pool member that could not be handed over. */
  private async discardClaimed(row: SandboxTable): Promise<void> {
    const node = this.nodes.get(row.node);
    if (node) {
      await node.client.destroy(row.id).catch(() => undefined);
      this.nodes.charge(row.node, this.cpuCharge(row), row.memory_mib, -1);
    }
    await this.store.deleteSandbox(row);
    this.capacityFreed();
  }

  /**
   * Creates many sandboxes in one request, each with its own result: validation per item,
   * claims from pools, quota for the rest in one transaction, placement in one pass over the
   * nodes, then the creates with bounded concurrency. Items refused for capacity fail alone
   * (or wait, if the batch asks to); a failed item leaves nothing behind.
   */
  async createSandboxes(p: Principal, body: unknown, opts: CreateBatchOptions = {}): Promise<CreateSandboxBatchResult> {
    requireRole(p, 'member');
    const batch = parseInput(CreateSandboxBatchRequestSchema, body);
    const key = opts.idempotencyKey === undefined ? undefined : parseInput(IdempotencyKeySchema, opts.idempotencyKey, IDEMPOTENCY_FIELD);
    const { signal } = opts;
    const admission = batch.admission ?? {};
    const projectId = p.projectId;
    const resolve = await this.layerResolver(projectId);
    const count = batch.items?.length ?? batch.count ?? 0;
    const results: BatchItemResult[] = new Array<BatchItemResult>(count);
    const finish = (index: number, outcome: { sandbox: Sandbox } | { error: unknown }): void => {
      const r: BatchItemResult = 'sandbox' in outcome ? { index, sandbox: outcome.sandbox } : { index, error: this.itemError(outcome.error) };
      results[index] = r;
      opts.onItem?.(r);
    };

    // Validation: a bad spec fails the whole request; a bad item fails alone.
    const items: Array<{ index: number; item: CreateItem }> = [];
    if (batch.spec) {
      const item = await this.prepare(projectId, batch.spec, 'spec', resolve, p);
      for (let i = 0; i < count; i++) items.push({ index: i, item });
    } else {
      for (const [i, raw] of (batch.items ?? []).entries()) {
        try {
          items.push({ index: i, item: await this.prepare(projectId, parseInput(SandboxRequestSchema, raw, `items.${i}`), `items.${i}`, resolve, p) });
        } catch (err) {
          finish(i, { error: err });
        }
      }
    }
    if (key !== undefined) {
      // The batch's own key guards against reusing it for another batch; items get `<key>#<i>`.
      const { admission: _ignored, ...what } = batch;
      const held = await this.idempotency.acquire(projectId, key, hashOf({ batch: what }), signal);
      if (held.owned) await this.idempotency.complete(projectId, key, null);
    }

    opts.onStart?.();

    interface Task {
      run(): Promise<void>;
      cancel(): Promise<void>;
    }
    const tasks: Task[] = [];
    const itemKey = (index: number): string | undefined => (key === undefined ? undefined : `${key}#${index}`);
    const cancelled = (): DsecError => new DsecError('CANCELLED', 'the request was cancelled before this item was created');
    /** A task for one item whose key (if any) is held: through the whole pipeline, or with a ticket. */
    const held = (index: number, item: CreateItem, ticket?: Ticket): Task => ({
      run: async () => {
        try {
          finish(index, { sandbox: await this.createHeld(projectId, item, admission, signal, itemKey(index), ticket) });
        } catch (err) {
          finish(index, { error: err });
        }
      },
      cancel: async () => {
        await ticket?.release();
        const k = itemKey(index);
        if (k !== undefined) await this.idempotency.release(projectId, k);
        finish(index, { error: cancelled() });
      },
    });

    // Keys and claims, item by item (a claim is one short transaction).
    const fresh: Array<{ index: number; item: CreateItem }> = [];
    for (const it of items) {
      const k = itemKey(it.index);
      try {
        if (k !== undefined) {
          const got = await this.idempotency.tryAcquire(projectId, k, it.item.requestHash);
          if ('pending' in got) {
            // Another request holds this item's key: wait for it, as a single create would.
            tasks.push({
              run: async () => {
                try {
                  const again = await this.idempotency.acquire(projectId, k, it.item.requestHash, signal);
                  finish(it.index, { sandbox: again.owned ? await this.createHeld(projectId, it.item, admission, signal, k) : await this.replayIdempotent(again.row) });
                } catch (err) {
                  finish(it.index, { error: err });
                }
              },
              cancel: async () => finish(it.index, { error: cancelled() }),
            });
            continue;
          }
          if (!got.owned) {
            finish(it.index, { sandbox: await this.replayIdempotent(got.row) });
            continue;
          }
        }
        const claimed = await this.claimFromPool(projectId, it.item);
        if (!claimed) {
          fresh.push(it);
          continue;
        }
        if (k !== undefined) await this.idempotency.complete(projectId, k, claimed);
        finish(it.index, { sandbox: claimed });
      } catch (err) {
        if (k !== undefined) await this.idempotency.release(projectId, k).catch(() => undefined);
        finish(it.index, { error: err });
      }
    }

    // Quota for the rest in one transaction, placement in one pass, unless the project already
    // has creates waiting (they go first: these queue behind them, or are refused).
    const queued = this.admission.waiting(projectId) > 0;
    const refusals = queued ? fresh.map(() => undefined) : await this.store.reserveMany(projectId, fresh.map((f) => reservationOf(f.item)));
    const admitted = queued ? [] : fresh.filter((_, i) => !refusals[i]);
    const nodes = this.placement.placeMany(admitted.map((f) => placementOf(f.item)), this.nodes.all());
    const later: Array<{ index: number; item: CreateItem; refusal: DsecError | undefined }> = queued ? fresh.map((f) => ({ ...f, refusal: undefined })) : [];
    for (const [i, f] of admitted.entries()) {
      const node = nodes[i];
      if (node) {
        this.chargeNode(node, f.item, 1);
        tasks.push(held(f.index, f.item, this.ticket(projectId, f.item, node, reservationOf(f.item))));
      } else {
        await this.store.unreserve(projectId, reservationOf(f.item));
        later.push({ ...f, refusal: capacityError(f.item) });
      }
    }
    if (!queued) for (const [i, f] of fresh.entries()) if (refusals[i]) later.push({ ...f, refusal: refusals[i] });
    for (const f of later.sort((a, b) => a.index - b.index)) {
      if (admission.wait) {
        tasks.push(held(f.index, f.item));
        continue;
      }
      // Behind the project's waiting creates: the admission queue answers (a refusal, at once).
      if (!f.refusal) {
        tasks.push(held(f.index, f.item));
        continue;
      }
      const k = itemKey(f.index);
      if (k !== undefined) await this.idempotency.release(projectId, k);
      finish(f.index, { error: f.refusal });
    }

    // The creates, a few at a time; after a cancel the rest are given back unstarted.
    let next = 0;
    const worker = async (): Promise<void> => {
      for (let t = tasks[next++]; t; t = tasks[next++]) await (signal?.aborted ? t.cancel() : t.run());
    };
    const concurrency = Math.max(1, opts.concurrency ?? DEFAULT_BATCH_CONCURRENCY);
    await Promise.all(Array.from({ length: Math.min(concurrency, tasks.length) }, worker));
    const created = results.filter((r) => r.sandbox).length;
    return { items: results, created, failed: count - created };
  }

  /** A sandbox row the principal may see, or SANDBOX_NOT_FOUND. */
  async sandboxRow(p: Principal, id: string): Promise<SandboxRow> {
    const row = typeof id === 'string' && id.length <= 128 ? await this.store.sandbox(id) : undefined;
    // A pool's sandbox is nobody's until it is claimed.
    if (!row || !p.visibleProjects.has(row.project_id) || row.pool_id !== null) throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${id} not found`, { sandboxId: id });
    return row;
  }

  /**
   * The node client of a visible, running sandbox. The request counts as the sandbox's API
   * activity; a paused sandbox is resumed first when its lease says `autoResume` (else 409).
   * With `paused: 'allow'` (host-side reads: stats, diff, verify, network info and log, and
   * snapshots, which keep a paused sandbox paused), a paused sandbox is routed to as it is, and
   * the request is not activity.
   */
  async route(p: Principal, id: string, minRole: 'viewer' | 'member' = 'member', opts: { paused?: 'resume' | 'allow' } = {}): Promise<{ row: SandboxTable; edge: EdgeClient }> {
    requireRole(p, minRole);
    if (typeof id !== 'string' || id.length > 128) throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${String(id)} not found`, { sandboxId: String(id) });
    // Recorded before the read: an idle pause that claims the row after this read sees it.
    // Reading stats (host-side, `paused: 'allow'`) is not activity: monitoring never keeps a sandbox awake.
    const touched = opts.paused === 'allow' ? undefined : this.activity.touch(id);
    // The hot path (every exec and file operation): one indexed read, no labels.
    let row = await this.store.sandboxOnly(id);
    if (!row || !p.visibleProjects.has(row.project_id) || row.pool_id !== null) {
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
    // lease.exceeded for an elapsed lifetime is the watcher's (it raises it once per sandbox).
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

  /** Destroys a pool's member if it is still ready; a member claimed meanwhile is left alone. */
  async destroyPooled(row: SandboxTable): Promise<void> {
    await this.destroyRow(row, [POOLED_STATE]).catch((err: unknown) => {
      if (!(err instanceof DsecError && (err.code === 'CONFLICT' || err.code === 'SANDBOX_NOT_FOUND'))) throw err;
    });
  }

  /** Destroys a sandbox by its row (the watcher uses this for expiry and orphans). */
  async destroyRow(row: SandboxTable, states: string[] = DESTROYABLE_STATES): Promise<void> {
    // A pause or resume under way here finishes first.
    await this.transitions.get(row.id)?.catch(() => undefined);
    // Claim the row first: one destroyer per sandbox, and never one that is still being
    // created (its quota and node charge belong to the create until it finishes).
    const from = (await this.store.sandboxOnly(row.id))?.state;
    if (!from || !states.includes(from) || !(await this.store.transitionSandbox(row.id, [from], 'stopping'))) {
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
    this.trajectory.end(row.id);
    this.counters.sandboxesDestroyed++;
    this.capacityFreed();
  }

  toSandbox(row: SandboxRow): Sandbox {
    const spec = JSON.parse(row.spec) as z.infer<typeof CreateSandboxRequestSchema> & { image: ImageSpec; resources: GrantedResources };
    // A pause or resume under way shows as the state it leaves.
    const state = row.state === PAUSING ? 'running' : row.state === RESUMING ? 'paused' : row.state;
    return {
      id: row.id,
      project: row.project_id,
      node: row.node,
      backend: row.backend as Sandbox['backend'],
      state: state as Sandbox['state'],
      image: spec.image,
      ...(spec.snapshot !== undefined ? { snapshot: spec.snapshot } : {}),
      layers: JSON.parse(row.layers) as string[],
      resources: spec.resources,
      labels: row.labels,
      envKeys: Object.keys(spec.env ?? {}),
      network: spec.network ?? DEFAULT_NETWORK_POLICY,
      createdAt: row.created_at,
      expiresAt: row.expires_at,
      lease: leaseOf(row),
      owner: row.owner_id ?? null,
      lastActiveAt: new Date(this.activity.lastActiveOf(row)).toISOString(),
      pausedAt: row.paused_at ?? null,
      pauseReason: row.pause_reason ?? null,
      ...(spec.protect ? { protect: spec.protect } : {}),
      ...(spec.security ? { security: spec.security } : {}),
    };
  }

  /** The error body of a failed batch item; unexpected errors are logged, as the HTTP layer does. */
  private itemError(err: unknown): ItemError {
    if (err instanceof DsecError) return err.toJSON().error;
    this.log(`internal error in a batch item: ${(err as Error)?.stack ?? String(err)}`);
    return { code: 'INTERNAL', message: 'internal error' };
  }

  // ---- warm pools ----

  /** Creates or replaces a pool of the caller's project; it fills in the background. */
  async putPool(p: Principal, name: string, body: unknown): Promise<Pool> {
    requireRole(p, 'member');
    const poolName = parseInput(PoolNameSchema, name, 'name');
    const req = parseInput(PutPoolRequestSchema, body);
    const item = await this.prepare(p.projectId, req.spec, 'spec', await this.layerResolver(p.projectId));
    // A pool's sandboxes count against the quota: a pool that could never fill is refused.
    for (const id of await this.store.ancestry(p.projectId)) {
      const q = await this.store.project(id);
      if (!q) continue;
      const over =
        req.size > q.quota_sandboxes
          ? `${req.size} sandboxes exceed the quota of ${q.quota_sandboxes}`
          : req.size * item.resources.cpu > q.quota_cpu
            ? `${req.size} x ${item.resources.cpu} cpu exceed the cpu quota of ${q.quota_cpu}`
            : req.size * item.resources.memoryMiB > q.quota_memory_mib
              ? `${req.size} x ${item.resources.memoryMiB} MiB exceed the memory quota of ${q.quota_memory_mib} MiB`
              : undefined;
      if (over) throw invalidArgument('size', `${over} (project ${q.name})`);
    }
    const resolved = { ...req.spec, backend: item.backend, image: item.spec.image, resources: item.spec.resources };
    const old = await this.store.pool(p.projectId, poolName);
    const { row } = await this.store.putPool({
      projectId: p.projectId,
      name: poolName,
      spec: JSON.stringify(req.spec),
      resolved: JSON.stringify(resolved),
      specKey: item.poolKey,
      size: req.size,
      idleTimeoutMs: req.idleTimeoutMs ?? DEFAULT_POOL_IDLE_TIMEOUT_MS,
      maxPools: MAX_POOLS_PER_PROJECT,
    });
    // A new spec made a new pool: the old one's ready sandboxes go now, their quota with them.
    if (old && old.id !== row.id) await this.pools.drain(old.id);
    this.pools.kick();
    return this.toPool(row);
  }

  /** The pools of the caller's project and its descendants. */
  async listPools(p: Principal): Promise<Pool[]> {
    requireRole(p, 'viewer');
    const rows = await this.store.pools([...p.visibleProjects]);
    const counts = await this.store.poolMemberCounts();
    return rows.map((r) => this.poolBody(r, counts.get(r.id)?.[POOLED_STATE] ?? 0));
  }

  /** One pool of the caller's project. */
  async getPool(p: Principal, name: string): Promise<Pool> {
    requireRole(p, 'viewer');
    return this.toPool(await this.poolRow(p, name));
  }

  /** Deletes a pool; its ready sandboxes are destroyed before this returns. */
  async deletePool(p: Principal, name: string): Promise<void> {
    requireRole(p, 'member');
    const row = await this.poolRow(p, name);
    await this.store.deletePool(row.id);
    await this.pools.drain(row.id);
  }

  private async poolRow(p: Principal, name: string): Promise<PoolTable> {
    const poolName = parseInput(PoolNameSchema, name, 'name');
    const row = await this.store.pool(p.projectId, poolName);
    if (!row) throw new DsecError('NOT_FOUND', `pool ${poolName} not found`, { pool: poolName });
    return row;
  }

  private async toPool(row: PoolTable): Promise<Pool> {
    return this.poolBody(row, (await this.store.poolMemberCounts(row.id)).get(row.id)?.[POOLED_STATE] ?? 0);
  }

  private poolBody(row: PoolTable, ready: number): Pool {
    const progress = this.pools.progress(row.id);
    return {
      name: row.name,
      project: row.project_id,
      spec: JSON.parse(row.spec) as Pool['spec'],
      size: row.size,
      idleTimeoutMs: row.idle_timeout_ms,
      ready,
      creating: progress.creating,
      idle: poolIsIdle(row),
      lastError: progress.lastError,
      lastUsedAt: row.last_used_at,
      createdAt: row.created_at,
      updatedAt: row.updated_at,
    };
  }

  /** Creates one ready member of a pool (the pool manager's refill); throws when refused. */
  async createPoolMember(pool: PoolTable): Promise<void> {
    const req = JSON.parse(pool.resolved) as SandboxRequest;
    const item = await this.prepare(pool.project_id, req, 'spec', (ref) => ref);
    const ticket = await this.reserveAndPlace(pool.project_id, item);
    await this.createWithTicket(pool.project_id, item, ticket, undefined, pool);
  }

  /** Creates of a project waiting for admission. */
  waitingAdmissions(projectId: string): number {
    return this.admission.waiting(projectId);
  }

  // ---- snapshots and forks ----

  /** A snapshot layer visible to a project: 404 when unknown there, 400 when not a snapshot. */
  private async resolveSnapshot(projectId: string, ref: string, field: string): Promise<SnapshotTable> {
    const digest = await this.resolveLayer(projectId, ref, field);
    const snap = await this.store.snapshot(digest);
    if (!snap) throw invalidArgument(field, `layer ${ref} is not a snapshot`);
    return snap;
  }

  /** The resolved spec of a sandbox: from its trajectory, or rebuilt from its row. */
  private async specOf(row: SandboxTable): Promise<TrajectorySpec> {
    const t = await this.store.trajectory(row.id);
    if (t) return JSON.parse(t.spec) as TrajectorySpec;
    const h = await this.headerFromRow(row.id);
    if (!h) throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${row.id} not found`, { sandboxId: row.id });
    return h.spec;
  }

  /** A trajectory header for a sandbox that has none (made before trajectories were kept). */
  private async headerFromRow(sandboxId: string): Promise<TrajectoryHeader | undefined> {
    const row = await this.store.sandboxOnly(sandboxId);
    if (!row) return undefined;
    const req = JSON.parse(row.spec) as z.infer<typeof CreateSandboxRequestSchema> & { image: ImageSpec; resources: GrantedResources };
    const layers = JSON.parse(row.layers) as string[];
    const image: ImageSpec = { base: layers[0] ?? req.image.base };
    let next = 1;
    if (req.image.workspace) image.workspace = layers[next++] ?? req.image.workspace;
    if (req.image.toolkits?.length) image.toolkits = req.image.toolkits.map((t) => layers[next++] ?? t);
    const spec: SandboxSpec = { backend: row.backend as BackendKind, image, resources: req.resources };
    if (layers.length > next) spec.snapshots = layers.slice(next);
    return { sandboxId, projectId: row.project_id, spec: trajectorySpec(req, spec), layers, createdAt: row.created_at };
  }

  /**
   * Packs a running sandbox's writable layer into a snapshot layer owned by its project (the
   * sandbox is frozen while it is read). Sandboxes created from it get its parents plus it.
   */
  async snapshot(p: Principal, id: string, body: unknown, signal?: AbortSignal): Promise<Layer> {
    requireRole(p, 'member');
    const req = parseInput(SnapshotRequestSchema, body);
    const name = req.name === undefined ? null : normalizeLayerName(req.name);
    // A paused sandbox is packed as it is and stays paused (the node reads its frozen files).
    const { row, edge } = await this.route(p, id, 'member', { paused: 'allow' });
    const spec = await this.specOf(row);
    if ((spec.snapshots?.length ?? 0) >= MAX_SNAPSHOT_DEPTH) {
      throw new DsecError('CONFLICT', `sandbox ${id} sits on a chain of ${MAX_SNAPSHOT_DEPTH} snapshots, the most there can be; start again from an image`, { sandboxId: id });
    }
    const seq = await this.trajectory.position(row.id);
    const info = await edge.snapshot(row.id, signal ? { signal } : {});
    const snap = await this.store.addSnapshot({
      digest: info.digest,
      project_id: row.project_id,
      sandbox_id: row.id,
      seq,
      image: JSON.stringify(spec.image),
      parents: row.layers,
      created_at: new Date().toISOString(),
    });
    const layer = await this.registerLayer(row.project_id, info, name);
    return { ...layer, snapshot: { parents: JSON.parse(snap.parents) as string[], sandboxId: snap.sandbox_id, seq: snap.seq } };
  }

  /**
   * One snapshot, then `count` sandboxes from it in the source's project (quota checked for
   * each). All or nothing: when one create fails, the ones made are destroyed and the error
   * (with `details.snapshot`, which stays) is thrown.
   */
  async fork(p: Principal, id: string, body: unknown, signal?: AbortSignal): Promise<ForkResult> {
    requireRole(p, 'member');
    const req = parseInput(ForkRequestSchema, body);
    const source = await this.sandboxRow(p, id);
    const snapshot = await this.snapshot(p, id, {}, signal);
    const spec = await this.specOf(source);
    const owner: Principal = { ...p, projectId: source.project_id };
    const create = {
      backend: spec.backend,
      snapshot: snapshot.digest,
      resources: spec.resources,
      ...(spec.env ? { env: spec.env } : {}),
      labels: { ...source.labels, ...req.labels },
      ...(req.timeoutMs !== undefined ? { timeoutMs: req.timeoutMs } : {}),
    };
    const made: Sandbox[] = [];
    let failure: unknown;
    let next = 0;
    const worker = async (): Promise<void> => {
      while (failure === undefined && next < req.count) {
        next++;
        try {
          made.push(await this.createSandbox(owner, create, signal));
        } catch (err) {
          failure ??= err;
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(FORK_CONCURRENCY, req.count) }, worker));
    if (failure !== undefined) {
      for (const sb of made) {
        const row = await this.store.sandbox(sb.id);
        if (row) await this.destroyRow(row).catch(() => undefined);
      }
      if (failure instanceof DsecError) failure.details.snapshot = snapshot.digest;
      throw failure;
    }
    made.sort((a, b) => a.createdAt.localeCompare(b.createdAt) || a.id.localeCompare(b.id));
    return { snapshot, sandboxes: made };
  }

  // ---- trajectories and replay ----

  /** A trajectory the principal may read (its sandbox may be gone). */
  private async trajectoryRow(p: Principal, id: string) {
    requireRole(p, 'member');
    const t = typeof id === 'string' && id.length <= 128 ? await this.trajectory.header(id) : undefined;
    if (!t || !p.visibleProjects.has(t.project_id)) {
      // A sandbox from before trajectories were kept: start its log now.
      const row = typeof id === 'string' && id.length <= 128 ? await this.store.sandboxOnly(id) : undefined;
      if (row && p.visibleProjects.has(row.project_id)) {
        await this.trajectory.position(id);
        const made = await this.trajectory.header(id);
        if (made) return made;
      }
      throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${id} not found`, { sandboxId: id });
    }
    return t;
  }

  /** A page of a sandbox's trajectory (also of a destroyed or lost sandbox, while it is kept). */
  async getTrajectory(p: Principal, id: string, query: unknown): Promise<Trajectory> {
    const q = parseInput(TrajectoryQuerySchema, query, 'query');
    const t = await this.trajectoryRow(p, id);
    const limit = q.limit ?? DEFAULT_PAGE_SIZE;
    const steps = await this.trajectory.page(id, q.after ?? -1, Math.min(limit, MAX_PAGE_SIZE) + 1);
    const items: TrajectoryStep[] = [];
    let bytes = 0;
    for (const step of steps.slice(0, limit)) {
      if (q.content === 'false') for (const key of ['stdout', 'stderr', 'stdin', 'data'] as const) delete step[key]?.base64;
      bytes += JSON.stringify(step).length;
      if (items.length > 0 && bytes > MAX_TRAJECTORY_PAGE_BYTES) break;
      items.push(step);
    }
    const more = items.length < steps.length;
    const last = items[items.length - 1];
    const spec = JSON.parse(t.spec) as TrajectorySpec;
    const sandbox = t.ended_at === null ? await this.store.sandboxOnly(id) : undefined;
    // A row being destroyed reads as stopped.
    const state = sandbox === undefined ? 'gone' : SandboxStateSchema.safeParse(sandbox.state).data ?? 'stopped';
    return {
      sandboxId: t.sandbox_id,
      project: t.project_id,
      sandboxState: state,
      image: spec.image,
      snapshots: spec.snapshots ?? [],
      createdAt: t.created_at,
      endedAt: t.ended_at,
      steps: t.steps,
      bytes: t.bytes,
      truncated: t.truncated === 1,
      items,
      nextCursor: more && last ? String(last.seq) : null,
    };
  }

  /**
   * Creates a fresh sandbox from the trajectory's layers (or from a snapshot of it) and re-runs
   * its steps in order, comparing each with the record. `onEvent` sees progress as it happens.
   * When the caller goes away before it learned the new sandbox (no `onEvent`), the sandbox is
   * destroyed.
   */
  async replay(p: Principal, id: string, body: unknown, signal?: AbortSignal, onEvent?: (ev: ReplayEvent) => void): Promise<ReplayResult> {
    requireRole(p, 'member');
    const req = parseInput(ReplayRequestSchema, body);
    const t = await this.trajectoryRow(p, id);
    const spec = JSON.parse(t.spec) as TrajectorySpec;
    const owner: Principal = { ...p, projectId: t.project_id };
    let fromSeq = -1;
    let start: { image: ImageSpec } | { snapshot: string } = spec.snapshot !== undefined ? { snapshot: spec.snapshot } : { image: spec.image };
    if (req.snapshot !== undefined) {
      const snap = await this.resolveSnapshot(t.project_id, req.snapshot, 'snapshot');
      if (snap.sandbox_id !== id) throw invalidArgument('snapshot', `layer ${req.snapshot} is not a snapshot of sandbox ${id}`);
      start = { snapshot: snap.digest };
      fromSeq = snap.seq - 1;
    }
    const resources = req.resources ?? spec.resources;
    const env = req.env ?? spec.env;
    const labels = req.labels ?? spec.labels;
    const timeoutMs = req.timeoutMs ?? spec.timeoutMs;
    const sandbox = await this.createSandbox(
      owner,
      { backend: spec.backend, ...start, resources, ...(env ? { env } : {}), ...(labels ? { labels } : {}), ...(timeoutMs !== undefined ? { timeoutMs } : {}) },
      signal,
    );
    onEvent?.({ type: 'sandbox', sandbox, fromSeq });
    const result: ReplayResult = { sandbox, fromSeq, steps: [], summary: summarize([]), truncated: t.truncated === 1 };
    try {
      const { edge, row } = await this.route(owner, sandbox.id);
      for await (const step of this.trajectory.stepsAfter(id, fromSeq)) {
        if (req.upTo !== undefined && step.seq > req.upTo) break;
        signal?.throwIfAborted();
        const done: ReplayStep = await replayStep({ edge, sandboxId: row.id, log: this.trajectory }, step, signal);
        result.steps.push(done);
        onEvent?.({ type: 'step', step: done });
        if (req.stopOnDivergence && done.verdict !== 'same') break;
      }
    } catch (err) {
      if (signal?.aborted && !onEvent) {
        const row = await this.store.sandbox(sandbox.id);
        if (row) await this.destroyRow(row).catch(() => undefined);
        throw err;
      }
      const e = err instanceof DsecError ? err : new DsecError('INTERNAL', err instanceof Error ? err.message : String(err));
      result.error = { code: e.code, message: e.message };
    }
    result.summary = summarize(result.steps);
    return result;
  }

  // ---- networks ----

  /** Network changes of one sandbox run one after another (the stored policy follows the last). */
  private readonly networkChains = new Map<string, Promise<unknown>>();

  private serialNetwork<T>(id: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.networkChains.get(id) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const tail = next.catch(() => undefined);
    this.networkChains.set(id, tail);
    void tail.then(() => {
      if (this.networkChains.get(id) === tail) this.networkChains.delete(id);
    });
    return next;
  }

  /** Replaces (`replace`) or patches a sandbox's network policy on its node, then records it. */
  async changeNetwork(p: Principal, id: string, body: unknown, how: 'replace' | 'patch'): Promise<SandboxNetwork> {
    const { row, edge } = await this.route(p, id);
    return this.changeNetworkOf(row, edge, body, how);
  }

  private changeNetworkOf(row: SandboxTable, edge: EdgeClient, body: unknown, how: 'replace' | 'patch'): Promise<SandboxNetwork> {
    return this.serialNetwork(row.id, async () => {
      const denied = (await this.deniedNames?.(row.project_id)) ?? [];
      let info;
      if (denied.length === 0) {
        info = await edge.setNetwork(row.id, await this.nextPolicy(edge, row.id, body, how));
      } else {
        // The new policy is worked out here so that the rules' denied names stay in it.
        info = await edge.setNetwork(row.id, withDeniedNames(await this.nextPolicy(edge, row.id, body, how), denied));
      }
      const spec = JSON.parse((await this.store.sandboxOnly(row.id))?.spec ?? row.spec) as Record<string, unknown>;
      await this.store.setSandboxSpec(row.id, JSON.stringify({ ...spec, network: info.policy }));
      return info as SandboxNetwork;
    });
  }

  /** The policy a replace or a patch leads to, validated and in its normal form. */
  private async nextPolicy(edge: EdgeClient, id: string, body: unknown, how: 'replace' | 'patch'): Promise<NetworkPolicy> {
    if (how === 'replace') return normalizeNetworkPolicy(parseInput(NetworkPolicySchema, body, 'network'));
    const patched = applyNetworkPatch((await edge.networkInfo(id)).policy, parseInput(NetworkPolicyPatchSchema, body, 'network'));
    return normalizeNetworkPolicy(parseInput(NetworkPolicySchema, patched, 'network'));
  }

  /** A sandbox's network: policy, addresses, counters. */
  async getNetwork(p: Principal, id: string): Promise<SandboxNetwork> {
    // Host-side state: a paused sandbox keeps its network (links, policy) and is shown as it is.
    const { row, edge } = await this.route(p, id, 'viewer', { paused: 'allow' });
    return edge.networkInfo(row.id);
  }

  /** The latest egress attempts of a sandbox, oldest first. */
  async networkLog(p: Principal, id: string, query: unknown): Promise<EgressLogEntryBody[]> {
    const q = parseInput(NetworkLogQuerySchema, query, 'query');
    const { row, edge } = await this.route(p, id, 'viewer', { paused: 'allow' });
    return edge.networkLog(row.id, q.limit ?? DEFAULT_NETWORK_LOG_LIMIT);
  }

  /**
   * Replaces or patches the policy of every visible sandbox carrying the selector's labels (a
   * whole training job). Each sandbox changes atomically; one that fails keeps its old policy
   * and is reported.
   */
  async applyNetwork(p: Principal, body: unknown): Promise<ApplyNetworkResult> {
    requireRole(p, 'member');
    const req = parseInput(ApplyNetworkRequestSchema, body);
    const labels = Object.entries(req.selector.labels);
    const rows: SandboxRow[] = [];
    let after: string | undefined;
    for (;;) {
      const page = await this.store.listSandboxes({ projectIds: [...p.visibleProjects], labels, limit: 1000, ...(after ? { after } : {}) });
      rows.push(...page);
      if (rows.length > MAX_NETWORK_APPLY_SANDBOXES) {
        throw invalidArgument('selector.labels', `matches more than ${MAX_NETWORK_APPLY_SANDBOXES} sandboxes; narrow it`);
      }
      if (page.length < 1000) break;
      after = page[page.length - 1]?.id;
    }
    const change = req.policy ?? req.patch;
    const how = req.policy ? 'replace' : 'patch';
    const result: ApplyNetworkResult = { matched: rows.length, applied: [], failed: [] };
    const work = [...rows];
    const worker = async (): Promise<void> => {
      for (let row = work.shift(); row; row = work.shift()) {
        try {
          const node = this.nodes.get(row.node);
          if (!node) throw new DsecError('UNAVAILABLE', `node ${row.node} is not reachable`);
          if (row.state !== 'running') throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${row.id} is ${row.state}`);
          const info = await this.changeNetworkOf(row, node.client, change, how);
          result.applied.push({ id: row.id, network: info.policy as NetworkPolicy });
        } catch (err) {
          const e = err instanceof DsecError ? err : new DsecError('INTERNAL', (err as Error).message);
          result.failed.push({ id: row.id, error: { code: e.code, message: e.message } });
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(NETWORK_APPLY_CONCURRENCY, work.length) }, worker));
    return result;
  }

  // ---- layers ----

  /** Projects whose layers a project may use: itself, its ancestors, then the public ones. */
  private async layerScope(projectId: string): Promise<string[]> {
    return [...(await this.store.ancestry(projectId)), PUBLIC_PROJECT_ID];
  }

  /** Resolves a layer reference for a project to a `sha256:` digest. */
  async resolveLayer(projectId: string, ref: string, field: string): Promise<string> {
    return (await this.layerResolver(projectId))(ref, field);
  }

  /** Records a layer built on the nodes as owned by a project (public for built-ins). */
  async registerLayer(projectId: string, info: LayerInfo, name: string | null): Promise<Layer> {
    const row = await this.store.addLayer({ projectId, digest: info.digest, kind: info.kind, name: name === null ? null : layerName(name) });
    return this.toLayer(row, info);
  }

  private toLayer(row: LayerTable, info?: LayerInfo, snap?: SnapshotTable): Layer {
    const layer: Layer = {
      digest: row.digest,
      kind: row.kind as LayerKind,
      names: row.name ? [row.name] : [],
      project: row.project_id,
      contentBytes: info?.contentBytes ?? 0,
      files: info?.files ?? 0,
      createdAt: row.created_at,
    };
    if (snap) layer.snapshot = { parents: JSON.parse(snap.parents) as string[], sandboxId: snap.sandbox_id, seq: snap.seq };
    return layer;
  }

  /** Layers a principal can see. */
  async listLayers(p: Principal, kind?: LayerKind): Promise<Layer[]> {
    const rows = await this.store.layers([...p.visibleProjects, ...(await this.store.ancestry(p.projectId)), PUBLIC_PROJECT_ID]);
    const out: Layer[] = [];
    const edge = this.anyEdge();
    for (const row of rows) {
      if (kind && row.kind !== kind) continue;
      const info = await edge.layers.resolve(row.digest).catch(() => undefined);
      out.push(this.toLayer(row, info, row.kind === 'snapshot' ? await this.store.snapshot(row.digest) : undefined));
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
    const snap = row.kind === 'snapshot' ? await this.store.snapshot(digest) : undefined;
    return { ...this.toLayer(row, info, snap), names: rows.map((r) => r.name).filter((n): n is string => n !== null) };
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
    const over = mine.length === all.length ? await this.store.snapshotsOver(digest) : [];
    if (over.length > 0) throw new DsecError('CONFLICT', `layer ${ref} is below snapshot ${over[0]!.digest}; delete the snapshot first`, { layer: ref });
    await this.store.removeLayerRows(mine.map((r) => r.id));
    if (mine.length === all.length) {
      await this.store.removeSnapshot(digest);
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

/** Older snapshots below a snapshot (its parents past the image's layers). */
function chainOf(snap: SnapshotTable): string[] {
  const image = JSON.parse(snap.image) as ImageSpec;
  const imageLayers = 1 + (image.workspace ? 1 : 0) + (image.toolkits?.length ?? 0);
  return (JSON.parse(snap.parents) as string[]).slice(imageLayers);
}

/** What a trajectory keeps of a create: the resolved layers and everything needed to repeat it. */
function trajectorySpec(req: z.infer<typeof CreateSandboxRequestSchema>, spec: SandboxSpec): TrajectorySpec {
  const out: TrajectorySpec = { backend: spec.backend ?? 'container', image: spec.image, resources: spec.resources ?? {} };
  if (spec.snapshots?.length) out.snapshots = spec.snapshots;
  if (req.snapshot !== undefined) out.snapshot = req.snapshot;
  if (req.env) out.env = req.env;
  if (req.labels) out.labels = req.labels;
  if (req.timeoutMs !== undefined) out.timeoutMs = req.timeoutMs;
  return out;
}
