// The state store: projects, keys, sandboxes and layer ownership, on Kysely. SQLite
// (better-sqlite3) is the embedded default; the queries use only what PostgreSQL also has.
import { randomBytes } from 'node:crypto';
import { Kysely, Migrator, SqliteDialect } from 'kysely';
import type { Dialect, Transaction } from 'kysely';
import { DsecError } from '@dsec/protocol';
import type { Quota, Role } from '@dsec/protocol';
import type { ApiKeyTable, Database, LayerTable, ProjectTable, SandboxTable } from './schema.js';
import { migrationProvider } from './migrations.js';

/** The id of the root project every tree hangs from. */
export const ROOT_PROJECT_ID = 'root';
/** Project id of layers every project can use. */
export const PUBLIC_PROJECT_ID = 'public';
/** Quota of the root project (the whole installation). */
export const ROOT_QUOTA: Quota = { sandboxes: 1_000_000, cpu: 1_000_000, memoryMiB: 1_000_000_000 };

/** The subset of better-sqlite3's Database that Kysely's SqliteDialect needs. */
export interface SqliteDatabase {
  close(): void;
  prepare(sql: string): unknown;
  pragma(source: string): unknown;
}

/** What a sandbox reserves against its project's quota. */
export interface Reservation {
  sandboxes: number;
  cpu: number;
  memoryMiB: number;
}

function now(): string {
  return new Date().toISOString();
}

/** A new random id with a prefix (`prj_...`, `key_...`). */
export function newId(prefix: string): string {
  return `${prefix}_${randomBytes(10).toString('hex')}`;
}

/** State of the control plane. */
export class StateStore {
  private constructor(readonly db: Kysely<Database>) {}

  /** Opens a store on any Kysely dialect and migrates it to the latest schema. */
  static async open(dialect: Dialect): Promise<StateStore> {
    const db = new Kysely<Database>({ dialect });
    const migrator = new Migrator({ db, provider: migrationProvider });
    const { error } = await migrator.migrateToLatest();
    if (error) throw new DsecError('INTERNAL', `state store migration failed: ${(error as Error).message}`);
    const store = new StateStore(db);
    await store.ensureRoot();
    return store;
  }

  /** Opens the embedded SQLite store. */
  static async openSqlite(database: SqliteDatabase): Promise<StateStore> {
    database.pragma('journal_mode = WAL');
    database.pragma('foreign_keys = ON');
    database.pragma('busy_timeout = 5000');
    return StateStore.open(new SqliteDialect({ database: database as never }));
  }

  async close(): Promise<void> {
    await this.db.destroy();
  }

  private async ensureRoot(): Promise<void> {
    const root = await this.db.selectFrom('projects').select('id').where('id', '=', ROOT_PROJECT_ID).executeTakeFirst();
    if (root) return;
    await this.db
      .insertInto('projects')
      .values({
        id: ROOT_PROJECT_ID,
        name: 'root',
        parent_id: null,
        quota_sandboxes: ROOT_QUOTA.sandboxes,
        quota_cpu: ROOT_QUOTA.cpu,
        quota_memory_mib: ROOT_QUOTA.memoryMiB,
        used_sandboxes: 0,
        used_cpu: 0,
        used_memory_mib: 0,
        created_at: now(),
      })
      .execute();
  }

  // ---- projects ----

  async projects(): Promise<ProjectTable[]> {
    return this.db.selectFrom('projects').selectAll().orderBy('created_at').execute();
  }

  async project(id: string): Promise<ProjectTable | undefined> {
    return this.db.selectFrom('projects').selectAll().where('id', '=', id).executeTakeFirst();
  }

  async createProject(p: { name: string; parentId: string; quota: Quota }): Promise<ProjectTable> {
    const row: ProjectTable = {
      id: newId('prj'),
      name: p.name,
      parent_id: p.parentId,
      quota_sandboxes: p.quota.sandboxes,
      quota_cpu: p.quota.cpu,
      quota_memory_mib: p.quota.memoryMiB,
      used_sandboxes: 0,
      used_cpu: 0,
      used_memory_mib: 0,
      created_at: now(),
    };
    try {
      await this.db.insertInto('projects').values(row).execute();
    } catch (err) {
      if (/UNIQUE|duplicate/i.test((err as Error).message)) {
        throw new DsecError('CONFLICT', `a project named ${p.name} already exists there`, { field: 'name' });
      }
      throw err;
    }
    return row;
  }

  /** Ids of the project and its ancestors, nearest first. */
  async ancestry(projectId: string, db: Kysely<Database> | Transaction<Database> = this.db): Promise<string[]> {
    const all = new Map((await db.selectFrom('projects').select(['id', 'parent_id']).execute()).map((r) => [r.id, r.parent_id]));
    const chain: string[] = [];
    for (let id: string | null | undefined = projectId; id; id = all.get(id)) {
      if (chain.includes(id)) break;
      chain.push(id);
    }
    return chain;
  }

  /**
   * Adds a reservation to a project and every ancestor, atomically: each row is updated only
   * if its usage stays within its quota, and one refusal rolls the whole reservation back.
   */
  async reserve(projectId: string, r: Reservation): Promise<void> {
    await this.db.transaction().execute(async (tx) => {
      for (const id of await this.ancestry(projectId, tx)) {
        if (!(await this.addUsage(tx, id, r, 1, true))) {
          const row = await tx.selectFrom('projects').selectAll().where('id', '=', id).executeTakeFirst();
          throw quotaError(row, r);
        }
      }
    });
  }

  /** Returns a reservation to a project and its ancestors. */
  async unreserve(projectId: string, r: Reservation, tx: Kysely<Database> | Transaction<Database> = this.db): Promise<void> {
    for (const id of await this.ancestry(projectId, tx)) await this.addUsage(tx, id, r, -1, false);
  }

  /** Adds `sign * r` to one project's usage; with `withinQuota`, only if it stays within; true when applied. */
  private async addUsage(db: Kysely<Database> | Transaction<Database>, id: string, r: Reservation, sign: 1 | -1, withinQuota: boolean): Promise<boolean> {
    const d = { sandboxes: sign * r.sandboxes, cpu: sign * r.cpu, memoryMiB: sign * r.memoryMiB };
    let q = db
      .updateTable('projects')
      .set((eb) => ({
        used_sandboxes: eb('used_sandboxes', '+', d.sandboxes),
        used_cpu: eb('used_cpu', '+', d.cpu),
        used_memory_mib: eb('used_memory_mib', '+', d.memoryMiB),
      }))
      .where('id', '=', id);
    if (withinQuota) {
      q = q.where((eb) =>
        eb.and([
          eb(eb('used_sandboxes', '+', d.sandboxes), '<=', eb.ref('quota_sandboxes')),
          eb(eb('used_cpu', '+', d.cpu), '<=', eb.ref('quota_cpu')),
          eb(eb('used_memory_mib', '+', d.memoryMiB), '<=', eb.ref('quota_memory_mib')),
        ]),
      );
    }
    return Number((await q.executeTakeFirst()).numUpdatedRows) === 1;
  }

  // ---- keys ----

  async createKey(k: { projectId: string; name: string; role: Role; keyHash: string }): Promise<ApiKeyTable> {
    const row: ApiKeyTable = { id: newId('key'), project_id: k.projectId, name: k.name, role: k.role, key_hash: k.keyHash, created_at: now(), revoked_at: null };
    await this.db.insertInto('api_keys').values(row).execute();
    return row;
  }

  async keyByHash(hash: string): Promise<ApiKeyTable | undefined> {
    return this.db.selectFrom('api_keys').selectAll().where('key_hash', '=', hash).executeTakeFirst();
  }

  async keys(projectIds: string[]): Promise<ApiKeyTable[]> {
    if (projectIds.length === 0) return [];
    return this.db.selectFrom('api_keys').selectAll().where('project_id', 'in', projectIds).orderBy('created_at').execute();
  }

  async key(id: string): Promise<ApiKeyTable | undefined> {
    return this.db.selectFrom('api_keys').selectAll().where('id', '=', id).executeTakeFirst();
  }

  async revokeKey(id: string): Promise<void> {
    await this.db.updateTable('api_keys').set({ revoked_at: now() }).where('id', '=', id).where('revoked_at', 'is', null).execute();
  }

  // ---- sandboxes ----

  async insertSandbox(row: SandboxTable, labels: Record<string, string>): Promise<void> {
    await this.db.transaction().execute(async (tx) => {
      await tx.insertInto('sandboxes').values(row).execute();
      const entries = Object.entries(labels);
      if (entries.length > 0) {
        await tx
          .insertInto('sandbox_labels')
          .values(entries.map(([key, value]) => ({ sandbox_id: row.id, key, value })))
          .execute();
      }
    });
  }

  /** Moves a sandbox to `to` only if it is in one of `from`; true when it moved. */
  async transitionSandbox(id: string, from: string[], to: string): Promise<boolean> {
    const res = await this.db.updateTable('sandboxes').set({ state: to }).where('id', '=', id).where('state', 'in', from).executeTakeFirst();
    return Number(res.numUpdatedRows) === 1;
  }

  /** Replaces a sandbox's stored create request (its network policy changed). */
  async setSandboxSpec(id: string, spec: string): Promise<void> {
    await this.db.updateTable('sandboxes').set({ spec }).where('id', '=', id).execute();
  }

  async setSandboxState(id: string, state: string): Promise<void> {
    await this.db.updateTable('sandboxes').set({ state }).where('id', '=', id).execute();
  }

  /** Deletes a sandbox's row and returns its reservation to the quota, in one transaction. */
  async deleteSandbox(row: SandboxTable): Promise<void> {
    await this.db.transaction().execute(async (tx) => {
      const res = await tx.deleteFrom('sandboxes').where('id', '=', row.id).executeTakeFirst();
      if (Number(res.numDeletedRows) === 1) {
        await this.unreserve(row.project_id, { sandboxes: 1, cpu: row.cpu, memoryMiB: row.memory_mib }, tx);
      }
    });
  }

  /** A sandbox row without its labels. */
  async sandboxOnly(id: string): Promise<SandboxTable | undefined> {
    return this.db.selectFrom('sandboxes').selectAll().where('id', '=', id).executeTakeFirst();
  }

  async sandbox(id: string): Promise<(SandboxTable & { labels: Record<string, string> }) | undefined> {
    const row = await this.db.selectFrom('sandboxes').selectAll().where('id', '=', id).executeTakeFirst();
    if (!row) return undefined;
    return { ...row, labels: await this.labelsOf(id) };
  }

  private async labelsOf(id: string): Promise<Record<string, string>> {
    const rows = await this.db.selectFrom('sandbox_labels').select(['key', 'value']).where('sandbox_id', '=', id).execute();
    return Object.fromEntries(rows.map((r) => [r.key, r.value]));
  }

  /** A page of sandboxes in the given projects, by id order, filtered by labels and state. */
  async listSandboxes(q: { projectIds: string[]; labels: Array<[string, string]>; state?: string; limit: number; after?: string }): Promise<Array<SandboxTable & { labels: Record<string, string> }>> {
    if (q.projectIds.length === 0) return [];
    let query = this.db.selectFrom('sandboxes').selectAll().where('project_id', 'in', q.projectIds);
    for (const [key, value] of q.labels) {
      query = query.where((eb) =>
        eb.exists(
          eb
            .selectFrom('sandbox_labels')
            .select('sandbox_labels.key')
            .whereRef('sandbox_labels.sandbox_id', '=', 'sandboxes.id')
            .where('sandbox_labels.key', '=', key)
            .where('sandbox_labels.value', '=', value),
        ),
      );
    }
    if (q.state) query = query.where('state', '=', q.state);
    if (q.after) query = query.where('id', '>', q.after);
    const rows = await query.orderBy('id').limit(q.limit).execute();
    const labelRows = rows.length
      ? await this.db.selectFrom('sandbox_labels').selectAll().where('sandbox_id', 'in', rows.map((r) => r.id)).execute()
      : [];
    const byId = new Map<string, Record<string, string>>();
    for (const l of labelRows) (byId.get(l.sandbox_id) ?? byId.set(l.sandbox_id, {}).get(l.sandbox_id)!)[l.key] = l.value;
    return rows.map((r) => ({ ...r, labels: byId.get(r.id) ?? {} }));
  }

  /** Every sandbox row (the watcher reconciles them with the nodes). */
  async allSandboxes(): Promise<SandboxTable[]> {
    return this.db.selectFrom('sandboxes').selectAll().execute();
  }

  async expiredSandboxes(at: string): Promise<SandboxTable[]> {
    return this.db.selectFrom('sandboxes').selectAll().where('expires_at', '<=', at).execute();
  }

  // ---- layers ----

  async addLayer(l: { projectId: string; digest: string; kind: string; name: string | null }): Promise<LayerTable> {
    if (l.name !== null) {
      await this.db.deleteFrom('layers').where('project_id', '=', l.projectId).where('name', '=', l.name).execute();
    } else {
      const existing = await this.db.selectFrom('layers').selectAll().where('project_id', '=', l.projectId).where('digest', '=', l.digest).where('name', 'is', null).executeTakeFirst();
      if (existing) return existing;
    }
    const row: LayerTable = { id: newId('lyr'), project_id: l.projectId, digest: l.digest, kind: l.kind, name: l.name, created_at: now() };
    await this.db.insertInto('layers').values(row).execute();
    return row;
  }

  async layers(projectIds: string[]): Promise<LayerTable[]> {
    return this.db.selectFrom('layers').selectAll().where('project_id', 'in', projectIds).orderBy('created_at').execute();
  }

  async removeLayerRows(ids: string[]): Promise<void> {
    if (ids.length) await this.db.deleteFrom('layers').where('id', 'in', ids).execute();
  }

  async layerDigestInUse(digest: string): Promise<boolean> {
    const rows = await this.db.selectFrom('sandboxes').select('layers').execute();
    return rows.some((r) => (JSON.parse(r.layers) as string[]).includes(digest));
  }

  async layerRowsForDigest(digest: string): Promise<LayerTable[]> {
    return this.db.selectFrom('layers').selectAll().where('digest', '=', digest).execute();
  }
}

function quotaError(row: ProjectTable | undefined, r: Reservation): DsecError {
  const what = !row
    ? 'project'
    : row.used_sandboxes + r.sandboxes > row.quota_sandboxes
      ? `sandboxes (${row.used_sandboxes}/${row.quota_sandboxes})`
      : row.used_cpu + r.cpu > row.quota_cpu
        ? `cpu (${row.used_cpu}/${row.quota_cpu})`
        : `memoryMiB (${row.used_memory_mib}/${row.quota_memory_mib})`;
  return new DsecError('QUOTA_EXCEEDED', `quota of project ${row?.name ?? '?'} exceeded: ${what}`, { project: row?.id, retryAfterMs: 1000 });
}
