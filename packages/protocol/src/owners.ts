// Owner sessions: a trainer or a job that keeps its sandboxes by heartbeating.
import { z } from 'zod';

/** How long an owner may go without a heartbeat before it is lost. */
export const DEFAULT_OWNER_GRACE_MS = 60_000;

/** Shortest and longest owner grace period. */
export const MIN_OWNER_GRACE_MS = 1000;

export const MAX_OWNER_GRACE_MS = 86_400_000;

/** Longest heartbeat interval an owner is told to keep (a third of its grace, at most this). */
export const MAX_HEARTBEAT_INTERVAL_MS = 10_000;

/** An owner id (`own_<hex>`). */
export const OwnerIdSchema = z.string().regex(/^own_[0-9a-f]{1,64}$/, 'not an owner id');

/** POST /v1/owners: an owner session (a trainer, a job) that keeps its sandboxes by heartbeating. */
export const CreateOwnerRequestSchema = z.strictObject({
  name: z.string().min(1).max(128).optional(),
  /** Time without a heartbeat before the owner is lost. Default {@link DEFAULT_OWNER_GRACE_MS}. */
  graceMs: z.number().int().min(MIN_OWNER_GRACE_MS).max(MAX_OWNER_GRACE_MS).optional(),
});

export type CreateOwnerRequest = z.infer<typeof CreateOwnerRequestSchema>;

/** An owner session. */
export const OwnerSchema = z.object({
  id: z.string(),
  project: z.string(),
  name: z.string().nullable(),
  /** `active` while heartbeating; `lost` past its grace; `closed` after DELETE. */
  state: z.enum(['active', 'lost', 'closed']),
  graceMs: z.number(),
  /** How often to heartbeat. */
  heartbeatIntervalMs: z.number(),
  createdAt: z.string(),
  heartbeatAt: z.string(),
  /** Sandboxes it owns now. */
  sandboxes: z.number(),
});

export type Owner = z.infer<typeof OwnerSchema>;
