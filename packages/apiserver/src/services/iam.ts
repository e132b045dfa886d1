// Identity and access: projects (nested, each quota within its parent's), API keys (a role in
// a project), and the nodes as an admin sees them.
import { DsecError, KeyedSerialQueue, limitExceeded } from '@dsec/protocol';
import type { ApiKey, CreateKeyRequest, CreateProjectRequest, NodeInfo, Project, Quota, TenantLimits } from '@dsec/protocol';
import { ROOT_PROJECT_ID } from '../db/store.js';
import { newKeySecret, requireRole, roleAtLeast } from '../auth.js';
import type { AuthRequest, Authenticator, Principal } from '../auth.js';
import type { ApiKeyTable, ProjectTable } from '../db/schema.js';
import type { StateStore } from '../db/store.js';
import { accelFields } from '../nodes.js';
import type { NodeRegistry } from '../nodes.js';
import type { Placement } from '../scheduler.js';
import type { WsTicket } from '../ws-tickets.js';

function toProject(r: ProjectTable): Project {
  return {
    id: r.id,
    name: r.name,
    parent: r.parent_id,
    quota: { sandboxes: r.quota_sandboxes, cpu: r.quota_cpu, memoryMiB: r.quota_memory_mib },
    usage: { sandboxes: r.used_sandboxes, cpu: r.used_cpu, memoryMiB: r.used_memory_mib },
    createdAt: r.created_at,
  };
}

function toKey(r: ApiKeyTable, secret?: string): ApiKey {
  const k: ApiKey = { id: r.id, name: r.name, role: r.role, project: r.project_id, createdAt: r.created_at, revokedAt: r.revoked_at };
  if (secret) k.key = secret;
  return k;
}

/** Projects, keys and the node list. */
export class IamService {
  /** A tenant's count-then-insert runs one at a time, so that concurrent requests cannot pass a limit together. */
  private readonly perTenant = new KeyedSerialQueue();

  constructor(
    private readonly store: StateStore,
    private readonly auth: Authenticator,
    private readonly nodes: NodeRegistry,
    private readonly placement: Placement,
    private readonly limits: Pick<TenantLimits, 'keysPerTenant' | 'projectsPerTenant'>,
  ) {}

  /** The principal of an `Authorization` header (UNAUTHENTICATED when it names no live key). */
  authenticate(header: string | undefined, cachedOnly?: { refuse: () => Error }, req?: AuthRequest): Promise<Principal> {
    return this.auth.authenticate(header, cachedOnly, req);
  }

  /** The principal of a single-use WebSocket ticket (ws-tickets.ts). */
  authenticateTicket(ticket: string, cachedOnly?: { refuse: () => Error }): Promise<Principal> {
    return this.auth.authenticateTicket(ticket, cachedOnly);
  }

  /**
   * A single-use WebSocket ticket for the calling key (already authenticated by its
   * `Authorization` header). A credential of another kind (an endpoint token in a path) gets none:
   * a ticket stands for a whole key.
   */
  issueWsTicket(p: Principal, authorization: string | undefined): Promise<WsTicket> {
    if (!/^Bearer\s+\S+$/i.test(authorization ?? ''))
      throw new DsecError('PERMISSION_DENIED', 'a WebSocket ticket is issued only to an API key sent as Authorization: Bearer <key>');
    return this.auth.wsTickets.issue(p.keyId);
  }

  /** Takes one request of the principal's tenant rate (`limits.requestsPerSecondPerTenant`); RATE_LIMITED when spent. */
  rateLimited(p: Principal): Promise<Principal> {
    return this.auth.rateLimited(p);
  }

  /** The tenant of a project: its top-level project (tenant limits count there). */
  tenantOf(projectId: string): Promise<string> {
    return this.auth.tenantOf(projectId);
  }

  /** Creates a sub-project of the caller's project (or of a visible one) with a quota within its parent's. */
  async createProject(p: Principal, req: CreateProjectRequest): Promise<Project> {
    requireRole(p, 'admin');
    const parentId = req.parent ?? p.projectId;
    if (!p.visibleProjects.has(parentId)) throw new DsecError('NOT_FOUND', `project ${parentId} not found`, { field: 'parent' });
    const parent = await this.store.project(parentId);
    if (!parent) throw new DsecError('NOT_FOUND', `project ${parentId} not found`, { field: 'parent' });
    // A project made directly under the root is a new tenant; one below a tenant counts in it.
    const tenantId = parentId === ROOT_PROJECT_ID ? undefined : await this.auth.tenantOf(parentId);
    return this.perTenant.run(`projects/${tenantId ?? ''}`, async () => {
      if (tenantId !== undefined) {
        const max = this.limits.projectsPerTenant;
        if ((await this.auth.descendants(tenantId)).size - 1 >= max)
          throw limitExceeded('projectsPerTenant', max, `tenant ${tenantId} has ${max} sub-projects`);
      }
      return this.insertProject(req, parent);
    });
  }

  private async insertProject(req: CreateProjectRequest, parent: ProjectTable): Promise<Project> {
    const parentId = parent.id;
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
    await this.auth.invalidate();
    return toProject(row);
  }

  /** The projects the caller can see. */
  async listProjects(p: Principal): Promise<Project[]> {
    return (await this.store.projects()).filter((r) => p.visibleProjects.has(r.id)).map(toProject);
  }

  /** One visible project. */
  async getProject(p: Principal, id: string): Promise<Project> {
    const row = p.visibleProjects.has(id) ? await this.store.project(id) : undefined;
    if (!row) throw new DsecError('NOT_FOUND', `project ${id} not found`);
    return toProject(row);
  }

  /** Creates a key in the caller's project (or a descendant) with a role no stronger than its own. */
  async createKey(p: Principal, req: CreateKeyRequest): Promise<ApiKey> {
    requireRole(p, 'admin');
    const project = req.project ?? p.projectId;
    if (!p.visibleProjects.has(project)) throw new DsecError('NOT_FOUND', `project ${project} not found`, { field: 'project' });
    if (!roleAtLeast(p.role, req.role)) throw new DsecError('PERMISSION_DENIED', `role: cannot grant ${req.role} with a ${p.role} key`, { field: 'role' });
    // Keys count in the tenant of the project they act in (the root project's count in the root's).
    const tenantId = await this.auth.tenantOf(project);
    return this.perTenant.run(`keys/${tenantId}`, async () => {
      const scope = [...(await this.auth.tenantProjects(tenantId))];
      const max = this.limits.keysPerTenant;
      if ((await this.store.keys(scope)).filter((k) => !k.revoked_at).length >= max) {
        throw limitExceeded('keysPerTenant', max, `tenant ${tenantId} has ${max} live keys; revoke some`);
      }
      return this.issueKey(project, req.name, req.role, req.format);
    });
  }

  /** Creates a key without a caller (the first admin key). */
  async issueKey(projectId: string, name: string, role: ApiKey['role'], format?: 'dsec' | 'e2b'): Promise<ApiKey> {
    const { secret, hash } = newKeySecret(format);
    const row = await this.store.createKey({ projectId, name, role, keyHash: hash });
    return toKey(row, secret);
  }

  /** The keys of the visible projects (no secrets). */
  async listKeys(p: Principal): Promise<ApiKey[]> {
    requireRole(p, 'admin');
    return (await this.store.keys([...p.visibleProjects])).map((r) => toKey(r));
  }

  /**
   * Checks again that a principal still holds (a live stream's, long after it authenticated):
   * its key exists and is not revoked, its project exists. UNAUTHENTICATED naming what changed.
   */
  async recheck(p: Principal): Promise<void> {
    const key = await this.store.key(p.keyId);
    if (!key) throw new DsecError('UNAUTHENTICATED', `key ${p.keyId} no longer exists`);
    if (key.revoked_at) throw new DsecError('UNAUTHENTICATED', `key ${p.keyId} was revoked`);
    if (!(await this.store.project(p.projectId))) throw new DsecError('UNAUTHENTICATED', `project ${p.projectId} no longer exists`);
  }

  /**
   * Calls `fn` after a change that may end principals (a key revoked, a project changed; on any
   * replica), until the returned function is called.
   */
  onPrincipalsChanged(fn: () => void): () => void {
    return this.auth.onForget(fn);
  }

  /** Revokes a key of a visible project. */
  async revokeKey(p: Principal, id: string): Promise<void> {
    requireRole(p, 'admin');
    const row = await this.store.key(id);
    if (!row || !p.visibleProjects.has(row.project_id)) throw new DsecError('NOT_FOUND', `key ${id} not found`);
    await this.store.revokeKey(id);
    await this.auth.invalidate();
  }

  /** The nodes with their capacity and allocation. */
  listNodes(p: Principal): NodeInfo[] {
    requireRole(p, 'viewer');
    return this.nodes.all().map((n) => ({
      name: n.name,
      healthy: n.healthy,
      backends: [...n.backends],
      ...accelFields(n),
      capacity: { ...n.capacity },
      allocatable: this.placement.allocatable(n),
      allocated: { ...n.allocated },
    }));
  }
}
