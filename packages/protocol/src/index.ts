// @dsec/protocol: the schemas, types and error codes every dsec component shares (no I/O).
// One file per resource; each schema once, with the type inferred from it.
export { DsecError, ERROR_STATUS, invalidArgument, isDsecError } from './errors.js';
export type { ErrorCode, ErrorDetails } from './errors.js';
export { parseOrThrow } from './parse.js';
export {
  DEFAULT_AUDIT_ROWS_PER_PROJECT,
  DEFAULT_AUTH_FAILURE_BURST,
  DEFAULT_AUTH_FAILURES_PER_SECOND,
  DEFAULT_CALL_SLOTS_PER_NODE,
  DEFAULT_CALLS_PER_TENANT,
  DEFAULT_EXEC_OUTPUT_BYTES,
  DEFAULT_EXECS_PER_NODE,
  DEFAULT_EXECS_PER_TENANT,
  DEFAULT_KEYS_PER_TENANT,
  DEFAULT_LAYER_STORAGE_BYTES_PER_TENANT,
  DEFAULT_LAYER_UPLOAD_BYTES,
  DEFAULT_OWNERS_PER_TENANT,
  DEFAULT_PROJECTS_PER_TENANT,
  DEFAULT_ROOT_RULE_HEADROOM,
  DEFAULT_RULES_PER_TENANT,
  DEFAULT_TENANT_LIMITS,
  DEFAULT_TRAJECTORY_BYTES_PER_TENANT,
  DEFAULT_TRAJECTORY_BYTES_TOTAL,
  DEFAULT_TRANSFERS_PER_NODE,
  DEFAULT_TRANSFERS_PER_TENANT,
  DEFAULT_WS_STDIN_BUFFER_BYTES,
  fairShare,
  newcomerReserve,
  LIMIT_NAMES,
  LimitsConfigSchema,
  limitExceeded,
  MAX_UPLOAD_BYTES,
  pastHighWater,
  reserveAllows,
  resolveLimits,
} from './limits.js';
export type { LimitName, LimitsConfig, TenantLimits } from './limits.js';
export { forEachBounded, KeyedSerialQueue, Limiter } from './concurrency.js';
export {
  MAX_TAR_BYTES_BETWEEN_ENTRIES,
  MAX_TAR_EXTENDED_HEADER_BYTES,
  MAX_TAR_PAX_RECORDS,
  tarBytesBetweenEntriesFault,
  tarExtendedHeaderFault,
  tarHeaderOverflowFault,
} from './tar-headers.js';
export type { TarEntryHeader } from './tar-headers.js';
export { DEFAULT_LAYER_TAG, normalizeLayerName } from './layer-names.js';
export {
  DEFAULT_IDEMPOTENCY_TTL_MS,
  EnvSchema,
  ErrorBodySchema,
  IDEMPOTENCY_KEY_HEADER,
  IdempotencyKeySchema,
  ItemErrorSchema,
  LabelsSchema,
  NormalisedPathSchema,
} from './common.js';
export type { Env, ErrorBody, ItemError, Labels } from './common.js';
export { DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, pageOf } from './pages.js';
export {
  AccelSchema,
  BackendAccelSchema,
  BackendKindSchema,
  DEFAULT_CPU,
  DEFAULT_DISK_MIB,
  DEFAULT_MEMORY_MIB,
  DEFAULT_OPEN_FILES,
  DEFAULT_PIDS,
  GrantedResourcesSchema,
  NodeSchema,
  ResourcesSchema,
} from './resources.js';
export type { Accel, BackendAccel, BackendKind, GrantedResources, NodeInfo, Resources } from './resources.js';
export { LayerCacheStatsSchema } from './layer-cache.js';
export type { LayerCacheStats } from './layer-cache.js';
export {
  BuildableLayerKindSchema,
  DebianLayerRequestSchema,
  imageLayers,
  ImageRefSchema,
  ImageSpecSchema,
  LayerInfoSchema,
  LayerKindSchema,
  LayerRefSchema,
  LayerSchema,
  PullLayerRequestSchema,
  UploadLayerQuerySchema,
} from './layers.js';
export type { BuildableLayerKind, DebianLayerRequest, ImageSpec, Layer, LayerInfo, LayerKind, PullLayerRequest, UploadLayerQuery } from './layers.js';
export { UpdateLayerRequestSchema } from './layers.js';
export { VmLayerRequestSchema } from './layers.js';
export type { VmLayerRequest } from './layers.js';
export type { UpdateLayerRequest } from './layers.js';
export {
  CreateOwnerRequestSchema,
  DEFAULT_OWNER_GRACE_MS,
  MAX_HEARTBEAT_INTERVAL_MS,
  MAX_OWNER_GRACE_MS,
  MIN_OWNER_GRACE_MS,
  OwnerIdSchema,
  OwnerSchema,
} from './owners.js';
export type { CreateOwnerRequest, Owner } from './owners.js';
export {
  AdmissionSchema,
  BatchEventSchema,
  BatchItemResultSchema,
  CreateSandboxBatchRequestSchema,
  CreateSandboxBatchResultSchema,
  CreateSandboxRequestSchema,
  DEFAULT_ADMISSION_WAIT_MS,
  DEFAULT_IDLE_TIMEOUT_MS,
  DEFAULT_SANDBOX_TIMEOUT_MS,
  GrantedLeaseSchema,
  LeaseActionSchema,
  LeaseSchema,
  ListSandboxesQuerySchema,
  MAX_ADMISSION_WAIT_MS,
  MAX_BATCH_SIZE,
  MAX_PROTECTED_PATHS,
  MAX_SANDBOX_TIMEOUT_MS,
  MAX_SNAPSHOT_DEPTH,
  PauseResultSchema,
  ProtectSchema,
  RecoverySchema,
  ResumeRequestSchema,
  PauseMemorySchema,
  PauseRequestSchema,
  SandboxClaimSchema,
  SandboxPathSchema,
  SandboxRequestSchema,
  SandboxSchema,
  SandboxSpecSchema,
  SandboxStateSchema,
  SandboxStatsSchema,
  SecuritySchema,
  UpdateSandboxRequestSchema,
} from './sandboxes.js';
export type {
  Admission,
  BatchEvent,
  BatchItemResult,
  CreateSandboxBatchRequest,
  CreateSandboxBatchResult,
  CreateSandboxRequest,
  GrantedLease,
  Lease,
  LeaseAction,
  ListSandboxesQuery,
  PauseResult,
  Protect,
  Recovery,
  ResumeRequest,
  PauseMemory,
  PauseRequest,
  Sandbox,
  SandboxClaim,
  SandboxRequest,
  SandboxSpec,
  SandboxState,
  SandboxStats,
  Security,
  UpdateSandboxRequest,
} from './sandboxes.js';
export {
  CommandFieldsSchema,
  ExecEventSchema,
  ExecReplySchema,
  ExecRequestSchema,
  ExecResultSchema,
  ExecSpecSchema,
  ExitInfoSchema,
  MAX_COMMAND_BYTES,
  ONE_COMMAND,
  oneCommand,
  OutputQuerySchema,
  ProcessSchema,
  PtySchema,
  SignalRequestSchema,
  WsClientMessageSchema,
  WsExecRequestSchema,
} from './exec.js';
export type {
  CommandFields,
  ExecEvent,
  ExecReply,
  ExecRequest,
  ExecResult,
  ExecSpec,
  ExitInfo,
  OutputQuery,
  ProcessInfo,
  Pty,
  SignalRequest,
  WsClientMessage,
  WsExecRequest,
} from './exec.js';
export {
  DEFAULT_DIFF_PAGE,
  DiffEntrySchema,
  DiffOptionsSchema,
  DiffQuerySchema,
  DiffResultSchema,
  FilePathQuerySchema,
  FileStatSchema,
  FileTypeSchema,
  MAX_DIFF_PAGE,
  MAX_HASH_BYTES,
  MAX_VERIFY_PATHS,
  RenameRequestSchema,
  VerifyItemSchema,
  VerifyRequestSchema,
  VerifyResultSchema,
} from './files.js';
export type {
  DiffEntry,
  DiffOptions,
  DiffQuery,
  DiffResult,
  FilePathQuery,
  FileStat,
  FileType,
  RenameRequest,
  VerifyItem,
  VerifyRequest,
  VerifyResult,
} from './files.js';
export { ForkRequestSchema, ForkResultSchema, MAX_FORK_COUNT, SnapshotRequestSchema } from './snapshots.js';
export type { ForkRequest, ForkResult, SnapshotRequest } from './snapshots.js';
export {
  RecordedBytesSchema,
  ReplayEventSchema,
  ReplayRequestSchema,
  ReplayResultSchema,
  ReplayStepSchema,
  ReplaySummarySchema,
  ReplayVerdictSchema,
  TrajectoryQuerySchema,
  TrajectorySchema,
  TrajectoryStepKindSchema,
  TrajectoryStepSchema,
} from './trajectories.js';
export type {
  RecordedBytes,
  ReplayEvent,
  ReplayRequest,
  ReplayResult,
  ReplayStep,
  ReplaySummary,
  ReplayVerdict,
  Trajectory,
  TrajectoryQuery,
  TrajectoryStep,
  TrajectoryStepKind,
} from './trajectories.js';
export {
  DEFAULT_POOL_IDLE_TIMEOUT_MS,
  MAX_POOL_IDLE_TIMEOUT_MS,
  MAX_POOL_SIZE,
  MAX_POOLS_PER_PROJECT,
  PoolNameSchema,
  PoolSchema,
  PoolSpecSchema,
  PutPoolRequestSchema,
} from './pools.js';
export type { Pool, PoolSpec, PutPoolRequest } from './pools.js';
export {
  AllowRuleSchema,
  applyNetworkPatch,
  ApplyNetworkRequestSchema,
  ApplyNetworkResultSchema,
  CidrSchema,
  DEFAULT_ALLOW_PORTS,
  DEFAULT_NETWORK_LOG_LIMIT,
  DEFAULT_NETWORK_POLICY,
  domainNameProblem,
  EgressLogEntrySchema,
  hostPatternProblem,
  HostPatternSchema,
  ipv4ToInt,
  isIPv4,
  MAX_ALLOW_ADDRESSES,
  MAX_ALLOW_RULES,
  MAX_NETWORK_APPLY_SANDBOXES,
  MAX_NETWORK_LOG_LIMIT,
  MAX_RULE_PORTS,
  MIN_ALLOW_ADDRESS_PREFIX,
  MirrorSchema,
  MirrorsSchema,
  NETWORK_PRESET_NAMES,
  NETWORK_PRESETS,
  NetworkLogQuerySchema,
  NetworkModeSchema,
  NetworkPolicyPatchSchema,
  NetworkPolicySchema,
  NetworkStatsSchema,
  normalizeNetworkPolicy,
  parseCidr,
  PortSchema,
  PresetNameSchema,
  SandboxNetworkSchema,
  withDeniedNames,
  restrictedEntries,
  restrictedHost,
  restrictedPatchEntries,
  restrictedRange,
} from './network.js';
export type {
  AllowRule,
  RestrictedEntry,
  ApplyNetworkRequest,
  ApplyNetworkResult,
  EgressLogEntry,
  Mirror,
  Mirrors,
  NetworkLogQuery,
  NetworkMode,
  NetworkPolicy,
  NetworkPolicyPatch,
  NetworkPreset,
  NetworkStats,
  SandboxNetwork,
} from './network.js';
export {
  CallBatchItemSchema,
  CallBatchRequestSchema,
  CallBatchResultSchema,
  CallRequestSchema,
  CallResultSchema,
  CallRuntimeSchema,
  CallStepResultSchema,
  DEFAULT_CALL_COMPILE_TIMEOUT_MS,
  DEFAULT_CALL_MEMORY_MIB,
  DEFAULT_CALL_OUTPUT_LIMIT_BYTES,
  DEFAULT_CALL_TIMEOUT_MS,
  MAX_CALL_BATCH,
  MAX_CALL_MEMORY_MIB,
  MAX_CALL_OUTPUT_LIMIT_BYTES,
  MAX_CALL_TIMEOUT_MS,
} from './calls.js';
export type { CallBatchItem, CallBatchRequest, CallBatchResult, CallRequest, CallResult, CallRuntime, CallStepResult } from './calls.js';
export { ApiKeySchema, CreateKeyRequestSchema, CreateProjectRequestSchema, ProjectSchema, QuotaSchema, RoleSchema } from './iam.js';
export type { ApiKey, CreateKeyRequest, CreateProjectRequest, Project, Quota, Role } from './iam.js';
export {
  AuditEntrySchema,
  CreateRuleRequestSchema,
  DEFAULT_WATCH_PAGE_SIZE,
  DeniableSyscallSchema,
  DomainPatternSchema,
  EVENT_KINDS,
  SANDBOX_ROW_EVENT_KINDS,
  EventKindSchema,
  EventMatchSchema,
  EventSchema,
  EventSeveritySchema,
  ListAuditQuerySchema,
  ListEventsQuerySchema,
  MAX_WATCH_PAGE_SIZE,
  RaisedEventSchema,
  RuleKindSchema,
  RuleSchema,
} from './events.js';
export type {
  AuditEntry,
  CreateRuleRequest,
  EventKind,
  EventMatch,
  EventSeverity,
  EventSink,
  ListAuditQuery,
  ListEventsQuery,
  RaisedEvent,
  RecordedEvent,
  Rule,
  RuleKind,
} from './events.js';
export { ESSENTIAL_SYSCALLS, SYSCALL_NAMES } from './syscalls.js';
export type {
  EdgeCalls,
  EdgeClient,
  EdgeCallOptions,
  EdgeExecOptions,
  EdgeLayers,
  EdgeSandbox,
  LayerBuildOptions,
  ReadDiskOptions,
  LayerBuildSource,
  NodeCapacity,
  NodeGarbageReport,
  NodeUsageReport,
  NodePauseResult,
  OutputEvent,
  ProcessStream,
} from './edge-client.js';

export {
  DEFAULT_HEARTBEAT_MS,
  EDGE_WIRE_VERSION,
  MAX_UPLOAD_CHUNK_BYTES,
  STREAM_WINDOW_EVENTS,
  UPLOAD_WINDOW_CHUNKS,
  decodeClientFrame,
  decodeServerFrame,
  encodeFrame,
} from './edge-wire/frames.js';
export type { ClientFrame, ServerFrame } from './edge-wire/frames.js';
export { decodeValue, encodeValue, fromWireError, toWireError } from './edge-wire/values.js';
export type { WireError, WireValue } from './edge-wire/values.js';
export { WireEdgeClient } from './edge-wire/client.js';
export type { WireEdgeClientOptions } from './edge-wire/client.js';
export { serveEdge } from './edge-wire/server.js';
export type { EdgeServer, ServeEdgeOptions } from './edge-wire/server.js';
export { loopbackTransport } from './edge-wire/transport.js';
export type { FrameParts, Transport } from './edge-wire/transport.js';
export { EdgeWireModeSchema, edgeThroughWire, loopbackEdge } from './edge-wire/loopback.js';
export type { EdgeWireMode, WiredEdge } from './edge-wire/loopback.js';

export {
  checkConfig,
  configJsonSchema,
  DEFAULT_DSEC_ADDR,
  DEFAULT_DSEC_HOME,
  DsecConfigSchema,
  HostPortSchema,
  LayerRegistryConfigSchema,
  MirrorsConfigSchema,
  NetworkConfigSchema,
  NodeConfigSchema,
  PrivateRangeSchema,
  ProxyLimitsConfigSchema,
  RegistryEndpointConfigSchema,
  RetentionConfigSchema,
  CallsConfigSchema,
  DEFAULT_RUNTIME_CACHE,
  RUNTIME_LAYER_IDS,
} from './config.js';
export type { ConfigIssue, DsecConfig, DsecConfigInput, LayerRegistryConfig, NetworkConfig, NodeConfig, RegistryEndpointConfig } from './config.js';
export { EXEC_FRAMES_MEDIA_TYPE, ExecFrameDecoder, MAX_EXEC_FRAME_BYTES, encodeExecFrame, readExecFrames } from './exec-frames.js';
export type { ExecStreamEvent } from './exec-frames.js';
// Nodes of a cluster (issue 16): the admin API, joining and the edge wire's transport.
export {
  CONTROL_PLANE_TLS_NAME,
  CUT_OFF_PAUSE_REASON,
  EDGE_WIRE_VERSION_HEADER,
  NODE_HEARTBEAT_HEADER,
  NODE_LOST_AFTER_HEADER,
  NODE_UNREACHABLE_AFTER_HEADER,
  DEFAULT_JOIN_TOKEN_TTL_MS,
  DEFAULT_NODE_LOST_AFTER_MS,
  DEFAULT_NODE_UNREACHABLE_AFTER_MS,
  DrainRequestSchema,
  DrainResultSchema,
  JoinTokenRequestSchema,
  JoinTokenSchema,
  NODE_JOIN_PATHS,
  NODE_SESSION_HTTP2,
  NodeDetailSchema,
  NodeJoinRequestSchema,
  NodeJoinResponseSchema,
  NodeStateSchema,
  parseJoinToken,
} from './nodes.js';
export type {
  DrainRequest,
  DrainResult,
  JoinToken,
  JoinTokenParts,
  JoinTokenRequest,
  NodeDetail,
  NodeJoinRequest,
  NodeJoinResponse,
  NodeState,
} from './nodes.js';
export { MAX_WIRE_FRAME_BYTES, framedTransport } from './edge-wire/framed-transport.js';
export type { ByteDuplex } from './edge-wire/framed-transport.js';
export {
  MAX_DNS_LABEL_LENGTH,
  MAX_DNS_NAME_LENGTH,
  NEVER_DIALLED_CLASSES,
  SPECIAL_IPV4_RANGES,
  classifyAddress,
  classifyRange,
  embeddedIPv4,
  formatIpAddress,
  formatIpRange,
  hostNameProblem,
  isCanonicalIPv4,
  isLocalhostName,
  looksLikeIpLiteral,
  parseIPv4,
  parseIPv6,
  parseIpAddress,
  parseIpRange,
  rangeContains,
  rangesOverlap,
} from './addresses.js';
export type { AddressClass, IpAddress, IpRange, NodeAddressContext } from './addresses.js';
export {
  MAX_DRAG_POINTS,
  MAX_INPUT_WAIT_MS,
  MAX_SCREEN_ACTIONS,
  MAX_TYPED_CHARS,
  MAX_WAIT_MS,
  ScreenActionSchema,
  ScreenActionsSchema,
  ScreenInputRequestSchema,
  ScreenInputResultSchema,
  actionPoints,
} from './screen.js';
export type { ScreenAction, ScreenCapture, ScreenInputRequest, ScreenInputResult, ScreenPoint } from './screen.js';
export { keyQcode, parseKeyChord, textChords } from './screen-keys.js';
export type { KeyChord } from './screen-keys.js';
export type { EdgeScreen } from './edge-client.js';
export {
  DEFAULT_USAGE_STREAM_INTERVAL_MS,
  MAX_USAGE_STREAM_INTERVAL_MS,
  MIN_USAGE_STREAM_INTERVAL_MS,
  NodeUsageSampleSchema,
  NodeUsageSchema,
  SandboxStatsSampleSchema,
  UsageStreamQuerySchema,
} from './usage-stream.js';
export type { NodeUsage, NodeUsageSample, SandboxStatsSample, UsageStreamQuery } from './usage-stream.js';
export { BACKEND_CRASH_STEPS, CRASH_AT_ENV, CRASH_STEPS, EDGE_CRASH_STEPS, MICROVM_CRASH_STEPS, crashPoint } from './crash-points.js';
export type { CrashStep, EdgeCrashStep } from './crash-points.js';
export type { EdgeCreateItem, EdgeCreateResult } from './edge-client.js';
export { MAX_CREATE_MANY } from './edge-wire/methods.js';
