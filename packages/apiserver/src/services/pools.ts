// Warm pools as a resource: put, list, get, delete, and the refill of one member that the
// PoolManager asks for.
import { DEFAULT_POOL_IDLE_TIMEOUT_MS, DsecError, MAX_POOLS_PER_PROJECT, invalidArgument } from '@dsec/protocol';
import type { Pool, PutPoolRequest, SandboxRequest } from '@dsec/protocol';
import { requireRole } from '../auth.js';
import type { Principal } from '../auth.js';
import type { PoolTable } from '../db/schema.js';
import type { StateStore } from '../db/store.js';
import { POOLED_STATE, poolIsIdle } from '../pools.js';
import type { PoolManager } from '../pools.js';
import type { CreatePipeline } from './create-pipeline.js';
import type { LayerService } from './layers.js';

/** Warm pools of projects. */
export class PoolService {
  constructor(
    private readonly store: StateStore,
    private readonly pipeline: CreatePipeline,
    private readonly layers: LayerService,
    private readonly manager: PoolManager,
  ) {}

  /** Creates or replaces a pool of the caller's project (name already validated); it fills in the background. */
  async put(p: Principal, name: string, req: PutPoolRequest): Promise<Pool> {
    requireRole(p, 'member');
    const item = await this.pipeline.prepare(p.projectId, req.spec, 'spec', await this.layers.resolver(p.projectId));
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
    const old = await this.store.pool(p.projectId, name);
    const { row } = await this.store.putPool({
      projectId: p.projectId,
      name,
      spec: JSON.stringify(req.spec),
      resolved: JSON.stringify(resolved),
      specKey: item.poolKey,
      size: req.size,
      idleTimeoutMs: req.idleTimeoutMs ?? DEFAULT_POOL_IDLE_TIMEOUT_MS,
      maxPools: MAX_POOLS_PER_PROJECT,
    });
    // A new spec made a new pool: the old one's ready sandboxes go now, their quota with them.
    if (old && old.id !== row.id) await this.manager.drain(old.id);
    this.manager.kick();
    return this.toPool(row);
  }

  /** The pools of the caller's project and its descendants. */
  async list(p: Principal): Promise<Pool[]> {
    requireRole(p, 'viewer');
    const rows = await this.store.pools([...p.visibleProjects]);
    const counts = await this.store.poolMemberCounts();
    return rows.map((r) => this.poolBody(r, counts.get(r.id)?.[POOLED_STATE] ?? 0));
  }

  /** One pool of the caller's project. */
  async get(p: Principal, name: string): Promise<Pool> {
    requireRole(p, 'viewer');
    return this.toPool(await this.poolRow(p, name));
  }

  /** Deletes a pool; its ready sandboxes are destroyed before this returns. */
  async remove(p: Principal, name: string): Promise<void> {
    requireRole(p, 'member');
    const row = await this.poolRow(p, name);
    await this.store.deletePool(row.id);
    await this.manager.drain(row.id);
  }

  /** Creates one ready member of a pool (the pool manager's refill); throws when refused. */
  async createMember(pool: PoolTable): Promise<void> {
    const req = JSON.parse(pool.resolved) as SandboxRequest;
    const item = await this.pipeline.prepare(pool.project_id, req, 'spec', (ref) => ref);
    const ticket = await this.pipeline.reserveAndPlace(pool.project_id, item);
    await this.pipeline.createWithTicket(pool.project_id, item, ticket, undefined, pool);
  }

  private async poolRow(p: Principal, name: string): Promise<PoolTable> {
    const row = await this.store.pool(p.projectId, name);
    if (!row) throw new DsecError('NOT_FOUND', `pool ${name} not found`, { pool: name });
    return row;
  }

  private async toPool(row: PoolTable): Promise<Pool> {
    return this.poolBody(row, (await this.store.poolMemberCounts(row.id)).get(row.id)?.[POOLED_STATE] ?? 0);
  }

  private poolBody(row: PoolTable, ready: number): Pool {
    const progress = this.manager.progress(row.id);
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
}
