// The services behind the API, built together: each takes its collaborators in its constructor,
// and this is the one place that wires them.
import { resolveLimits } from '@dsec/protocol';
import type { EventSink, TenantLimits } from '@dsec/protocol';
import { TenantSlots } from '../tenant-limits.js';
import { AdmissionQueue } from '../admission.js';
import type { Authenticator } from '../auth.js';
import type { StateStore } from '../db/store.js';
import { IdempotencyKeys } from '../idempotency.js';
import { ActivityTracker } from '../leases.js';
import type { NodeRegistry } from '../nodes.js';
import { PoolManager } from '../pools.js';
import type { Placement } from '../scheduler.js';
import { TrajectoryLog } from '../trajectory.js';
import type { TrajectoryOptions } from '../trajectory.js';
import { EndpointTokenService } from '../compat/endpoint-tokens.js';
import { SwerexService } from '../compat/swerex.js';
import { CallService } from './calls.js';
import { CommandService } from './commands.js';
import { headerFromRow, newCounters } from './common.js';
import type { PlatformCounters, ServiceSinks } from './common.js';
import { CreatePipeline } from './create-pipeline.js';
import type { SpecTightener } from './create-pipeline.js';
import { FileService } from './files.js';
import { IamService } from './iam.js';
import { LayerService } from './layers.js';
import { LifecycleService } from './lifecycle.js';
import { NetworkService } from './networks.js';
import { NodeService } from './nodes.js';
import type { DeniedNames } from './networks.js';
import { OwnerService } from './owners.js';
import { PoolService } from './pools.js';
import { SandboxService } from './sandboxes.js';
import { ScreenService } from './screens.js';
import { SnapshotService } from './snapshots.js';
import { TrajectoryService } from './trajectories.js';

/** What the services are built from. */
export interface ServiceDeps {
  store: StateStore;
  auth: Authenticator;
  nodes: NodeRegistry;
  placement: Placement;
  /** Where internal errors and background failures are logged. Default: nowhere. */
  log?: (line: string) => void;
  /** Where owner.lost and lease.exceeded go. Default: nowhere. */
  raise?: EventSink;
  /** Where events about a sandbox whose row may be gone go, with whose it was. Default: `raise`. */
  raiseOwned?: ServiceSinks['raiseOwned'];
  /** Run-time rules merged into every new sandbox's spec. */
  tighten?: SpecTightener;
  /** Names run-time deny-domain rules keep out of a project's network policies. */
  deniedNames?: DeniedNames;
  /** Limits and retention of the trajectory log. */
  trajectory?: TrajectoryOptions;
  /** Counters to count in (shared with the metrics). Default: fresh ones. */
  counters?: PlatformCounters;
  /** The admission queue (shared with the metrics). Default: a fresh one. */
  admission?: AdmissionQueue;
  /** Tenant limits, resolved once by the control plane. Default: protocol's `DEFAULT_TENANT_LIMITS`. */
  limits?: TenantLimits;
}

/** Every service, and the shared state they keep. */
export interface Services {
  counters: PlatformCounters;
  /** The tenant limits in force. */
  limits: TenantLimits;
  /** Running commands, file transfers and calls, per tenant and per node. */
  slots: TenantSlots;
  admission: AdmissionQueue;
  activity: ActivityTracker;
  idempotency: IdempotencyKeys;
  trajectory: TrajectoryLog;
  /** Keeps warm pools full (started by the platform). */
  poolManager: PoolManager;
  nodes: NodeRegistry;
  lifecycle: LifecycleService;
  layers: LayerService;
  owners: OwnerService;
  sandboxes: SandboxService;
  pools: PoolService;
  snapshots: SnapshotService;
  trajectories: TrajectoryService;
  commands: CommandService;
  files: FileService;
  networks: NetworkService;
  calls: CallService;
  iam: IamService;
  /** Node administration (GET /v1/nodes/{name}, cordon, drain, rm, join tokens) and node loss. */
  nodeAdmin: NodeService;
  /** Endpoint tokens in URL paths (SandboxFusion clients without headers). */
  endpointTokens: EndpointTokenService;
  /** SWE-ReX runtimes of sandboxes (their bash sessions). */
  swerex: SwerexService;
  /** Screens, input and live views of VMs. */
  screens: ScreenService;
}

/** Builds the services over a store and a set of nodes. */
export function createServices(deps: ServiceDeps): Services {
  const { store, nodes, placement } = deps;
  const log = deps.log ?? (() => undefined);
  const raise = deps.raise ?? (() => undefined);
  const sinks: ServiceSinks = { raise, raiseOwned: deps.raiseOwned ?? ((ev) => raise(ev)), log };
  const counters = deps.counters ?? newCounters();
  const limits = deps.limits ?? resolveLimits();
  const slots = new TenantSlots(limits);
  const admission = deps.admission ?? new AdmissionQueue();
  const activity = new ActivityTracker();
  const idempotency = new IdempotencyKeys(store);
  const trajectory = new TrajectoryLog(store, (id) => headerFromRow(store, id), {
    ...deps.trajectory,
    budget: {
      bytesPerTenant: limits.trajectoryBytesPerTenant,
      bytesTotal: limits.trajectoryBytesTotal,
      tenantOf: (projectId) => deps.auth.tenantOf(projectId),
      tenantProjects: (tenantId) => deps.auth.tenantProjects(tenantId),
    },
  });
  // The pool manager and the services that refill it know each other: it reaches them through
  // these functions, which run only once everything below is built.
  const poolManager: PoolManager = new PoolManager(
    {
      store,
      createPoolMember: (pool) => pools.createMember(pool),
      destroyPooled: (row) => lifecycle.destroyPooled(row),
      waitingAdmissions: (projectId) => admission.waiting(projectId),
    },
    log,
  );
  const onCapacityFreed = (): void => {
    admission.notify();
    poolManager.kick();
  };
  const lifecycle: LifecycleService = new LifecycleService({ store, nodes, placement, activity, trajectory, counters, sinks, onCapacityFreed });
  const layers = new LayerService(store, nodes, limits, (t) => deps.auth.tenantProjects(t));
  const owners = new OwnerService(store, lifecycle, limits, (t) => deps.auth.tenantProjects(t));
  const pipeline: CreatePipeline = new CreatePipeline({
    store,
    nodes,
    placement,
    admission,
    idempotency,
    pools: poolManager,
    lifecycle,
    owners,
    layers,
    trajectory,
    counters,
    sinks,
    tighten: deps.tighten,
    onCapacityFreed,
  });
  const sandboxes = new SandboxService({ store, nodes, placement, admission, idempotency, pipeline, lifecycle, owners, layers, sinks });
  const pools: PoolService = new PoolService(store, pipeline, layers, poolManager);
  const commands = new CommandService(trajectory, activity, limits);
  const files = new FileService(trajectory);
  const trajectories = new TrajectoryService({ store, trajectory, lifecycle, sandboxes, layers, commands, files, sinks });
  return {
    counters,
    limits,
    slots,
    admission,
    activity,
    idempotency,
    trajectory,
    poolManager,
    nodes,
    lifecycle,
    layers,
    owners,
    sandboxes,
    pools,
    snapshots: new SnapshotService(store, lifecycle, layers, sandboxes, trajectory),
    trajectories,
    commands,
    files,
    networks: new NetworkService(store, nodes, lifecycle, sinks, deps.deniedNames),
    calls: new CallService(nodes, layers, slots),
    iam: new IamService(store, deps.auth, nodes, placement, limits),
    nodeAdmin: new NodeService({ store, nodes, placement, lifecycle, trajectories, sinks }),
    endpointTokens: new EndpointTokenService(store, deps.auth),
    swerex: new SwerexService({ lifecycle, commands, files, slots }, deps.auth),
    screens: new ScreenService(lifecycle, slots),
  };
}
