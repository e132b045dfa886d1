// @dsec/sdk: the TypeScript client of dsec.
export { DsecClient, DEFAULT_API_URL, DEFAULT_REQUEST_TIMEOUT_MS } from './client.js';
export type { CallOptions, ConnectionOptions, DsecClientOptions } from './client.js';
export { Sandbox } from './sandbox.js';
export { SandboxPaginator } from './sandboxes.js';
export type { BatchCreateOptions, BatchCreateResult, BatchItem, CreateOptions } from './sandboxes.js';
export { Commands, DEFAULT_EXEC_TIMEOUT_MS, MAX_COLLECTED_OUTPUT_BYTES } from './commands.js';
export type { AttachOptions, CommandOptions, ExecOptions, SpawnOptions } from './commands.js';
export type { NetworkApi } from './network.js';
export { Snapshots } from './snapshots.js';
export type { ForkOptions, ForkOutcome, SnapshotOptions } from './snapshots.js';
export { Changes } from './changes.js';
export type { DiffOptions } from './changes.js';
export type { ReplayOptions, ReplayOutcome, TrajectoryApi, TrajectoryOptions } from './trajectory.js';
export { ExecHandle, MAX_QUEUED_OUTPUT_BYTES } from './exec-handle.js';
export type { OutputCallbacks, OutputEvent, OutputOffsets } from './exec-handle.js';
export { Files } from './files.js';
export type { DirTransferResult, FileReadOptions, FileWriteOptions } from './files.js';
export { CallsApi } from './calls.js';
export { OwnersApi, OwnerSession } from './owners.js';
export { LayersApi } from './layers.js';
export type { DebianBuildOptions, LayerUploadOptions } from './layers.js';
export { KeysApi, ProjectsApi } from './iam.js';
export { NodesApi } from './nodes.js';
export { PoolsApi } from './pools.js';
export { CommandExitError } from './errors.js';
export { DsecError, isDsecError } from '@dsec/protocol';
export type {
  CallBatchItem,
  CallRequest,
  CallResult,
  CallRuntime,
  DiffEntry,
  DiffResult,
  ErrorCode,
  ErrorDetails,
  ReplayStep,
  ReplaySummary,
  ReplayVerdict,
  Trajectory,
  TrajectoryStep,
  VerifyItem,
  VerifyResult,
} from '@dsec/protocol';
export type {
  ApiKeyInfo,
  ApplyNetworkRequest,
  ApplyNetworkResult,
  DebianLayerRequest,
  VmLayerRequest,
  EgressLogEntry,
  ExecResult,
  ExitInfo,
  FileInfo,
  KeyCreateRequest,
  LayerInfo,
  LayerUploadQuery,
  LeaseOptions,
  NetworkPolicy,
  NetworkPolicyPatch,
  NodeInfo,
  OwnerCreateOptions,
  OwnerInfo,
  PauseResult,
  Page,
  PoolInfo,
  PoolPutRequest,
  ProcessInfo,
  ProjectCreateRequest,
  ProjectInfo,
  SandboxBatchRequest,
  SandboxCreateOptions,
  SandboxInfo,
  SandboxListOptions,
  SandboxNetworkInfo,
  SandboxStats,
} from './types.js';
export { Screen } from './screen.js';
export type { Screenshot } from './screen.js';
export type { ScreenAction, ScreenInputResult, ScreenPoint } from '@dsec/protocol';
