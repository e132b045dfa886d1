// Trajectories (the recorded steps of a sandbox) and their replay.
import { z } from 'zod';
import { EnvSchema, LabelsSchema } from './common.js';
import { CommandFieldsSchema, PtySchema } from './exec.js';
import { ImageSpecSchema, LayerRefSchema } from './layers.js';
import { MAX_PAGE_SIZE } from './pages.js';
import { ResourcesSchema } from './resources.js';
import { MAX_SANDBOX_TIMEOUT_MS, SandboxSchema, SandboxStateSchema } from './sandboxes.js';

/** Kinds of trajectory steps: a command, or a change of files through the API. */
export const TrajectoryStepKindSchema = z.enum(['exec', 'write', 'mkdir', 'remove', 'rename', 'tar']);

export type TrajectoryStepKind = z.infer<typeof TrajectoryStepKindSchema>;

/** Bytes as a trajectory keeps them: the digest of all, a bounded copy of the first. */
export const RecordedBytesSchema = z.object({
  /** Hex sha256 of every byte seen. */
  sha256: z.string(),
  bytes: z.number(),
  /** Base64 of the first bytes (left out when the listing asked for no content). */
  base64: z.string().optional(),
  /** True when the copy holds fewer bytes than `bytes`. */
  partial: z.boolean(),
  /** Output the agent dropped before it was read (not covered by the digest). */
  lostBytes: z.number().optional(),
});

export type RecordedBytes = z.infer<typeof RecordedBytesSchema>;

/** One step of a sandbox's trajectory. */
export const TrajectoryStepSchema = z.object({
  seq: z.number(),
  kind: TrajectoryStepKindSchema,
  startedAt: z.string(),
  /** Null while a command still runs (or when the sandbox went before it ended). */
  durationMs: z.number().nullable(),
  /** exec: the route it came through. */
  via: z.enum(['exec', 'stream', 'ws']).optional(),
  /** exec: what ran (the caller's own fields, env values included). */
  command: CommandFieldsSchema.extend({ pty: PtySchema.optional() }).optional(),
  /** exec: how it ended; null while it runs. */
  exit: z.object({ exitCode: z.number().nullable(), signal: z.string().nullable(), timedOut: z.boolean(), oomKilled: z.boolean() }).nullable().optional(),
  stdout: RecordedBytesSchema.optional(),
  stderr: RecordedBytesSchema.optional(),
  /** exec: bytes written to stdin through the API. */
  stdin: RecordedBytesSchema.optional(),
  path: z.string().optional(),
  mode: z.number().optional(),
  append: z.boolean().optional(),
  recursive: z.boolean().optional(),
  from: z.string().optional(),
  to: z.string().optional(),
  /** write: the file content; tar: the archive. */
  data: RecordedBytesSchema.optional(),
  /** The step failed with this error (a file operation, or a command that could not start). */
  error: z.object({ code: z.string(), message: z.string() }).optional(),
  /** False when replay cannot repeat it (content past the recorded bound); `reason` says why. */
  replayable: z.boolean(),
  reason: z.string().optional(),
});

export type TrajectoryStep = z.infer<typeof TrajectoryStepSchema>;

/** GET /v1/sandboxes/{id}/trajectory query. */
export const TrajectoryQuerySchema = z.strictObject({
  /** Steps with a seq above this (the `nextCursor` of the previous page). */
  after: z.coerce.number().int().min(-1).optional(),
  limit: z.coerce.number().int().min(1).max(MAX_PAGE_SIZE).optional(),
  /** `false` leaves the bounded copies of output and data out (digests stay). */
  content: z.enum(['true', 'false']).optional(),
});
/** GET /v1/sandboxes/{id}/trajectory query. */
export type TrajectoryQuery = z.infer<typeof TrajectoryQuerySchema>;

/** A page of a sandbox's trajectory. */
export const TrajectorySchema = z.object({
  sandboxId: z.string(),
  project: z.string(),
  /** The sandbox's state, or `gone` once it was destroyed (the trajectory outlives it). */
  sandboxState: z.union([SandboxStateSchema, z.literal('gone')]),
  image: ImageSpecSchema,
  snapshots: z.array(z.string()),
  createdAt: z.string(),
  endedAt: z.string().nullable(),
  /** Steps stored so far, and their stored bytes. */
  steps: z.number(),
  bytes: z.number(),
  /** True when steps past the per-sandbox limits were not stored. */
  truncated: z.boolean(),
  items: z.array(TrajectoryStepSchema),
  nextCursor: z.string().nullable(),
});

export type Trajectory = z.infer<typeof TrajectorySchema>;

/** POST /v1/sandboxes/{id}/replay: a fresh sandbox from the same layers, the steps re-run. */
export const ReplayRequestSchema = z.strictObject({
  /** Replay steps up to and including this seq; default all. */
  upTo: z.number().int().min(0).optional(),
  /** Start from this snapshot of the sandbox instead, replaying only the steps after it. */
  snapshot: LayerRefSchema.optional(),
  resources: ResourcesSchema.optional(),
  env: EnvSchema.optional(),
  labels: LabelsSchema.optional(),
  timeoutMs: z.number().int().min(1000).max(MAX_SANDBOX_TIMEOUT_MS).optional(),
  /** Stop at the first step that differs. */
  stopOnDivergence: z.boolean().optional(),
});

export type ReplayRequest = z.infer<typeof ReplayRequestSchema>;

/** How a replayed step compares with the recorded one. */
export const ReplayVerdictSchema = z.enum(['same', 'exit-differs', 'output-differs', 'not-replayable']);

export type ReplayVerdict = z.infer<typeof ReplayVerdictSchema>;

const ReplayOutcomeSchema = z.object({
  exitCode: z.number().nullable().optional(),
  signal: z.string().nullable().optional(),
  stdoutSha256: z.string().optional(),
  stderrSha256: z.string().optional(),
  error: z.string().optional(),
});

/** One replayed step. */
export const ReplayStepSchema = z.object({
  seq: z.number(),
  kind: TrajectoryStepKindSchema,
  verdict: ReplayVerdictSchema,
  reason: z.string().optional(),
  durationMs: z.number(),
  expected: ReplayOutcomeSchema.optional(),
  actual: ReplayOutcomeSchema.optional(),
});

export type ReplayStep = z.infer<typeof ReplayStepSchema>;

/** Counts of each verdict. */
export const ReplaySummarySchema = z.object({ same: z.number(), exitDiffers: z.number(), outputDiffers: z.number(), notReplayable: z.number() });

export type ReplaySummary = z.infer<typeof ReplaySummarySchema>;

/** 201 reply of a replay (JSON form). */
export const ReplayResultSchema = z.object({
  sandbox: SandboxSchema,
  /** Steps up to this seq came with the snapshot (-1: started from the image). */
  fromSeq: z.number(),
  steps: z.array(ReplayStepSchema),
  summary: ReplaySummarySchema,
  /** True when the trajectory had steps that were not stored. */
  truncated: z.boolean(),
  /** Set when the replay stopped early (the new sandbox stays for inspection). */
  error: z.object({ code: z.string(), message: z.string() }).optional(),
});

export type ReplayResult = z.infer<typeof ReplayResultSchema>;

/** One line of a replay's `application/x-ndjson` progress stream. */
export const ReplayEventSchema = z.discriminatedUnion('type', [
  z.object({ type: z.literal('sandbox'), sandbox: SandboxSchema, fromSeq: z.number() }),
  z.object({ type: z.literal('step'), step: ReplayStepSchema }),
  z.object({ type: z.literal('done'), result: ReplayResultSchema }),
  z.object({ type: z.literal('error'), error: z.object({ code: z.string(), message: z.string() }) }),
]);

export type ReplayEvent = z.infer<typeof ReplayEventSchema>;
