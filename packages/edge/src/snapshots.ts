// A sandbox's writable layer read from the host: packed into a snapshot layer ("pack diff"),
// or viewed over its lower layers for diffs and integrity checks.
import { DsecError } from '@dsec/protocol';
import type { DiffOptions, LayerInfo } from '@dsec/protocol';
import type { BackendSandbox, DiskSnapshotFacet, GuestLayerFacet, PauseFacet } from './backend.js';
import type { DiffLayersOptions, SandboxLayersView } from './diff.js';
import type { IdShift } from './host/idmap.js';
import type { LayerStore } from './layers/index.js';

/** Label of a snapshot layer: its parent layers' digests, bottom first, comma-separated. */
export const SNAPSHOT_PARENTS_LABEL = 'dsec.snapshot.parents';
/** Label of a snapshot layer: the sandbox it was taken of. */
export const SNAPSHOT_SANDBOX_LABEL = 'dsec.snapshot.sandbox';

/** Options of {@link Edge.snapshot}. */
export interface SnapshotOptions {
  /** Merged into the snapshot layer's labels. */
  labels?: Record<string, string>;
  /** Host ids `base + n` of a user-namespaced sandbox are stored as `n`; default none. */
  idShift?: IdShift;
  signal?: AbortSignal;
}

/** The sandbox held still for a snapshot: no pause or resume runs until `release` (idempotent). */
export interface SnapshotHold {
  /** The sandbox was paused (already frozen; it stays so). */
  paused: boolean;
  release(): void;
}

/** What {@link packWritableLayer} packs. */
export interface PackRequest {
  id: string;
  /** Host path of the sandbox's upper directory. */
  upper: string;
  /** The sandbox's layers' digests, bottom first. */
  parents: string[];
  labels: Record<string, string>;
  idShift?: IdShift;
  signal?: AbortSignal;
  freezer: Pick<PauseFacet, 'freeze' | 'thaw' | 'isFrozen'>;
  hold: SnapshotHold;
}

/** The labels of a snapshot of `record`: the caller's, its parents and the sandbox. */
export function snapshotLabels(record: BackendSandbox, labels: Record<string, string> | undefined): Record<string, string> {
  return { ...labels, [SNAPSHOT_PARENTS_LABEL]: record.layers.map((l) => l.digest).join(','), [SNAPSHOT_SANDBOX_LABEL]: record.id };
}

/**
 * What a snapshot of `record` packs, all but the hold: its upper directory (at `upper`), its
 * layers as parents, its labels, and the ids to store. A user-namespaced sandbox's files are
 * owned by its host id range: stored as the ids it sees, unless `opts.idShift` says otherwise.
 */
export function snapshotRequest(record: BackendSandbox, upper: string, freezer: PackRequest['freezer'], opts: SnapshotOptions): Omit<PackRequest, 'hold'> {
  const range = record.idRange;
  const idShift = opts.idShift ?? (range ? { uid: range.uid, gid: range.gid, count: range.size } : undefined);
  return {
    id: record.id,
    upper,
    parents: record.layers.map((l) => l.digest),
    labels: snapshotLabels(record, opts.labels),
    freezer,
    ...(idShift ? { idShift } : {}),
    ...(opts.signal ? { signal: opts.signal } : {}),
  };
}

/**
 * Packs the upper directory into a layer of kind `snapshot`. A running sandbox is frozen only
 * while the tree is read; the digest and the commit happen with it running again (a paused
 * one is read as it is and stays paused). The hold is released with the thaw, also on failure.
 */
export async function packWritableLayer(layers: LayerStore, req: PackRequest): Promise<LayerInfo> {
  const { id, freezer, hold } = req;
  let frozen = false;
  const thaw = async (): Promise<void> => {
    try {
      if (frozen) {
        frozen = false;
        await freezer.thaw(id);
      }
    } finally {
      hold.release();
    }
  };
  try {
    if (!hold.paused && !(await freezer.isFrozen(id))) {
      frozen = true;
      await freezer.freeze(id);
    }
    return await layers.build(
      { type: 'upper', dir: req.upper, parents: req.parents, ...(req.idShift ? { idShift: req.idShift } : {}) },
      { kind: 'snapshot', labels: req.labels, onSourceRead: thaw, ...(req.signal ? { signal: req.signal } : {}) },
    );
  } finally {
    await thaw();
  }
}

/**
 * Packs a writable layer that lives inside a guest (`GuestLayerFacet`, a microVM) into a layer
 * of kind `snapshot`: the guest holds its disk still while its upper directory is copied out
 * (the hold is released once it runs on), then the copy is packed as a container's upper
 * directory is and removed. A paused sandbox is refused: its guest reads its own disk.
 */
export async function packGuestLayer(
  layers: LayerStore,
  guest: GuestLayerFacet,
  req: Pick<PackRequest, 'id' | 'parents' | 'labels' | 'signal' | 'hold'> & { kind: string },
): Promise<LayerInfo> {
  const { id, hold } = req;
  let upper: Awaited<ReturnType<GuestLayerFacet['exportUpper']>>;
  try {
    if (hold.paused) {
      throw new DsecError(
        'SANDBOX_NOT_RUNNING',
        `sandbox ${id} is paused: a ${req.kind} sandbox is snapshotted running (its guest reads its own disk); resume it first`,
        {
          sandboxId: id,
        },
      );
    }
    upper = await guest.exportUpper(id, req.signal);
  } finally {
    hold.release();
  }
  try {
    return await layers.build(
      { type: 'upper', dir: upper.dir, parents: req.parents },
      { kind: 'snapshot', labels: req.labels, ...(req.signal ? { signal: req.signal } : {}) },
    );
  } finally {
    await upper.remove();
  }
}

/**
 * Packs a VM's writable disk (`DiskSnapshotFacet`) into a new `disk` layer: the sandbox is held
 * (no pause or resume) only while its disk is copied, then the copy is flattened over its image
 * into a standalone qcow2 with the VM running on, stored as a disk layer and removed. The layer
 * keeps the booted image's labels (agent, bus, desktop) under the snapshot's own.
 */
export async function packDisk(layers: LayerStore, disk: DiskSnapshotFacet, req: Pick<PackRequest, 'id' | 'labels' | 'signal' | 'hold'>): Promise<LayerInfo> {
  let copy: Awaited<ReturnType<DiskSnapshotFacet['copyDisk']>>;
  try {
    copy = await disk.copyDisk(req.id, req.signal);
  } finally {
    req.hold.release();
  }
  try {
    return await layers.build(
      { type: 'vm-disk', write: (out, signal) => copy.flatten(out, signal) },
      { kind: 'disk', labels: { ...copy.labels, ...req.labels }, ...(req.signal ? { signal: req.signal } : {}) },
    );
  } finally {
    await copy.remove();
  }
}

/** The writable layer over its lower layers, as diffs and integrity checks read them. */
export function layersView(upper: string, record: BackendSandbox, layers: LayerStore): SandboxLayersView {
  return {
    upper,
    // Records list layers bottom first; overlayfs and the view want the topmost first.
    lowers: record.layers.map((l) => layers.mountDir(l.digest)).reverse(),
    ...(record.idRange ? { idRange: record.idRange } : {}),
  };
}

/** The page of a diff that `opts` asks for; `frozen` when the sandbox is paused (a consistent view). */
export function diffPage(opts: DiffOptions, frozen: boolean): DiffLayersOptions {
  const { paths, hash, limit, cursor } = opts;
  return {
    ...(paths ? { paths } : {}),
    ...(hash !== undefined ? { hash } : {}),
    ...(limit !== undefined ? { limit } : {}),
    ...(cursor !== undefined ? { cursor } : {}),
    frozen,
  };
}
