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

/** The whole database. */
export interface Database {
  projects: ProjectTable;
  api_keys: ApiKeyTable;
  sandboxes: SandboxTable;
  sandbox_labels: SandboxLabelTable;
  layers: LayerTable;
  events: EventTable;
  audit: AuditTable;
  rules: RuleTable;
}
