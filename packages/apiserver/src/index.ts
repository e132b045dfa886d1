export { startPlatform, DEFAULT_ADDR, DEFAULT_HOME, BUILTIN_BASE } from './platform.js';
export type { Platform, PlatformOptions } from './platform.js';
export { startApiserver } from './replica.js';
export type { Replica, ReplicaOptions } from './replica.js';
export { startControlPlane } from './control-plane.js';
export type { ControlPlane, ControlPlaneOptions } from './control-plane.js';
export { isPostgresUrl, redactUrl, PostgresListener, DEFAULT_POSTGRES_POOL_SIZE } from './db/postgres.js';
export type { PostgresOptions } from './db/postgres.js';
export { copyStore, copySqliteToPostgres } from './db/copy.js';
export type { CopyReport } from './db/copy.js';
export { TrustedProxies } from './http/client-address.js';
export { EVENTS_CHANNEL, RULES_CHANNEL } from './watch.js';
export { createApp, MAX_JSON_BYTES, MAX_UPLOAD_BYTES } from './http/app.js';
export type { Env, RouterDeps } from './http/env.js';
export { createServices } from './services/index.js';
export type { ServiceDeps, Services } from './services/index.js';
export { newCounters, toSandbox } from './services/common.js';
export type { PlatformCounters, SandboxRow, ServiceSinks } from './services/common.js';
export { LifecycleService, OWNER_GONE_REASONS } from './services/lifecycle.js';
export type { LifecycleDeps, RoutedSandbox, RouteOptions } from './services/lifecycle.js';
export { CreatePipeline, IDEMPOTENCY_FIELD } from './services/create-pipeline.js';
export type { CreateItem, CreatePipelineDeps, SpecTightener, Ticket } from './services/create-pipeline.js';
export { SandboxService, DEFAULT_BATCH_CONCURRENCY } from './services/sandboxes.js';
export type { CreateBatchOptions, CreateSandboxOptions, SandboxServiceDeps } from './services/sandboxes.js';
export { LayerService, layerName } from './services/layers.js';
export type { LayerResolver } from './services/layers.js';
export { OwnerService, MAX_OWNERS_PER_PROJECT } from './services/owners.js';
export { PoolService } from './services/pools.js';
export { SnapshotService } from './services/snapshots.js';
export { TrajectoryService } from './services/trajectories.js';
export type { TrajectoryServiceDeps } from './services/trajectories.js';
export { replayStep, summarize } from './services/replay.js';
export type { ReplayTarget } from './services/replay.js';
export { CommandService, RunningCommand, outputEvent } from './services/commands.js';
export type { CommandTarget, RecordedExec, StreamVia } from './services/commands.js';
export { FileService } from './services/files.js';
export type { WriteFileOptions } from './services/files.js';
export { NetworkService } from './services/networks.js';
export type { DeniedNames, NetworkChange } from './services/networks.js';
export { CallService } from './services/calls.js';
export { IamService } from './services/iam.js';
export { itemError, publicError, toDsecError } from './errors.js';
export { AdmissionQueue, MAX_QUEUED_ADMISSIONS, MAX_QUEUED_PER_PROJECT } from './admission.js';
export type { AdmissionQueueOptions, AdmitOptions, Admitted } from './admission.js';
export { PoolManager, POOL_REFILL_CONCURRENCY, POOL_REFILL_QUIET_MS } from './pools.js';
export type { PoolHost } from './pools.js';
export { IdempotencyKeys } from './idempotency.js';
export {
  TrajectoryLog,
  ByteRecorder,
  DEFAULT_TRAJECTORY_MAX_BYTES,
  DEFAULT_TRAJECTORY_MAX_STEPS,
  DEFAULT_TRAJECTORY_RETENTION_MS,
  TRAJECTORY_DATA_COPY_BYTES,
  TRAJECTORY_OUTPUT_COPY_BYTES,
} from './trajectory.js';
export type { TrajectoryHeader, TrajectoryOptions, TrajectorySpec } from './trajectory.js';
export { StateStore, ROOT_PROJECT_ID, PUBLIC_PROJECT_ID } from './db/store.js';
export type { SqliteDatabase, Reservation, StoreOpenOptions } from './db/store.js';
export { Authenticator, hashKey, newKeySecret, roleAtLeast } from './auth.js';
export type { Principal } from './auth.js';
export { Placement, DEFAULT_CPU_OVERCOMMIT, DEFAULT_MEMORY_OVERCOMMIT, DEFAULT_SAMPLE_K, BEST_EFFORT_CPU_FACTOR } from './scheduler.js';
export type { NodeView, PlacementOptions, PlacementRequest } from './scheduler.js';
export { NodeRegistry } from './nodes.js';
export type { NodeEntry, NodeShare } from './nodes.js';
export { Metrics } from './metrics.js';
export type { ControlPlaneGauges } from './metrics.js';
export { openApiDocument } from './openapi.js';
export { ActivityTracker, ACTIVITY_FLUSH_INTERVAL_MS, grantLease, heartbeatIntervalMs, leaseOf, mergeLease } from './leases.js';
export type { ActivityStore, PauseReason } from './leases.js';
export { WatchService, DEFAULT_HEARTBEAT_MS, DEFAULT_SUBSCRIBER_QUEUE } from './watch.js';
export type { Retention, WatchServiceOptions } from './watch.js';
export { WatchStore, DEFAULT_EVENT_RETENTION, DEFAULT_AUDIT_RETENTION } from './db/watch-store.js';
export { CRASH_STEPS, CRASH_AT_ENV, crashPoint } from './crash-points.js';
export type { CrashStep } from './crash-points.js';
export { reconcileAtStart, reconcileGoneReplica, reconcileOwnNodes, reconcileSummary, reconcileWasClean } from './reconcile.js';
export type { GoneReplicaReport, ReconcileDeps, ReconcileReport, SettledRow } from './reconcile.js';
export { AuthFailureGate, TenantSlots, clientAddress } from './tenant-limits.js';
export type { AuthFailureEntry, SlotKind } from './tenant-limits.js';
export { WsTickets, WS_TICKET_TTL_MS, MAX_TICKETS_PER_KEY } from './ws-tickets.js';
export type { WsTicket } from './ws-tickets.js';
