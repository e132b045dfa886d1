// The limits that keep one tenant from starving the others, defined once. A tenant is a
// top-level project (a child of the root project) with everything below it: sub-projects and
// extra keys share their tenant's limits instead of multiplying them. The defaults are sized for
// the project's reference node (2 cores, 24 GiB); the operator changes them with the `limits`
// key of the configuration (file, `DSEC_LIMIT_*` variables, `--limit name=value` flags). The
// control plane resolves them once and hands them to the services. A refusal is a 429
// `LIMIT_EXCEEDED` whose `limit` detail names the limit (docs/security.md, "Tenants and crashes").
import { z } from 'zod';
import { DsecError } from './errors.js';

/** Bytes of stdout (and, apart, of stderr) a buffered exec collects before it marks `truncated`. */
export const DEFAULT_EXEC_OUTPUT_BYTES = 16 * 1024 * 1024;
/** Commands one tenant runs at once (buffered, streamed and WebSocket execs alike). */
export const DEFAULT_EXECS_PER_TENANT = 64;
/** Commands the node runs at once for every tenant together. */
export const DEFAULT_EXECS_PER_NODE = 512;
/** File transfers (reads, writes, tar up and down) one tenant has in flight. */
export const DEFAULT_TRANSFERS_PER_TENANT = 16;
/** File transfers in flight on the node for every tenant together. */
export const DEFAULT_TRANSFERS_PER_NODE = 32;
/** Function calls (a batch counts as one) one tenant runs at once. */
export const DEFAULT_CALLS_PER_TENANT = 16;
/** Function-call slots of the node for every tenant together. */
export const DEFAULT_CALL_SLOTS_PER_NODE = 64;
/** Live streams (events, node usage, sandbox stats) one tenant holds open at once. */
export const DEFAULT_STREAMS_PER_TENANT = 32;
/** Live streams one apiserver replica holds open for every tenant together. */
export const DEFAULT_STREAMS_PER_REPLICA = 1024;
/** Bytes of WebSocket stdin queued for a command before the socket stops being read. */
export const DEFAULT_WS_STDIN_BUFFER_BYTES = 8 * 1024 * 1024;
/** Largest HTTP upload body (a file, a tar, a layer, a disk image), whatever the tenant's limits. */
export const MAX_UPLOAD_BYTES = 1024 * 1024 * 1024;
/** Decompressed bytes of one uploaded layer. */
export const DEFAULT_LAYER_UPLOAD_BYTES = 8 * 1024 * 1024 * 1024;
/** Bytes of layers one tenant keeps (uploaded, built and snapshot layers). */
export const DEFAULT_LAYER_STORAGE_BYTES_PER_TENANT = 20 * 1024 * 1024 * 1024;
/** Trajectory bytes one tenant keeps (finished sandboxes' trajectories are evicted first). */
export const DEFAULT_TRAJECTORY_BYTES_PER_TENANT = 2 * 1024 * 1024 * 1024;
/** Trajectory bytes the platform keeps for every tenant together. */
export const DEFAULT_TRAJECTORY_BYTES_TOTAL = 8 * 1024 * 1024 * 1024;
/** API keys (live, not revoked) of one tenant. */
export const DEFAULT_KEYS_PER_TENANT = 1000;
/** Sub-projects of one tenant. */
export const DEFAULT_PROJECTS_PER_TENANT = 200;
/** Open owner sessions of one tenant. */
export const DEFAULT_OWNERS_PER_TENANT = 1000;
/** Run-time rules of one tenant. */
export const DEFAULT_RULES_PER_TENANT = 100;
/** Rules that only the root project may add once the tenants have used the rest (emergencies). */
export const DEFAULT_ROOT_RULE_HEADROOM = 100;
/** Failed authentications a source may make per second, on average. */
export const DEFAULT_AUTH_FAILURES_PER_SECOND = 5;
/** Failed authentications a source may make in a burst. */
export const DEFAULT_AUTH_FAILURE_BURST = 50;
/** Audit entries kept per project (a flood in one never erases another's). */
export const DEFAULT_AUDIT_ROWS_PER_PROJECT = 100_000;
/** Authenticated requests one tenant (all its keys together) may make per second, on average. */
export const DEFAULT_REQUESTS_PER_SECOND_PER_TENANT = 100;
/** Authenticated requests one tenant may make in a burst. */
export const DEFAULT_REQUEST_BURST_PER_TENANT = 1000;

/** Every tenant limit, resolved (each key of the configuration's `limits`). */
export interface TenantLimits {
  /** Default {@link DEFAULT_EXEC_OUTPUT_BYTES}. */
  execOutputBytes: number;
  /** Default {@link DEFAULT_EXECS_PER_TENANT}. */
  execsPerTenant: number;
  /** Default {@link DEFAULT_EXECS_PER_NODE}. */
  execsPerNode: number;
  /** Default {@link DEFAULT_TRANSFERS_PER_TENANT}. */
  transfersPerTenant: number;
  /** Default {@link DEFAULT_TRANSFERS_PER_NODE}. */
  transfersPerNode: number;
  /** Default {@link DEFAULT_CALLS_PER_TENANT}. */
  callsPerTenant: number;
  /** Default {@link DEFAULT_CALL_SLOTS_PER_NODE}. */
  callSlotsPerNode: number;
  /** Default {@link DEFAULT_STREAMS_PER_TENANT}. */
  streamsPerTenant: number;
  /** Default {@link DEFAULT_STREAMS_PER_REPLICA}. */
  streamsPerReplica: number;
  /** Default {@link DEFAULT_WS_STDIN_BUFFER_BYTES}. */
  wsStdinBufferBytes: number;
  /** Default {@link DEFAULT_LAYER_UPLOAD_BYTES}. */
  layerUploadBytes: number;
  /** Default {@link DEFAULT_LAYER_STORAGE_BYTES_PER_TENANT}. */
  layerStorageBytesPerTenant: number;
  /** Default {@link DEFAULT_TRAJECTORY_BYTES_PER_TENANT}. */
  trajectoryBytesPerTenant: number;
  /** Default {@link DEFAULT_TRAJECTORY_BYTES_TOTAL}. */
  trajectoryBytesTotal: number;
  /** Default {@link DEFAULT_KEYS_PER_TENANT}. */
  keysPerTenant: number;
  /** Default {@link DEFAULT_PROJECTS_PER_TENANT}. */
  projectsPerTenant: number;
  /** Default {@link DEFAULT_OWNERS_PER_TENANT}. */
  ownersPerTenant: number;
  /** Default {@link DEFAULT_RULES_PER_TENANT}. */
  rulesPerTenant: number;
  /** Default {@link DEFAULT_ROOT_RULE_HEADROOM}. */
  rootRuleHeadroom: number;
  /** Default {@link DEFAULT_AUTH_FAILURES_PER_SECOND}. */
  authFailuresPerSecond: number;
  /** Default {@link DEFAULT_AUTH_FAILURE_BURST}. */
  authFailureBurst: number;
  /** Default {@link DEFAULT_AUDIT_ROWS_PER_PROJECT}. */
  auditRowsPerProject: number;
  /** Default {@link DEFAULT_REQUESTS_PER_SECOND_PER_TENANT}. */
  requestsPerSecondPerTenant: number;
  /** Default {@link DEFAULT_REQUEST_BURST_PER_TENANT}. */
  requestBurstPerTenant: number;
}

/** The name of one limit (what a LIMIT_EXCEEDED refusal's `limit` detail holds). */
export type LimitName = keyof TenantLimits;

/** Every limit at its default. */
export const DEFAULT_TENANT_LIMITS: Readonly<TenantLimits> = Object.freeze({
  execOutputBytes: DEFAULT_EXEC_OUTPUT_BYTES,
  execsPerTenant: DEFAULT_EXECS_PER_TENANT,
  execsPerNode: DEFAULT_EXECS_PER_NODE,
  transfersPerTenant: DEFAULT_TRANSFERS_PER_TENANT,
  transfersPerNode: DEFAULT_TRANSFERS_PER_NODE,
  callsPerTenant: DEFAULT_CALLS_PER_TENANT,
  callSlotsPerNode: DEFAULT_CALL_SLOTS_PER_NODE,
  streamsPerTenant: DEFAULT_STREAMS_PER_TENANT,
  streamsPerReplica: DEFAULT_STREAMS_PER_REPLICA,
  wsStdinBufferBytes: DEFAULT_WS_STDIN_BUFFER_BYTES,
  layerUploadBytes: DEFAULT_LAYER_UPLOAD_BYTES,
  layerStorageBytesPerTenant: DEFAULT_LAYER_STORAGE_BYTES_PER_TENANT,
  trajectoryBytesPerTenant: DEFAULT_TRAJECTORY_BYTES_PER_TENANT,
  trajectoryBytesTotal: DEFAULT_TRAJECTORY_BYTES_TOTAL,
  keysPerTenant: DEFAULT_KEYS_PER_TENANT,
  projectsPerTenant: DEFAULT_PROJECTS_PER_TENANT,
  ownersPerTenant: DEFAULT_OWNERS_PER_TENANT,
  rulesPerTenant: DEFAULT_RULES_PER_TENANT,
  rootRuleHeadroom: DEFAULT_ROOT_RULE_HEADROOM,
  authFailuresPerSecond: DEFAULT_AUTH_FAILURES_PER_SECOND,
  authFailureBurst: DEFAULT_AUTH_FAILURE_BURST,
  auditRowsPerProject: DEFAULT_AUDIT_ROWS_PER_PROJECT,
  requestsPerSecondPerTenant: DEFAULT_REQUESTS_PER_SECOND_PER_TENANT,
  requestBurstPerTenant: DEFAULT_REQUEST_BURST_PER_TENANT,
});

/** The names of every limit, in the order of the table in docs/security.md. */
export const LIMIT_NAMES = Object.keys(DEFAULT_TENANT_LIMITS) as LimitName[];

const limitValue = z.int({ error: 'not a positive integer' }).positive({ error: 'not a positive integer' });
const nonNegativeLimit = z.int({ error: 'not a non-negative integer' }).nonnegative({ error: 'not a non-negative integer' });

/** The configuration's `limits`: every key optional, each a positive integer (headroom may be 0). */
export const LimitsConfigSchema = z.strictObject(
  Object.fromEntries(LIMIT_NAMES.map((n) => [n, (n === 'rootRuleHeadroom' ? nonNegativeLimit : limitValue).optional()])) as {
    [K in LimitName]: z.ZodOptional<typeof limitValue>;
  },
);

/** The configuration's `limits` as written. */
export type LimitsConfig = Partial<TenantLimits>;

/** The limits in force: the defaults with the configured ones over them. */
export function resolveLimits(config: LimitsConfig | undefined = {}): TenantLimits {
  const out: TenantLimits = { ...DEFAULT_TENANT_LIMITS };
  for (const n of LIMIT_NAMES) {
    const v = config[n];
    if (v !== undefined) out[n] = v;
  }
  return out;
}

/**
 * Whether a node-wide slot cap applies its fair share: once a grant would put more than half of
 * `nodeMax` slots in use, a tenant may hold only its fair share after the grant.
 */
export function pastHighWater(nodeUsedAfter: number, nodeMax: number): boolean {
  return 2 * nodeUsedAfter > nodeMax;
}

/**
 * A tenant's fair share of a node-wide cap of `nodeMax` slots held by `holders` tenants (the
 * asker included, also when this grant is its first): the cap divided among them and one tenant
 * yet to come, at least 1. A tenant alone on a node thus holds at most `floor(nodeMax / 2)`.
 */
export function fairShare(nodeMax: number, holders: number): number {
  return Math.max(1, Math.floor(nodeMax / (holders + 1)));
}

/**
 * The slots of a node-wide cap kept for tenants that hold none there: an eighth of the cap, at
 * least 1. A grant may use them only when it is one slot for a tenant that held none on the
 * node (`reserveAllows`).
 */
export function newcomerReserve(nodeMax: number): number {
  return Math.max(1, Math.floor(nodeMax / 8));
}

/**
 * Whether a grant of `count` slots keeps the newcomers' reserve: it leaves `newcomerReserve`
 * slots free, or it is a single slot for a tenant that held none (`heldBefore` 0). Hence, at
 * every moment, slots in use minus tenants holding slots is at most `nodeMax - reserve` (a
 * reserve slot adds one to both; a release takes at least as many slots as holders away), so
 * a tenant that holds none is refused its first slot by the node's cap only when at least
 * `newcomerReserve(nodeMax)` tenants hold slots there.
 */
export function reserveAllows(nodeUsedAfter: number, nodeMax: number, heldBefore: number, count: number): boolean {
  return nodeUsedAfter <= nodeMax - newcomerReserve(nodeMax) || (heldBefore === 0 && count === 1);
}

/** The 429 of a limit: names it (`limit`) and its value (`max`); `retryAfterMs` when waiting helps. */
export function limitExceeded(limit: LimitName, max: number, message: string, retryAfterMs?: number): DsecError {
  return new DsecError('LIMIT_EXCEEDED', `${message} (limit ${limit} = ${max})`, { limit, max, ...(retryAfterMs !== undefined ? { retryAfterMs } : {}) });
}
