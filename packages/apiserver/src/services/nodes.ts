// Nodes as the admin API sees them (GET /v1/nodes/{name}, cordon, drain, rm, join tokens) and
// what happens to their sandboxes when a node comes back (reconcile) or is lost (marked lost,
// and recreated elsewhere from their trajectories when their recovery says `replay`).
import { DsecError } from '@dsec/protocol';
import type { DrainResult, JoinToken, JoinTokenRequest, LayerCacheStats, NodeDetail, NodeUsageSample, RaisedEvent } from '@dsec/protocol';
import { requireRole, tenantOfAncestry } from '../auth.js';
import type { Principal } from '../auth.js';
import { NodeStore } from '../cluster/node-store.js';
import type { SandboxTable } from '../db/schema.js';
import { ROOT_PROJECT_ID } from '../db/store.js';
import type { StateStore } from '../db/store.js';
import { cpuPercentBetween, readMachineUse } from '../machine-use.js';
import type { MachineUse } from '../machine-use.js';
import { accelFields } from '../nodes.js';
import type { NodeEntry, NodeRegistry, NodeShare } from '../nodes.js';
import type { Placement } from '../scheduler.js';
import type { ServiceSinks, StoredSpec } from './common.js';
import { PAUSING, RESUMING, abortableSleep } from './common.js';
import type { LifecycleService } from './lifecycle.js';
import type { TrajectoryService } from './trajectories.js';

/** Label a replayed sandbox carries: the id of the sandbox it replaces. */
export const REPLAY_OF_LABEL = 'dsec.replay-of';

/** States of a sandbox that still occupies its node. */
const ON_NODE_STATES = ['running', 'paused', PAUSING, RESUMING];

/** The node port's side of membership: join tokens and revocation (absent without `--node-addr`). */
export interface NodeMembership {
  issueToken(ttlMs?: number): Promise<JoinToken>;
  /** Revokes a node's certificate and ends its session. */
  revoke(name: string): Promise<void>;
}

/** What {@link NodeService} is built from. */
export interface NodeServiceDeps {
  store: StateStore;
  nodes: NodeRegistry;
  placement: Placement;
  lifecycle: LifecycleService;
  trajectories: TrajectoryService;
  sinks: ServiceSinks;
}

/** Node administration and node loss. */
export class NodeService {
  /** Joined nodes and join tokens in the store. */
  readonly store: NodeStore;
  /** Set by the node port when the control plane takes remote nodes. */
  membership: NodeMembership | undefined;

  constructor(private readonly d: NodeServiceDeps) {
    this.store = new NodeStore(d.store.db);
  }

  /**
   * Every node (viewer), as {@link seesClusterUse} lets the key see it: a tenant's key gets each
   * node's name, health, state, backends and capacity, and null for its allocation, its
   * sandboxes by state, its layer cache and its address.
   */
  async list(p: Principal): Promise<NodeDetail[]> {
    requireRole(p, 'viewer');
    const operator = seesClusterUse(p);
    const out: NodeDetail[] = [];
    for (const n of this.d.nodes.all()) out.push(await this.detail(n, operator));
    return out;
  }

  /**
   * The nodes' allocation and use, one sample now and one every `intervalMs` until `signal`
   * aborts (viewer): what the dashboard's overview shows, pushed instead of polled. Read from
   * memory (the registry and its usage reports) and, for the in-process node, from /proc: no
   * store read per sample. The cluster's allocation, its sandboxes' use and the machine's own
   * CPU and memory are the operator's: only keys of the root project get them; a tenant's key
   * gets each node's name, health, state, backends and capacity, and null for the rest.
   */
  usageStream(p: Principal, intervalMs: number, signal: AbortSignal): AsyncGenerator<NodeUsageSample> {
    requireRole(p, 'viewer');
    return this.usageSamples(intervalMs, signal, seesClusterUse(p));
  }

  private async *usageSamples(intervalMs: number, signal: AbortSignal, operator: boolean): AsyncGenerator<NodeUsageSample> {
    let before: MachineUse | undefined;
    while (!signal.aborted) {
      const machine = operator && this.d.nodes.all().some((n) => !n.remote) ? await readMachineUse() : undefined;
      yield {
        at: new Date().toISOString(),
        items: this.d.nodes.all().map((n) => ({
          name: n.name,
          healthy: n.healthy,
          state: n.state,
          cordoned: n.cordoned === true,
          backends: [...n.backends],
          capacity: { cpu: n.capacity.cpu, memoryMiB: n.capacity.memoryMiB, sandboxes: n.capacity.sandboxes },
          allocatable: operator ? this.d.placement.allocatable(n) : null,
          allocated: operator ? { ...n.allocated } : null,
          used: operator && n.usage ? { cpu: n.usage.cpu, memoryMiB: n.usage.memoryMiB, sandboxes: n.usage.sandboxes } : null,
          machine:
            !n.remote && machine
              ? {
                  cpuPercent: before ? cpuPercentBetween(before, machine) : 0,
                  memoryUsedBytes: machine.memoryTotalBytes - machine.memoryAvailableBytes,
                  memoryTotalBytes: machine.memoryTotalBytes,
                }
              : null,
        })),
      };
      before = machine;
      await abortableSleep(intervalMs, signal);
    }
  }

  /** One node in full (admin of the root project). */
  async get(p: Principal, name: string): Promise<NodeDetail> {
    requireClusterAdmin(p);
    return this.detail(this.entry(name), seesClusterUse(p));
  }

  /** A single-use join token. */
  async joinToken(p: Principal, req: JoinTokenRequest): Promise<JoinToken> {
    requireClusterAdmin(p);
    if (!this.membership) throw new DsecError('UNAVAILABLE', 'this control plane takes no remote nodes (start it with --node-addr)');
    return this.membership.issueToken(req.ttlMs);
  }

  /** Cordons (no new placement) or uncordons a node. */
  async cordon(p: Principal, name: string, cordoned: boolean): Promise<NodeDetail> {
    requireClusterAdmin(p);
    const n = this.entry(name);
    this.d.nodes.setCordoned(name, cordoned);
    if (n.remote) await this.store.setCordoned(name, cordoned);
    return this.detail(n, seesClusterUse(p));
  }

  /**
   * Drains a node: cordons it; with `replay`, recreates each of its sandboxes elsewhere from its
   * trajectory and destroys the original once its replacement runs.
   */
  async drain(p: Principal, name: string, replay: boolean): Promise<DrainResult> {
    await this.cordon(p, name, true);
    const result: DrainResult = { node: name, replayed: [], failed: [] };
    if (!replay) return result;
    for (const row of await this.d.store.sandboxesOnNodes([name])) {
      if (row.pool_id !== null || !ON_NODE_STATES.includes(row.state)) continue;
      try {
        const to = await this.replay(row);
        result.replayed.push({ from: row.id, to });
        await this.d.lifecycle.destroyRow(row).catch((err: unknown) => this.d.sinks.log(`nodes: drain: destroying ${row.id}: ${(err as Error).message}`));
      } catch (err) {
        result.failed.push({ sandboxId: row.id, error: err instanceof DsecError ? `${err.code}: ${err.message}` : 'internal error' });
      }
    }
    return result;
  }

  /** Removes a remote node: its certificate is revoked, its session ends, its sandboxes are lost (and replayed where asked). */
  async remove(p: Principal, name: string): Promise<void> {
    requireClusterAdmin(p);
    const n = this.d.nodes.get(name);
    const row = await this.store.node(name);
    if (n && !n.remote) throw new DsecError('INVALID_ARGUMENT', `node ${name} is this control plane's own edge; it cannot be removed`, { field: 'name' });
    if (!row || row.revoked_at !== null) throw new DsecError('NOT_FOUND', `node ${name} not found`, { node: name });
    if (!this.membership) throw new DsecError('UNAVAILABLE', 'this control plane takes no remote nodes (start it with --node-addr)');
    await this.membership.revoke(name);
    await this.nodeLost(name, 'removed');
    this.d.nodes.remove(name);
  }

  /**
   * One sandbox its node reports lost (a microVM whose QEMU died: the node raised
   * `sandbox.lost` and removed what it had), or the watcher found missing from its node: the row
   * becomes `lost` and its charge is released (once: a lost row holds none). False when the row
   * was not on its node (gone, already lost, being created or deleted) or belongs to another node.
   */
  async sandboxLost(id: string, node?: string): Promise<boolean> {
    const row = await this.d.store.sandbox(id);
    // A node speaks only for its own sandboxes.
    if (!row || !ON_NODE_STATES.includes(row.state) || (node !== undefined && row.node !== node)) return false;
    if (!(await this.d.store.transitionSandbox(row.id, [row.state], 'lost'))) return false;
    this.d.nodes.forgetRecounted(row.node, row.id);
    if (row.pool_id === null) this.d.lifecycle.rowEvents.stateChanged(row, 'lost', row.state);
    this.d.nodes.chargeShare(row.node, this.d.lifecycle.shareOf(row), -1);
    return true;
  }

  /**
   * An event a node raised (the local edge's or a remote node's): a microVM whose QEMU died, or
   * a sandbox whose lazy layer's server died, makes its row lost. Never throws.
   */
  nodeEvent(ev: RaisedEvent, node?: string): void {
    if (ev.kind === 'sandbox.lost' && ev.sandboxId && (ev.data?.backend === 'microvm' || ev.data?.backend === 'vm' || ev.data?.reason === 'layer-server-lost'))
      void this.sandboxLost(ev.sandboxId, node ?? ev.node).catch((err: unknown) => this.d.sinks.log(`nodes: ${ev.sandboxId} lost: ${(err as Error).message}`));
  }

  /**
   * A node is lost (its grace ran out) or removed: every sandbox still on it is `lost`, its
   * charge released, and one whose recovery says `replay` is recreated on another node.
   */
  async nodeLost(name: string, why: 'lost' | 'removed'): Promise<void> {
    const { store, sinks } = this.d;
    for (const row of await this.d.store.sandboxesOnNodes([name])) {
      if (![...ON_NODE_STATES, 'creating'].includes(row.state)) continue;
      if (!(await store.transitionSandbox(row.id, [row.state], 'lost'))) continue;
      this.d.nodes.forgetRecounted(name, row.id);
      if (row.pool_id === null) this.d.lifecycle.rowEvents.stateChanged(row, 'lost', row.state);
      this.d.nodes.chargeShare(name, this.d.lifecycle.shareOf(row), -1);
      this.raise({
        kind: 'sandbox.lost',
        severity: 'warning',
        sandboxId: row.id,
        message: `sandbox ${row.id}: its node ${name} was ${why}; marked lost`,
        data: { node: name, reason: `node-${why}` },
      });
      if (row.pool_id !== null) continue;
      const spec = JSON.parse(row.spec) as StoredSpec;
      if (spec.recovery?.onNodeLost !== 'replay') continue;
      try {
        const to = await this.replay(row);
        sinks.log(`nodes: sandbox ${row.id} of lost node ${name} replayed as ${to}`);
      } catch (err) {
        sinks.log(`nodes: replaying ${row.id} of lost node ${name} failed: ${(err as Error).message}`);
        this.raise({
          kind: 'sandbox.replay-failed',
          severity: 'warning',
          sandboxId: row.id,
          message: `sandbox ${row.id} could not be replayed elsewhere`,
          data: { node: name, error: err instanceof DsecError ? err.code : 'INTERNAL' },
        });
      }
    }
  }

  /**
   * A node's session opened: its allocation is recounted from the store as the start counts it
   * (every row placed there but a lost one: pool members and failed rows too, whose deletes give
   * a share back; `stopping` and `creating` rows are remembered as counted here, their teardowns
   * and creates being under way on it), and every sandbox it runs that the store does not place
   * there (lost meanwhile, replayed elsewhere, deleted) is destroyed on it, so nothing runs
   * twice. Rows it no longer has are left to the watcher.
   */
  async reconcile(n: NodeEntry): Promise<{ destroyed: string[] }> {
    const onNode = await n.client.list();
    // What each row's share needs, not the rows in full: every node of a restarted replica recounts at once.
    const rows = new Map((await this.d.store.sandboxShares(n.name)).map((r) => [r.id, r]));
    const destroyed: string[] = [];
    for (const s of onNode) {
      const row = rows.get(s.id);
      // Frozen by the node itself while it was cut off, and still meant to run: it runs again.
      if (row?.state === 'running' && s.state === 'paused') {
        await n.client
          .resume(s.id, { reason: 'node-returned' })
          .catch((err: unknown) => this.d.sinks.log(`nodes: ${n.name}: resuming ${s.id}: ${(err as Error).message}`));
        continue;
      }
      // Kept: every sandbox whose row places it here and is not lost (a pool's member, a failed
      // one its owner still deletes, a create or delete under way); a lost one may run elsewhere.
      if (row && row.state !== 'lost') continue;
      await n.client.destroy(s.id).then(
        () => destroyed.push(s.id),
        (err: unknown) => this.d.sinks.log(`nodes: ${n.name}: destroying ${s.id}: ${(err as Error).message}`),
      );
    }
    const allocated = { cpu: 0, memoryMiB: 0, sandboxes: 0 };
    let microvmMemoryMiB = 0;
    const spreads = new Map<string, number>();
    const inFlight = new Map<string, NodeShare>();
    for (const row of rows.values()) {
      // Counted as the start counts them (`LifecycleService.loadAllocations`): every row but a lost
      // one, whose deletes give a share back. A `stopping` row's sandbox holds its node until its
      // teardown ends (whoever deletes the row gives its share back); one paused before its delete
      // holds no CPU.
      if (row.state === 'lost') continue;
      const share = this.d.lifecycle.shareOf(row);
      if (row.state === 'stopping' || row.state === 'creating') inFlight.set(row.id, share);
      allocated.cpu += share.cpu;
      allocated.memoryMiB += share.memoryMiB;
      allocated.sandboxes += 1;
      if (row.backend === 'microvm' || row.backend === 'vm') microvmMemoryMiB += row.memory_mib;
      if (share.spread !== undefined) spreads.set(share.spread, (spreads.get(share.spread) ?? 0) + 1);
    }
    this.d.nodes.setAllocated(n.name, allocated, spreads, microvmMemoryMiB, inFlight);
    return { destroyed };
  }

  /** Recreates a sandbox from its trajectory on another node; returns the new id. */
  private async replay(row: SandboxTable): Promise<string> {
    const labels = (await this.d.store.sandbox(row.id))?.labels ?? {};
    const recovery: Principal = {
      keyId: 'node-recovery',
      projectId: row.project_id,
      role: 'admin',
      visibleProjects: new Set([row.project_id]),
      tenantId: tenantOfAncestry(await this.d.store.ancestry(row.project_id), ROOT_PROJECT_ID),
    };
    const result = await this.d.trajectories.replay(recovery, row.id, { labels: { ...labels, [REPLAY_OF_LABEL]: row.id } });
    this.raise({
      kind: 'sandbox.replayed',
      severity: 'info',
      sandboxId: row.id,
      message: `sandbox ${row.id} was recreated as ${result.sandbox.id} on node ${result.sandbox.node} from its trajectory`,
      data: { to: result.sandbox.id, node: result.sandbox.node, steps: result.steps.length, ...(result.error ? { error: result.error.code } : {}) },
    });
    return result.sandbox.id;
  }

  private raise(ev: RaisedEvent): void {
    this.d.sinks.raise(ev);
  }

  private entry(name: string): NodeEntry {
    const n = this.d.nodes.get(name);
    if (!n) throw new DsecError('NOT_FOUND', `node ${name} not found`, { node: name });
    return n;
  }

  /** A node as the API shows it; `operator` false: without the operator's figures ({@link seesClusterUse}). */
  private async detail(n: NodeEntry, operator: boolean): Promise<NodeDetail> {
    const heardAt = n.lastHeardAt();
    const view: NodeDetail = {
      name: n.name,
      healthy: n.healthy,
      backends: [...n.backends],
      ...accelFields(n),
      capacity: { ...n.capacity },
      allocatable: null,
      allocated: null,
      state: n.state,
      cordoned: n.cordoned === true,
      remote: n.remote,
      address: null,
      version: n.version,
      joinedAt: n.joinedAt,
      lastHeardAt: heardAt === null ? null : new Date(heardAt).toISOString(),
      stateSince: new Date(n.stateSince).toISOString(),
      sandboxes: null,
    };
    if (!operator) return n.healthy && n.client.layers.cacheStats ? { ...view, layerCache: null } : view;
    const counts = await this.d.store.sandboxStatesOn(n.name);
    return {
      ...view,
      allocatable: this.d.placement.allocatable(n),
      allocated: { ...n.allocated },
      address: n.address,
      sandboxes: counts,
      ...(n.healthy && n.client.layers.cacheStats ? { layerCache: await layerCacheOf(n) } : {}),
    };
  }
}

/** A node's chunk cache of lazy layers; null when it loads none lazily or does not answer within 2 s. */
async function layerCacheOf(n: NodeEntry): Promise<LayerCacheStats | null> {
  const ask = n.client.layers.cacheStats?.();
  if (ask === undefined) return null;
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<null>((resolve) => {
    timer = setTimeout(() => resolve(null), 2_000);
  });
  try {
    return await Promise.race([ask.catch(() => null), late]);
  } finally {
    clearTimeout(timer);
  }
}

/** Node administration is for admins of the root project (the operator), not of a tenant's project. */
/**
 * Whether a key sees the operator's figures of the nodes: their allocation (every tenant's
 * together), their sandboxes, their use, the machine's own CPU and memory, their layer cache and
 * address. Only keys of the root project do; the one decision behind GET /v1/nodes (a list or
 * the usage stream) and every node reply.
 */
export function seesClusterUse(p: Principal): boolean {
  return p.projectId === ROOT_PROJECT_ID;
}

function requireClusterAdmin(p: Principal): void {
  requireRole(p, 'admin');
  if (p.projectId !== ROOT_PROJECT_ID) throw new DsecError('PERMISSION_DENIED', 'nodes are administered with a key of the root project');
}
