// Schema migrations, written with Kysely's schema builder so that they run on SQLite and
// PostgreSQL alike.
import type { Kysely, Migration, MigrationProvider } from 'kysely';
import { migration0006Limits } from './migration-0006-limits.js';
import { migration0010EndpointTokens } from './migration-0010-endpoint-tokens.js';
import { migration0012Tenants } from './migration-0012-tenants.js';
import { migration0023Cell } from './migration-0023-cell.js';
import { migration0026CellLeases } from './migration-0026-cell-leases.js';
import { migration0027ReplicaWork } from './migration-0027-replica-work.js';
import { migration0028ReplicaKeys } from './migration-0028-replica-keys.js';
import { migration0018LiveWsTickets } from '../ws-tickets.js';

const migrations: Record<string, Migration> = {
  '0001_initial': {
    async up(db: Kysely<unknown>): Promise<void> {
      await db.schema
        .createTable('projects')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('name', 'text', (c) => c.notNull())
        .addColumn('parent_id', 'text', (c) => c.references('projects.id'))
        .addColumn('quota_sandboxes', 'integer', (c) => c.notNull())
        .addColumn('quota_cpu', 'double precision', (c) => c.notNull())
        .addColumn('quota_memory_mib', 'integer', (c) => c.notNull())
        .addColumn('used_sandboxes', 'integer', (c) => c.notNull().defaultTo(0))
        .addColumn('used_cpu', 'double precision', (c) => c.notNull().defaultTo(0))
        .addColumn('used_memory_mib', 'integer', (c) => c.notNull().defaultTo(0))
        .addColumn('created_at', 'text', (c) => c.notNull())
        .execute();
      await db.schema.createIndex('projects_parent').on('projects').column('parent_id').execute();
      await db.schema.createIndex('projects_parent_name').on('projects').columns(['parent_id', 'name']).unique().execute();

      await db.schema
        .createTable('api_keys')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('project_id', 'text', (c) => c.notNull().references('projects.id'))
        .addColumn('name', 'text', (c) => c.notNull())
        .addColumn('role', 'text', (c) => c.notNull())
        .addColumn('key_hash', 'text', (c) => c.notNull().unique())
        .addColumn('created_at', 'text', (c) => c.notNull())
        .addColumn('revoked_at', 'text')
        .execute();

      await db.schema
        .createTable('sandboxes')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('project_id', 'text', (c) => c.notNull().references('projects.id'))
        .addColumn('node', 'text', (c) => c.notNull())
        .addColumn('backend', 'text', (c) => c.notNull())
        .addColumn('state', 'text', (c) => c.notNull())
        .addColumn('spec', 'text', (c) => c.notNull())
        .addColumn('layers', 'text', (c) => c.notNull())
        .addColumn('cpu', 'double precision', (c) => c.notNull())
        .addColumn('memory_mib', 'integer', (c) => c.notNull())
        .addColumn('created_at', 'text', (c) => c.notNull())
        .addColumn('expires_at', 'text', (c) => c.notNull())
        .execute();
      await db.schema.createIndex('sandboxes_project').on('sandboxes').columns(['project_id', 'id']).execute();
      await db.schema.createIndex('sandboxes_expiry').on('sandboxes').column('expires_at').execute();

      await db.schema
        .createTable('sandbox_labels')
        .addColumn('sandbox_id', 'text', (c) => c.notNull().references('sandboxes.id').onDelete('cascade'))
        .addColumn('key', 'text', (c) => c.notNull())
        .addColumn('value', 'text', (c) => c.notNull())
        .addPrimaryKeyConstraint('sandbox_labels_pk', ['sandbox_id', 'key'])
        .execute();
      await db.schema.createIndex('sandbox_labels_kv').on('sandbox_labels').columns(['key', 'value']).execute();

      await db.schema
        .createTable('layers')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('project_id', 'text', (c) => c.notNull())
        .addColumn('digest', 'text', (c) => c.notNull())
        .addColumn('kind', 'text', (c) => c.notNull())
        .addColumn('name', 'text')
        .addColumn('created_at', 'text', (c) => c.notNull())
        .execute();
      await db.schema.createIndex('layers_project_name').on('layers').columns(['project_id', 'name']).unique().execute();
      await db.schema.createIndex('layers_digest').on('layers').column('digest').execute();
    },
  },
  '0002_lifecycle': {
    async up(db: Kysely<unknown>): Promise<void> {
      await db.schema
        .createTable('owners')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('project_id', 'text', (c) => c.notNull().references('projects.id'))
        .addColumn('name', 'text')
        .addColumn('grace_ms', 'integer', (c) => c.notNull())
        .addColumn('state', 'text', (c) => c.notNull())
        .addColumn('created_at', 'text', (c) => c.notNull())
        .addColumn('heartbeat_at', 'text', (c) => c.notNull())
        .addColumn('closed_at', 'text')
        .execute();
      await db.schema.createIndex('owners_state').on('owners').column('state').execute();
      // One column per statement: SQLite adds one at a time.
      for (const column of ['owner_id', 'lease', 'last_active_at', 'paused_at', 'pause_reason']) {
        await db.schema.alterTable('sandboxes').addColumn(column, 'text').execute();
      }
      await db.schema.createIndex('sandboxes_owner').on('sandboxes').column('owner_id').execute();
      await db.schema.createIndex('sandboxes_state').on('sandboxes').column('state').execute();
    },
  },
  '0003_admission': {
    async up(db: Kysely<unknown>): Promise<void> {
      // Pool members are sandbox rows that name their pool until a claim clears it. The index
      // serves a claim (a pool's oldest ready member) without a sort.
      await db.schema.alterTable('sandboxes').addColumn('pool_id', 'text').execute();
      await db.schema.createIndex('sandboxes_pool').on('sandboxes').columns(['pool_id', 'state', 'created_at']).execute();

      await db.schema
        .createTable('pools')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('project_id', 'text', (c) => c.notNull().references('projects.id'))
        .addColumn('name', 'text', (c) => c.notNull())
        .addColumn('spec', 'text', (c) => c.notNull())
        .addColumn('resolved', 'text', (c) => c.notNull())
        .addColumn('spec_key', 'text', (c) => c.notNull())
        .addColumn('size', 'integer', (c) => c.notNull())
        .addColumn('idle_timeout_ms', 'integer', (c) => c.notNull())
        .addColumn('last_used_at', 'text', (c) => c.notNull())
        .addColumn('created_at', 'text', (c) => c.notNull())
        .addColumn('updated_at', 'text', (c) => c.notNull())
        .execute();
      await db.schema.createIndex('pools_project_name').on('pools').columns(['project_id', 'name']).unique().execute();
      await db.schema.createIndex('pools_project_key').on('pools').columns(['project_id', 'spec_key']).execute();

      await db.schema
        .createTable('idempotency_keys')
        .addColumn('project_id', 'text', (c) => c.notNull())
        .addColumn('key', 'text', (c) => c.notNull())
        .addColumn('request_hash', 'text', (c) => c.notNull())
        .addColumn('state', 'text', (c) => c.notNull())
        .addColumn('sandbox_id', 'text')
        .addColumn('response', 'text')
        .addColumn('created_at', 'text', (c) => c.notNull())
        .addColumn('expires_at', 'text', (c) => c.notNull())
        .addPrimaryKeyConstraint('idempotency_keys_pk', ['project_id', 'key'])
        .execute();
      await db.schema.createIndex('idempotency_keys_expiry').on('idempotency_keys').column('expires_at').execute();
    },
  },
  '0004_trajectory': {
    async up(db: Kysely<unknown>): Promise<void> {
      // The trajectory of each sandbox outlives it (no foreign key to sandboxes): a replay after
      // its node died reads the steps and the resolved spec from here.
      await db.schema
        .createTable('trajectories')
        .addColumn('sandbox_id', 'text', (c) => c.primaryKey())
        .addColumn('project_id', 'text', (c) => c.notNull())
        .addColumn('spec', 'text', (c) => c.notNull())
        .addColumn('layers', 'text', (c) => c.notNull())
        .addColumn('created_at', 'text', (c) => c.notNull())
        .addColumn('ended_at', 'text')
        .addColumn('steps', 'integer', (c) => c.notNull().defaultTo(0))
        .addColumn('bytes', 'integer', (c) => c.notNull().defaultTo(0))
        .addColumn('truncated', 'integer', (c) => c.notNull().defaultTo(0))
        .execute();
      await db.schema.createIndex('trajectories_ended').on('trajectories').column('ended_at').execute();

      await db.schema
        .createTable('trajectory_steps')
        .addColumn('sandbox_id', 'text', (c) => c.notNull())
        .addColumn('seq', 'integer', (c) => c.notNull())
        .addColumn('kind', 'text', (c) => c.notNull())
        .addColumn('started_at', 'text', (c) => c.notNull())
        .addColumn('bytes', 'integer', (c) => c.notNull())
        .addColumn('step', 'text', (c) => c.notNull())
        .addPrimaryKeyConstraint('trajectory_steps_pk', ['sandbox_id', 'seq'])
        .execute();

      await db.schema
        .createTable('snapshots')
        .addColumn('digest', 'text', (c) => c.primaryKey())
        .addColumn('project_id', 'text', (c) => c.notNull())
        .addColumn('sandbox_id', 'text', (c) => c.notNull())
        .addColumn('seq', 'integer', (c) => c.notNull())
        .addColumn('image', 'text', (c) => c.notNull())
        .addColumn('parents', 'text', (c) => c.notNull())
        .addColumn('created_at', 'text', (c) => c.notNull())
        .execute();
    },
  },
  '0005_events': {
    async up(db: Kysely<unknown>): Promise<void> {
      // Events: ids sort by time (watcher's sortableId), so pages and SSE resumption go by id.
      await db.schema
        .createTable('events')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('at', 'text', (c) => c.notNull())
        .addColumn('kind', 'text', (c) => c.notNull())
        .addColumn('severity', 'text', (c) => c.notNull())
        .addColumn('project_id', 'text')
        .addColumn('sandbox_id', 'text')
        .addColumn('node', 'text')
        .addColumn('message', 'text', (c) => c.notNull())
        .addColumn('data', 'text', (c) => c.notNull())
        .execute();
      await db.schema.createIndex('events_project').on('events').columns(['project_id', 'id']).execute();
      await db.schema.createIndex('events_sandbox').on('events').columns(['sandbox_id', 'id']).execute();
      await db.schema.createIndex('events_kind').on('events').columns(['kind', 'id']).execute();
      await db.schema.createIndex('events_at').on('events').column('at').execute();

      await db.schema
        .createTable('audit')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('at', 'text', (c) => c.notNull())
        .addColumn('key_id', 'text')
        .addColumn('project_id', 'text')
        .addColumn('method', 'text', (c) => c.notNull())
        .addColumn('route', 'text', (c) => c.notNull())
        .addColumn('sandbox_id', 'text')
        .addColumn('status', 'integer', (c) => c.notNull())
        .addColumn('duration_ms', 'double precision', (c) => c.notNull())
        .addColumn('command', 'text')
        .addColumn('exit_code', 'integer')
        .execute();
      await db.schema.createIndex('audit_project').on('audit').columns(['project_id', 'id']).execute();
      await db.schema.createIndex('audit_sandbox').on('audit').columns(['sandbox_id', 'id']).execute();
      await db.schema.createIndex('audit_key').on('audit').columns(['key_id', 'id']).execute();
      await db.schema.createIndex('audit_at').on('audit').column('at').execute();

      await db.schema
        .createTable('rules')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('project_id', 'text', (c) => c.notNull().references('projects.id'))
        .addColumn('kind', 'text', (c) => c.notNull())
        .addColumn('spec', 'text', (c) => c.notNull())
        .addColumn('created_by', 'text', (c) => c.notNull())
        .addColumn('created_at', 'text', (c) => c.notNull())
        .execute();
    },
  },
  '0006_limits': migration0006Limits,
  '0007_replicas': {
    async up(db: Kysely<unknown>): Promise<void> {
      // State that replicas on one PostgreSQL share: rate-limit buckets (taken in one upsert on
      // the database's clock) and the trajectory seq counter of each sandbox.
      await db.schema
        .createTable('rate_buckets')
        .addColumn('key', 'text', (c) => c.primaryKey())
        .addColumn('tokens', 'double precision', (c) => c.notNull())
        .addColumn('at_ms', 'double precision', (c) => c.notNull())
        .addColumn('denied', 'integer', (c) => c.notNull().defaultTo(0))
        .execute();
      await db.schema
        .createTable('trajectory_seqs')
        .addColumn('sandbox_id', 'text', (c) => c.primaryKey())
        .addColumn('last_seq', 'integer', (c) => c.notNull())
        .execute();
    },
  },
  '0008_nodes': {
    async up(db: Kysely<unknown>): Promise<void> {
      // Nodes that joined from other machines, and the single-use tokens they joined with.
      await db.schema
        .createTable('nodes')
        .addColumn('name', 'text', (c) => c.primaryKey())
        .addColumn('cert_fingerprint', 'text', (c) => c.notNull())
        .addColumn('cordoned', 'integer', (c) => c.notNull().defaultTo(0))
        .addColumn('joined_at', 'text', (c) => c.notNull())
        .addColumn('revoked_at', 'text')
        .execute();
      await db.schema
        .createTable('join_tokens')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('hash', 'text', (c) => c.notNull())
        .addColumn('created_at', 'text', (c) => c.notNull())
        .addColumn('expires_at', 'text', (c) => c.notNull())
        .addColumn('used_at', 'text')
        .addColumn('used_by', 'text')
        .execute();
    },
  },
  '0010_endpoint_tokens': migration0010EndpointTokens,
  '0012_tenants': migration0012Tenants,
  '0018_live_ws_tickets': migration0018LiveWsTickets,
  '0023_cell': migration0023Cell,
  '0026_cell_leases': migration0026CellLeases,
  '0027_replica_work': migration0027ReplicaWork,
  '0028_replica_keys': migration0028ReplicaKeys,
};

/** The migrations of the state store, in order. */
export const migrationProvider: MigrationProvider = {
  getMigrations: async () => migrations,
};
