// Warm pools: sandboxes kept ready for creates that match them.
import { z } from 'zod';
import { SandboxRequestSchema } from './sandboxes.js';

/** Largest warm pool. */
export const MAX_POOL_SIZE = 1000;

/** Most pools per project. */
export const MAX_POOLS_PER_PROJECT = 64;

/** A pool unclaimed this long (ms) drops its ready sandboxes until the next matching create. */
export const DEFAULT_POOL_IDLE_TIMEOUT_MS = 600_000;

export const MAX_POOL_IDLE_TIMEOUT_MS = 7 * 86_400_000;

/** A pool's name: unique in its project. */
export const PoolNameSchema = z.string().regex(/^[a-z0-9][a-z0-9-]{0,62}$/, 'lowercase letters, digits and -');

/** What a pool keeps ready: a create request less what a claim applies (env, labels, timeoutMs, lease, owner). */
export const PoolSpecSchema = SandboxRequestSchema.omit({ env: true, labels: true, timeoutMs: true, lease: true, owner: true });

export type PoolSpec = z.infer<typeof PoolSpecSchema>;

/** PUT /v1/pools/{name}: creates or replaces a pool. */
export const PutPoolRequestSchema = z.strictObject({
  spec: PoolSpecSchema,
  /** Sandboxes kept ready; they count against the project's quota. */
  size: z.number().int().min(0).max(MAX_POOL_SIZE),
  /** Default {@link DEFAULT_POOL_IDLE_TIMEOUT_MS}. */
  idleTimeoutMs: z.number().int().min(1000).max(MAX_POOL_IDLE_TIMEOUT_MS).optional(),
});

export type PutPoolRequest = z.infer<typeof PutPoolRequestSchema>;

/** A warm pool as the API returns it. */
export const PoolSchema = z.object({
  name: z.string(),
  project: z.string(),
  spec: PoolSpecSchema,
  size: z.number(),
  idleTimeoutMs: z.number(),
  /** Sandboxes created and ready to be claimed. */
  ready: z.number(),
  /** Sandboxes being created for the pool. */
  creating: z.number(),
  /** True when unclaimed for idleTimeoutMs: the pool keeps none ready until a matching create. */
  idle: z.boolean(),
  /** Why the last refill failed (quota, capacity), or null. */
  lastError: z.string().nullable(),
  lastUsedAt: z.string(),
  createdAt: z.string(),
  updatedAt: z.string(),
});

export type Pool = z.infer<typeof PoolSchema>;
