import { z } from 'zod';
import { NetworkPolicySchema } from './network.js';

/** The four isolation backends of dsec. */
export const BackendKindSchema = z.enum(['fncall', 'container', 'microvm', 'vm']);
/** One of the four isolation backends. */
export type BackendKind = z.infer<typeof BackendKindSchema>;

/**
 * The kind of an image layer: a base, a workspace on top, toolkits above that; a snapshot is a
 * sandbox's packed writable layer, above the layers it was taken over.
 */
export const LayerKindSchema = z.enum(['base', 'workspace', 'toolkit', 'snapshot']);
/** The kind of an image layer. */
export type LayerKind = z.infer<typeof LayerKindSchema>;
/** Kinds a layer can be built or uploaded as (snapshots only come from sandboxes). */
export const BuildableLayerKindSchema = z.enum(['base', 'workspace', 'toolkit']);
/** A kind a layer can be built as. */
export type BuildableLayerKind = z.infer<typeof BuildableLayerKindSchema>;

/** Lifecycle states of a sandbox (DESIGN.md, Lifecycle). */
export const SandboxStateSchema = z.enum(['pending', 'creating', 'running', 'paused', 'stopped', 'failed', 'lost']);
/** Lifecycle state of a sandbox. */
export type SandboxState = z.infer<typeof SandboxStateSchema>;

/** A layer reference: `sha256:<64 hex>`, a bare 64-hex digest, `name` or `name:tag`. */
export const LayerRefSchema = z
  .string()
  .min(1)
  .max(256)
  .regex(/^(sha256:[0-9a-f]{64}|[0-9a-f]{64}|[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]{1,128})?)$/, 'not a layer reference (sha256:<hex>, name or name:tag)');

/** An environment: base + optional workspace + toolkits (lowest first). */
export const ImageSpecSchema = z.strictObject({
  base: LayerRefSchema,
  workspace: LayerRefSchema.optional(),
  toolkits: z.array(LayerRefSchema).max(16).optional(),
});
/** An environment: base + optional workspace + toolkits. */
export type ImageSpec = z.infer<typeof ImageSpecSchema>;

/**
 * The layers of an image, bottom first, each with the field that named it (`image.base`,
 * `image.workspace`, `image.toolkits.2`): the one place that says how an image stacks.
 */
export function imageLayers(image: ImageSpec): Array<{ field: string; ref: string }> {
  const out = [{ field: 'image.base', ref: image.base }];
  if (image.workspace !== undefined) out.push({ field: 'image.workspace', ref: image.workspace });
  (image.toolkits ?? []).forEach((ref, i) => out.push({ field: `image.toolkits.${i}`, ref }));
  return out;
}

/** Default CPU request in cores. */
export const DEFAULT_CPU = 1;
/** Default memory limit. */
export const DEFAULT_MEMORY_MIB = 512;
/** Default size of the writable layer. */
export const DEFAULT_DISK_MIB = 1024;
/** Default process limit. */
export const DEFAULT_PIDS = 512;
/** Default open-file limit (RLIMIT_NOFILE). */
export const DEFAULT_OPEN_FILES = 4096;

/** Resource requests and limits of a sandbox. */
export const ResourcesSchema = z.strictObject({
  /** CPU in cores (fractions allowed); sets the weight and the quota. */
  cpu: z.number().positive().max(256).optional(),
  memoryMiB: z.number().int().min(16).max(1_048_576).optional(),
  diskMiB: z.number().int().min(1).max(1_048_576).optional(),
  pids: z.number().int().min(8).max(1_000_000).optional(),
  openFiles: z.number().int().min(64).max(1_048_576).optional(),
  /** latency-sensitive (default) or best-effort (SCHED_IDLE, low weight). */
  cpuClass: z.enum(['latency-sensitive', 'best-effort']).optional(),
});
/** Resource requests and limits of a sandbox. */
export type Resources = z.infer<typeof ResourcesSchema>;

const envKey = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'not an environment variable name').max(256);
/** Environment variables: names are shell identifiers, values at most 128 KiB. */
export const EnvSchema = z.record(envKey, z.string().max(131_072)).refine((e) => Object.keys(e).length <= 1024, 'at most 1024 variables');

/** Labels: short keys and values, at most 64. */
export const LabelsSchema = z
  .record(z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$/, 'not a label key'), z.string().max(256))
  .refine((l) => Object.keys(l).length <= 64, 'at most 64 labels');

/** Most snapshots stacked on one image (a snapshot of a sandbox made from a snapshot, ...). */
export const MAX_SNAPSHOT_DEPTH = 16;
/** Most paths in each list of {@link ProtectSchema}. */
export const MAX_PROTECTED_PATHS = 32;
/** Top-level directories a protected path may not be in (the platform's own mounts). */
const UNPROTECTABLE = ['proc', 'sys', 'dev', '.dsec'];

/** An absolute, normalised path inside a sandbox: no `.`/`..` components, no `//`, no trailing `/` (`/` itself allowed). */
export const NormalisedPathSchema = z
  .string()
  .min(1)
  .max(4096)
  .refine((p) => p.startsWith('/') && !p.includes('\0'), 'must be an absolute path without NUL')
  .refine((p) => p === '/' || p.slice(1).split('/').every((c) => c !== '' && c !== '.' && c !== '..'), 'must be normalised (no empty, . or .. components, no trailing /)');

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
  denySyscalls: z.array(z.string().regex(/^[a-z0-9_]{1,64}$/, 'not a system call name')).max(256).optional(),
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
  hostname: z.string().regex(/^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/, 'not a hostname').optional(),
  /** Hardening beyond the defaults; the control plane merges run-time rules (POST /v1/rules) in. */
  protect: ProtectSchema.optional(),
  security: SecuritySchema.optional(),
  /** Network policy; default `{mode: 'none'}` (loopback only). */
  network: NetworkPolicySchema.optional(),
});
/** What edge needs to create one sandbox. */
export type SandboxSpec = z.infer<typeof SandboxSpecSchema>;

/** What a claim applies to a sandbox created ahead of demand (a warm pool's). */
export const SandboxClaimSchema = z.strictObject({ env: EnvSchema.optional(), labels: LabelsSchema.optional() });
/** What a claim applies to a pooled sandbox. */
export type SandboxClaim = z.infer<typeof SandboxClaimSchema>;

/** Largest single command line (argv bytes, or a shell string). */
export const MAX_COMMAND_BYTES = 1_048_576;

/** The fields every way of running a command shares (exec, streaming exec, WebSocket). */
export const CommandFieldsSchema = z.strictObject({
  cmd: z.string().min(1).max(MAX_COMMAND_BYTES).optional(),
  argv: z.array(z.string().max(MAX_COMMAND_BYTES)).min(1).max(65_536).optional(),
  cwd: z.string().startsWith('/', 'must be absolute').max(4096).optional(),
  env: EnvSchema.optional(),
  uid: z.number().int().min(0).max(4_294_967_294).optional(),
  gid: z.number().int().min(0).max(4_294_967_294).optional(),
  timeoutMs: z.number().int().min(1).max(86_400_000).optional(),
});

/** A terminal size. */
export const PtySchema = z.strictObject({ rows: z.number().int().min(1).max(1000), cols: z.number().int().min(1).max(1000) });

/** Refinement: exactly one of `cmd` (a shell string) or `argv`. */
export function oneCommand(s: { cmd?: string | undefined; argv?: string[] | undefined }): boolean {
  return (s.cmd === undefined) !== (s.argv === undefined);
}
/** The message and field of {@link oneCommand}'s refusal. */
export const ONE_COMMAND = { message: 'give exactly one of cmd or argv', path: ['cmd'] };

/** One command to run in a sandbox, as edge takes it. */
export const ExecSpecSchema = CommandFieldsSchema.extend({
  stdin: z.union([z.string(), z.instanceof(Uint8Array)]).optional(),
  keepStdinOpen: z.boolean().optional(),
  pty: PtySchema.optional(),
}).refine(oneCommand, ONE_COMMAND);
/** One command to run in a sandbox. */
export type ExecSpec = z.infer<typeof ExecSpecSchema>;

/** How a process ended. */
export interface ExitInfo {
  /** Exit status, or null when killed by a signal. */
  exitCode: number | null;
  /** Signal name (`SIGKILL`) when killed by one, else null. */
  signal: string | null;
  timedOut: boolean;
  /** True when the sandbox's memory limit killed it. */
  oomKilled: boolean;
  durationMs: number;
  cpuUserMs: number;
  cpuSysMs: number;
  peakMemoryKiB: number;
  stdoutBytes: number;
  stderrBytes: number;
}

/** The result of a command run to completion. */
export interface ExecResult extends ExitInfo {
  stdout: string;
  stderr: string;
  /** True when output beyond the caller's limit was dropped. */
  truncated: boolean;
}

/** File type in a sandbox. */
export type FileType = 'file' | 'dir' | 'symlink' | 'other';

/** Metadata of one file in a sandbox. */
export interface FileStat {
  name: string;
  type: FileType;
  mode: number;
  size: number;
  mtimeMs: number;
  uid?: number;
  gid?: number;
  linkTarget?: string;
}

/** A content-addressed layer held by a node. */
export interface LayerInfo {
  /** `sha256:<hex>` of the layer's EROFS metadata image followed by its data blob. */
  digest: string;
  kind: LayerKind;
  /** `name:tag` aliases pointing at this layer. */
  names: string[];
  labels: Record<string, string>;
  /** Bytes of file content in the layer. */
  contentBytes: number;
  metaBytes: number;
  blobBytes: number;
  files: number;
  createdAt: string;
}

/** Resource use of one sandbox, read from its cgroups and writable layer. */
export interface SandboxStats {
  cpuUsageMs: number;
  memoryBytes: number;
  memoryPeakBytes: number;
  memoryLimitBytes: number;
  pids: number;
  pidsLimit: number;
  diskUsedBytes: number;
  diskLimitBytes: number;
  oomKills: number;
}
