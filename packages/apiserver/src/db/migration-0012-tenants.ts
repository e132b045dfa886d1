// Migration 0012_tenants (issue 13, the rest): a trajectory cut short by its tenant's byte
// budget (or the platform's) is marked, so that a replay of it is refused with
// TRAJECTORY_TRUNCATED instead of replaying half a history; a snapshot layer may be shared with
// the sub-projects of its project (private by default).
import type { Kysely, Migration } from 'kysely';

/** Adds `trajectories.cut_at` (null unless a byte budget stopped the recording) and `layers.shared` (0: private). */
export const migration0012Tenants: Migration = {
  async up(db: Kysely<unknown>): Promise<void> {
    await db.schema.alterTable('trajectories').addColumn('cut_at', 'text').execute();
    await db.schema
      .alterTable('layers')
      .addColumn('shared', 'integer', (c) => c.notNull().defaultTo(0))
      .execute();
  },
};
