// @dsec/sdk: the TypeScript client of dsec.
export { DsecClient, DEFAULT_API_URL, DEFAULT_REQUEST_TIMEOUT_MS } from './client.js';
export type { CallOptions, ConnectionOptions, DsecClientOptions } from './client.js';
export { Sandbox, SandboxPaginator, DEFAULT_EXEC_TIMEOUT_MS, MAX_COLLECTED_OUTPUT_BYTES } from './sandbox.js';
export type { AttachOptions, CommandOptions, ExecOptions, SpawnOptions } from './sandbox.js';
export { ExecHandle, MAX_QUEUED_OUTPUT_BYTES } from './exec-handle.js';
export type { OutputCallbacks, OutputEvent, OutputOffsets } from './exec-handle.js';
export { Files } from './files.js';
export type { DirTransferResult, FileReadOptions, FileWriteOptions } from './files.js';
export { CallsApi } from './calls.js';
export { LayersApi } from './layers.js';
export type { DebianBuildOptions, LayerUploadOptions } from './layers.js';
export { KeysApi, ProjectsApi } from './iam.js';
export { CommandExitError } from './errors.js';
export { DsecError, isDsecError } from '@dsec/protocol';
export type { CallBatchItem, CallRequest, CallResult, CallRuntime, ErrorCode, ErrorDetails } from '@dsec/protocol';
export type {
  ApiKeyInfo,
  ApplyNetworkRequest,
  ApplyNetworkResult,
  DebianLayerRequest,
  EgressLogEntry,
  ExecResult,
  ExitInfo,
  FileInfo,
  KeyCreateRequest,
  LayerInfo,
  LayerUploadQuery,
  NetworkPolicy,
  NetworkPolicyPatch,
  NodeInfo,
  Page,
  ProcessInfo,
  ProjectCreateRequest,
  ProjectInfo,
  SandboxCreateOptions,
  SandboxInfo,
  SandboxListOptions,
  SandboxNetworkInfo,
  SandboxStats,
} from './types.js';
