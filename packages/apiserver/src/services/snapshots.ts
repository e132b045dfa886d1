// Snapshots (a sandbox's writable layer packed into a layer of its project) and forks (one
// snapshot, then N sandboxes from it).
import { CreateSandboxRequestSchema, DsecError, MAX_SNAPSHOT_DEPTH, invalidArgument, normalizeLayerName, parseOrThrow, forEachBounded } from '@dsec/protocol';
import type { BackendKind, CreateSandboxRequest, ForkRequest, ForkResult, Layer, Sandbox, SnapshotRequest } from '@dsec/protocol';
import { requireRole, tenantOfAncestry } from '../auth.js';
import type { Principal } from '../auth.js';
import { crashPoint } from '../crash-points.js';
import { ROOT_PROJECT_ID } from '../db/store.js';
import type { StateStore } from '../db/store.js';
import type { TrajectoryLog } from '../trajectory.js';
import { specOf } from './common.js';
import type { LayerService } from './layers.js';
import type { LifecycleService } from './lifecycle.js';
import type { SandboxService } from './sandboxes.js';

/** Creates a fork runs at once. */
const FORK_CONCURRENCY = 4;

/** Snapshots and forks. */
export class SnapshotService {
  constructor(
    private readonly store: StateStore,
    private readonly lifecycle: LifecycleService,
    private readonly layers: LayerService,
    private readonly sandboxes: SandboxService,
    private readonly trajectory: TrajectoryLog,
  ) {}

  /**
   * Packs a running sandbox's writable layer into a snapshot layer owned by its project (the
   * sandbox is frozen while it is read). Sandboxes created from it get its parents plus it.
   */
  async snapshot(p: Principal, id: string, req: SnapshotRequest, signal?: AbortSignal): Promise<Layer> {
    requireRole(p, 'member');
    const name = req.name === undefined ? null : normalizeLayerName(req.name);
    // A paused sandbox is packed as it is and stays paused (the node reads its frozen files).
    const { row, edge } = await this.lifecycle.route(p, id, 'member', { paused: 'allow' });
    const spec = await specOf(this.store, row);
    if ((spec.snapshots?.length ?? 0) >= MAX_SNAPSHOT_DEPTH) {
      throw new DsecError('CONFLICT', `sandbox ${id} sits on a chain of ${MAX_SNAPSHOT_DEPTH} snapshots, the most there can be; start again from an image`, {
        sandboxId: id,
      });
    }
    const seq = await this.trajectory.position(row.id);
    const info = await edge.snapshot(row.id, signal ? { signal } : {});
    crashPoint('snapshot.node');
    // A snapshot layer counts in its sandbox's tenant's layer storage as an uploaded one does.
    await this.layers.checkStorage(tenantOfAncestry(await this.store.ancestry(row.project_id), ROOT_PROJECT_ID), info, edge);
    const snap = await this.store.addSnapshot({
      digest: info.digest,
      project_id: row.project_id,
      sandbox_id: row.id,
      seq,
      image: JSON.stringify(spec.image),
      parents: row.layers,
      created_at: new Date().toISOString(),
    });
    crashPoint('snapshot.row');
    // A full VM's snapshot is a whole disk image on the node, but a snapshot to the API: private
    // to its project as any snapshot, and its forks boot it over the same recorded parents.
    const layer = await this.layers.register(row.project_id, info.kind === 'disk' ? { ...info, kind: 'snapshot' } : info, name);
    if (req.shareWithSubProjects) await this.store.shareLayer(row.project_id, info.digest, true);
    return {
      ...layer,
      snapshot: {
        parents: JSON.parse(snap.parents) as string[],
        sandboxId: snap.sandbox_id,
        seq: snap.seq,
        sharedWithSubProjects: req.shareWithSubProjects === true,
      },
    };
  }

  /**
   * One snapshot, then `count` sandboxes from it in the source's project (quota checked for
   * each). All or nothing: when one create fails, the ones made are destroyed and the error
   * (with `details.snapshot`, which stays) is thrown.
   */
  async fork(p: Principal, id: string, req: ForkRequest, signal?: AbortSignal): Promise<ForkResult> {
    requireRole(p, 'member');
    if (req.memory === true) return this.forkWithMemory(p, id, req, signal);
    const source = await this.lifecycle.sandboxRow(p, id);
    const snapshot = await this.snapshot(p, id, {}, signal);
    const spec = await specOf(this.store, source);
    const owner: Principal = { ...p, projectId: source.project_id };
    // Composed from the source and the request (labels merged): checked as any create is.
    const create = parseOrThrow(CreateSandboxRequestSchema, {
      backend: spec.backend as BackendKind,
      snapshot: snapshot.digest,
      resources: spec.resources,
      ...(spec.env ? { env: spec.env } : {}),
      labels: { ...source.labels, ...req.labels },
      ...(req.timeoutMs !== undefined ? { timeoutMs: req.timeoutMs } : {}),
    });
    const made: Sandbox[] = [];
    let failure: unknown;
    const slots = Array.from({ length: req.count }, (_, i) => i);
    await forEachBounded(
      slots,
      FORK_CONCURRENCY,
      async () => {
        try {
          made.push(await this.sandboxes.create(owner, create, signal ? { signal } : {}));
        } catch (err) {
          failure ??= err;
        }
      },
      () => failure !== undefined,
    );
    if (failure !== undefined) {
      for (const sb of made) {
        const row = await this.store.sandbox(sb.id);
        if (row) await this.lifecycle.destroyRow(row).catch(() => undefined);
      }
      if (failure instanceof DsecError) failure.details.snapshot = snapshot.digest;
      throw failure instanceof Error ? failure : new DsecError('INTERNAL', 'internal error');
    }
    made.sort((a, b) => a.createdAt.localeCompare(b.createdAt) || a.id.localeCompare(b.id));
    return { snapshot, sandboxes: made };
  }

  /**
   * `count` forks with memory of a running or paused VM, one after the other (each copies the
   * source's memory and disk at its own instant, the source stopped meanwhile): each resumes
   * where the source was, on its node, with the source's image, resources, env and network
   * policy, and labels merged as for any fork. No snapshot layer. All or nothing, as `fork`.
   */
  private async forkWithMemory(p: Principal, id: string, req: ForkRequest, signal?: AbortSignal): Promise<ForkResult> {
    const source = await this.lifecycle.sandboxRow(p, id);
    if (source.backend !== 'microvm' && source.backend !== 'vm') {
      throw invalidArgument('memory', `a ${source.backend} sandbox cannot be forked with its memory (only microvm and vm)`);
    }
    if (source.state !== 'running' && source.state !== 'paused') {
      throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${source.state}`, { sandboxId: id });
    }
    const spec = await specOf(this.store, source);
    // The request as it was made (network policy, guards); the image as the layers it resolved to.
    const asked = JSON.parse(source.spec) as Partial<CreateSandboxRequest>;
    const owner: Principal = { ...p, projectId: source.project_id };
    const create = parseOrThrow(CreateSandboxRequestSchema, {
      backend: spec.backend as BackendKind,
      ...(spec.snapshot !== undefined ? { snapshot: spec.snapshot } : { image: spec.image }),
      resources: spec.resources,
      ...(spec.env ? { env: spec.env } : {}),
      ...(asked.network ? { network: asked.network } : {}),
      ...(asked.protect ? { protect: asked.protect } : {}),
      ...(asked.security ? { security: asked.security } : {}),
      labels: { ...source.labels, ...req.labels },
      ...(req.timeoutMs !== undefined ? { timeoutMs: req.timeoutMs } : {}),
    });
    const made: Sandbox[] = [];
    try {
      for (let i = 0; i < req.count; i++) made.push(await this.sandboxes.createMemoryFork(owner, create, source, signal));
    } catch (err) {
      for (const sb of made) {
        const row = await this.store.sandbox(sb.id);
        if (row) await this.lifecycle.destroyRow(row).catch(() => undefined);
      }
      throw err;
    }
    return { sandboxes: made };
  }
}
