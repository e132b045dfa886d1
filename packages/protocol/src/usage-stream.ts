// Live use pushed to a reader instead of polled by it: GET /v1/nodes and
// GET /v1/sandboxes/{id}/stats with `Accept: application/x-ndjson` answer one sample at once and
// then one line per interval, until the reader leaves (the dashboard reads them with fetch and
// the key header, as it reads the event stream).
import { z } from 'zod';
import { NodeStateSchema } from './nodes.js';
import { SandboxStatsSchema } from './sandboxes.js';

/** Default interval between two samples of a usage stream (ms). */
export const DEFAULT_USAGE_STREAM_INTERVAL_MS = 2000;
/** Shortest interval a reader may ask for (ms). */
export const MIN_USAGE_STREAM_INTERVAL_MS = 500;
/** Longest interval a reader may ask for (ms). */
export const MAX_USAGE_STREAM_INTERVAL_MS = 60_000;

/** Query of a usage stream: `intervalMs` between samples (default 2,000). */
export const UsageStreamQuerySchema = z.strictObject({
  intervalMs: z.coerce.number().int().min(MIN_USAGE_STREAM_INTERVAL_MS).max(MAX_USAGE_STREAM_INTERVAL_MS).optional(),
});
/** Query of a usage stream. */
export type UsageStreamQuery = z.infer<typeof UsageStreamQuerySchema>;

const amounts = z.object({ cpu: z.number(), memoryMiB: z.number(), sandboxes: z.number() });

/** One node in a usage sample: what it offers, what is allocated, what is used. */
export const NodeUsageSchema = z.object({
  name: z.string(),
  healthy: z.boolean(),
  state: NodeStateSchema,
  cordoned: z.boolean(),
  backends: z.array(z.string()),
  capacity: amounts,
  /** What placement may still give out; null for a key outside the root project (the operator's figure). */
  allocatable: z.object({ cpu: z.number(), memoryMiB: z.number() }).nullable(),
  /** What is allocated to sandboxes (every tenant's together); null for a key outside the root project. */
  allocated: amounts.nullable(),
  /** What its sandboxes use together (cores, MiB, count), as placement judges it; null until measured and for a key outside the root project. */
  used: amounts.nullable(),
  /** The machine's own CPU (percent of all cores) and memory; null for a node on another machine and for a key outside the root project. */
  machine: z.object({ cpuPercent: z.number(), memoryUsedBytes: z.number(), memoryTotalBytes: z.number() }).nullable(),
});
/** One node in a usage sample. */
export type NodeUsage = z.infer<typeof NodeUsageSchema>;

/** A line of the node usage stream. */
export const NodeUsageSampleSchema = z.object({ at: z.string(), items: z.array(NodeUsageSchema) });
/** A line of the node usage stream. */
export type NodeUsageSample = z.infer<typeof NodeUsageSampleSchema>;

/**
 * A line of a sandbox's stats stream: its stats, or the error that ended the stream (the sandbox
 * was deleted, or its node cannot be reached).
 */
export const SandboxStatsSampleSchema = z.object({
  at: z.string(),
  stats: SandboxStatsSchema.exactOptional(),
  error: z.object({ code: z.string(), message: z.string() }).exactOptional(),
});
/** A line of a sandbox's stats stream. */
export type SandboxStatsSample = z.infer<typeof SandboxStatsSampleSchema>;
