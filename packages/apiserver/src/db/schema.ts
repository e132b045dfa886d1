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
}

/** The whole database. */
export interface Database {
  projects: ProjectTable;
  api_keys: ApiKeyTable;
  sandboxes: SandboxTable;
  sandbox_labels: SandboxLabelTable;
  layers: LayerTable;
  owners: OwnerTable;
}
