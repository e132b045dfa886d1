// Sandboxes: what a node needs to create one, what the API takes and returns, leases, admission,
// pause and resume, stats, and batches.
import { z } from 'zod';
import { EnvSchema, ItemErrorSchema, LabelsSchema, NormalisedPathSchema } from './common.js';
import { ImageSpecSchema, LayerRefSchema } from './layers.js';
import { NetworkPolicySchema } from './network.js';
import { MAX_OWNER_GRACE_MS, OwnerIdSchema } from './owners.js';
import { MAX_PAGE_SIZE } from './pages.js';
import { BackendKindSchema, GrantedResourcesSchema, ResourcesSchema } from './resources.js';

/** Lifecycle states of a sandbox (DESIGN.md, Lifecycle). */
export const SandboxStateSchema = z.enum(['pending', 'creating', 'running', 'paused', 'stopped', 'failed', 'lost']);

/** Lifecycle state of a sandbox. */
export type SandboxState = z.infer<typeof SandboxStateSchema>;

/** Most snapshots stacked on one image (a snapshot of a sandbox made from a snapshot, ...). */
export const MAX_SNAPSHOT_DEPTH = 16;

/** Most paths in each list of {@link ProtectSchema}. */
export const MAX_PROTECTED_PATHS = 32;

/** Top-level directories a protected path may not be in (the platform's own mounts). */
const UNPROTECTABLE = ['proc', 'sys', 'dev', '.dsec'];

/** A path that can be protected: normalised, not `/`, not in the platform's own mounts. */
export const SandboxPathSchema = NormalisedPathSchema.refine((p) => p !== '/' && p.length <= 1024, 'must be below / and at most 1024 bytes').refine(
  (p) => !UNPROTECTABLE.includes(p.split('/')[1] ?? ''),
  'may not be under /proc, /sys, /dev or /.dsec',
);

/**
 * Reward-hacking guards. `readOnly`: paths (a test suite, a grader) the sandbox cannot change,
 * not even as root, nor move aside (every directory above them is pinned). `watch`: paths whose
 * changes raise `protected-path.write` events.
 */
export const ProtectSchema = z.strictObject({
  readOnly: z.array(SandboxPathSchema).max(MAX_PROTECTED_PATHS).optional(),
  watch: z.array(SandboxPathSchema).max(MAX_PROTECTED_PATHS).optional(),
  /** System calls denied (EPERM) on top of the default seccomp profile (run-time rules add them). */
  denySyscalls: z
    .array(z.string().regex(/^[a-z0-9_]{1,64}$/, 'not a system call name'))
    .max(256)
    .optional(),
});

/** Reward-hacking guards of a sandbox. */
export type Protect = z.infer<typeof ProtectSchema>;

/** Per-sandbox relaxations of the default hardening. */
export const SecuritySchema = z.strictObject({
  /** Allow ptrace, process_vm_readv/writev, process_madvise and pidfd_getfd (debuggers, strace). Default false. */
  allowPtrace: z.boolean().optional(),
});

/** Per-sandbox relaxations of the default hardening. */
export type Security = z.infer<typeof SecuritySchema>;

/** What edge needs to create one sandbox. */
export const SandboxSpecSchema = z.strictObject({
  backend: BackendKindSchema.optional(),
  image: ImageSpecSchema,
  /** Snapshot layers above the image, oldest first (the chain of a snapshot). */
  snapshots: z.array(LayerRefSchema).max(MAX_SNAPSHOT_DEPTH).optional(),
  resources: ResourcesSchema.optional(),
  env: EnvSchema.optional(),
  labels: LabelsSchema.optional(),
  hostname: z
    .string()
    .regex(/^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/, 'not a hostname')
    .optional(),
  /** Hardening beyond the defaults; the control plane merges run-time rules (POST /v1/rules) in. */
  protect: ProtectSchema.optional(),
  security: SecuritySchema.optional(),
  /** Network policy; default `{mode: 'none'}` (loopback only). */
  network: NetworkPolicySchema.optional(),
  /**
   * A fork with memory (VM backends): the new sandbox resumes from a copy of this sandbox's
   * memory and writable disk on the same node instead of booting. Set by the control plane's
   * fork, never by a create request.
   */
  memoryOf: z
    .string()
    .regex(/^[a-z0-9][a-z0-9-]{2,62}$/, 'not a sandbox id')
    .optional(),
});

/** What edge needs to create one sandbox. */
export type SandboxSpec = z.infer<typeof SandboxSpecSchema>;

/** What a claim applies to a sandbox created ahead of demand (a warm pool's). */
export const SandboxClaimSchema = z.strictObject({ env: EnvSchema.optional(), labels: LabelsSchema.optional() });

/** What a claim applies to a pooled sandbox. */
export type SandboxClaim = z.infer<typeof SandboxClaimSchema>;

/** Default sandbox lifetime when the create request gives none. */
export const DEFAULT_SANDBOX_TIMEOUT_MS = 3_600_000;

/** Longest lifetime a create request may ask for. */
export const MAX_SANDBOX_TIMEOUT_MS = 7 * 86_400_000;

/** Idle time (no API activity) after which a sandbox's `onIdle` action is taken. */
export const DEFAULT_IDLE_TIMEOUT_MS = 600_000;

/** What happens when a lease runs out: the sandbox is frozen (kept) or destroyed. */
export const LeaseActionSchema = z.enum(['pause', 'kill']);

export type LeaseAction = z.infer<typeof LeaseActionSchema>;

/**
 * A sandbox's lease: how long it may live and what happens when it is idle or its owner goes
 * away. Every field is optional at create (defaults below) and may be changed later (PATCH).
 */
export const LeaseSchema = z.strictObject({
  /** No API activity (exec, files, processes, output) for this long triggers `onIdle`; 0: never. Default {@link DEFAULT_IDLE_TIMEOUT_MS}. */
  idleTimeoutMs: z.number().int().min(0).max(MAX_SANDBOX_TIMEOUT_MS).optional(),
  /** Lifetime from creation; the sandbox is destroyed when it elapses. Default {@link DEFAULT_SANDBOX_TIMEOUT_MS}. */
  maxLifetimeMs: z.number().int().min(1000).max(MAX_SANDBOX_TIMEOUT_MS).optional(),
  /** What the idle timeout does. Default `pause`. */
  onIdle: LeaseActionSchema.optional(),
  /** Time without an owner heartbeat before `onOwnerLost`; default the owner's `graceMs`. */
  ownerGraceMs: z.number().int().min(0).max(MAX_OWNER_GRACE_MS).optional(),
  /** What losing (or closing) the owner does. Default `pause`. */
  onOwnerLost: LeaseActionSchema.optional(),
  /** A request to a paused sandbox resumes it first (else 409 SANDBOX_NOT_RUNNING). Default true. */
  autoResume: z.boolean().optional(),
  /** What the end of `maxLifetimeMs` does: `kill` (default) or `pause` (kept paused until resumed or deleted). */
  onExpire: LeaseActionSchema.optional(),
});

export type Lease = z.infer<typeof LeaseSchema>;

/** A lease as granted: defaults filled in (`ownerGraceMs` null: the owner's). */
export const GrantedLeaseSchema = z.object({
  idleTimeoutMs: z.number(),
  maxLifetimeMs: z.number(),
  onIdle: LeaseActionSchema,
  ownerGraceMs: z.number().nullable(),
  onOwnerLost: LeaseActionSchema,
  autoResume: z.boolean(),
  /** Absent: `kill`. */
  onExpire: LeaseActionSchema.optional(),
});

export type GrantedLease = z.infer<typeof GrantedLeaseSchema>;

/** Default and longest time a create may wait in the admission queue (ms). */
export const DEFAULT_ADMISSION_WAIT_MS = 30_000;

export const MAX_ADMISSION_WAIT_MS = 600_000;

/**
 * What a create does when the project's quota or the nodes are full: by default it is refused
 * at once (429 QUOTA_EXCEEDED or 503 CAPACITY_EXHAUSTED, with `Retry-After`); with `wait` it
 * waits in a bounded queue, fair across projects, until capacity frees or `timeoutMs` passes.
 */
export const AdmissionSchema = z.strictObject({
  wait: z.boolean().optional(),
  /** Longest wait in ms; default {@link DEFAULT_ADMISSION_WAIT_MS}. */
  timeoutMs: z.number().int().min(0).max(MAX_ADMISSION_WAIT_MS).optional(),
});

export type Admission = z.infer<typeof AdmissionSchema>;

/** POST /v1/sandboxes: give exactly one of `image` or `snapshot`. */
/**
 * What happens to a sandbox when its node is lost: `mark-lost` (the default) leaves it `lost`;
 * `replay` recreates it on another node from its trajectory, as a new sandbox (a new id, since
 * an id names its node) labelled `dsec.replay-of` with the lost one's id.
 */
export const RecoverySchema = z.strictObject({
  onNodeLost: z.enum(['mark-lost', 'replay']),
});

/** A sandbox's recovery policy. */
export type Recovery = z.infer<typeof RecoverySchema>;

export const CreateSandboxRequestSchema = z.strictObject({
  backend: BackendKindSchema.optional(),
  image: ImageSpecSchema.optional(),
  /** A snapshot layer to start from (its parent layers come with it), instead of `image`. */
  snapshot: LayerRefSchema.optional(),
  resources: ResourcesSchema.optional(),
  env: EnvSchema.optional(),
  labels: LabelsSchema.optional(),
  /** Network policy; default `{mode: 'none'}` (loopback only). */
  network: NetworkPolicySchema.optional(),
  /** Lifetime in ms from creation (the same as `lease.maxLifetimeMs`; give at most one). */
  timeoutMs: z.number().int().min(1000).max(MAX_SANDBOX_TIMEOUT_MS).optional(),
  lease: LeaseSchema.optional(),
  /** The owner session whose heartbeats keep this sandbox running. */
  owner: OwnerIdSchema.optional(),
  /** Refuse at once (default) or wait when the quota or the nodes are full. */
  admission: AdmissionSchema.optional(),
  /** Read-only and watched paths (reward-hacking guards). */
  protect: ProtectSchema.optional(),
  /** Relaxations of the default hardening (ptrace). */
  security: SecuritySchema.optional(),
  /** What happens when the sandbox's node is lost (default: the sandbox is marked lost). */
  recovery: RecoverySchema.optional(),
});

export type CreateSandboxRequest = z.infer<typeof CreateSandboxRequestSchema>;

/** A sandbox as the API returns it. */
export const SandboxSchema = z.object({
  id: z.string(),
  project: z.string(),
  node: z.string(),
  backend: BackendKindSchema,
  state: SandboxStateSchema,
  image: ImageSpecSchema,
  /** The snapshot the sandbox was created from (its top layer), when it was. */
  snapshot: z.string().optional(),
  /** Every layer, bottom first: base, workspace, toolkits, snapshots. */
  layers: z.array(z.string()),
  resources: GrantedResourcesSchema,
  labels: z.record(z.string(), z.string()),
  /** Names of the environment variables set at create (values are not returned). */
  envKeys: z.array(z.string()),
  /** The network policy in force. */
  network: NetworkPolicySchema,
  createdAt: z.string(),
  expiresAt: z.string(),
  lease: GrantedLeaseSchema,
  /** The owner session, or null. */
  owner: z.string().nullable(),
  /** Last API activity (recorded to within about a second). */
  lastActiveAt: z.string(),
  /** When it was paused, and why (`api`, `idle`, `owner-lost`); null while running. */
  pausedAt: z.string().nullable(),
  pauseReason: z.string().nullable(),
  /** Hardening beyond the defaults, run-time rules (POST /v1/rules) included. */
  protect: ProtectSchema.optional(),
  security: SecuritySchema.optional(),
  /** What happens when its node is lost (given at create). */
  recovery: RecoverySchema.optional(),
});

export type Sandbox = z.infer<typeof SandboxSchema>;

/** PATCH /v1/sandboxes/{id}: change the lease, or hand the sandbox to another owner (null: none). */
export const UpdateSandboxRequestSchema = z.strictObject({
  lease: LeaseSchema.optional(),
  owner: OwnerIdSchema.nullable().optional(),
});

export type UpdateSandboxRequest = z.infer<typeof UpdateSandboxRequestSchema>;

/**
 * Where a paused sandbox's memory stays: `keep` (frozen in place, reclaimable), or `file`
 * (written to a file on the node and freed: a VM's QEMU migrates to a file and exits).
 */
export const PauseMemorySchema = z.enum(['keep', 'file']);
export type PauseMemory = z.infer<typeof PauseMemorySchema>;

/** POST /v1/sandboxes/{id}/pause */
export const PauseRequestSchema = z.strictObject({
  /** Default `keep`; `file` only on backends that can (microVMs), else 400 naming `memory`. */
  memory: PauseMemorySchema.optional(),
});
/** POST /v1/sandboxes/{id}/pause body. */
export type PauseRequest = z.infer<typeof PauseRequestSchema>;

/** POST /v1/sandboxes/{id}/resume */
export const ResumeRequestSchema = z.strictObject({
  /** Read swapped-out process memory back in before answering. Default true. */
  prefetch: z.boolean().optional(),
});
/** POST /v1/sandboxes/{id}/resume body. */
export type ResumeRequest = z.infer<typeof ResumeRequestSchema>;

/** 200 reply of POST /v1/sandboxes/{id}/pause and /resume. */
export const PauseResultSchema = z.object({
  sandbox: SandboxSchema,
  /** Time the node took (freeze and reclaim, or thaw and prefetch). */
  durationMs: z.number(),
  /** The sandbox's memory (its cgroup's usage) before and after. */
  memoryBeforeBytes: z.number(),
  memoryAfterBytes: z.number(),
  /** Memory of the sandbox held in swap afterwards (0 without swap). */
  swapBytes: z.number(),
});

export type PauseResult = z.infer<typeof PauseResultSchema>;

/** Resource use of one sandbox, read from its cgroups and writable layer (`GET /v1/sandboxes/{id}/stats`). */
export const SandboxStatsSchema = z.object({
  cpuUsageMs: z.number(),
  memoryBytes: z.number(),
  memoryPeakBytes: z.number(),
  memoryLimitBytes: z.number(),
  pids: z.number(),
  pidsLimit: z.number(),
  diskUsedBytes: z.number(),
  diskLimitBytes: z.number(),
  oomKills: z.number(),
  /**
   * Bytes fetched from the registry for the sandbox's lazily loaded layers (shared with the
   * other sandboxes of those layers on the node); absent when none is lazy.
   */
  layerBytesFetched: z.number().exactOptional(),
});
/** Resource use of one sandbox. */
export type SandboxStats = z.infer<typeof SandboxStatsSchema>;

/** GET /v1/sandboxes query. `label` repeats as `key=value`. */
export const ListSandboxesQuerySchema = z.strictObject({
  label: z
    .array(z.string().regex(/^[^=]+=.*$/, 'must be key=value'))
    .max(16)
    .optional(),
  state: SandboxStateSchema.optional(),
  limit: z.coerce.number().int().min(1).max(MAX_PAGE_SIZE).optional(),
  cursor: z.string().max(256).optional(),
});

export type ListSandboxesQuery = z.infer<typeof ListSandboxesQuerySchema>;

/** Most sandboxes one batch creates. */
export const MAX_BATCH_SIZE = 10_000;

/** One sandbox of a batch: a create request without an admission option of its own. */
export const SandboxRequestSchema = CreateSandboxRequestSchema.omit({ admission: true });

export type SandboxRequest = z.infer<typeof SandboxRequestSchema>;

/**
 * POST /v1/sandboxes:batch: `count` sandboxes of one `spec`, or one per entry of `items`. Each
 * entry of `items` is validated on its own: a bad one fails alone, naming `items.<i>.<field>`.
 */
export const CreateSandboxBatchRequestSchema = z
  .strictObject({
    spec: SandboxRequestSchema.optional(),
    count: z.number().int().min(1).max(MAX_BATCH_SIZE).optional(),
    items: z.array(z.unknown().describe('a sandbox create request (without admission)')).min(1).max(MAX_BATCH_SIZE).optional(),
    admission: AdmissionSchema.optional(),
  })
  .refine((b) => b.items === undefined || (b.spec === undefined && b.count === undefined), { error: 'give either spec with count, or items', path: ['items'] })
  .refine((b) => b.items !== undefined || b.spec !== undefined, { error: 'give either spec with count, or items', path: ['spec'] })
  .refine((b) => b.items !== undefined || b.count !== undefined, { error: 'required with spec', path: ['count'] });

export type CreateSandboxBatchRequest = z.infer<typeof CreateSandboxBatchRequestSchema>;

/** The outcome of one item of a batch: its sandbox, or the error that kept it from being created. */
export const BatchItemResultSchema = z.object({
  /** Position of the item in the request (for `count`, 0 to count-1). */
  index: z.number(),
  sandbox: SandboxSchema.optional(),
  error: ItemErrorSchema.optional(),
});

export type BatchItemResult = z.infer<typeof BatchItemResultSchema>;

/** 200 reply of a batch: one result per item, in request order. */
export const CreateSandboxBatchResultSchema = z.object({
  items: z.array(BatchItemResultSchema),
  created: z.number(),
  failed: z.number(),
});

export type CreateSandboxBatchResult = z.infer<typeof CreateSandboxBatchResultSchema>;

/** One line of a batch streamed as `application/x-ndjson`: an item as it finishes, then the summary. */
export const BatchEventSchema = z.discriminatedUnion('type', [
  BatchItemResultSchema.extend({ type: z.literal('item') }),
  z.object({ type: z.literal('summary'), created: z.number(), failed: z.number(), durationMs: z.number() }),
  /** The batch stopped early (items not reported were not created). */
  z.object({ type: z.literal('error'), error: ItemErrorSchema }),
]);

export type BatchEvent = z.infer<typeof BatchEventSchema>;
