// What several services share: the row shapes, the states only the store knows, and how a
// stored row becomes the API's sandbox or a trajectory's spec.
import { DEFAULT_NETWORK_POLICY, DsecError } from '@dsec/protocol';
import type { BackendKind, CreateSandboxRequest, EventSink, GrantedResources, ImageSpec, RaisedEvent, Sandbox, SandboxSpec } from '@dsec/protocol';
import type { EventOwner } from '@dsec/watcher';
import type { SandboxTable, SnapshotTable } from '../db/schema.js';
import type { StateStore } from '../db/store.js';
import type { ActivityTracker } from '../leases.js';
import { grantedLeaseOf } from '../leases.js';
import type { TrajectoryHeader, TrajectorySpec } from '../trajectory.js';
import { visibleLabels } from '../e2b/sandboxes.js';

/** A sandbox row with its labels. */
export type SandboxRow = SandboxTable & { labels: Record<string, string> };

/**
 * Store-only states of a pause or resume under way (the API shows them as the state they
 * leave): the row is claimed so that one pause, resume or destroy acts at a time.
 */
export const PAUSING = 'pausing';
export const RESUMING = 'resuming';

/** The request a row's spec JSON holds, with its backend and granted resources. */
export type StoredSpec = CreateSandboxRequest & { image: ImageSpec; resources: GrantedResources };

/** Counters exported as metrics. */
export interface PlatformCounters {
  sandboxesCreated: number;
  sandboxCreateFailures: number;
  sandboxesDestroyed: number;
  sandboxesExpired: number;
  /** Creates answered by a warm pool's sandbox. */
  poolClaims: number;
  /** Creates answered by replaying an earlier request with the same idempotency key. */
  idempotentReplays: number;
  sandboxesPaused: number;
  sandboxesResumed: number;
}

/** Fresh counters, all zero. */
export function newCounters(): PlatformCounters {
  return {
    sandboxesCreated: 0,
    sandboxCreateFailures: 0,
    sandboxesDestroyed: 0,
    sandboxesExpired: 0,
    poolClaims: 0,
    idempotentReplays: 0,
    sandboxesPaused: 0,
    sandboxesResumed: 0,
  };
}

/** Where services raise events, and where they log what no caller sees. */
export interface ServiceSinks {
  raise: EventSink;
  /** Raises an event about a sandbox whose row may be gone when it is stored: `owner` says whose it was. */
  raiseOwned: (ev: RaisedEvent, owner: EventOwner) => void;
  log: (line: string) => void;
}

/** The API's view of a row. */
export function toSandbox(row: SandboxRow, activity: ActivityTracker): Sandbox {
  const spec = JSON.parse(row.spec) as StoredSpec;
  // A pause or resume under way shows as the state it leaves.
  const state = row.state === PAUSING ? 'running' : row.state === RESUMING ? 'paused' : row.state;
  return {
    id: row.id,
    project: row.project_id,
    node: row.node,
    backend: row.backend as Sandbox['backend'],
    state: state as Sandbox['state'],
    image: spec.image,
    ...(spec.snapshot !== undefined ? { snapshot: spec.snapshot } : {}),
    layers: JSON.parse(row.layers) as string[],
    resources: spec.resources,
    labels: visibleLabels(row.labels),
    envKeys: Object.keys(spec.env ?? {}),
    network: spec.network ?? DEFAULT_NETWORK_POLICY,
    createdAt: row.created_at,
    expiresAt: row.expires_at,
    lease: grantedLeaseOf(row),
    owner: row.owner_id ?? null,
    lastActiveAt: new Date(activity.lastActiveOf(row)).toISOString(),
    pausedAt: row.paused_at ?? null,
    pauseReason: row.pause_reason ?? null,
    ...(spec.protect ? { protect: spec.protect } : {}),
    ...(spec.security ? { security: spec.security } : {}),
    ...(spec.recovery ? { recovery: spec.recovery } : {}),
  };
}

/** Older snapshots below a snapshot (its parents past the image's layers). */
export function chainOf(snap: SnapshotTable): string[] {
  const image = JSON.parse(snap.image) as ImageSpec;
  const imageLayers = 1 + (image.workspace ? 1 : 0) + (image.toolkits?.length ?? 0);
  return (JSON.parse(snap.parents) as string[]).slice(imageLayers);
}

/** What a trajectory keeps of a create: the resolved layers and everything needed to repeat it. */
export function trajectorySpec(req: CreateSandboxRequest, spec: SandboxSpec): TrajectorySpec {
  const out: TrajectorySpec = { backend: spec.backend ?? 'container', image: spec.image, resources: spec.resources ?? {} };
  if (spec.snapshots?.length) out.snapshots = spec.snapshots;
  if (req.snapshot !== undefined) out.snapshot = req.snapshot;
  if (req.env) out.env = req.env;
  if (req.labels) out.labels = req.labels;
  if (req.timeoutMs !== undefined) out.timeoutMs = req.timeoutMs;
  if (req.recovery) out.recovery = req.recovery;
  return out;
}

/** A trajectory header for a sandbox that has none (made before trajectories were kept). */
export async function headerFromRow(store: StateStore, sandboxId: string): Promise<TrajectoryHeader | undefined> {
  const row = await store.sandboxOnly(sandboxId);
  if (!row) return undefined;
  const req = JSON.parse(row.spec) as StoredSpec;
  const layers = JSON.parse(row.layers) as string[];
  const image: ImageSpec = { base: layers[0] ?? req.image.base };
  let next = 1;
  if (req.image.workspace) image.workspace = layers[next++] ?? req.image.workspace;
  if (req.image.toolkits?.length) image.toolkits = req.image.toolkits.map((t) => layers[next++] ?? t);
  const spec: SandboxSpec = { backend: row.backend as BackendKind, image, resources: req.resources };
  if (layers.length > next) spec.snapshots = layers.slice(next);
  return { sandboxId, projectId: row.project_id, spec: trajectorySpec(req, spec), layers, createdAt: row.created_at };
}

/** The resolved spec of a sandbox: from its trajectory, or rebuilt from its row. */
export async function specOf(store: StateStore, row: SandboxTable): Promise<TrajectorySpec> {
  const t = await store.trajectory(row.id);
  if (t) return JSON.parse(t.spec) as TrajectorySpec;
  const h = await headerFromRow(store, row.id);
  if (!h) throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${row.id} not found`, { sandboxId: row.id });
  return h.spec;
}

/** SANDBOX_NOT_FOUND for an id. */
export function sandboxNotFound(id: string): DsecError {
  return new DsecError('SANDBOX_NOT_FOUND', `sandbox ${id} not found`, { sandboxId: id });
}

/** Waits `ms`, or less when `signal` aborts (never rejects). */
export function abortableSleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const done = (): void => {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
  });
}
