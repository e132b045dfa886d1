// Request and response schemas of the HTTP API (/v1). The apiserver validates with them, the SDK
// infers its types from them, and the OpenAPI document is generated from them.
import { z } from 'zod';
import {
  BackendKindSchema,
  EnvSchema,
  ImageSpecSchema,
  LabelsSchema,
  LayerKindSchema,
  ResourcesSchema,
  SandboxStateSchema,
  CommandFieldsSchema,
  ONE_COMMAND,
  PtySchema,
  oneCommand,
} from './types.js';
import { NetworkPolicyPatchSchema, NetworkPolicySchema } from './network.js';

/** Default and largest page of a listing. */
export const DEFAULT_PAGE_SIZE = 100;
export const MAX_PAGE_SIZE = 1000;
/** Default sandbox lifetime when the create request gives none. */
export const DEFAULT_SANDBOX_TIMEOUT_MS = 3_600_000;
/** Longest lifetime a create request may ask for. */
export const MAX_SANDBOX_TIMEOUT_MS = 7 * 86_400_000;

/** POST /v1/sandboxes */
export const CreateSandboxRequestSchema = z.strictObject({
  backend: BackendKindSchema.optional(),
  image: ImageSpecSchema,
  resources: ResourcesSchema.optional(),
  env: EnvSchema.optional(),
  labels: LabelsSchema.optional(),
  /** Network policy; default `{mode: 'none'}` (loopback only). */
  network: NetworkPolicySchema.optional(),
  /** Lifetime in ms from creation; the sandbox is destroyed when it elapses. */
  timeoutMs: z.number().int().min(1000).max(MAX_SANDBOX_TIMEOUT_MS).optional(),
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
  layers: z.array(z.string()),
  resources: GrantedResourcesSchema,
  labels: z.record(z.string(), z.string()),
  /** Names of the environment variables set at create (values are not returned). */
  envKeys: z.array(z.string()),
  /** The network policy in force. */
  network: NetworkPolicySchema,
  createdAt: z.string(),
  expiresAt: z.string(),
});
export type Sandbox = z.infer<typeof SandboxSchema>;

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
export type ProcessBody = z.infer<typeof ProcessSchema>;

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
  kind: LayerKindSchema,
  name: z.string().max(256).optional(),
  /** `tar`: one layer tar (default); `oci`: an OCI layout or `docker save` tarball, squashed. */
  format: z.enum(['tar', 'oci']).optional(),
});

/** POST /v1/layers/debian */
export const DebianLayerRequestSchema = z.strictObject({
  kind: LayerKindSchema,
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
