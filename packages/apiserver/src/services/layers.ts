// Layers owned by projects: name and digest resolution in a project's scope (itself, its
// ancestors, then the public layers), registration of layers the nodes build, listing, delete.
import { DEFAULT_TENANT_LIMITS, DsecError, invalidArgument, limitExceeded } from '@dsec/protocol';
import type { EdgeClient, Layer, LayerBuildOptions, LayerBuildSource, LayerInfo, LayerKind, TenantLimits, UpdateLayerRequest } from '@dsec/protocol';
import { requireRole } from '../auth.js';
import type { Principal } from '../auth.js';
import type { LayerTable, SnapshotTable } from '../db/schema.js';
import { PUBLIC_PROJECT_ID } from '../db/store.js';
import type { StateStore } from '../db/store.js';
import type { NodeRegistry } from '../nodes.js';

const DIGEST_RE = /^(sha256:)?[0-9a-f]{64}$/;

/** Resolves a layer reference (digest or name) to a `sha256:` digest; `field` names it in errors. */
export type LayerResolver = (ref: string, field: string) => string;

/** Normalizes a layer name to `name:tag`. */
export function layerName(ref: string): string {
  return ref.includes(':') ? ref : `${ref}:latest`;
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

/** Whether a layer row in scope is visible: any layer but an ancestor's snapshot it has not shared. */
function visibleFrom(row: LayerTable, own: ReadonlySet<string>): boolean {
  return row.kind !== 'snapshot' || own.has(row.project_id) || row.project_id === PUBLIC_PROJECT_ID || row.shared === 1;
}

function toLayer(row: LayerTable, info?: LayerInfo, snap?: SnapshotTable): Layer {
  const layer: Layer = {
    digest: row.digest,
    kind: row.kind as LayerKind,
    names: row.name ? [row.name] : [],
    project: row.project_id,
    contentBytes: info?.contentBytes ?? 0,
    files: info?.files ?? 0,
    createdAt: row.created_at,
  };
  if (snap)
    layer.snapshot = { parents: JSON.parse(snap.parents) as string[], sandboxId: snap.sandbox_id, seq: snap.seq, sharedWithSubProjects: row.shared === 1 };
  return layer;
}

/** Layers of projects. */
export class LayerService {
  constructor(
    private readonly store: StateStore,
    private readonly nodes: NodeRegistry,
    private readonly limits: Pick<TenantLimits, 'layerStorageBytesPerTenant'> = DEFAULT_TENANT_LIMITS,
    /** The projects of a tenant (whose layers count in its storage). Default: the tenant alone. */
    private readonly tenantProjects: (tenantId: string) => Promise<Set<string>> = async (t) => new Set([t]),
  ) {}

  /** Projects whose layers a project may use: itself, its ancestors, then the public ones. */
  private async scope(projectId: string): Promise<string[]> {
    return [...(await this.store.ancestry(projectId)), PUBLIC_PROJECT_ID];
  }

  /**
   * A resolver of layer references in a project (one read of its layer scope for many refs).
   * Snapshots are private to the project that took them: an ancestor's snapshot (its agents'
   * state, perhaps a graded answer) is not visible below it.
   */
  async resolver(projectId: string): Promise<LayerResolver> {
    const scope = await this.scope(projectId);
    const rows = (await this.store.layers(scope)).filter((r) => visibleFrom(r, new Set([projectId])));
    return (ref, field) => matchLayer(rows, scope, ref, field);
  }

  /**
   * Runs `fn` (the create path's resolving of one request) with a resolver over the cached
   * layer scope of the project (catalog-cache.ts); when a reference did not resolve from the
   * cache, `fn` runs again with a resolver read from the store, so that a layer added a moment
   * ago on another replica is never refused. `fn` must be safe to run twice (it only reads).
   */
  async withResolver<T>(projectId: string, fn: (resolve: LayerResolver) => Promise<T>): Promise<T> {
    const scope = await this.scope(projectId);
    const own = new Set([projectId]);
    const rows = (await this.store.cachedLayers(scope)).filter((r) => visibleFrom(r, own));
    let missed = false;
    try {
      return await fn((ref, field) => {
        try {
          return matchLayer(rows, scope, ref, field);
        } catch (err) {
          missed = true;
          throw err;
        }
      });
    } catch (err) {
      if (!missed) throw err;
    }
    return fn(await this.resolver(projectId));
  }

  /** Resolves a layer reference for a project to a `sha256:` digest. */
  async resolve(projectId: string, ref: string, field: string): Promise<string> {
    return (await this.resolver(projectId))(ref, field);
  }

  /** A snapshot layer visible to a project: 404 when unknown there, 400 when not a snapshot. */
  async resolveSnapshot(projectId: string, ref: string, field: string): Promise<SnapshotTable> {
    const digest = await this.resolve(projectId, ref, field);
    const snap = await this.store.snapshot(digest);
    if (!snap) throw invalidArgument(field, `layer ${ref} is not a snapshot`);
    return snap;
  }

  /** Records a layer built on the nodes as owned by a project (public for built-ins). */
  async register(projectId: string, info: LayerInfo, name: string | null): Promise<Layer> {
    const row = await this.store.addLayer({ projectId, digest: info.digest, kind: info.kind, name: name === null ? null : layerName(name) });
    return toLayer(row, info);
  }

  /** Builds a layer on a node and records it as the caller's project's, under `name` if given. */
  async build(p: Principal, source: LayerBuildSource, opts: LayerBuildOptions, name: string | null): Promise<Layer> {
    requireRole(p, 'member');
    const edge = this.anyEdge();
    const info = await edge.layers.build(source, opts);
    await this.checkStorage(p.tenantId, info, edge);
    return this.register(p.projectId, info, name);
  }

  /**
   * A new layer (uploaded, built or a snapshot) must fit in its tenant's layer storage (the
   * content bytes of the distinct layers its projects hold, counted once at the top-level
   * project); one that does not is removed from `edge` again (unless a project holds it) and
   * refused.
   */
  async checkStorage(tenantId: string, info: LayerInfo, edge: EdgeClient): Promise<void> {
    const digests = new Set((await this.store.layers([...(await this.tenantProjects(tenantId))])).map((r) => r.digest));
    if (digests.has(info.digest)) return;
    let used = 0;
    for (const d of digests) used += (await edge.layers.resolve(d).catch(() => undefined))?.contentBytes ?? 0;
    const max = this.limits.layerStorageBytesPerTenant;
    if (used + info.contentBytes <= max) return;
    if ((await this.store.layerRowsForDigest(info.digest)).length === 0) await edge.layers.remove(info.digest).catch(() => undefined);
    throw limitExceeded('layerStorageBytesPerTenant', max, `tenant ${tenantId} holds ${used} bytes of layers; this one adds ${info.contentBytes}`);
  }

  /** Layers a principal can see. */
  async list(p: Principal, kind?: LayerKind): Promise<Layer[]> {
    const rows = (await this.store.layers([...p.visibleProjects, ...(await this.store.ancestry(p.projectId)), PUBLIC_PROJECT_ID])).filter((r) =>
      visibleFrom(r, p.visibleProjects),
    );
    const out: Layer[] = [];
    const edge = this.anyEdge();
    for (const row of rows) {
      if (kind && row.kind !== kind) continue;
      const info = await edge.layers.resolve(row.digest).catch(() => undefined);
      out.push(toLayer(row, info, row.kind === 'snapshot' ? await this.store.snapshot(row.digest) : undefined));
    }
    return out;
  }

  /** One layer a principal can see. */
  async get(p: Principal, ref: string): Promise<Layer> {
    const digest = await this.resolve(p.projectId, ref, 'ref');
    const ancestors = new Set(await this.store.ancestry(p.projectId));
    const rows = (await this.store.layerRowsForDigest(digest)).filter(
      (r) =>
        r.project_id === PUBLIC_PROJECT_ID ||
        p.visibleProjects.has(r.project_id) ||
        r.project_id === p.projectId ||
        // An ancestor's snapshot it shares with its sub-projects.
        (r.kind === 'snapshot' && r.shared === 1 && ancestors.has(r.project_id)),
    );
    const info = await this.anyEdge()
      .layers.resolve(digest)
      .catch(() => undefined);
    const row = rows[0];
    if (!row) throw new DsecError('LAYER_NOT_FOUND', `layer ${ref} not found`, { layer: ref });
    const snap = row.kind === 'snapshot' ? await this.store.snapshot(digest) : undefined;
    return { ...toLayer(row, info, snap), names: rows.map((r) => r.name).filter((n): n is string => n !== null) };
  }

  /**
   * The image of a `disk` layer the principal can see, as raw (sparse on the node, streamed
   * whole) or qcow2: chunks read from a node until the end.
   */
  async exportDisk(p: Principal, ref: string, format: 'raw' | 'qcow2', signal?: AbortSignal): Promise<AsyncIterable<Uint8Array>> {
    const layer = await this.get(p, ref);
    const edge = this.anyEdge();
    // A full VM's snapshot is a disk image on the node (a snapshot to the API).
    const onNode = layer.kind === 'snapshot' ? (await edge.layers.resolve(layer.digest).catch(() => undefined))?.kind : layer.kind;
    if (onNode !== 'disk') throw invalidArgument('ref', `layer ${ref} is a ${layer.kind} layer, not a disk image`);
    const read = edge.layers.readDisk?.bind(edge.layers);
    if (!read) throw invalidArgument('ref', 'the node exports no disk images');
    const chunkBytes = 4 * 1024 * 1024;
    // The first slice is read before the answer starts, so a failure is still a status code.
    const first = await read(layer.digest, { format, offset: 0, length: chunkBytes });
    return (async function* () {
      let offset = 0;
      for (let chunk = first; chunk.byteLength > 0; chunk = await read(layer.digest, { format, offset, length: chunkBytes })) {
        signal?.throwIfAborted();
        yield chunk;
        offset += chunk.byteLength;
      }
    })();
  }

  /**
   * Shares a snapshot of the caller's project (or of one below it) with that project's
   * sub-projects, or makes it private again. Only the project that holds it may: a sub-project
   * that sees a shared snapshot cannot change it.
   */
  async update(p: Principal, ref: string, req: UpdateLayerRequest): Promise<Layer> {
    requireRole(p, 'member');
    const digest = await this.resolve(p.projectId, ref, 'ref');
    const mine = (await this.store.layerRowsForDigest(digest)).filter((r) => p.visibleProjects.has(r.project_id));
    const row = mine.find((r) => r.project_id === p.projectId) ?? mine[0];
    if (!row) throw new DsecError('PERMISSION_DENIED', `layer ${ref} is not owned by this project`, { layer: ref });
    if (row.kind !== 'snapshot') throw invalidArgument('shareWithSubProjects', `layer ${ref} is a ${row.kind} layer: only snapshots are private to a project`);
    await this.store.shareLayer(row.project_id, digest, req.shareWithSubProjects);
    return this.get(p, ref);
  }

  /** Drops a project's reference to a layer; the bytes go when nothing else refers to them. */
  async remove(p: Principal, ref: string): Promise<void> {
    requireRole(p, 'member');
    const digest = await this.resolve(p.projectId, ref, 'ref');
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

  /** An edge that holds layers (every node builds the same layers in this single-node form). */
  anyEdge(): EdgeClient {
    const n = this.nodes.all()[0];
    if (!n) throw new DsecError('UNAVAILABLE', 'no node is registered');
    return n.client;
  }
}
