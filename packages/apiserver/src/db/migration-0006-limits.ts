// Migration 0006_limits (tenant limits, issue 13 §3): an audit entry may stand for several
// calls (repeated failed authentications from one source are collapsed into one entry with
// their count).
import type { Kysely, Migration } from 'kysely';

/** Adds `audit.count` (1 for an entry of one call). */
export const migration0006Limits: Migration = {
  async up(db: Kysely<unknown>): Promise<void> {
    await db.schema
      .alterTable('audit')
      .addColumn('count', 'integer', (c) => c.notNull().defaultTo(1))
      .execute();
  },
};
