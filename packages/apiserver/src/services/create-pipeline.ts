// The path of one create: a validated request resolved (layers, resources, lease, hashes), a
// warm pool's member claimed when one matches, else quota and a node reserved (or waited for),
// the sandbox created on its node, its trajectory opened. Nothing is left behind on failure.
import { randomBytes } from 'node:crypto';
import {
  DEFAULT_CPU,
  DEFAULT_DISK_MIB,
  DEFAULT_MEMORY_MIB,
  DEFAULT_PIDS,
  DsecError,
  IDEMPOTENCY_KEY_HEADER,
  MAX_SANDBOX_TIMEOUT_MS,
  invalidArgument,
  restrictedEntries,
} from '@dsec/protocol';
import { MAX_CREATE_MANY } from '@dsec/protocol';
import type {
  Admission,
  BackendKind,
  EdgeCreateItem,
  EdgeSandbox,
  GrantedLease,
  GrantedResources,
  ImageSpec,
  Sandbox,
  SandboxRequest,
  SandboxSpec,
} from '@dsec/protocol';
import type { AdmissionQueue, Admitted } from '../admission.js';
import type { Principal } from '../auth.js';
import type { IdempotencyKeyTable, PoolTable, SandboxTable } from '../db/schema.js';
import { crashPoint } from '../crash-points.js';
import { WriteGroups } from '../db/write-groups.js';
import type { Reservation, StateStore } from '../db/store.js';
import { hashOf } from '../idempotency.js';
import type { IdempotencyKeys } from '../idempotency.js';
import { grantLease, nextLeaseCheckMs } from '../leases.js';
import type { NodeEntry, NodeRegistry } from '../nodes.js';
import { POOLED_STATE } from '../pools.js';
import type { PoolManager } from '../pools.js';
import { spreadOf } from '../scheduler.js';
import type { Placement, PlacementRequest } from '../scheduler.js';
import type { TrajectoryLog } from '../trajectory.js';
import { chainOf, trajectorySpec } from './common.js';
import type { PlatformCounters, ServiceSinks } from './common.js';
import type { LayerResolver, LayerService } from './layers.js';
import type { LifecycleService } from './lifecycle.js';
import type { OwnerService } from './owners.js';
import { refuseRestricted } from './networks.js';

/** Fields of a create request a pool claim applies; every other field must match the pool's spec. */
const CLAIM_FIELDS = ['env', 'labels', 'timeoutMs', 'lease', 'owner'] as const;
/** The idempotency header's name, used as the field of its errors. */
export const IDEMPOTENCY_FIELD = IDEMPOTENCY_KEY_HEADER;

/** Merges run-time rules (deny-path, deny-syscall, deny-domain) into a new sandbox's spec. */
export type SpecTightener = (projectId: string, spec: SandboxSpec) => Promise<SandboxSpec>;

/** A create request, validated and resolved: what the create pipeline works on. */
export interface CreateItem {
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
  /**
   * Worked out once per item (a batch's `spec` is one item for all of its creates): the row's
   * spec JSON ({@link rowSpecOf}), its layers (and their JSON), the lease's JSON, and whether
   * its node create may share a createMany message ({@link groupable}).
   */
  rowSpec: string;
  layers: string[];
  layersJson: string;
  leaseJson: string;
  groupable: boolean;
}

/** Capacity held for one create: its quota reservation and a charge on its node. */
export interface Ticket extends Admitted {
  node: NodeEntry;
  reservation: Reservation;
}

/** What {@link CreatePipeline} is built from. */
export interface CreatePipelineDeps {
  store: StateStore;
  nodes: NodeRegistry;
  placement: Placement;
  admission: AdmissionQueue;
  idempotency: IdempotencyKeys;
  pools: PoolManager;
  lifecycle: LifecycleService;
  owners: OwnerService;
  layers: LayerService;
  trajectory: TrajectoryLog;
  counters: PlatformCounters;
  sinks: ServiceSinks;
  /** Run-time rules applied to every new sandbox (none: the spec as asked). */
  tighten?: SpecTightener | undefined;
  /** Capacity went back: wake waiting creates, refill pools. */
  onCapacityFreed: () => void;
}

/** The quota one item takes. */
export function reservationOf(item: CreateItem): Reservation {
  return { sandboxes: 1, cpu: item.resources.cpu, memoryMiB: item.resources.memoryMiB };
}

/** What placement needs of one item. */
export function placementOf(item: CreateItem): PlacementRequest {
  return {
    backend: item.backend,
    cpu: item.resources.cpu,
    memoryMiB: item.resources.memoryMiB,
    cpuClass: item.resources.cpuClass,
    spread: spreadOf(item.spec.labels),
  };
}

/** The refusal of an item no node has room for. */
export function capacityError(item: CreateItem): DsecError {
  const r = item.resources;
  return new DsecError('CAPACITY_EXHAUSTED', `no node has room for this sandbox (${item.backend}, ${r.cpu} cpu, ${r.memoryMiB} MiB)`, { retryAfterMs: 1000 });
}

/** The sandbox spec JSON kept in a row: the request with its backend and granted resources. */
function rowSpecOf(req: SandboxRequest, backend: BackendKind, resources: GrantedResources, spec: SandboxSpec): string {
  return JSON.stringify({ ...req, backend, resources, ...(spec.protect ? { protect: spec.protect } : {}) });
}

/** The layers a sandbox of `spec` is made of, base first. */
function layersOf(spec: SandboxSpec): string[] {
  return [spec.image.base, spec.image.workspace, ...(spec.image.toolkits ?? []), ...(spec.snapshots ?? [])].filter((l): l is string => Boolean(l));
}

/**
 * The largest spec (as JSON) a grouped node create carries: a group of MAX_CREATE_MANY such
 * items, and its answer, stay well under the node protocol's frame limit (a larger one, a big
 * `env`, goes alone in a message of its own).
 */
const MAX_GROUPED_SPEC_BYTES = 64 * 1024;

/**
 * Whether a create may share a createMany message: only containers (whose creates take tens of
 * milliseconds; a node answers a group once all of its items settle, so a VM boot or a fork
 * with memory would hold up the fast creates beside it) with a small spec.
 */
export function groupable(spec: SandboxSpec): boolean {
  if ((spec.backend ?? 'container') !== 'container' || spec.memoryOf !== undefined) return false;
  return Buffer.byteLength(JSON.stringify(spec)) <= MAX_GROUPED_SPEC_BYTES;
}

/** Random bytes for sandbox ids, drawn from the CSPRNG 4 KiB at a time (512 ids a call into OpenSSL, not one each). */
const idEntropy = { bytes: Buffer.alloc(0), at: 0 };

/** A new sandbox's id on `node`: the node's name and 8 random bytes in hex. */
function newSandboxId(node: string): string {
  if (idEntropy.at + 8 > idEntropy.bytes.length) {
    idEntropy.bytes = randomBytes(4096);
    idEntropy.at = 0;
  }
  const suffix = idEntropy.bytes.toString('hex', idEntropy.at, idEntropy.at + 8);
  idEntropy.at += 8;
  return `${node}-${suffix}`;
}

/** One node create waiting for its node's next createMany message. */
interface NodeCreate {
  node: NodeEntry;
  item: EdgeCreateItem;
}

/** Resolves, admits, places and creates sandboxes one item at a time. */
export class CreatePipeline {
  /**
   * Creates placed on one node in the same turn of the event loop (a batch's items, concurrent
   * single creates) go to it in one createMany message, where the node's client has one (the
   * node protocol): one message and one answer for many creates instead of one each. A group
   * does not wait for the node's group in flight (the groups overlap, as single creates did).
   */
  readonly nodeCreates = new WriteGroups<NodeCreate, EdgeSandbox>(
    async (_node, creates) => {
      const client = creates[0]!.node.client;
      const out = await client.createMany!(creates.map((c) => c.item));
      return out.map((r) => ('sandbox' in r ? r.sandbox : r.error));
    },
    MAX_CREATE_MANY,
    true,
  );

  constructor(private readonly d: CreatePipelineDeps) {}

  /**
   * Creates one sandbox on its node: grouped with the node's other creates of this moment when
   * the node's client takes many at once, else alone. A grouped create whose request was
   * cancelled meanwhile is destroyed on the node again.
   */
  private async nodeCreate(node: NodeEntry, item: CreateItem, id: string, signal: AbortSignal | undefined): Promise<void> {
    const spec = item.spec;
    if (!node.client.createMany || !item.groupable) {
      await node.client.create(spec, signal ? { id, signal } : { id });
      return;
    }
    signal?.throwIfAborted();
    await this.nodeCreates.submit(node.name, { node, item: { spec, id } });
    if (signal?.aborted) {
      await node.client.destroy(id).catch(() => undefined);
      throw new DsecError('CANCELLED', 'the request was cancelled while its sandbox was created');
    }
  }

  /** Resolves a validated request: layers to digests, resources granted, the pool and request hashes. */
  async prepare(projectId: string, req: SandboxRequest, prefix: string, resolve: LayerResolver, p?: Principal): Promise<CreateItem> {
    const at = (f: string): string => (prefix ? `${prefix}.${f}` : f);
    const requestHash = hashOf(req);
    const lease = grantLease(req, at);
    if (req.owner !== undefined) {
      // Only a caller's own request names an owner (pool members get theirs at claim).
      if (!p) throw invalidArgument(at('owner'), 'an owner is given at claim, not in a pool');
      await this.d.owners.liveOwner(p, req.owner, at('owner'));
    }
    const backend = req.backend ?? 'container';
    if ((req.image === undefined) === (req.snapshot === undefined)) throw invalidArgument(at('image'), 'give exactly one of image or snapshot');
    let image: SandboxSpec['image'];
    let snapshots: string[] = [];
    if (req.snapshot !== undefined) {
      // A snapshot brings its parents: the image it was taken over, and older snapshots.
      const snap = await this.d.layers.resolveSnapshot(projectId, req.snapshot, at('snapshot'));
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
    if (req.network) {
      refuseRestricted(projectId, restrictedEntries(req.network), at('network'));
      spec.network = req.network;
    }
    if (this.d.tighten) spec = await this.d.tighten(projectId, spec);
    const rest: Record<string, unknown> = { ...req };
    for (const f of CLAIM_FIELDS) delete rest[f];
    const poolKey = hashOf({ ...rest, backend, image, resources: spec.resources });
    const layers = layersOf(spec);
    return {
      req,
      spec,
      resources,
      backend,
      lease,
      poolKey,
      requestHash,
      rowSpec: rowSpecOf(req, backend, resources, spec),
      layers,
      layersJson: JSON.stringify(layers),
      leaseJson: JSON.stringify(lease),
      groupable: groupable(spec),
    };
  }

  /** Creates one item whose idempotency key (if any) the caller holds; completes or releases it. */
  async createHeld(
    projectId: string,
    item: CreateItem,
    admission: Admission,
    signal: AbortSignal | undefined,
    key: string | undefined,
    ticket?: Ticket,
  ): Promise<Sandbox> {
    try {
      let sb: Sandbox | undefined;
      if (!ticket) sb = await this.claimFromPool(projectId, item, key);
      if (!sb) {
        const held =
          ticket ??
          (await this.d.admission.admit(projectId, () => this.reserveAndPlace(projectId, item), {
            wait: admission.wait,
            timeoutMs: admission.timeoutMs,
            signal,
          }));
        sb = await this.createWithTicket(projectId, item, held, signal, undefined, key);
      }
      if (key !== undefined) await this.d.idempotency.complete(projectId, key, sb);
      return sb;
    } catch (err) {
      if (key !== undefined) await this.d.idempotency.release(projectId, key);
      throw err;
    }
  }

  /** The reply to a retry: the sandbox as it is now, or the first reply if it is gone. */
  async replayIdempotent(row: IdempotencyKeyTable): Promise<Sandbox> {
    this.d.counters.idempotentReplays++;
    const now = row.sandbox_id ? await this.d.store.sandbox(row.sandbox_id) : undefined;
    // A deleted one (`stopping`: its teardown may still run) is gone, as it is for GET.
    if (now && now.project_id === row.project_id && now.pool_id === null && now.state !== 'stopping') return this.d.lifecycle.toSandbox(now);
    if (row.response) return JSON.parse(row.response) as Sandbox;
    if (row.sandbox_id) throw new DsecError('SANDBOX_NOT_FOUND', `the sandbox ${row.sandbox_id} created with ${IDEMPOTENCY_FIELD} ${row.key} is gone`);
    throw new DsecError('CONFLICT', `${IDEMPOTENCY_FIELD} ${row.key} belongs to a batch, not to one sandbox`, { field: IDEMPOTENCY_FIELD });
  }

  /** Adds (or removes) one item's requests to a node's allocation. */
  chargeNode(node: NodeEntry, item: CreateItem, sign: 1 | -1): void {
    this.d.nodes.charge(node.name, this.d.placement.cpuCharge(item.resources), item.resources.memoryMiB, sign, spreadOf(item.spec.labels), item.backend);
  }

  /**
   * Reserves quota and a node for one create (the admission attempt); throws a capacity refusal.
   * A fork with memory (`memorySource`) is placed on its source's node or nowhere.
   */
  async reserveAndPlace(projectId: string, item: CreateItem, memorySource?: SandboxTable): Promise<Ticket> {
    const reservation = reservationOf(item);
    await this.d.store.reserve(projectId, reservation);
    const nodes = memorySource ? this.d.nodes.all().filter((n) => n.name === memorySource.node) : this.d.nodes.all();
    const node = this.d.placement.place(placementOf(item), nodes);
    if (!node) {
      await this.d.store.unreserve(projectId, reservation);
      if (memorySource)
        throw new DsecError('CAPACITY_EXHAUSTED', `node ${memorySource.node} of sandbox ${memorySource.id} has no room for a fork with memory`, {
          sandboxId: memorySource.id,
          retryAfterMs: 1000,
        });
      throw capacityError(item);
    }
    this.chargeNode(node, item, 1);
    crashPoint('create.reserved');
    return this.ticket(projectId, item, node, reservation);
  }

  /** A ticket for capacity already reserved and charged; its release gives both back. */
  ticket(projectId: string, item: CreateItem, node: NodeEntry, reservation: Reservation): Ticket {
    return {
      node,
      reservation,
      release: async () => {
        this.chargeNode(node, item, -1);
        await this.d.store.unreserve(projectId, reservation);
        this.d.onCapacityFreed();
      },
    };
  }

  /**
   * Creates a sandbox with the capacity a ticket holds; a node that refuses is excluded and
   * placement runs again. On failure the reservation is returned and nothing is left behind.
   * `key`: the pending idempotency key this create holds (it records the sandbox's id with its row).
   */
  async createWithTicket(
    projectId: string,
    item: CreateItem,
    ticket: Ticket,
    signal: AbortSignal | undefined,
    pool?: PoolTable,
    key?: string,
  ): Promise<Sandbox> {
    let node = ticket.node;
    const refused = new Set<string>();
    try {
      for (;;) {
        const created = await this.createOn(node, projectId, item, signal, pool, key);
        if (created) {
          this.d.counters.sandboxesCreated++;
          return created;
        }
        refused.add(node.name);
        const next = this.d.placement.place(placementOf(item), this.d.nodes.all(), refused);
        if (!next) throw capacityError(item);
        this.chargeNode(next, item, 1);
        node = next;
      }
    } catch (err) {
      this.d.counters.sandboxCreateFailures++;
      if (!(err instanceof SettledElsewhere)) await this.d.store.unreserve(projectId, ticket.reservation);
      this.d.onCapacityFreed();
      throw err;
    }
  }

  /**
   * Creates on one node that is already charged for it; undefined when the node refused for
   * want of capacity. On any failure the node's charge and the row are undone. A pool's member
   * is created without env or labels and is left `pooled`.
   */
  private async createOn(
    node: NodeEntry,
    projectId: string,
    item: CreateItem,
    signal: AbortSignal | undefined,
    pool?: PoolTable,
    key?: string,
  ): Promise<Sandbox | undefined> {
    const id = newSandboxId(node.name);
    const createdAt = new Date();
    const lifetimeMs = pool ? MAX_SANDBOX_TIMEOUT_MS : item.lease.maxLifetimeMs;
    const row: SandboxTable = {
      id,
      project_id: projectId,
      node: node.name,
      backend: item.backend,
      state: 'creating',
      spec: item.rowSpec,
      layers: item.layersJson,
      cpu: item.resources.cpu,
      memory_mib: item.resources.memoryMiB,
      created_at: createdAt.toISOString(),
      expires_at: new Date(createdAt.getTime() + lifetimeMs).toISOString(),
      pool_id: pool?.id ?? null,
      // A pool's member gets its lease and owner when it is claimed.
      owner_id: pool ? null : (item.req.owner ?? null),
      lease: pool ? null : item.leaseJson,
      last_active_at: createdAt.toISOString(),
      // The lease pass need not look at it before its idle timeout can be due.
      lease_check_ms: pool ? null : nextLeaseCheckMs(item.lease, createdAt.getTime()),
      paused_at: null,
      pause_reason: null,
    };
    let onNode = false;
    let inserted = false;
    try {
      await this.d.store.insertSandbox(row, item.req.labels ?? {}, key);
      inserted = true;
      crashPoint('create.row');
      await this.nodeCreate(node, item, id, signal);
      onNode = true;
      crashPoint('create.node');
      row.state = pool ? POOLED_STATE : 'running';
      // Grouped with the other creates finishing now: one UPDATE for all of them.
      // Settled meanwhile (this replica was taken for gone): the row is no longer this create's.
      if (!(await this.d.store.transitionSandboxGrouped(id, ['creating'], row.state))) {
        throw new DsecError('UNAVAILABLE', settledElsewhere(id));
      }
      this.d.nodes.forgetRecounted(node.name, id);
      crashPoint('create.running');
    } catch (err) {
      // Whichever step failed, nothing of this create stays: the node's charge, the sandbox on
      // its node, the row (deleted by id even when its insert failed: an insert whose answer was
      // lost may have committed).
      this.chargeNode(node, item, -1);
      this.d.nodes.forgetRecounted(node.name, id);
      if (onNode) await node.client.destroy(id).catch(() => undefined);
      const deleted = await this.d.store.deleteFailedCreateRow(row);
      // Its row was written and is gone: whoever settled it gave the reservation back with it.
      if (inserted && !deleted) throw new SettledElsewhere(id, err);
      if (!onNode && err instanceof DsecError && err.code === 'CAPACITY_EXHAUSTED') return undefined;
      throw err;
    }
    if (pool) return this.d.lifecycle.toSandbox({ ...row, labels: item.req.labels ?? {} });
    this.openTrajectory(row, item, item.layers);
    const sandbox = this.d.lifecycle.toSandbox({ ...row, labels: item.req.labels ?? {} });
    this.d.lifecycle.rowEvents.created(sandbox, item.req.labels ?? {});
    return sandbox;
  }

  /**
   * A fork with memory of `source`: created on the source's node alone (the node copies the
   * source's memory and writable disk, `spec.memoryOf`), never claimed from a pool nor placed
   * elsewhere; admitted as any create (the project's admission queue, its quota and the node's
   * charge). Its layers must be the source's (a name that moved since the source was made is a
   * conflict).
   */
  async createMemoryFork(projectId: string, item: CreateItem, source: SandboxTable, admission: Admission, signal: AbortSignal | undefined): Promise<Sandbox> {
    if (item.layersJson !== source.layers) {
      throw new DsecError('CONFLICT', `sandbox ${source.id}: its image now resolves to other layers; a fork with memory needs the source's own`, {
        sandboxId: source.id,
      });
    }
    const fork: CreateItem = { ...item, spec: { ...item.spec, memoryOf: source.id }, groupable: false };
    const ticket = await this.d.admission.admit(projectId, () => this.reserveAndPlace(projectId, fork, source), {
      wait: admission.wait,
      timeoutMs: admission.timeoutMs,
      signal,
    });
    try {
      const created = await this.createOn(ticket.node, projectId, fork, signal);
      if (!created) throw capacityError(fork);
      this.d.counters.sandboxesCreated++;
      return created;
    } catch (err) {
      this.d.counters.sandboxCreateFailures++;
      if (!(err instanceof SettledElsewhere)) await this.d.store.unreserve(projectId, ticket.reservation);
      this.d.onCapacityFreed();
      throw err;
    }
  }

  /** Starts the trajectory of a sandbox its caller now holds (created, or claimed from a pool). */
  private openTrajectory(row: SandboxTable, item: CreateItem, layers: string[]): void {
    this.d.trajectory.open({
      sandboxId: row.id,
      projectId: row.project_id,
      spec: trajectorySpec(item.req, item.spec),
      layers,
      createdAt: row.created_at,
    });
  }

  /**
   * Claims a ready sandbox from one of the project's pools whose spec matches, in one
   * transaction, and hands it over on its node (env, labels); the row is `creating` until then,
   * so that a claim cut short by a crash is rolled back as a create is (reconcile.ts), by the
   * start-up reconcile or, beside live replicas, with the dead replica's work. Undefined when none is ready.
   * `key`: the pending idempotency key this create holds (it records the claimed id in the claim's transaction).
   */
  async claimFromPool(projectId: string, item: CreateItem, key?: string): Promise<Sandbox | undefined> {
    const now = new Date();
    const labels = item.req.labels ?? {};
    const row = await this.d.store.claimPooled({
      projectId,
      specKey: item.poolKey,
      spec: item.rowSpec,
      labels,
      createdAt: now.toISOString(),
      expiresAt: new Date(now.getTime() + item.lease.maxLifetimeMs).toISOString(),
      lease: item.leaseJson,
      ownerId: item.req.owner ?? null,
      idempotencyKey: key,
    });
    if (!row) return undefined;
    this.d.pools.claimed();
    crashPoint('claim.row');
    try {
      const node = this.d.nodes.get(row.node);
      if (!node) throw new DsecError('UNAVAILABLE', `node ${row.node} is not reachable`);
      await node.client.claim(row.id, { ...(item.req.env ? { env: item.req.env } : {}), ...(item.req.labels ? { labels } : {}) });
      crashPoint('claim.node');
      // Settled meanwhile (this replica was taken for gone): the row is no longer this claim's.
      if (!(await this.d.store.transitionSandboxGrouped(row.id, ['creating'], 'running'))) throw new Error(`claimed ${row.id} was settled elsewhere`);
      this.d.nodes.forgetRecounted(row.node, row.id);
      row.state = 'running';
      crashPoint('claim.running');
    } catch {
      // The member cannot be handed over (its node or sandbox is gone, or it was used): it is
      // dropped, and this create goes on without the pool. Nobody has seen its id yet.
      await this.discardClaimed(row);
      return undefined;
    }
    this.d.counters.poolClaims++;
    // A member's row keeps the layers it was made of (the same digests: its pool's key matched).
    this.openTrajectory(row, item, JSON.parse(row.layers) as string[]);
    const sandbox = this.d.lifecycle.toSandbox({ ...row, labels });
    this.d.lifecycle.rowEvents.created(sandbox, labels);
    return sandbox;
  }

  /** Removes a claimed pool member that could not be handed over. */
  private async discardClaimed(row: SandboxTable): Promise<void> {
    const node = this.d.nodes.get(row.node);
    if (node) {
      await node.client.destroy(row.id).catch(() => undefined);
      this.d.nodes.chargeShare(row.node, this.d.lifecycle.shareOf(row), -1);
      // Given back here: a recount that counted the claim (`creating`) must not give it back again.
      this.d.nodes.forgetRecounted(row.node, row.id);
    }
    await this.d.store.deleteSandbox(row);
    this.d.onCapacityFreed();
  }
}

/**
 * A create whose row another replica settled while it ran (this replica was taken for gone): the
 * reservation went back with the row, so the create must not give it back again.
 */
class SettledElsewhere extends DsecError {
  constructor(id: string, cause: unknown) {
    super('UNAVAILABLE', settledElsewhere(id), {}, { cause });
  }
}

/** Why a create whose row another replica settled meanwhile fails. */
function settledElsewhere(id: string): string {
  return `sandbox ${id}: its create was settled by another replica meanwhile; create it again`;
}
