// Migration 0027_replica_work (issue 13 §4, replicas on PostgreSQL): what a replica has under
// way, tagged with its session tag, so that a live replica can settle the work of one that died.
// `sandboxes.replica`: the replica that last put the row in a transitional state (`creating`,
// `pausing`, `resuming`, `stopping`); `replica_reservations`: per replica and project, the quota
// it reserved and has not yet turned into a row or given back (a create between its
// reservation and its row). Stores of one process (SQLite) leave both empty.
import type { Kysely, Migration } from 'kysely';

/** Adds `sandboxes.replica` and the table `replica_reservations`. */
export const migration0027ReplicaWork: Migration = {
  async up(db: Kysely<unknown>): Promise<void> {
    await db.schema.alterTable('sandboxes').addColumn('replica', 'text').execute();
    await db.schema.createIndex('sandboxes_replica').on('sandboxes').column('replica').where('replica', 'is not', null).execute();
    await db.schema
      .createTable('replica_reservations')
      .addColumn('replica', 'text', (c) => c.notNull())
      .addColumn('project_id', 'text', (c) => c.notNull())
      .addColumn('sandboxes', 'integer', (c) => c.notNull())
      .addColumn('cpu', 'double precision', (c) => c.notNull())
      .addColumn('memory_mib', 'integer', (c) => c.notNull())
      .addPrimaryKeyConstraint('replica_reservations_pk', ['replica', 'project_id'])
      .execute();
  },
};
