// Snapshots and forks of a sandbox's writable layer.
import { z } from 'zod';
import { LabelsSchema } from './common.js';
import { LayerSchema } from './layers.js';
import { MAX_SANDBOX_TIMEOUT_MS, SandboxSchema } from './sandboxes.js';

/** Most sandboxes one fork creates. */
export const MAX_FORK_COUNT = 256;

/** POST /v1/sandboxes/{id}/snapshot */
export const SnapshotRequestSchema = z.strictObject({
  /** `name` or `name:tag` for the snapshot layer in the sandbox's project. */
  name: z.string().max(256).optional(),
  /** Share the snapshot with the sub-projects of the sandbox's project (default: private to it). */
  shareWithSubProjects: z.boolean().optional(),
});
/** POST /v1/sandboxes/{id}/snapshot body. */
export type SnapshotRequest = z.infer<typeof SnapshotRequestSchema>;

/** POST /v1/sandboxes/{id}/fork: one snapshot, then `count` sandboxes from it. */
export const ForkRequestSchema = z.strictObject({
  count: z.number().int().min(1).max(MAX_FORK_COUNT),
  /** Added to (and overriding) the source sandbox's labels. */
  labels: LabelsSchema.optional(),
  /** Lifetime of each new sandbox; default the API's. */
  timeoutMs: z.number().int().min(1000).max(MAX_SANDBOX_TIMEOUT_MS).optional(),
  /**
   * Fork with memory (`microvm`, `vm`): each new sandbox resumes from a copy of the source's
   * memory (its processes running on) and writable disk, on the source's node, with a network
   * identity of its own; no snapshot layer is made. Default false: a disk snapshot, then new boots.
   */
  memory: z.boolean().optional(),
});

export type ForkRequest = z.infer<typeof ForkRequestSchema>;

/** 201 reply of a fork. */
export const ForkResultSchema = z.object({
  /** The disk snapshot the new sandboxes start from; absent for a fork with memory. */
  snapshot: LayerSchema.optional(),
  sandboxes: z.array(SandboxSchema),
});

export type ForkResult = z.infer<typeof ForkResultSchema>;
