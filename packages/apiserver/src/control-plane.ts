// The control plane's logic, apart from HTTP: sandboxes (quota, placement, routing to their
// node), layers owned by projects, projects and keys.
import { randomBytes } from 'node:crypto';
import {
  CallBatchRequestSchema,
  CallRequestSchema,
  CreateKeyRequestSchema,
  CreateProjectRequestSchema,
  ApplyNetworkRequestSchema,
  CreateSandboxRequestSchema,
  DEFAULT_NETWORK_LOG_LIMIT,
  DEFAULT_NETWORK_POLICY,
  MAX_NETWORK_APPLY_SANDBOXES,
  NetworkLogQuerySchema,
  DEFAULT_CPU,
  DEFAULT_DISK_MIB,
  DEFAULT_MEMORY_MIB,
  DEFAULT_PAGE_SIZE,
  DEFAULT_PIDS,
  DEFAULT_SANDBOX_TIMEOUT_MS,
  DsecError,
  ListSandboxesQuerySchema,
  invalidArgument,
} from '@dsec/protocol';
import type { ApiKey, ApplyNetworkResult, EgressLogEntryBody, NetworkPolicy, SandboxNetwork, CallBatchItem, CallBatchResult, CallRequest, CallResult, GrantedResources, Layer, LayerInfo, LayerKind, NodeBody, Project, Quota, Sandbox, SandboxSpec } from '@dsec/protocol';
import type { z } from 'zod';
import { newKeySecret, requireRole, roleAtLeast } from './auth.js';
import type { Authenticator, Principal } from './auth.js';
import type { ApiKeyTable, LayerTable, ProjectTable, SandboxTable } from './db/schema.js';
import { PUBLIC_PROJECT_ID, ROOT_PROJECT_ID } from './db/store.js';
import type { StateStore } from './db/store.js';
import type { EdgeClient, NodeEntry, NodeRegistry } from './nodes.js';
import type { Placement } from './scheduler.js';

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
const DESTROYABLE_STATES = ['running', 'paused', 'failed', 'lost'];

/** Normalizes a layer name to `name:tag`. */
export function layerName(ref: string): string {
  return ref.includes(':') ? ref : `${ref}:latest`;
}

/** A sandbox row with its labels. */
export type SandboxRow = SandboxTable & { labels: Record<string, string> };

/** Counters the HTTP layer exports as metrics. */
export interface ControlPlaneCounters {
  sandboxesCreated: number;
  sandboxCreateFailures: number;
  sandboxesDestroyed: number;
  sandboxesExpired: number;
}

/** The control plane. */
export class ControlPlane {
  readonly counters: ControlPlaneCounters = { sandboxesCreated: 0, sandboxCreateFailures: 0, sandboxesDestroyed: 0, sandboxesExpired: 0 };

  constructor(
    readonly store: StateStore,
    readonly auth: Authenticator,
    readonly nodes: NodeRegistry,
    readonly placement: Placement,
  ) {}

  /** Rebuilds node allocations from the stored sandboxes (after a restart). */
  async loadAllocations(): Promise<void> {
    for (const row of await this.store.allSandboxes()) this.nodes.charge(row.node, this.cpuCharge(row), row.memory_mib, 1);
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
    if (req.network) spec.network = req.network;
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
      expires_at: new Date(createdAt.getTime() + (req.timeoutMs ?? DEFAULT_SANDBOX_TIMEOUT_MS)).toISOString(),
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

  /** The node client of a visible, running sandbox. */
  async route(p: Principal, id: string, minRole: 'viewer' | 'member' = 'member'): Promise<{ row: SandboxTable; edge: EdgeClient }> {
    requireRole(p, minRole);
    // The hot path (every exec and file operation): one indexed read, no labels.
    const row = typeof id === 'string' && id.length <= 128 ? await this.store.sandboxOnly(id) : undefined;
    if (!row || !p.visibleProjects.has(row.project_id)) throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${id} not found`, { sandboxId: id });
    const node = this.nodes.get(row.node);
    if (!node) throw new DsecError('UNAVAILABLE', `node ${row.node} of sandbox ${id} is not reachable`, { sandboxId: id });
    if (row.state !== 'running') throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${row.state}`, { sandboxId: id });
    return { row, edge: node.client };
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
    // Claim the row first: one destroyer per sandbox, and never one that is still being
    // created (its quota and node charge belong to the create until it finishes).
    if (!(await this.store.transitionSandbox(row.id, DESTROYABLE_STATES, 'stopping'))) {
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
      this.nodes.charge(row.node, this.cpuCharge(row), row.memory_mib, -1);
    }
    await this.store.deleteSandbox(row);
    this.counters.sandboxesDestroyed++;
  }

  toSandbox(row: SandboxRow): Sandbox {
    const spec = JSON.parse(row.spec) as z.infer<typeof CreateSandboxRequestSchema> & { resources: GrantedResources };
    return {
      id: row.id,
      project: row.project_id,
      node: row.node,
      backend: row.backend as Sandbox['backend'],
      state: row.state as Sandbox['state'],
      image: spec.image,
      layers: JSON.parse(row.layers) as string[],
      resources: spec.resources,
      labels: row.labels,
      envKeys: Object.keys(spec.env ?? {}),
      network: spec.network ?? DEFAULT_NETWORK_POLICY,
      createdAt: row.created_at,
      expiresAt: row.expires_at,
    };
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
      const info = how === 'replace' ? await edge.setNetwork(row.id, body) : await edge.patchNetwork(row.id, body);
      const spec = JSON.parse((await this.store.sandboxOnly(row.id))?.spec ?? row.spec) as Record<string, unknown>;
      await this.store.setSandboxSpec(row.id, JSON.stringify({ ...spec, network: info.policy }));
      return info as SandboxNetwork;
    });
  }

  /** A sandbox's network: policy, addresses, counters. */
  async getNetwork(p: Principal, id: string): Promise<SandboxNetwork> {
    const { row, edge } = await this.route(p, id, 'viewer');
    return edge.networkInfo(row.id) as SandboxNetwork;
  }

  /** The latest egress attempts of a sandbox, oldest first. */
  async networkLog(p: Principal, id: string, query: unknown): Promise<EgressLogEntryBody[]> {
    const q = parseInput(NetworkLogQuerySchema, query, 'query');
    const { row, edge } = await this.route(p, id, 'viewer');
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
