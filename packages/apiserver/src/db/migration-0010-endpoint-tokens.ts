// Migration 0010_endpoint_tokens (issue 20): revocable tokens that stand in a URL's path for
// clients that send no headers (verl's SandboxFusion client). Only the token's SHA-256 is kept.
import type { Kysely, Migration } from 'kysely';

/** Adds `endpoint_tokens`. */
export const migration0010EndpointTokens: Migration = {
  async up(db: Kysely<unknown>): Promise<void> {
    await db.schema
      .createTable('endpoint_tokens')
      .addColumn('id', 'text', (c) => c.primaryKey())
      .addColumn('name', 'text', (c) => c.notNull())
      .addColumn('project_id', 'text', (c) => c.notNull())
      .addColumn('protocol', 'text', (c) => c.notNull())
      .addColumn('token_hash', 'text', (c) => c.notNull().unique())
      .addColumn('created_by', 'text', (c) => c.notNull())
      .addColumn('created_at', 'text', (c) => c.notNull())
      .addColumn('revoked_at', 'text')
      .execute();
  },
};
