// Tables of the state store. Column types are the portable subset of SQLite and PostgreSQL:
// text, integer, double precision; timestamps are ISO-8601 text.

export interface ProjectTable {
  id: string;
  name: string;
  parent_id: string | null;
  quota_sandboxes: number;
  quota_cpu: number;
  quota_memory_mib: number;
  used_sandboxes: number;
  used_cpu: number;
  used_memory_mib: number;
  created_at: string;
}

export interface ApiKeyTable {
  id: string;
  project_id: string;
  name: string;
  role: 'admin' | 'member' | 'viewer';
  key_hash: string;
  created_at: string;
  revoked_at: string | null;
}

export interface SandboxTable {
  id: string;
  project_id: string;
  node: string;
  backend: string;
  state: string;
  /** The create request, as JSON. */
  spec: string;
  /** Resolved layer digests, bottom first, as JSON. */
  layers: string;
  cpu: number;
  memory_mib: number;
  created_at: string;
  expires_at: string;
  /** The warm pool that holds this sandbox until it is claimed; null for every other sandbox. */
  pool_id: string | null;
  // Lifecycle columns (migration 0002_lifecycle); optional so that rows can be written
  // without them (they default to NULL).
  /** Owner session (owners.id), or null. */
  owner_id?: string | null | undefined;
  /** The granted lease (GrantedLease) as JSON; null for rows made before leases: the defaults. */
  lease?: string | null | undefined;
  /** Last API activity, written about once a second from memory. */
  last_active_at?: string | null | undefined;
  /** When and why the sandbox was paused; null while it runs. */
  paused_at?: string | null | undefined;
  pause_reason?: string | null | undefined;
  /**
   * Earliest time (ms since the epoch) at which the lease pass must look at this running row
   * again for its idle timeout (migration 0026_cell_leases); null: at the next pass. Written by
   * the pass, set back to null with any write of `lease` or `owner_id`. PostgreSQL returns it as
   * a string (bigint); nothing reads it but the pass's query.
   */
  lease_check_ms?: number | string | null | undefined;
  /**
   * The session tag of the replica that last put the row in a transitional state (migration
   * 0027_replica_work), cleared when the row leaves it; null on one-process stores. A live
   * replica settles the row when that replica is gone (reconcile.ts, reconcileGoneReplica).
   */
  replica?: string | null | undefined;
}

/** Quota one replica reserved for a project and has not yet turned into rows or given back. */
export interface ReplicaReservationTable {
  replica: string;
  project_id: string;
  sandboxes: number;
  cpu: number;
  memory_mib: number;
}

/** An owner session: a client that keeps its sandboxes by heartbeating. */
export interface OwnerTable {
  id: string;
  project_id: string;
  name: string | null;
  grace_ms: number;
  /** `active`, `lost` (no heartbeat within the grace) or `closed` (DELETE). */
  state: string;
  created_at: string;
  heartbeat_at: string;
  closed_at: string | null;
}

export interface SandboxLabelTable {
  sandbox_id: string;
  key: string;
  value: string;
}

export interface LayerTable {
  id: string;
  /** Owning project, or 'public' for the node's built-in layers. */
  project_id: string;
  digest: string;
  kind: string;
  /** User-facing `name:tag`, unique per project; null for an unnamed upload. */
  name: string | null;
  created_at: string;
  /** 1: a snapshot its project shares with its sub-projects (a snapshot is private otherwise). */
  shared: number;
}

/** A warm pool: K sandboxes of one spec kept ready for claims. */
export interface PoolTable {
  id: string;
  project_id: string;
  name: string;
  /** The pool's spec as given, as JSON. */
  spec: string;
  /** The spec with layers resolved and resources granted, as JSON: what members are created from. */
  resolved: string;
  /** Hash of the resolved spec: a create whose resolved spec hashes the same claims from the pool. */
  spec_key: string;
  size: number;
  idle_timeout_ms: number;
  /** Last claim, matching create or configuration. */
  last_used_at: string;
  created_at: string;
  updated_at: string;
}

/** An idempotency key of a project and what it created. */
export interface IdempotencyKeyTable {
  project_id: string;
  key: string;
  /** Hash of the request the key was first used with. */
  request_hash: string;
  /** `pending` while the first request runs; `done` once it created its sandbox (or for a batch). */
  state: string;
  sandbox_id: string | null;
  /** The first reply's body, as JSON. */
  response: string | null;
  created_at: string;
  expires_at: string;
  /**
   * The session tag of the replica whose request holds the key while it is pending (migration
   * 0028_replica_keys); null on one-process stores. Settled with that replica's work when it is gone.
   */
  replica?: string | null | undefined;
}

/** The record of one sandbox's life: its resolved spec and step counters. */
export interface TrajectoryTable {
  sandbox_id: string;
  project_id: string;
  /** The resolved spec (layer digests, resources, env, labels, lifetime), as JSON. */
  spec: string;
  /** Layer digests, bottom first, as JSON. */
  layers: string;
  created_at: string;
  /** When the sandbox was destroyed; null while it exists. */
  ended_at: string | null;
  steps: number;
  bytes: number;
  /** 1 when steps past the limits were not stored. */
  truncated: number;
  /** When a byte budget (the tenant's or the platform's) stopped the recording: not replayable. */
  cut_at: string | null;
}

/** One step of a trajectory. */
export interface TrajectoryStepTable {
  sandbox_id: string;
  seq: number;
  kind: string;
  started_at: string;
  /** Stored size of `step`. */
  bytes: number;
  /** The step as the API returns it (bounded copies included), as JSON. */
  step: string;
}

/** A snapshot layer: what it sits on and where it comes from. */
export interface SnapshotTable {
  digest: string;
  project_id: string;
  sandbox_id: string;
  /** Trajectory steps of the sandbox below this seq were recorded before the snapshot. */
  seq: number;
  /** The image (base, workspace, toolkits digests) of the chain, as JSON. */
  image: string;
  /** Every layer below the snapshot, bottom first, as JSON. */
  parents: string;
  created_at: string;
}

export interface EventTable {
  /** Sortable: time order. */
  id: string;
  at: string;
  kind: string;
  severity: string;
  /** The sandbox's project; null for node-level events. */
  project_id: string | null;
  sandbox_id: string | null;
  node: string | null;
  message: string;
  /** Kind-specific fields, as JSON. */
  data: string;
}

export interface AuditTable {
  /** Sortable: time order. */
  id: string;
  at: string;
  /** The API key's id, never the key; null when no valid key was sent. */
  key_id: string | null;
  project_id: string | null;
  method: string;
  /** Route pattern (`/v1/sandboxes/:id/exec`). */
  route: string;
  sandbox_id: string | null;
  status: number;
  duration_ms: number;
  /** exec: the command, cut short. */
  command: string | null;
  exit_code: number | null;
  /** Calls this entry stands for (repeated failed authentications collapsed; 0006_limits). */
  count: number;
}

export interface RuleTable {
  id: string;
  project_id: string;
  kind: string;
  /** The rule as created, as JSON. */
  spec: string;
  created_by: string;
  created_at: string;
}

/** A rate-limit token bucket shared by replicas (migration 0007_replicas). */
export interface RateBucketTable {
  key: string;
  tokens: number;
  /** When `tokens` was computed, ms since the epoch on the database's clock. */
  at_ms: number;
  /** 1 when the last take found no token. */
  denied: number;
}

/** The last trajectory seq handed out per sandbox (migration 0007_replicas). */
export interface TrajectorySeqTable {
  sandbox_id: string;
  last_seq: number;
}

/** A node that joined the cluster (remote edges; the in-process edge has no row). */
export interface NodeTable {
  name: string;
  /** SHA-256 fingerprint of its client certificate (colon-separated hex, as Node prints it). */
  cert_fingerprint: string;
  /** 1 while cordoned (placement skips it). */
  cordoned: number;
  joined_at: string;
  /** Set when the node was removed: its certificate is refused from then on. */
  revoked_at: string | null;
}

/** A single-use join token (its secret stored hashed). */
export interface JoinTokenTable {
  id: string;
  hash: string;
  created_at: string;
  expires_at: string;
  /** Set when a node joined with it. */
  used_at: string | null;
  used_by: string | null;
}

/** The whole database. */
export interface Database {
  nodes: NodeTable;
  join_tokens: JoinTokenTable;
  projects: ProjectTable;
  api_keys: ApiKeyTable;
  sandboxes: SandboxTable;
  sandbox_labels: SandboxLabelTable;
  layers: LayerTable;
  owners: OwnerTable;
  pools: PoolTable;
  idempotency_keys: IdempotencyKeyTable;
  trajectories: TrajectoryTable;
  trajectory_steps: TrajectoryStepTable;
  snapshots: SnapshotTable;
  events: EventTable;
  audit: AuditTable;
  rules: RuleTable;
  rate_buckets: RateBucketTable;
  trajectory_seqs: TrajectorySeqTable;
  replica_reservations: ReplicaReservationTable;
}
