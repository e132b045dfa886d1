// Trajectories (every step that reached a sandbox through the API, kept beyond its life) and
// replay (a fresh sandbox from the trajectory's layers or a snapshot of it, its steps re-run
// and compared with the record).
import { CreateSandboxRequestSchema, DEFAULT_PAGE_SIZE, DsecError, MAX_PAGE_SIZE, SandboxStateSchema, invalidArgument, parseOrThrow } from '@dsec/protocol';
import type { BackendKind, ImageSpec, ReplayEvent, ReplayRequest, ReplayResult, ReplayStep, Trajectory, TrajectoryQuery, TrajectoryStep } from '@dsec/protocol';
import { requireRole } from '../auth.js';
import type { Principal } from '../auth.js';
import type { TrajectoryTable } from '../db/schema.js';
import type { StateStore } from '../db/store.js';
import { publicError } from '../errors.js';
import type { TrajectoryLog, TrajectorySpec } from '../trajectory.js';
import type { ServiceSinks } from './common.js';
import { sandboxNotFound } from './common.js';
import type { CommandService } from './commands.js';
import type { FileService } from './files.js';
import type { LayerService } from './layers.js';
import type { LifecycleService } from './lifecycle.js';
import { replayStep, summarize } from './replay.js';
import type { SandboxService } from './sandboxes.js';

/** Most bytes of steps one trajectory page carries (at least one step is always sent). */
const MAX_TRAJECTORY_PAGE_BYTES = 8 * 1024 * 1024;

/** What {@link TrajectoryService} is built from. */
export interface TrajectoryServiceDeps {
  store: StateStore;
  trajectory: TrajectoryLog;
  lifecycle: LifecycleService;
  sandboxes: SandboxService;
  layers: LayerService;
  commands: CommandService;
  files: FileService;
  sinks: ServiceSinks;
}

/** Trajectories and replay. */
export class TrajectoryService {
  constructor(private readonly d: TrajectoryServiceDeps) {}

  /** A trajectory the principal may read (its sandbox may be gone). */
  private async header(p: Principal, id: string): Promise<TrajectoryTable> {
    requireRole(p, 'member');
    const { trajectory, store } = this.d;
    const t = id.length <= 128 ? await trajectory.header(id) : undefined;
    if (!t || !p.visibleProjects.has(t.project_id)) {
      // A sandbox from before trajectories were kept: start its log now.
      const row = id.length <= 128 ? await store.sandboxOnly(id) : undefined;
      if (row && p.visibleProjects.has(row.project_id)) {
        await trajectory.position(id);
        const made = await trajectory.header(id);
        if (made) return made;
      }
      throw sandboxNotFound(id);
    }
    return t;
  }

  /** A page of a sandbox's trajectory (also of a destroyed or lost sandbox, while it is kept). */
  async get(p: Principal, id: string, q: TrajectoryQuery): Promise<Trajectory> {
    const t = await this.header(p, id);
    const limit = q.limit ?? DEFAULT_PAGE_SIZE;
    const steps = await this.d.trajectory.page(id, q.after ?? -1, Math.min(limit, MAX_PAGE_SIZE) + 1);
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
    const sandbox = t.ended_at === null ? await this.d.store.sandboxOnly(id) : undefined;
    // A row being destroyed reads as stopped.
    const state = sandbox === undefined ? 'gone' : (SandboxStateSchema.safeParse(sandbox.state).data ?? 'stopped');
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
  async replay(p: Principal, id: string, req: ReplayRequest, signal?: AbortSignal, onEvent?: (ev: ReplayEvent) => void): Promise<ReplayResult> {
    requireRole(p, 'member');
    const t = await this.header(p, id);
    if (t.cut_at !== null) {
      throw new DsecError(
        'TRAJECTORY_TRUNCATED',
        `the trajectory of ${id} was cut short at ${t.cut_at} by a trajectory byte budget (limits.trajectoryBytesPerTenant or limits.trajectoryBytesTotal): it cannot be replayed`,
        { sandboxId: id },
      );
    }
    const spec = JSON.parse(t.spec) as TrajectorySpec;
    const owner: Principal = { ...p, projectId: t.project_id };
    let fromSeq = -1;
    let start: { image: ImageSpec } | { snapshot: string } = spec.snapshot !== undefined ? { snapshot: spec.snapshot } : { image: spec.image };
    if (req.snapshot !== undefined) {
      const snap = await this.d.layers.resolveSnapshot(t.project_id, req.snapshot, 'snapshot');
      if (snap.sandbox_id !== id) throw invalidArgument('snapshot', `layer ${req.snapshot} is not a snapshot of sandbox ${id}`);
      start = { snapshot: snap.digest };
      fromSeq = snap.seq - 1;
    }
    const resources = req.resources ?? spec.resources;
    const env = req.env ?? spec.env;
    const labels = req.labels ?? spec.labels;
    const timeoutMs = req.timeoutMs ?? spec.timeoutMs;
    // Read back from the store and merged with the request: checked as any create is.
    const sandbox = await this.d.sandboxes.create(
      owner,
      parseOrThrow(CreateSandboxRequestSchema, {
        backend: spec.backend as BackendKind,
        ...start,
        resources,
        ...(env ? { env } : {}),
        ...(labels ? { labels } : {}),
        ...(timeoutMs !== undefined ? { timeoutMs } : {}),
        ...(spec.recovery ? { recovery: spec.recovery } : {}),
      }),
      signal ? { signal } : {},
    );
    onEvent?.({ type: 'sandbox', sandbox, fromSeq });
    const result: ReplayResult = { sandbox, fromSeq, steps: [], summary: summarize([]), truncated: t.truncated === 1 };
    try {
      const { edge, row } = await this.d.lifecycle.route(owner, sandbox.id);
      const target = { target: { sandboxId: row.id, edge }, commands: this.d.commands, files: this.d.files };
      for await (const step of this.d.trajectory.stepsAfter(id, fromSeq)) {
        if (req.upTo !== undefined && step.seq > req.upTo) break;
        signal?.throwIfAborted();
        const done: ReplayStep = await replayStep(target, step, signal);
        result.steps.push(done);
        onEvent?.({ type: 'step', step: done });
        if (req.stopOnDivergence && done.verdict !== 'same') break;
      }
    } catch (err) {
      if (signal?.aborted && !onEvent) {
        const row = await this.d.store.sandbox(sandbox.id);
        if (row) await this.d.lifecycle.destroyRow(row).catch(() => undefined);
        throw err;
      }
      result.error = publicError(err, this.d.sinks.log);
    }
    result.summary = summarize(result.steps);
    return result;
  }
}
