// SDK types, inferred from the protocol's zod schemas so that they follow the API.
import type { z } from 'zod';
import type {
  ApiKeySchema,
  ApplyNetworkRequestSchema,
  ApplyNetworkResultSchema,
  EgressLogEntrySchema,
  NetworkPolicyPatchSchema,
  NetworkPolicySchema,
  SandboxNetworkSchema,
  CreateKeyRequestSchema,
  CreateOwnerRequestSchema,
  CreateProjectRequestSchema,
  CreateSandboxBatchRequestSchema,
  CreateSandboxRequestSchema,
  DebianLayerRequestSchema,
  ExecReplySchema,
  ExitInfoSchema,
  FileStatSchema,
  LayerSchema,
  LeaseSchema,
  NodeSchema,
  OwnerSchema,
  PauseResultSchema,
  PoolSchema,
  ProcessSchema,
  PutPoolRequestSchema,
  ProjectSchema,
  SandboxSchema,
  SandboxState,
  UploadLayerQuerySchema,
} from '@dsec/protocol';

/** A sandbox as the API describes it (`GET /v1/sandboxes/{id}`). */
export type SandboxInfo = z.infer<typeof SandboxSchema>;
/** What `Sandbox.create` sends: image, resources, env, labels, lifetime. */
export type SandboxCreateOptions = z.input<typeof CreateSandboxRequestSchema>;
/** What `Sandbox.createBatch` sends: `{spec, count}` or `{items}`, and an optional `admission`. */
export type SandboxBatchRequest = z.input<typeof CreateSandboxBatchRequestSchema>;
/** A warm pool with its ready and creating counts. */
export type PoolInfo = z.infer<typeof PoolSchema>;
/** What `pools.put` sends: the spec, the size, the idle timeout. */
export type PoolPutRequest = z.input<typeof PutPoolRequestSchema>;
/** How a process ended. */
export type ExitInfo = z.infer<typeof ExitInfoSchema>;
/** A command run to completion: its exit, its collected output and its process handle. */
export type ExecResult = z.infer<typeof ExecReplySchema>;
/** A process of a sandbox (`GET /v1/sandboxes/{id}/processes`). */
export type ProcessInfo = z.infer<typeof ProcessSchema>;
/** Metadata of one file in a sandbox. */
export type FileInfo = z.infer<typeof FileStatSchema>;
/** An image layer. */
export type LayerInfo = z.infer<typeof LayerSchema>;
/** Where and how a layer upload is stored (`kind`, `name`, `format`). */
export type LayerUploadQuery = z.input<typeof UploadLayerQuerySchema>;
/** A Debian layer build request. */
export type DebianLayerRequest = z.input<typeof DebianLayerRequestSchema>;
/** An API key (`key`, the secret, only in the reply of create). */
export type ApiKeyInfo = z.infer<typeof ApiKeySchema>;
/** A key create request. */
export type KeyCreateRequest = z.input<typeof CreateKeyRequestSchema>;
/** A project with its quota and usage. */
export type ProjectInfo = z.infer<typeof ProjectSchema>;
/** A project create request. */
export type ProjectCreateRequest = z.input<typeof CreateProjectRequestSchema>;
/** A node with its capacity. */
export type NodeInfo = z.infer<typeof NodeSchema>;

/** A sandbox's lease: idle timeout, lifetime, what losing its owner does (every field optional). */
export type LeaseOptions = z.input<typeof LeaseSchema>;
/** What opening an owner session takes (`graceMs`, `name`). */
export type OwnerCreateOptions = z.input<typeof CreateOwnerRequestSchema>;
/** An owner session. */
export type OwnerInfo = z.infer<typeof OwnerSchema>;
/** What a pause or resume did (the sandbox after it, time taken, memory before and after). */
export type PauseResult = z.infer<typeof PauseResultSchema>;
/** A network policy: `{mode: 'none'}` or `{mode: 'allowlist', allow, presets, allowAddresses, mirrors}`. */
export type NetworkPolicy = z.input<typeof NetworkPolicySchema>;
/** A change to a network policy: `{presets: {add: ['pypi']}}`, `{allow: {remove: ['x.com']}}`, ... */
export type NetworkPolicyPatch = z.input<typeof NetworkPolicyPatchSchema>;
/** A sandbox's network: policy, addresses, counters. */
export type SandboxNetworkInfo = z.infer<typeof SandboxNetworkSchema>;
/** One egress attempt with its verdict. */
export type EgressLogEntry = z.infer<typeof EgressLogEntrySchema>;
/** `client.applyNetwork` request: a label selector and a policy or a patch. */
export type ApplyNetworkRequest = z.input<typeof ApplyNetworkRequestSchema>;
/** Per-sandbox outcome of `client.applyNetwork`. */
export type ApplyNetworkResult = z.infer<typeof ApplyNetworkResultSchema>;

/** Resource use of a sandbox (`GET /v1/sandboxes/{id}/stats`). */
export type { SandboxStats } from '@dsec/protocol';

/** A filter for sandbox listings. */
export interface SandboxListOptions {
  /** Only sandboxes carrying all these labels. */
  labels?: Record<string, string>;
  state?: SandboxState;
  /** Page size (1-1000); default the server's (100). */
  limit?: number;
  signal?: AbortSignal;
}

/** One page of a listing. */
export interface Page<T> {
  items: T[];
  nextCursor: string | null;
}
