// Owner sessions: a trainer (or any client) that holds sandboxes and proves it is alive with
// heartbeats. Sandboxes of an owner that goes away get their lease's action.
import { DEFAULT_OWNER_GRACE_MS, DsecError, KeyedSerialQueue, OwnerIdSchema, limitExceeded } from '@dsec/protocol';
import type { CreateOwnerRequest, Owner, TenantLimits } from '@dsec/protocol';
import { requireRole } from '../auth.js';
import type { Principal } from '../auth.js';
import type { OwnerTable } from '../db/schema.js';
import { newId } from '../db/store.js';
import type { StateStore } from '../db/store.js';
import { toOwner } from '../leases.js';
import type { LifecycleService } from './lifecycle.js';

/** Most active owner sessions per project. */
export const MAX_OWNERS_PER_PROJECT = 10_000;

/** Owner sessions. */
export class OwnerService {
  /** A tenant's count-then-insert runs one at a time, so that concurrent opens cannot pass the limit together. */
  private readonly perTenant = new KeyedSerialQueue();

  constructor(
    private readonly store: StateStore,
    private readonly lifecycle: LifecycleService,
    private readonly limits: Pick<TenantLimits, 'ownersPerTenant'>,
    /** The projects of a tenant (itself and everything below it). */
    private readonly tenantProjects: (tenantId: string) => Promise<Set<string>>,
  ) {}

  /** An owner the principal may use: visible, and neither lost nor closed. */
  async liveOwner(p: Principal, id: string, field: string): Promise<OwnerTable> {
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
  async create(p: Principal, req: CreateOwnerRequest): Promise<Owner> {
    requireRole(p, 'member');
    if ((await this.store.activeOwnerCount(p.projectId)) >= MAX_OWNERS_PER_PROJECT) {
      throw new DsecError('QUOTA_EXCEEDED', `project ${p.projectId} has ${MAX_OWNERS_PER_PROJECT} active owner sessions; close some`, { retryAfterMs: 1000 });
    }
    return this.perTenant.run(p.tenantId, async () => {
      const max = this.limits.ownersPerTenant;
      if ((await this.store.activeOwnerCountIn([...(await this.tenantProjects(p.tenantId))])) >= max) {
        throw limitExceeded('ownersPerTenant', max, `tenant ${p.tenantId} has ${max} active owner sessions; close some`);
      }
      const now = new Date().toISOString();
      const row: OwnerTable = {
        id: newId('own'),
        project_id: p.projectId,
        name: req.name ?? null,
        grace_ms: req.graceMs ?? DEFAULT_OWNER_GRACE_MS,
        state: 'active',
        created_at: now,
        heartbeat_at: now,
        closed_at: null,
      };
      await this.store.insertOwner(row);
      return toOwner(row, 0);
    });
  }

  /** GET /v1/owners/{id} */
  async get(p: Principal, id: string): Promise<Owner> {
    requireRole(p, 'viewer');
    const row = await this.ownerRow(p, id);
    return toOwner(row, await this.store.ownedCount(row.id));
  }

  /**
   * POST /v1/owners/{id}/heartbeat. An owner that was lost is active again, and its sandboxes
   * that were paused because it was lost are resumed.
   */
  async heartbeat(p: Principal, id: string): Promise<Owner> {
    requireRole(p, 'member');
    const before = await this.ownerRow(p, id);
    if (before.state === 'closed') throw new DsecError('CONFLICT', `owner ${id} is closed`, { field: 'id' });
    const row = await this.store.heartbeatOwner(id, new Date().toISOString());
    if (!row) throw new DsecError('CONFLICT', `owner ${id} is closed`, { field: 'id' });
    if (before.state === 'lost') {
      for (const s of await this.store.sandboxesOfOwner(id)) {
        if (s.state === 'paused' && s.pause_reason === 'owner-lost') await this.lifecycle.resumeRow(s, 'owner-returned').catch(() => undefined);
      }
    }
    return toOwner(row, await this.store.ownedCount(id));
  }

  /**
   * DELETE /v1/owners/{id}: the owner is gone now rather than after its grace. Its sandboxes
   * get their `onOwnerLost` action on the watcher's next pass (pause by default: a client
   * that closes and later comes back finds them).
   */
  async close(p: Principal, id: string): Promise<void> {
    requireRole(p, 'member');
    await this.ownerRow(p, id);
    await this.store.transitionOwner(id, ['active', 'lost'], 'closed', new Date().toISOString());
  }
}
