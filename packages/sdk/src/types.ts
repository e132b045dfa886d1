// The SDK's names for the protocol's types (replies are the types inferred from the API's schemas;
// what the SDK sends is the schemas' input, defaults left to the server).
import type { z } from 'zod';
import type {
  ApiKey,
  ApplyNetworkRequestSchema,
  ApplyNetworkResult as ProtocolApplyNetworkResult,
  CreateKeyRequestSchema,
  CreateOwnerRequestSchema,
  CreateProjectRequestSchema,
  CreateSandboxBatchRequestSchema,
  CreateSandboxRequestSchema,
  DebianLayerRequestSchema,
  VmLayerRequestSchema,
  EgressLogEntry as ProtocolEgressLogEntry,
  ExecReply,
  ExitInfo as ProtocolExitInfo,
  FileStat,
  Layer,
  LeaseSchema,
  NetworkPolicyPatchSchema,
  NetworkPolicySchema,
  NodeInfo as ProtocolNodeInfo,
  Owner,
  PauseResult as ProtocolPauseResult,
  Pool,
  ProcessInfo as ProtocolProcessInfo,
  Project,
  PutPoolRequestSchema,
  Sandbox,
  SandboxNetwork,
  SandboxState,
  UploadLayerQuerySchema,
} from '@dsec/protocol';

/** A sandbox as the API describes it (`GET /v1/sandboxes/{id}`). */
export type SandboxInfo = Sandbox;
/** What `Sandbox.create` sends: image, resources, env, labels, lifetime. */
export type SandboxCreateOptions = z.input<typeof CreateSandboxRequestSchema>;
/** What `Sandbox.createBatch` sends: `{spec, count}` or `{items}`, and an optional `admission`. */
export type SandboxBatchRequest = z.input<typeof CreateSandboxBatchRequestSchema>;
/** A warm pool with its ready and creating counts. */
export type PoolInfo = Pool;
/** What `pools.put` sends: the spec, the size, the idle timeout. */
export type PoolPutRequest = z.input<typeof PutPoolRequestSchema>;
/** How a process ended. */
export type ExitInfo = ProtocolExitInfo;
/** A command run to completion: its exit, its collected output and its process handle. */
export type ExecResult = ExecReply;
/** A process of a sandbox (`GET /v1/sandboxes/{id}/processes`). */
export type ProcessInfo = ProtocolProcessInfo;
/** Metadata of one file in a sandbox. */
export type FileInfo = FileStat;
/** An image layer. */
export type LayerInfo = Layer;
/** Where and how a layer upload is stored (`kind`, `name`, `format`). */
export type LayerUploadQuery = z.input<typeof UploadLayerQuerySchema>;
/** A Debian layer build request. */
export type DebianLayerRequest = z.input<typeof DebianLayerRequestSchema>;
/** POST /v1/layers/vm body (`dsec image build --vm`). */
export type VmLayerRequest = z.input<typeof VmLayerRequestSchema>;
/** An API key (`key`, the secret, only in the reply of create). */
export type ApiKeyInfo = ApiKey;
/** A key create request. */
export type KeyCreateRequest = z.input<typeof CreateKeyRequestSchema>;
/** A project with its quota and usage. */
export type ProjectInfo = Project;
/** A project create request. */
export type ProjectCreateRequest = z.input<typeof CreateProjectRequestSchema>;
/** A node with its capacity. */
export type NodeInfo = ProtocolNodeInfo;

/** A sandbox's lease: idle timeout, lifetime, what losing its owner does (every field optional). */
export type LeaseOptions = z.input<typeof LeaseSchema>;
/** What opening an owner session takes (`graceMs`, `name`). */
export type OwnerCreateOptions = z.input<typeof CreateOwnerRequestSchema>;
/** An owner session. */
export type OwnerInfo = Owner;
/** What a pause or resume did (the sandbox after it, time taken, memory before and after). */
export type PauseResult = ProtocolPauseResult;
/** A network policy: `{mode: 'none'}` or `{mode: 'allowlist', allow, presets, allowAddresses, mirrors}`. */
export type NetworkPolicy = z.input<typeof NetworkPolicySchema>;
/** A change to a network policy: `{presets: {add: ['pypi']}}`, `{allow: {remove: ['x.com']}}`, ... */
export type NetworkPolicyPatch = z.input<typeof NetworkPolicyPatchSchema>;
/** A sandbox's network: policy, addresses, counters. */
export type SandboxNetworkInfo = SandboxNetwork;
/** One egress attempt with its verdict. */
export type EgressLogEntry = ProtocolEgressLogEntry;
/** `client.applyNetwork` request: a label selector and a policy or a patch. */
export type ApplyNetworkRequest = z.input<typeof ApplyNetworkRequestSchema>;
/** Per-sandbox outcome of `client.applyNetwork`. */
export type ApplyNetworkResult = ProtocolApplyNetworkResult;

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
