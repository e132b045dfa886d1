// Migration 0023_cell (issue 16, list/filter at cell scale): an index on sandbox labels by
// (key, value, sandbox_id), so that a list filtered by a label reads that label's sandboxes in
// id order (the page order) and stops after a page, instead of walking every sandbox of the
// project in id order and probing its labels.
import type { Kysely, Migration } from 'kysely';

/** Adds `sandbox_labels_kv_id`. */
export const migration0023Cell: Migration = {
  async up(db: Kysely<unknown>): Promise<void> {
    await db.schema.createIndex('sandbox_labels_kv_id').on('sandbox_labels').columns(['key', 'value', 'sandbox_id']).execute();
  },
};
