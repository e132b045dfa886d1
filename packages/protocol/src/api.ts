// Request and response schemas of the HTTP API (/v1). The apiserver validates with them, the SDK
// infers its types from them, and the OpenAPI document is generated from them.
import { z } from 'zod';
import {
  BackendKindSchema,
  BuildableLayerKindSchema,
  EnvSchema,
  ImageSpecSchema,
  LabelsSchema,
  LayerKindSchema,
  LayerRefSchema,
  ResourcesSchema,
  SandboxStateSchema,
  CommandFieldsSchema,
  ONE_COMMAND,
  PtySchema,
  oneCommand,
  NormalisedPathSchema,
  ProtectSchema,
  SecuritySchema,
} from './types.js';
import { NetworkPolicyPatchSchema, NetworkPolicySchema } from './network.js';

/** Default and largest page of a listing. */
export const DEFAULT_PAGE_SIZE = 100;
export const MAX_PAGE_SIZE = 1000;
/** Default sandbox lifetime when the create request gives none. */
export const DEFAULT_SANDBOX_TIMEOUT_MS = 3_600_000;
/** Longest lifetime a create request may ask for. */
export const MAX_SANDBOX_TIMEOUT_MS = 7 * 86_400_000;

// ---- leases and owners (docs/architecture.md, Lifecycle) ----

/** Idle time (no API activity) after which a sandbox's `onIdle` action is taken. */
export const DEFAULT_IDLE_TIMEOUT_MS = 600_000;
/** How long an owner may go without a heartbeat before it is lost. */
export const DEFAULT_OWNER_GRACE_MS = 60_000;
/** Shortest and longest owner grace period. */
export const MIN_OWNER_GRACE_MS = 1000;
export const MAX_OWNER_GRACE_MS = 86_400_000;
/** Longest heartbeat interval an owner is told to keep (a third of its grace, at most this). */
export const MAX_HEARTBEAT_INTERVAL_MS = 10_000;

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
});
export type GrantedLease = z.infer<typeof GrantedLeaseSchema>;

/** An owner id (`own_<hex>`). */
export const OwnerIdSchema = z.string().regex(/^own_[0-9a-f]{1,64}$/, 'not an owner id');

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

/** Header that makes a create (or a batch) idempotent. */
export const IDEMPOTENCY_KEY_HEADER = 'Idempotency-Key';
/** How long an idempotency key is remembered (ms). */
export const DEFAULT_IDEMPOTENCY_TTL_MS = 86_400_000;
/** An idempotency key: 1-255 printable ASCII characters, no spaces and no `#` (batches derive `<key>#<index>`). */
export const IdempotencyKeySchema = z
  .string()
  .min(1)
  .max(255)
  .regex(/^[\x21\x22\x24-\x7e]+$/, 'printable ASCII without spaces or #');

/** POST /v1/sandboxes: give exactly one of `image` or `snapshot`. */
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
});
export type CreateSandboxRequest = z.infer<typeof CreateSandboxRequestSchema>;

/** Resources as granted (defaults filled in). */
export const GrantedResourcesSchema = z.object({
  cpu: z.number(),
  memoryMiB: z.number(),
  diskMiB: z.number(),
  pids: z.number(),
  cpuClass: z.enum(['latency-sensitive', 'best-effort']),
});
export type GrantedResources = z.infer<typeof GrantedResourcesSchema>;

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
});
export type Sandbox = z.infer<typeof SandboxSchema>;

/** PATCH /v1/sandboxes/{id}: change the lease, or hand the sandbox to another owner (null: none). */
export const UpdateSandboxRequestSchema = z.strictObject({
  lease: LeaseSchema.optional(),
  owner: OwnerIdSchema.nullable().optional(),
});
export type UpdateSandboxRequest = z.infer<typeof UpdateSandboxRequestSchema>;

/** POST /v1/sandboxes/{id}/resume */
export const ResumeRequestSchema = z.strictObject({
  /** Read swapped-out process memory back in before answering. Default true. */
  prefetch: z.boolean().optional(),
});

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

/** GET /v1/sandboxes query. `label` repeats as `key=value`. */
export const ListSandboxesQuerySchema = z.strictObject({
  label: z.array(z.string().regex(/^[^=]+=.*$/, 'must be key=value')).max(16).optional(),
  state: SandboxStateSchema.optional(),
  limit: z.coerce.number().int().min(1).max(MAX_PAGE_SIZE).optional(),
  cursor: z.string().max(256).optional(),
});
export type ListSandboxesQuery = z.infer<typeof ListSandboxesQuerySchema>;

/** A page of a listing. */
export function pageOf<T extends z.ZodType>(item: T) {
  return z.object({ items: z.array(item), nextCursor: z.string().nullable() });
}

/** POST /v1/sandboxes/{id}/exec */
export const ExecRequestSchema = CommandFieldsSchema.extend({
  /** Text written to stdin, then stdin is closed. */
  stdin: z.string().max(16 * 1024 * 1024).optional(),
  /** Base64 bytes written to stdin, then stdin is closed (binary-safe form of `stdin`). */
  stdinBase64: z.string().max(22 * 1024 * 1024).optional(),
})
  .refine(oneCommand, ONE_COMMAND)
  .refine((s) => s.stdin === undefined || s.stdinBase64 === undefined, { message: 'give at most one of stdin or stdinBase64', path: ['stdin'] });
export type ExecRequest = z.infer<typeof ExecRequestSchema>;

/** How a process ended. */
export const ExitInfoSchema = z.object({
  exitCode: z.number().nullable(),
  signal: z.string().nullable(),
  timedOut: z.boolean(),
  oomKilled: z.boolean(),
  durationMs: z.number(),
  cpuUserMs: z.number(),
  cpuSysMs: z.number(),
  peakMemoryKiB: z.number(),
  stdoutBytes: z.number(),
  stderrBytes: z.number(),
});

/** 200 reply of exec (without streaming). */
export const ExecResultSchema = ExitInfoSchema.extend({
  /** The process's handle in this sandbox (the `{pid}` of the process routes). */
  pid: z.number(),
  stdout: z.string(),
  stderr: z.string(),
  truncated: z.boolean(),
});
export type ExecResultBody = z.infer<typeof ExecResultSchema>;

/**
 * One line of an `application/x-ndjson` exec or output stream (and one WebSocket message).
 * Output data is base64 so that any bytes pass.
 */
export const ExecEventSchema = z.discriminatedUnion('type', [
  z.object({ type: z.literal('start'), pid: z.number(), osPid: z.number() }),
  z.object({ type: z.literal('output'), stream: z.enum(['stdout', 'stderr']), offset: z.number(), data: z.string() }),
  z.object({ type: z.literal('gap'), stream: z.enum(['stdout', 'stderr']), offset: z.number(), bytes: z.number() }),
  ExitInfoSchema.extend({ type: z.literal('exit'), pid: z.number() }),
  z.object({ type: z.literal('error'), error: z.object({ code: z.string(), message: z.string() }) }),
]);
export type ExecEvent = z.infer<typeof ExecEventSchema>;

/** First WebSocket message of /v1/sandboxes/{id}/exec/ws: what to run. */
export const WsExecRequestSchema = CommandFieldsSchema.extend({ pty: PtySchema.optional() }).refine(oneCommand, ONE_COMMAND);

/** Later WebSocket messages from the client. */
export const WsClientMessageSchema = z.discriminatedUnion('type', [
  z.object({ type: z.literal('stdin'), data: z.string().max(2 * 1024 * 1024) }),
  z.object({ type: z.literal('eof') }),
  z.object({ type: z.literal('resize'), rows: z.number().int().min(1).max(1000), cols: z.number().int().min(1).max(1000) }),
  z.object({ type: z.literal('signal'), signal: z.string().max(16) }),
]);
export type WsClientMessage = z.infer<typeof WsClientMessageSchema>;

/** A process of a sandbox. */
export const ProcessSchema = z.object({
  pid: z.number(),
  osPid: z.number(),
  argv: z.array(z.string()),
  state: z.enum(['running', 'exited']),
  stdoutBytes: z.number(),
  stderrBytes: z.number(),
  exit: ExitInfoSchema.optional(),
});
/** A process of a sandbox: `pid` is dsec's id of it, `osPid` its process id inside the sandbox. */
export type ProcessInfo = z.infer<typeof ProcessSchema>;

/** GET /v1/sandboxes/{id}/processes/{pid}/output query. */
export const OutputQuerySchema = z.strictObject({
  from: z.coerce.number().int().min(0).optional(),
  fromStderr: z.coerce.number().int().min(0).optional(),
});

/** POST /v1/sandboxes/{id}/processes/{pid}/signal */
export const SignalRequestSchema = z.strictObject({ signal: z.string().regex(/^(SIG)?[A-Z0-9]+$/).max(16) });

/** Query of the file routes. */
export const FilePathQuerySchema = z.strictObject({
  path: z.string().startsWith('/', 'must be absolute').max(4096),
  offset: z.coerce.number().int().min(0).optional(),
  length: z.coerce.number().int().min(0).optional(),
  mode: z.string().regex(/^[0-7]{3,4}$/, 'octal mode').optional(),
  append: z.enum(['true', 'false']).optional(),
  recursive: z.enum(['true', 'false']).optional(),
});

/** POST /v1/sandboxes/{id}/files/rename */
export const RenameRequestSchema = z.strictObject({
  from: z.string().startsWith('/', 'must be absolute').max(4096),
  to: z.string().startsWith('/', 'must be absolute').max(4096),
});

/** A file's metadata. */
export const FileStatSchema = z.object({
  name: z.string(),
  type: z.enum(['file', 'dir', 'symlink', 'other']),
  mode: z.number(),
  size: z.number(),
  mtimeMs: z.number(),
  uid: z.number().optional(),
  gid: z.number().optional(),
  linkTarget: z.string().optional(),
});

/** POST /v1/layers query (the body is a tar stream, optionally gzip-compressed). */
export const UploadLayerQuerySchema = z.strictObject({
  kind: BuildableLayerKindSchema,
  name: z.string().max(256).optional(),
  /** `tar`: one layer tar (default); `oci`: an OCI layout or `docker save` tarball, squashed. */
  format: z.enum(['tar', 'oci']).optional(),
});

/** POST /v1/layers/debian */
export const DebianLayerRequestSchema = z.strictObject({
  kind: BuildableLayerKindSchema,
  name: z.string().max(256).optional(),
  packages: z.array(z.string().regex(/^[a-z0-9][a-z0-9+.-]+$/, 'not a Debian package name')).max(500),
  suite: z.string().regex(/^[a-z]+$/).optional(),
});

/** A layer as the API returns it. */
export const LayerSchema = z.object({
  digest: z.string(),
  kind: LayerKindSchema,
  names: z.array(z.string()),
  /** `public` for the node's built-in layers, else the owning project. */
  project: z.string(),
  contentBytes: z.number(),
  files: z.number(),
  createdAt: z.string(),
  /** For a snapshot layer: where it comes from and what it sits on. */
  snapshot: z
    .object({
      /** The layers below it, bottom first (a sandbox made from it gets these plus it). */
      parents: z.array(z.string()),
      /** The sandbox it was taken of. */
      sandboxId: z.string(),
      /** Trajectory steps of that sandbox with a lower seq were recorded before it was taken. */
      seq: z.number(),
    })
    .optional(),
});
export type Layer = z.infer<typeof LayerSchema>;

/** Roles of an API key, most powerful first. */
export const RoleSchema = z.enum(['admin', 'member', 'viewer']);
export type Role = z.infer<typeof RoleSchema>;

/** Limits of a project; usage of sub-projects counts toward every ancestor. */
export const QuotaSchema = z.strictObject({
  sandboxes: z.number().int().min(0).max(10_000_000),
  cpu: z.number().min(0).max(10_000_000),
  memoryMiB: z.number().int().min(0).max(1_000_000_000),
});
export type Quota = z.infer<typeof QuotaSchema>;

/** POST /v1/projects: a sub-project of the caller's project (or of `parent`, one of its descendants). */
export const CreateProjectRequestSchema = z.strictObject({
  name: z.string().regex(/^[a-z0-9][a-z0-9-]{0,62}$/, 'lowercase letters, digits and -'),
  parent: z.string().max(64).optional(),
  quota: QuotaSchema.partial().optional(),
});

/** A project. */
export const ProjectSchema = z.object({
  id: z.string(),
  name: z.string(),
  parent: z.string().nullable(),
  quota: QuotaSchema,
  usage: QuotaSchema,
  createdAt: z.string(),
});
export type Project = z.infer<typeof ProjectSchema>;

/** POST /v1/keys */
export const CreateKeyRequestSchema = z.strictObject({
  name: z.string().min(1).max(64),
  role: RoleSchema,
  /** Project the key acts in; default the caller's. Must be the caller's or a descendant. */
  project: z.string().max(64).optional(),
});

/** An API key (the secret is returned once, at creation). */
export const ApiKeySchema = z.object({
  id: z.string(),
  name: z.string(),
  role: RoleSchema,
  project: z.string(),
  createdAt: z.string(),
  revokedAt: z.string().nullable(),
  key: z.string().optional(),
});
export type ApiKey = z.infer<typeof ApiKeySchema>;

/** A node's capacity and use. */
export const NodeSchema = z.object({
  name: z.string(),
  healthy: z.boolean(),
  backends: z.array(BackendKindSchema),
  capacity: z.object({ cpu: z.number(), memoryMiB: z.number(), sandboxes: z.number() }),
  allocatable: z.object({ cpu: z.number(), memoryMiB: z.number() }),
  allocated: z.object({ cpu: z.number(), memoryMiB: z.number(), sandboxes: z.number() }),
});
export type NodeBody = z.infer<typeof NodeSchema>;

/** Every error body: `{error: {code, message, field?, ...}}`. */
export const ErrorBodySchema = z.object({
  error: z.object({ code: z.string(), message: z.string(), field: z.string().optional() }).passthrough(),
});

// ---- function calls (the fncall backend) ----

/** Runtimes every node offers for function calls. */
export const CallRuntimeSchema = z.enum(['sh', 'python3', 'node']);
export type CallRuntime = z.infer<typeof CallRuntimeSchema>;
/** Default and largest time limit of one call. */
export const DEFAULT_CALL_TIMEOUT_MS = 10_000;
export const MAX_CALL_TIMEOUT_MS = 300_000;
/** Default memory limit of one call (the whole process tree, tmpfs files included). */
export const DEFAULT_CALL_MEMORY_MIB = 256;
export const MAX_CALL_MEMORY_MIB = 8192;
/** Default and largest cap on each of stdout and stderr of one call. */
export const DEFAULT_CALL_OUTPUT_LIMIT_BYTES = 1_048_576;
export const MAX_CALL_OUTPUT_LIMIT_BYTES = 16 * 1_048_576;
/** Most calls in one batch. */
export const MAX_CALL_BATCH = 1000;

const callFilePath = z
  .string()
  .max(1024)
  .regex(/^(?!\/)(?!.*(^|\/)\.\.?(\/|$))[^\0]+$/, 'must be a relative path without . or .. segments');

/** POST /v1/calls: run a snippet once in a fresh sandbox. */
export const CallRequestSchema = z
  .strictObject({
    /** A built-in runtime (`code` runs as `sh -c`, `python3 -c` or `node -e`). */
    runtime: CallRuntimeSchema.optional(),
    /** Any layer set instead of a runtime (`code` then runs as `/bin/sh -c`). */
    image: ImageSpecSchema.optional(),
    /** Source text for the runtime. */
    code: z.string().min(1).max(1_048_576).optional(),
    /** A command line instead of `code`, run in the working directory `/work`. */
    argv: z.array(z.string().max(1_048_576)).min(1).max(4096).optional(),
    /** Files written under `/work` before the call: relative path -> UTF-8 content. */
    files: z
      .record(callFilePath, z.string().max(16 * 1_048_576))
      .refine((f) => Object.keys(f).length <= 256, 'at most 256 files')
      .optional(),
    stdin: z.string().max(16 * 1_048_576).optional(),
    env: EnvSchema.optional(),
    /** Wall-clock limit in ms; the call's processes are killed when it elapses. */
    timeoutMs: z.number().int().min(1).max(MAX_CALL_TIMEOUT_MS).optional(),
    /** Memory limit of the call in MiB. */
    memoryMiB: z.number().int().min(16).max(MAX_CALL_MEMORY_MIB).optional(),
    /** Cap on each of stdout and stderr in bytes; past it the call is killed and `truncated` set. */
    outputLimitBytes: z.number().int().min(0).max(MAX_CALL_OUTPUT_LIMIT_BYTES).optional(),
  })
  .refine((s) => (s.runtime === undefined) !== (s.image === undefined), { message: 'give exactly one of runtime or image', path: ['runtime'] })
  .refine((s) => (s.code === undefined) !== (s.argv === undefined), { message: 'give exactly one of code or argv', path: ['code'] });
export type CallRequest = z.infer<typeof CallRequestSchema>;

/** The result of one call. */
export const CallResultSchema = z.object({
  /** Exit status, or null when killed by a signal. */
  exitCode: z.number().nullable(),
  signal: z.string().nullable(),
  stdout: z.string(),
  stderr: z.string(),
  durationMs: z.number(),
  /** User plus system CPU time of the call's processes. */
  cpuMs: z.number(),
  peakMemoryKiB: z.number(),
  /** True when output past `outputLimitBytes` was dropped (the call was killed). */
  truncated: z.boolean(),
  /** True when `timeoutMs` elapsed and the call was killed. */
  timedOut: z.boolean(),
  /** True when the memory limit killed a process of the call. */
  oomKilled: z.boolean(),
});
export type CallResult = z.infer<typeof CallResultSchema>;

/** POST /v1/calls/batch */
export const CallBatchRequestSchema = z.strictObject({ calls: z.array(CallRequestSchema).min(1).max(MAX_CALL_BATCH) });
export type CallBatchRequest = z.infer<typeof CallBatchRequestSchema>;

/** One entry of a batch reply: a result, or the error that kept the call from running. */
export const CallBatchItemSchema = z.union([CallResultSchema, z.object({ error: z.object({ code: z.string(), message: z.string() }) })]);
export type CallBatchItem = z.infer<typeof CallBatchItemSchema>;

/** 200 reply of POST /v1/calls/batch: one item per call, in request order. */
export const CallBatchResultSchema = z.object({ results: z.array(CallBatchItemSchema) });
export type CallBatchResult = z.infer<typeof CallBatchResultSchema>;

// ---- batches and warm pools ----

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
  .refine((b) => b.items === undefined || (b.spec === undefined && b.count === undefined), { message: 'give either spec with count, or items', path: ['items'] })
  .refine((b) => b.items !== undefined || b.spec !== undefined, { message: 'give either spec with count, or items', path: ['spec'] })
  .refine((b) => b.items !== undefined || b.count !== undefined, { message: 'required with spec', path: ['count'] });
export type CreateSandboxBatchRequest = z.infer<typeof CreateSandboxBatchRequestSchema>;

/** The error of one failed item (the same body as an error reply's `error`). */
export const ItemErrorSchema = z.object({ code: z.string(), message: z.string(), field: z.string().optional() }).passthrough();
export type ItemError = z.infer<typeof ItemErrorSchema>;

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
// ---- snapshots, forks, trajectories, replay ----

/** Most sandboxes one fork creates. */
export const MAX_FORK_COUNT = 256;

/** POST /v1/sandboxes/{id}/snapshot */
export const SnapshotRequestSchema = z.strictObject({
  /** `name` or `name:tag` for the snapshot layer in the sandbox's project. */
  name: z.string().max(256).optional(),
});

/** POST /v1/sandboxes/{id}/fork: one snapshot, then `count` sandboxes from it. */
export const ForkRequestSchema = z.strictObject({
  count: z.number().int().min(1).max(MAX_FORK_COUNT),
  /** Added to (and overriding) the source sandbox's labels. */
  labels: LabelsSchema.optional(),
  /** Lifetime of each new sandbox; default the API's. */
  timeoutMs: z.number().int().min(1000).max(MAX_SANDBOX_TIMEOUT_MS).optional(),
});
export type ForkRequest = z.infer<typeof ForkRequestSchema>;

/** 201 reply of a fork. */
export const ForkResultSchema = z.object({ snapshot: LayerSchema, sandboxes: z.array(SandboxSchema) });
export type ForkResult = z.infer<typeof ForkResultSchema>;

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
/** Default and largest page of a diff. */
export const DEFAULT_DIFF_PAGE = 1000;
export const MAX_DIFF_PAGE = 10_000;
/** Largest file hashed in a diff or an integrity check (larger ones are reported unhashed). */
export const MAX_HASH_BYTES = 64 * 1024 * 1024;
/** Most paths in one integrity check. */
export const MAX_VERIFY_PATHS = 1024;

/** Options of a diff: which paths, whether to hash, which page. */
export const DiffOptionsSchema = z.strictObject({
  /** Only entries at or below these paths (default: everything). */
  paths: z.array(NormalisedPathSchema).max(32).optional(),
  /** sha256 of added and changed regular files (default true). */
  hash: z.boolean().optional(),
  limit: z.number().int().min(1).max(MAX_DIFF_PAGE).optional(),
  /** `nextCursor` of the previous page. */
  cursor: z.string().max(8192).optional(),
});
export type DiffOptions = z.infer<typeof DiffOptionsSchema>;

/** GET /v1/sandboxes/{id}/diff query (`path` repeats). */
export const DiffQuerySchema = z.strictObject({
  path: z.array(NormalisedPathSchema).max(32).optional(),
  hash: z.enum(['true', 'false']).optional(),
  limit: z.coerce.number().int().min(1).max(MAX_DIFF_PAGE).optional(),
  cursor: z.string().max(8192).optional(),
});

/**
 * One change of a sandbox against its layers. `added`: not in the layers; `changed`: in the
 * layers, written or its metadata changed; `deleted`: in the layers, removed; `replaced`: a
 * directory removed and made again (nothing below it comes from the layers) or a path whose
 * type changed.
 */
export const DiffEntrySchema = z.object({
  path: z.string(),
  change: z.enum(['added', 'changed', 'deleted', 'replaced']),
  type: z.enum(['file', 'dir', 'symlink', 'other']),
  /** Mode bits and owner as the sandbox sees them (absent for deletions). */
  mode: z.number().optional(),
  uid: z.number().optional(),
  gid: z.number().optional(),
  size: z.number().optional(),
  /** sha256 (hex) of a regular file's content. */
  sha256: z.string().optional(),
  /** Why a regular file has no sha256 (too large, the call's hashing budget spent). */
  hashSkipped: z.string().optional(),
  /** For `changed` regular files that were hashed: false when only metadata changed. */
  contentChanged: z.boolean().optional(),
  linkTarget: z.string().optional(),
});
export type DiffEntry = z.infer<typeof DiffEntrySchema>;

/** 200 reply of GET /v1/sandboxes/{id}/diff: entries in path order, a page at a time. */
export const DiffResultSchema = z.object({
  entries: z.array(DiffEntrySchema),
  nextCursor: z.string().nullable(),
  /** False while the sandbox kept running during the walk (no freeze available): a file written meanwhile may be seen half-written. */
  frozen: z.boolean(),
});
export type DiffResult = z.infer<typeof DiffResultSchema>;

/** POST /v1/sandboxes/{id}/verify: the sha256 each path must have. */
export const VerifyRequestSchema = z.strictObject({
  expected: z
    .record(NormalisedPathSchema, z.string().regex(/^[0-9a-f]{64}$/, 'must be a lowercase hex sha256'))
    .refine((e) => Object.keys(e).length >= 1 && Object.keys(e).length <= MAX_VERIFY_PATHS, `1 to ${MAX_VERIFY_PATHS} paths`),
});
export type VerifyRequest = z.infer<typeof VerifyRequestSchema>;

/** The check of one path. */
export const VerifyItemSchema = z.object({
  path: z.string(),
  expected: z.string(),
  /** sha256 of what the sandbox holds there now; null when it is not a regular file or is too large. */
  actual: z.string().nullable(),
  ok: z.boolean(),
  /** Why it failed: missing, not-a-file, symlink-in-path, too-large, mismatch. */
  reason: z.string().optional(),
  /** Where the content comes from: the sandbox's writable layer or its image layers. */
  source: z.enum(['upper', 'layers']).optional(),
});
export type VerifyItem = z.infer<typeof VerifyItemSchema>;

/** 200 reply of POST /v1/sandboxes/{id}/verify. */
export const VerifyResultSchema = z.object({ ok: z.boolean(), results: z.array(VerifyItemSchema) });
export type VerifyResult = z.infer<typeof VerifyResultSchema>;

/** Traffic and attempt counters of a sandbox's network. */
export const NetworkStatsSchema = z.object({
  /** Bytes from upstreams to the sandbox, through the proxy. */
  bytesIn: z.number(),
  /** Bytes from the sandbox to upstreams, through the proxy. */
  bytesOut: z.number(),
  /** Proxy connections open now. */
  connections: z.number(),
  /** Proxy connections since the sandbox joined the network. */
  totalConnections: z.number(),
  /** Attempts allowed (connections and DNS answers). */
  allowed: z.number(),
  /** Attempts denied (proxy, DNS stub and kernel). */
  denied: z.number(),
});

/** GET /v1/sandboxes/{id}/network; also the reply of PUT and PATCH. */
export const SandboxNetworkSchema = z.object({
  policy: NetworkPolicySchema,
  /** The sandbox's address (allowlist only). */
  address: z.string().optional(),
  /** Its gateway: DNS stub and proxy (allowlist only). */
  gateway: z.string().optional(),
  /** `HTTP_PROXY` value commands in the sandbox get (allowlist only). */
  proxy: z.string().optional(),
  stats: NetworkStatsSchema,
});
export type SandboxNetwork = z.infer<typeof SandboxNetworkSchema>;

/** One egress attempt and its verdict. */
export const EgressLogEntrySchema = z.object({
  at: z.string().optional(),
  sandboxId: z.string(),
  /** Where it was decided: proxy (`http`, `connect`, `transparent-http`, `transparent-tls`, `mirror`), `dns` or `kernel`. */
  via: z.string(),
  host: z.string(),
  port: z.number(),
  protocol: z.string().optional(),
  address: z.string().optional(),
  verdict: z.enum(['allowed', 'denied']),
  rule: z.string().optional(),
  reason: z.string().optional(),
});
export type EgressLogEntryBody = z.infer<typeof EgressLogEntrySchema>;

/** Default and largest number of attempts `GET .../network/log` returns. */
export const DEFAULT_NETWORK_LOG_LIMIT = 100;
export const MAX_NETWORK_LOG_LIMIT = 1000;

/** GET /v1/sandboxes/{id}/network/log query. */
export const NetworkLogQuerySchema = z.strictObject({
  limit: z.coerce.number().int().min(1).max(MAX_NETWORK_LOG_LIMIT).optional(),
});

/** Most sandboxes one `network:apply` changes. */
export const MAX_NETWORK_APPLY_SANDBOXES = 10_000;

/** POST /v1/network:apply — replace or patch the policy of every sandbox matching the labels. */
export const ApplyNetworkRequestSchema = z
  .strictObject({
    selector: z.strictObject({
      labels: LabelsSchema.refine((l) => Object.keys(l).length > 0, 'give at least one label'),
    }),
    policy: NetworkPolicySchema.optional(),
    patch: NetworkPolicyPatchSchema.optional(),
  })
  .refine((r) => (r.policy === undefined) !== (r.patch === undefined), { message: 'give exactly one of policy or patch', path: ['policy'] });
export type ApplyNetworkRequest = z.infer<typeof ApplyNetworkRequestSchema>;

/** The outcome of `network:apply`, per sandbox. */
export const ApplyNetworkResultSchema = z.object({
  /** Sandboxes the selector matched. */
  matched: z.number(),
  applied: z.array(z.object({ id: z.string(), network: NetworkPolicySchema })),
  /** Sandboxes whose policy did not change (their old policy stays in force). */
  failed: z.array(z.object({ id: z.string(), error: z.object({ code: z.string(), message: z.string() }) })),
});
export type ApplyNetworkResult = z.infer<typeof ApplyNetworkResultSchema>;
