// Migration 0028_replica_keys (issue 13 §4, replicas on PostgreSQL): a pending idempotency key
// is tagged with the session tag of the replica whose request holds it, so that a live replica
// settles it with the rest of a dead replica's work (reconcile.ts) instead of after
// IDEMPOTENCY_PENDING_STALE_MS. Stores of one process (SQLite) leave it null.
import { sql } from 'kysely';
import type { Kysely, Migration } from 'kysely';

/** Adds `idempotency_keys.replica`, indexed over the pending keys. */
export const migration0028ReplicaKeys: Migration = {
  async up(db: Kysely<unknown>): Promise<void> {
    await db.schema.alterTable('idempotency_keys').addColumn('replica', 'text').execute();
    await db.schema.createIndex('idempotency_keys_pending_replica').on('idempotency_keys').column('replica').where(sql.ref('state'), '=', 'pending').execute();
  },
};
