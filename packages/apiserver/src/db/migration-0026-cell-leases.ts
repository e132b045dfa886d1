// Migration 0026_cell_leases (issue 16, the periodic passes at cell scale):
// `sandboxes.lease_check_ms`, the earliest time (ms since the epoch) at which a running
// sandbox's idle timeout can next be due, and an index by (state, lease_check_ms). The lease
// pass reads only the running rows whose check is due (or unknown: NULL, as every row is after
// this migration) and those with an owner, instead of every running row once a second; a row it
// judges not due gets its next check written (StateStore.deferLeaseChecks), and a write of a
// row's lease or owner sets the column back to NULL. And an index by node: the watcher compares
// a share of the nodes with their records per pass and reads only those nodes' records. And
// a partial index of pool members (pool_id not null): the pool manager's count of members by
// pool and state, run on every pass and capacity change, reads the members alone instead of
// every sandbox row.
import type { Kysely, Migration } from 'kysely';

/** Adds `sandboxes.lease_check_ms`, `sandboxes_lease_check`, `sandboxes_node` and `sandboxes_pool_members`. */
export const migration0026CellLeases: Migration = {
  async up(db: Kysely<unknown>): Promise<void> {
    await db.schema.alterTable('sandboxes').addColumn('lease_check_ms', 'bigint').execute();
    await db.schema.createIndex('sandboxes_lease_check').on('sandboxes').columns(['state', 'lease_check_ms']).execute();
    await db.schema.createIndex('sandboxes_node').on('sandboxes').column('node').execute();
    await db.schema.createIndex('sandboxes_pool_members').on('sandboxes').columns(['pool_id', 'state']).where('pool_id', 'is not', null).execute();
  },
};
