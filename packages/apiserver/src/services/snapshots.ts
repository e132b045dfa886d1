// Snapshots (a sandbox's writable layer packed into a layer of its project) and forks (one
// snapshot, then N sandboxes from it).
import { CreateSandboxRequestSchema, DsecError, MAX_SNAPSHOT_DEPTH, normalizeLayerName, parseOrThrow, forEachBounded } from '@dsec/protocol';
import type { BackendKind, ForkRequest, ForkResult, Layer, Sandbox, SnapshotRequest } from '@dsec/protocol';
import { requireRole } from '../auth.js';
import type { Principal } from '../auth.js';
import { crashPoint } from '../crash-points.js';
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
}
