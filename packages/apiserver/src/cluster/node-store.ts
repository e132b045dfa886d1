// The nodes that joined the cluster and their join tokens, in the state store (SQLite or
// PostgreSQL alike: plain Kysely queries on the store's database).
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import type { Kysely } from 'kysely';
import { DsecError } from '@dsec/protocol';
import type { Database, NodeTable } from '../db/schema.js';

function hashSecret(secret: string): string {
  return createHash('sha256').update(secret).digest('hex');
}

/** Joined nodes and join tokens. */
export class NodeStore {
  constructor(private readonly db: Kysely<Database>) {}

  /** A new single-use token; returns its id and secret (the secret is stored hashed). */
  async issueToken(ttlMs: number): Promise<{ id: string; secret: string; expiresAt: string }> {
    const id = randomBytes(8).toString('hex');
    const secret = randomBytes(24).toString('base64url');
    const now = Date.now();
    const expiresAt = new Date(now + ttlMs).toISOString();
    await this.db
      .insertInto('join_tokens')
      .values({ id, hash: hashSecret(secret), created_at: new Date(now).toISOString(), expires_at: expiresAt, used_at: null, used_by: null })
      .execute();
    return { id, secret, expiresAt };
  }

  /**
   * Uses a token for node `name`: it must exist, match, be unexpired and unused; the use is one
   * conditional update, so two joins with one token never both pass. UNAUTHENTICATED otherwise.
   */
  async useToken(id: string, secret: string, name: string): Promise<void> {
    const refused = new DsecError('UNAUTHENTICATED', 'the join token is unknown, used or expired');
    const row = await this.db.selectFrom('join_tokens').selectAll().where('id', '=', id).executeTakeFirst();
    if (!row) throw refused;
    const a = Buffer.from(row.hash, 'hex');
    const b = Buffer.from(hashSecret(secret), 'hex');
    if (a.length !== b.length || !timingSafeEqual(a, b)) throw refused;
    const now = new Date().toISOString();
    if (row.used_at !== null || row.expires_at <= now) throw refused;
    const r = await this.db
      .updateTable('join_tokens')
      .set({ used_at: now, used_by: name })
      .where('id', '=', id)
      .where('used_at', 'is', null)
      .executeTakeFirst();
    if (Number(r.numUpdatedRows) !== 1) throw refused;
  }

  /** Deletes tokens that expired before `before` (used ones too). */
  async pruneTokens(before: string): Promise<void> {
    await this.db.deleteFrom('join_tokens').where('expires_at', '<', before).execute();
  }

  /** A joined node by name (revoked ones too). */
  async node(name: string): Promise<NodeTable | undefined> {
    return this.db.selectFrom('nodes').selectAll().where('name', '=', name).executeTakeFirst();
  }

  /** Every joined node (revoked ones too). */
  async nodes(): Promise<NodeTable[]> {
    return this.db.selectFrom('nodes').selectAll().orderBy('name').execute();
  }

  /**
   * Records node `name` with its certificate: a new name, or one whose earlier node was removed
   * (revoked). CONFLICT when a node of that name is still a member.
   */
  async join(name: string, certFingerprint: string): Promise<void> {
    const now = new Date().toISOString();
    const before = await this.node(name);
    if (before && before.revoked_at === null) throw new DsecError('CONFLICT', `node ${name} is already a member; remove it first (dsec nodes rm ${name})`);
    if (before) {
      await this.db
        .updateTable('nodes')
        .set({ cert_fingerprint: certFingerprint, joined_at: now, revoked_at: null, cordoned: 0 })
        .where('name', '=', name)
        .where('revoked_at', 'is not', null)
        .execute();
    } else {
      await this.db.insertInto('nodes').values({ name, cert_fingerprint: certFingerprint, cordoned: 0, joined_at: now, revoked_at: null }).execute();
    }
  }

  /** Cordons or uncordons a node. */
  async setCordoned(name: string, cordoned: boolean): Promise<void> {
    await this.db
      .updateTable('nodes')
      .set({ cordoned: cordoned ? 1 : 0 })
      .where('name', '=', name)
      .execute();
  }

  /** Revokes a node: its certificate is refused from now on. */
  async revoke(name: string): Promise<void> {
    await this.db.updateTable('nodes').set({ revoked_at: new Date().toISOString() }).where('name', '=', name).where('revoked_at', 'is', null).execute();
  }
}
