// The state store: projects, keys, sandboxes and layer ownership, on Kysely. SQLite
// (better-sqlite3) is the embedded default; the queries use only what PostgreSQL also has.
// Over 600 lines on purpose: it is the one shape a second store (PostgreSQL) implements, one
// section per table, and splitting it would split that shape.
import { randomBytes } from 'node:crypto';
import { Kysely, Migrator, sql } from 'kysely';
import type { CompiledQuery, Dialect, RawBuilder, SelectQueryBuilder, Transaction } from 'kysely';
import { DsecError } from '@dsec/protocol';
import type { Quota, Role, SandboxSpec } from '@dsec/protocol';
import type {
  ApiKeyTable,
  Database,
  IdempotencyKeyTable,
  LayerTable,
  OwnerTable,
  PoolTable,
  ProjectTable,
  SandboxLabelTable,
  SandboxTable,
  SnapshotTable,
  TrajectoryStepTable,
  TrajectoryTable,
} from './schema.js';
import { migrationProvider } from './migrations.js';
import { SandboxInserts } from './sandbox-inserts.js';
import { WriteGroups } from './write-groups.js';
import { CATALOG_CHANNEL, CatalogCache } from './catalog-cache.js';
import { SandboxRowCache } from './sandbox-row-cache.js';
import { GroupCommitSqliteDialect } from './sqlite-group-commit.js';
import type { GroupCommitFigures } from './sqlite-group-commit.js';
import { postgresDialect, redactUrl } from './postgres.js';
import type { PostgresOptions } from './postgres.js';

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
  /** True while a transaction is open (the group commit's driver reads it after a failure). */
  readonly inTransaction: boolean;
}

/** Prepared statements kept per SQLite database (Kysely prepares every query it runs). */
const STATEMENT_CACHE_SIZE = 512;

/**
 * The database with its prepared statements kept and reused by SQL text: Kysely's SQLite driver
 * prepares each query again on every run, and compiling the SQL was the largest single cost of
 * an exec through the API (perf, issue 15). A statement that is busy (iterating) is not shared.
 */
function withStatementCache(database: SqliteDatabase): SqliteDatabase {
  const cache = new Map<string, { busy?: boolean }>();
  return {
    close: () => database.close(),
    pragma: (source) => database.pragma(source),
    get inTransaction() {
      return database.inTransaction;
    },
    prepare(sql) {
      const hit = cache.get(sql);
      if (hit && !hit.busy) return hit;
      const stmt = database.prepare(sql) as { busy?: boolean };
      if (!hit) {
        if (cache.size >= STATEMENT_CACHE_SIZE) cache.delete(cache.keys().next().value!);
        cache.set(sql, stmt);
      }
      return stmt;
    },
  };
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

/** Options of {@link StateStore.open}. */
export interface StoreOpenOptions {
  /**
   * Other processes use the same database (PostgreSQL replicas): nothing may be settled from
   * one process's memory alone (no reconcile at start, no "pending keys are dead"). Default false.
   */
  shared?: boolean;
}

/** Collations under which text sorts by code point, as ids and cursors need. */
const BYTE_ORDER_COLLATIONS = /^(C|POSIX|C\.UTF-?8|C\.utf-?8|ucs_basic)$/;

/** The columns of a running sandbox that the lease pass reads ({@link StateStore.runningLeases}). */
export type LeaseRow = Pick<SandboxTable, 'id' | 'owner_id' | 'lease' | 'created_at' | 'expires_at' | 'last_active_at'>;

/** What reservations hold together. */
function sumOf(rs: readonly Reservation[]): Reservation {
  return rs.reduce((a, r) => ({ sandboxes: a.sandboxes + r.sandboxes, cpu: a.cpu + r.cpu, memoryMiB: a.memoryMiB + r.memoryMiB }), {
    sandboxes: 0,
    cpu: 0,
    memoryMiB: 0,
  });
}

/** A write of a sandbox's lease or owner sets its next lease check back to "at the next pass". */
function leaseCheckReset<T extends Partial<SandboxTable>>(set: T): T {
  return set.lease !== undefined || set.owner_id !== undefined ? { ...set, lease_check_ms: null } : set;
}

/** What the watcher reads of a sandbox ({@link StateStore.sandboxSummaries}). */
export type SandboxSummary = Pick<SandboxTable, 'id' | 'node' | 'state' | 'created_at' | 'expires_at' | 'lease'>;
const SUMMARY_COLUMNS = ['id', 'node', 'state', 'created_at', 'expires_at', 'lease'] as const;

/**
 * A row as its node's share counts it (`LifecycleService.shareOf`): without the spec, layers or
 * lease, whose JSON is most of a row; the two parts of the spec a share needs taken out of it by
 * the database. What a start and a node's session-open recount read of every row.
 */
export type SandboxShareRow = Pick<SandboxTable, 'id' | 'node' | 'state' | 'backend' | 'cpu' | 'memory_mib' | 'pool_id' | 'paused_at'> & {
  /** `spec.resources.cpuClass`; null when the spec has none. */
  cpu_class: string | null;
  /** `spec.labels` as JSON; null when the spec has none. */
  labels: string | null;
};

/** Sandbox ids read at most at once from a label's index by a filtered list. */
const LIST_CHUNK_MAX = 2000;
/**
 * Chunks of a label's index read per list before the rest of the page is asked of the sandboxes
 * (the index holds every tenant's ids for a label: a project with few matches on a common label
 * must not cost one query per 2,000 of other tenants' ids).
 */
const LIST_CHUNKS_PER_PAGE = 4;

/** Transitional states: a row in one is some process's work under way (tagged with its replica on shared stores). */
export const IN_FLIGHT_STATES = ['creating', 'pausing', 'resuming', 'stopping'];

/** How long the outcome of a transaction whose COMMIT went unanswered is waited for (ms). */
const COMMIT_VERIFY_MS = 10_000;

/** State of the control plane. */
export class StateStore {
  /** True when other processes (replicas) share this store's database. */
  readonly shared: boolean;
  /** On PostgreSQL, the tag in this replica's sessions' `application_name` (postgres.ts). */
  sessionTag: string | undefined;

  /** Sandbox rows written in groups (multi-row inserts). */
  readonly inserts: SandboxInserts;
  /** Quota reservations of concurrent creates, grouped per project (one transaction each group). */
  readonly reservations: WriteGroups<Reservation, undefined>;
  /** State moves of new sandboxes (`creating -> running`), grouped by their from/to states. */
  readonly transitions: WriteGroups<string, boolean>;
  /** Ancestry, layer scopes and pool spec keys kept in memory (catalog-cache.ts). */
  readonly catalog: CatalogCache;
  /** Rate-limit takes made at once (any buckets of one rate): one upsert for all of them. */
  readonly rateTakes: WriteGroups<{ key: string; perSecond: number; burst: number }, number>;
  /** The embedded SQLite store's group commits (undefined on PostgreSQL). */
  groupCommit: GroupCommitFigures | undefined;
  /** Sandbox rows kept in memory for routing (the embedded store only; sandbox-row-cache.ts). */
  sandboxRows: SandboxRowCache | undefined;

  private constructor(
    readonly db: Kysely<Database>,
    opts: StoreOpenOptions,
  ) {
    this.shared = opts.shared ?? false;
    this.inserts = new SandboxInserts(db, {
      bind: bindIdempotencyKey,
      afterRows: (tx, rows) => this.reservationsBecameRows(tx, rows),
      // PostgreSQL: a group is one statement, the replica's reservation row taken back in it.
      alsoInStatement: this.shared ? (rows) => this.reservationsBecameRowsSql(rows) : undefined,
    });
    this.reservations = new WriteGroups<Reservation, undefined>((projectId, rs) => this.reserveMany(projectId, rs));
    this.transitions = new WriteGroups((key, ids) => this.transitionMany(ids, ...(JSON.parse(key) as [string[], string])));
    this.catalog = new CatalogCache(this.shared);
    this.rateTakes = new WriteGroups((_rate, takes) => this.takeRateTokens(takes));
  }

  /**
   * Opens a store on any Kysely dialect and migrates it to the latest schema. On PostgreSQL,
   * Kysely's migrator holds an advisory lock for the migration, so replicas starting together
   * migrate once.
   */
  static async open(dialect: Dialect, opts: StoreOpenOptions = {}): Promise<StateStore> {
    const db = new Kysely<Database>({ dialect });
    // Migrations come from branches merged in any order (0002_lifecycle landed after 0003..0005
    // on some stores): each runs once, whichever order it was applied in.
    const migrator = new Migrator({ db, provider: migrationProvider, allowUnorderedMigrations: true });
    const { error } = await migrator.migrateToLatest();
    if (error) {
      await db.destroy();
      throw new DsecError('INTERNAL', `state store migration failed: ${(error as Error).message}`);
    }
    const store = new StateStore(db, opts);
    await store.ensureRoot();
    return store;
  }

  /**
   * Opens the PostgreSQL store at `url` (shared by every replica). The database must sort text by
   * code point (collation C): ids, pages and event cursors compare as text.
   */
  static async openPostgres(url: string, opts: PostgresOptions = {}): Promise<StateStore> {
    const { dialect, pool, tag } = postgresDialect(url, opts);
    let collation: string | undefined;
    try {
      const res = await pool.query<{ datcollate: string }>('SELECT datcollate FROM pg_database WHERE datname = current_database()');
      collation = res.rows[0]?.datcollate;
    } catch (err) {
      await pool.end().catch(() => undefined);
      throw new DsecError('UNAVAILABLE', `cannot reach the database ${redactUrl(url)}: ${(err as Error).message}`);
    }
    if (collation === undefined || !BYTE_ORDER_COLLATIONS.test(collation)) {
      await pool.end().catch(() => undefined);
      throw new DsecError(
        'INVALID_ARGUMENT',
        `db: the database's collation is ${collation ?? 'unknown'}; dsec needs C (createdb --template=template0 --locale=C, see docs/deploy.md)`,
        { field: 'db' },
      );
    }
    const store = await StateStore.open(dialect, { shared: true });
    store.sessionTag = tag;
    return store;
  }

  /** Opens the embedded SQLite store. */
  static async openSqlite(database: SqliteDatabase): Promise<StateStore> {
    database.pragma('journal_mode = WAL');
    // Every commit is on disk when it returns (WAL's default, NORMAL, may lose the last ones to a
    // power cut): a sandbox the node made must never be forgotten by the store (issue 13 §4).
    database.pragma('synchronous = FULL');
    database.pragma('foreign_keys = ON');
    database.pragma('busy_timeout = 5000');
    // Commits are grouped (sqlite-group-commit.ts): one fsync per group of concurrent writes,
    // each answered only once its group is on disk.
    const dialect = new GroupCommitSqliteDialect(withStatementCache(database));
    const store = await StateStore.open(dialect);
    store.groupCommit = dialect.driver.figures;
    const rows = new SandboxRowCache();
    dialect.driver.onWrite = (sql) => rows.written(sql);
    store.sandboxRows = rows;
    return store;
  }

  async close(): Promise<void> {
    await this.db.destroy();
  }

  /** Resolves when the database answers a query; rejects otherwise (health checks). */
  async ping(): Promise<void> {
    await sql`SELECT 1`.execute(this.db);
  }

  /**
   * Runs `fn` while no other process of the store runs a section of the same name (PostgreSQL:
   * a transaction-scoped advisory lock; SQLite has one process). `fn` writes through the store
   * as usual; the lock is released once it has returned.
   */
  async exclusive<T>(name: string, fn: () => Promise<T>): Promise<T> {
    if (!this.shared) return fn();
    return this.db.transaction().execute(async (tx) => {
      await sql`SELECT pg_advisory_xact_lock(hashtext(${`dsec:${name}`}))`.execute(tx);
      return fn();
    });
  }

  /** Sends a notification to every listening replica when the statement commits (PostgreSQL only). */
  async notify(channel: string, payload: string): Promise<void> {
    if (this.shared) await sql`SELECT pg_notify(${channel}, ${payload})`.execute(this.db);
  }

  private async ensureRoot(): Promise<void> {
    const root = await this.db.selectFrom('projects').select('id').where('id', '=', ROOT_PROJECT_ID).executeTakeFirst();
    if (root) return;
    // Replicas starting together may both get here: the second insert does nothing.
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
      .onConflict((oc) => oc.column('id').doNothing())
      .execute();
  }

  // ---- rate limits (shared stores) ----

  /**
   * Takes one token from the bucket `key` (refilled at `perSecond`, holding at most `burst`) on
   * the database's clock, so that replicas share the bucket. Takes made at once, of any buckets,
   * go in one statement ({@link takeRateTokens}). Returns 0 when a token was taken, else the ms
   * until one is there. PostgreSQL only.
   */
  async takeRateToken(key: string, perSecond: number, burst: number): Promise<number> {
    return this.rateTakes.submit(`${perSecond}/${burst}`, { key, perSecond, burst });
  }

  /**
   * Takes tokens from many buckets in one multi-row upsert: per bucket, as many of its takes as
   * there are whole tokens succeed, in order, the rest are refused (`denied` keeps how many).
   * Per take: 0 when it got a token, else the ms until one is there.
   */
  async takeRateTokens(takes: ReadonlyArray<{ key: string; perSecond: number; burst: number }>): Promise<number[]> {
    const { perSecond, burst } = takes[0]!;
    const counts = new Map<string, number>();
    for (const t of takes) counts.set(t.key, (counts.get(t.key) ?? 0) + 1);
    const nowMs = sql<number>`(extract(epoch from statement_timestamp()) * 1000)::float8`;
    const avail = sql<number>`least(${burst}::float8, b.tokens + greatest(0::float8, ${nowMs} - b.at_ms) * ${perSecond}::float8 / 1000.0)`;
    // The inserted row of a bucket taken n times holds tokens = burst - first and denied =
    // n - first (first = the takes a full bucket grants), so n = denied + burst - tokens.
    const n = sql<number>`round(excluded.denied + ${burst}::float8 - excluded.tokens)`;
    const granted = sql<number>`least(${n}, floor(${avail}))`;
    const rows = [...counts].map(([key, k]) => {
      const first = Math.min(k, Math.floor(burst));
      return sql`(${key}, ${burst - first}::float8, ${nowMs}, ${k - first}::int)`;
    });
    const res = await sql<{ key: string; tokens: number; denied: number }>`
      INSERT INTO rate_buckets AS b (key, tokens, at_ms, denied)
      VALUES ${sql.join(rows)}
      ON CONFLICT (key) DO UPDATE SET
        tokens = ${avail} - ${granted},
        at_ms = greatest(b.at_ms, ${nowMs}),
        denied = (${n} - ${granted})::int
      RETURNING key, tokens, denied`.execute(this.db);
    const left = new Map(res.rows.map((r) => [r.key, { denied: Number(r.denied), tokens: Number(r.tokens) }]));
    const seen = new Map<string, number>();
    return takes.map((t) => {
      const i = seen.get(t.key) ?? 0;
      seen.set(t.key, i + 1);
      const r = left.get(t.key);
      if (!r || i < counts.get(t.key)! - r.denied) return 0;
      return Math.max(1, Math.ceil(((1 - r.tokens) / perSecond) * 1000));
    });
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

  /** Ids of the project and its ancestors, nearest first (kept once read: parents never change). */
  async ancestry(projectId: string, db: Kysely<Database> | Transaction<Database> = this.db): Promise<string[]> {
    return this.catalog.ancestry(projectId, async () => {
      const all = new Map((await db.selectFrom('projects').select(['id', 'parent_id']).execute()).map((r) => [r.id, r.parent_id]));
      const chain: string[] = [];
      for (let id: string | null | undefined = projectId; id; id = all.get(id)) {
        if (chain.includes(id)) break;
        chain.push(id);
      }
      return { chain, known: all.has(projectId) };
    });
  }

  /**
   * Layers or pools changed: this process's cached scopes and pool sets are dropped, and on a
   * shared store every other replica is told to drop theirs.
   */
  private async catalogChanged(): Promise<void> {
    this.catalog.forget();
    await this.notify(CATALOG_CHANNEL, this.catalog.origin).catch(() => undefined);
  }

  /**
   * Adds a reservation to a project and every ancestor, atomically: each row is updated only
   * if its usage stays within its quota, and one refusal rolls the whole reservation back.
   */
  async reserve(projectId: string, r: Reservation): Promise<void> {
    // Grouped with the project's other reservations under way: one transaction for all, each
    // admitted or refused on its own terms (reserveMany).
    // A refusal (QUOTA_EXCEEDED) rejects this reservation alone.
    await this.reservations.submit(projectId, r);
  }

  /**
   * Reserves for many sandboxes of one project in one transaction, each on its own terms: an
   * entry is admitted only if it fits on the project and every ancestor after the entries
   * before it. Returns, per entry, undefined when admitted or the QUOTA_EXCEEDED refusal.
   */
  async reserveMany(projectId: string, rs: readonly Reservation[]): Promise<Array<DsecError | undefined>> {
    if (rs.length === 0) return [];
    return this.verifiedTransaction(async (tx) => {
      const chain = await this.ancestry(projectId, tx);
      // Everything at once first: when the sum fits on every project of the chain, one update
      // per project admits all (the common case, and one row lock taken once).
      const sum = sumOf(rs);
      let fitted = 0;
      while (fitted < chain.length && (await this.addUsage(tx, chain[fitted]!, sum, 1, true))) fitted++;
      if (fitted === chain.length) return { value: rs.map(() => undefined), xid: await this.holdReservation(tx, projectId, sum, 1) };
      for (const id of chain.slice(0, fitted)) await this.addUsage(tx, id, sum, -1, false);
      const out: Array<DsecError | undefined> = [];
      // Usage only grows within the transaction: a request no smaller than one refused is refused too.
      const refused: Array<{ r: Reservation; err: DsecError }> = [];
      for (const r of rs) {
        const known = refused.find((f) => r.sandboxes >= f.r.sandboxes && r.cpu >= f.r.cpu && r.memoryMiB >= f.r.memoryMiB);
        if (known) {
          out.push(known.err);
          continue;
        }
        let failedAt = -1;
        for (const [i, id] of chain.entries()) {
          if (!(await this.addUsage(tx, id, r, 1, true))) {
            failedAt = i;
            break;
          }
        }
        if (failedAt < 0) {
          out.push(undefined);
          continue;
        }
        for (const id of chain.slice(0, failedAt)) await this.addUsage(tx, id, r, -1, false);
        const row = await tx.selectFrom('projects').selectAll().where('id', '=', chain[failedAt]!).executeTakeFirst();
        const err = quotaError(row, r);
        refused.push({ r, err });
        out.push(err);
      }
      return { value: out, xid: await this.holdReservation(tx, projectId, sumOf(rs.filter((_, i) => !out[i])), 1) };
    });
  }

  /**
   * Runs `fn` in a transaction whose outcome is known even when the COMMIT's answer is not. On
   * PostgreSQL the answer can be lost after the server committed (the connection or the server
   * process died, the client gave up): the transaction's id is then asked of the server on
   * another connection, and a committed transaction answers as if the COMMIT had (a reservation
   * that counted is held by its caller, who gives it back, instead of being left counted with no
   * sandbox). An aborted one, or one whose fate cannot be read (the database unreachable), fails
   * as before; the next start-up reconcile recomputes usage from the rows. `fn` gives the id
   * from a statement it runs anyway (the replica's reservation row answers it: no round trip of
   * its own); only when it has none (it wrote no such row) is it read before the COMMIT. SQLite
   * is embedded: its commit answers or the process is gone.
   */
  private async verifiedTransaction<T>(fn: (tx: Transaction<Database>) => Promise<{ value: T; xid: string | undefined }>): Promise<T> {
    if (!this.shared) return (await this.db.transaction().execute(fn)).value;
    let xid: string | undefined;
    let done: { value: T } | undefined;
    try {
      return await this.db.transaction().execute(async (tx) => {
        const out = await fn(tx);
        xid = out.xid ?? (await sql<{ xid: string }>`SELECT txid_current()::text AS xid`.execute(tx)).rows[0]!.xid;
        done = { value: out.value };
        return out.value;
      });
    } catch (err) {
      // Failed before the COMMIT was sent: the transaction is rolled back, nothing to verify.
      if (!done || xid === undefined) throw err;
      if ((await this.transactionStatus(xid).catch(() => undefined)) === 'committed') return done.value;
      throw err;
    }
  }

  /**
   * What PostgreSQL says of a transaction (`committed`, `aborted`), waiting while it is still
   * `in progress` (a backend whose client vanished finishes its COMMIT or is rolled back).
   */
  private async transactionStatus(xid: string): Promise<string | undefined> {
    const until = Date.now() + COMMIT_VERIFY_MS;
    for (;;) {
      const status = (await sql<{ status: string | null }>`SELECT txid_status(${xid}::bigint) AS status`.execute(this.db)).rows[0]?.status ?? undefined;
      if (status !== 'in progress' || Date.now() > until) return status;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }

  /** Gives back a reservation that no row holds (a create that failed or was refused a node) to its project and ancestors. */
  async unreserve(projectId: string, r: Reservation): Promise<void> {
    if (!this.sessionTag) return this.release(this.db, projectId, r);
    await this.db.transaction().execute(async (tx) => {
      await this.release(tx, projectId, r);
      await this.holdReservation(tx, projectId, r, -1);
    });
  }

  /** Returns a reservation to a project and its ancestors. */
  private async release(db: Kysely<Database> | Transaction<Database>, projectId: string, r: Reservation): Promise<void> {
    for (const id of await this.ancestry(projectId, db)) await this.addUsage(db, id, r, -1, false);
  }

  /**
   * Adds (`sign` 1) or removes (-1) quota this replica holds for a project without a row
   * (`replica_reservations`, shared stores only): what it reserved, less what became rows or
   * went back. A replica that dies leaves it there for {@link releaseReplicaReservations}. A row
   * that holds no sandbox any more goes (what CPU a float sum left is no reservation). On
   * PostgreSQL one statement each way; an addition answers the transaction's id
   * ({@link verifiedTransaction}).
   */
  private async holdReservation(tx: Transaction<Database>, projectId: string, r: Reservation, sign: 1 | -1): Promise<string | undefined> {
    const replica = this.sessionTag;
    if (!replica || r.sandboxes === 0) return undefined;
    if (sign === -1 && this.shared) {
      const [gone, kept] = this.takeBackHeld(replica, [{ projectId, r }]);
      await sql`WITH ${gone} ${kept}`.execute(tx);
      return undefined;
    }
    const d = { sandboxes: sign * r.sandboxes, cpu: sign * r.cpu, memory_mib: sign * r.memoryMiB };
    const upsert = tx
      .insertInto('replica_reservations')
      .values({ replica, project_id: projectId, ...d })
      .onConflict((oc) =>
        oc.columns(['replica', 'project_id']).doUpdateSet((eb) => ({
          sandboxes: eb('replica_reservations.sandboxes', '+', d.sandboxes),
          cpu: eb('replica_reservations.cpu', '+', d.cpu),
          memory_mib: eb('replica_reservations.memory_mib', '+', d.memory_mib),
        })),
      );
    if (this.shared) return (await upsert.returning(sql<string>`txid_current()::text`.as('xid')).executeTakeFirstOrThrow()).xid;
    await upsert.execute();
    if (sign === -1)
      await tx.deleteFrom('replica_reservations').where('replica', '=', replica).where('project_id', '=', projectId).where('sandboxes', '<=', 0).execute();
    return undefined;
  }

  /**
   * PostgreSQL: the two parts of one statement that take `held` back from this replica's
   * reservation rows: `held_gone AS (...)` deletes each row that holds no more than it gives back,
   * then the UPDATE (`held_kept AS (...)` with `asCte`) takes it from the others. No row is
   * written twice in the statement: the update skips the projects whose row went. A row that
   * another transaction of this replica brings down to zero meanwhile may stay at zero; every
   * reader ignores rows that hold no sandbox.
   */
  private takeBackHeld(replica: string, held: ReadonlyArray<{ projectId: string; r: Reservation }>, asCte = false) {
    const h = sql`unnest(${held.map((x) => x.projectId)}::text[], ${held.map((x) => x.r.sandboxes)}::int[], ${held.map((x) => x.r.cpu)}::float8[], ${held.map((x) => x.r.memoryMiB)}::int[]) AS h(project_id, sandboxes, cpu, memory_mib)`;
    const gone = sql`held_gone AS (DELETE FROM replica_reservations r USING ${h}
      WHERE r.replica = ${replica} AND r.project_id = h.project_id AND r.sandboxes <= h.sandboxes RETURNING r.project_id)`;
    const update = sql`UPDATE replica_reservations r
      SET sandboxes = r.sandboxes - h.sandboxes, cpu = r.cpu - h.cpu, memory_mib = r.memory_mib - h.memory_mib
      FROM ${h} WHERE r.replica = ${replica} AND r.project_id = h.project_id AND h.project_id NOT IN (SELECT project_id FROM held_gone)`;
    return [gone, asCte ? sql`held_kept AS (${update})` : update] as const;
  }

  /** What the rows of this replica's creates (state `creating`) hold for each project, from its reservations. */
  private heldByRows(rows: readonly SandboxTable[]): Array<{ projectId: string; r: Reservation }> {
    const byProject = new Map<string, Reservation[]>();
    for (const row of rows) {
      if (row.state !== 'creating') continue;
      (byProject.get(row.project_id) ?? byProject.set(row.project_id, []).get(row.project_id)!).push({ sandboxes: 1, cpu: row.cpu, memoryMiB: row.memory_mib });
    }
    return [...byProject].map(([projectId, rs]) => ({ projectId, r: sumOf(rs) }));
  }

  /** Rows written by this replica: the reservations of its creates are held by them now, not by the replica. */
  private async reservationsBecameRows(tx: Transaction<Database>, rows: readonly SandboxTable[]): Promise<void> {
    if (!this.sessionTag) return;
    for (const { projectId, r } of this.heldByRows(rows)) await this.holdReservation(tx, projectId, r, -1);
  }

  /** {@link reservationsBecameRows} as parts of the insert's one statement (PostgreSQL). */
  private reservationsBecameRowsSql(rows: readonly SandboxTable[]): RawBuilder<unknown>[] {
    const held = this.heldByRows(rows);
    if (!this.sessionTag || held.length === 0) return [];
    return [...this.takeBackHeld(this.sessionTag, held, true)];
  }

  /**
   * Gives back, once, the quota that replica `replica` (gone) reserved and never turned into
   * rows: its `replica_reservations` are deleted and returned in one transaction (two replicas
   * settling the same gone one give it back once). Returns the projects and what each got back.
   */
  async releaseReplicaReservations(replica: string): Promise<Array<{ projectId: string; released: Reservation }>> {
    return this.db.transaction().execute(async (tx) => {
      const held = await tx.deleteFrom('replica_reservations').where('replica', '=', replica).returningAll().execute();
      const out: Array<{ projectId: string; released: Reservation }> = [];
      for (const h of held) {
        const released = { sandboxes: Number(h.sandboxes), cpu: Number(h.cpu), memoryMiB: Number(h.memory_mib) };
        if (released.sandboxes <= 0) continue;
        await this.release(tx, h.project_id, released);
        out.push({ projectId: h.project_id, released });
      }
      return out;
    });
  }

  /**
   * Replicas that have work on the store (rows in a transitional state they put there,
   * reservations without rows, or pending idempotency keys) and no session on the database now:
   * gone. On PostgreSQL every session of a replica carries its tag in `application_name`
   * (postgres.ts); a store of one process (SQLite) has no session of another, and holds tags only
   * where one was set (tests): every tag but this process's is a gone one's.
   */
  async replicasWithoutSessions(): Promise<string[]> {
    const tagged = await this.db
      .selectFrom('sandboxes')
      .select('replica')
      .distinct()
      .where('replica', 'is not', null)
      .where('state', 'in', IN_FLIGHT_STATES)
      .execute();
    const holding = await this.db.selectFrom('replica_reservations').select('replica').distinct().where('sandboxes', '>', 0).execute();
    const keys = await this.db
      .selectFrom('idempotency_keys')
      .select('replica')
      .distinct()
      .where('state', '=', 'pending')
      .where('replica', 'is not', null)
      .execute();
    const tags = new Set([...tagged.map((r) => r.replica!), ...holding.map((r) => r.replica), ...keys.map((r) => r.replica!)]);
    tags.delete(this.sessionTag ?? '');
    if (tags.size === 0 || !this.shared) return [...tags];
    const live = await sql<{ application_name: string }>`SELECT DISTINCT application_name FROM pg_stat_activity
      WHERE datname = current_database() AND application_name LIKE 'dsec-%'`.execute(this.db);
    const seen = new Set(live.rows.map((r) => r.application_name.split(' ')[1]));
    return [...tags].filter((t) => !seen.has(t));
  }

  /** The rows that replica `replica` left in a transitional state. */
  async inFlightRowsOf(replica: string): Promise<SandboxTable[]> {
    return this.db.selectFrom('sandboxes').selectAll().where('replica', '=', replica).where('state', 'in', IN_FLIGHT_STATES).execute();
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
    const row: ApiKeyTable = {
      id: newId('key'),
      project_id: k.projectId,
      name: k.name,
      role: k.role,
      key_hash: k.keyHash,
      created_at: now(),
      revoked_at: null,
    };
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

  /**
   * Inserts a sandbox row (and its labels). With `idempotencyKey`, the key (pending, held by
   * this create) records the sandbox's id in the same transaction: a crash before the key
   * completes leaves a key that the start-up reconcile settles against this row.
   */
  async insertSandbox(row: SandboxTable, labels: Record<string, string>, idempotencyKey?: string): Promise<void> {
    // Grouped with the other inserts under way: one transaction and multi-row INSERTs for all.
    await this.inserts.insert({ row: this.sessionTag && row.state === 'creating' ? { ...row, replica: this.sessionTag } : row, labels, idempotencyKey });
  }

  /**
   * The `replica` column a move to `state` writes: this replica's tag for a transitional state
   * (shared stores), none out of one (the row leaves the partial index `sandboxes_replica`).
   */
  private replicaOf(state: string): { replica?: string | null } {
    if (!IN_FLIGHT_STATES.includes(state)) return { replica: null };
    return this.sessionTag ? { replica: this.sessionTag } : {};
  }

  /**
   * Moves a sandbox to `to` only if it is in one of `from` (setting `also` with it) and, with
   * `tagged` given, only while its `replica` column is `tagged` (null: untagged); true when it moved.
   */
  async transitionSandbox(
    id: string,
    from: string[],
    to: string,
    also: Partial<Omit<SandboxTable, 'id' | 'state'>> = {},
    tagged?: string | null,
  ): Promise<boolean> {
    let q = this.db
      .updateTable('sandboxes')
      .set({ ...leaseCheckReset(also), state: to, ...this.replicaOf(to) })
      .where('id', '=', id)
      .where('state', 'in', from);
    if (tagged !== undefined) q = q.where((eb) => (tagged === null ? eb('replica', 'is', null) : eb('replica', '=', tagged)));
    const res = await q.executeTakeFirst();
    return Number(res.numUpdatedRows) === 1;
  }

  /**
   * Moves a new sandbox from one of `from` to `to`, grouped with the other such moves under way
   * (one UPDATE for the group); true when it moved. The create path's `creating -> running`.
   */
  async transitionSandboxGrouped(id: string, from: string[], to: string): Promise<boolean> {
    return this.transitions.submit(JSON.stringify([from, to]), id);
  }

  /** Moves sandboxes from one of `from` to `to`; per id, true when it moved. */
  private async transitionMany(ids: readonly string[], from: string[], to: string): Promise<boolean[]> {
    const rows = await perChunk(ids, (some) =>
      this.db
        .updateTable('sandboxes')
        .set({ state: to, ...this.replicaOf(to) })
        // PostgreSQL: the ids as one array parameter, not up to 500 of them (each a parameter to
        // encode, send and plan anew with every statement).
        .where((eb) => (this.shared ? eb('id', '=', sql<string>`any(${some}::text[])`) : eb('id', 'in', some)))
        .where('state', 'in', from)
        .returning('id')
        .execute(),
    );
    const moved = new Set(rows.map((r) => r.id));
    return ids.map((id) => moved.has(id));
  }

  /** Changes lifecycle fields of a sandbox (lease, owner, expiry). */
  async updateSandbox(id: string, set: Partial<Pick<SandboxTable, 'lease' | 'owner_id' | 'expires_at'>>): Promise<void> {
    if (Object.keys(set).length) await this.db.updateTable('sandboxes').set(leaseCheckReset(set)).where('id', '=', id).execute();
  }

  /** Records API activity of sandboxes (many at once: the activity tracker's flush). */
  async touchSandboxes(ids: string[], at: string): Promise<void> {
    await perChunk(ids, async (some) => {
      await this.db.updateTable('sandboxes').set({ last_active_at: at }).where('id', 'in', some).execute();
      return [];
    });
  }

  /**
   * What the lease pass judges a running sandbox by, and nothing more (not the spec or the
   * layers), for the running sandboxes it must look at `now`: those whose idle check is due or
   * unknown (`lease_check_ms`, through its index) and those with an owner (whose deadline moves
   * with the owner's heartbeats). The pass reads the full row only of the few that are due.
   */
  async runningLeases(now: number): Promise<LeaseRow[]> {
    return this.db
      .selectFrom('sandboxes')
      .select(['id', 'owner_id', 'lease', 'created_at', 'expires_at', 'last_active_at'])
      .where('state', '=', 'running')
      .where((eb) => eb.or([eb('lease_check_ms', 'is', null), eb('lease_check_ms', '<=', now), eb('owner_id', 'is not', null)]))
      .execute();
  }

  /**
   * Records when the lease pass must next look at running sandboxes it judged not due: per
   * group, the ids, the lease they were judged by and the time. A row whose lease changed since
   * it was read keeps its column (NULL: looked at next pass), so a shorter timeout is not missed.
   */
  async deferLeaseChecks(groups: ReadonlyArray<{ at: number; lease: string | null; ids: readonly string[] }>): Promise<void> {
    for (const g of groups) {
      await perChunk(g.ids, async (some) => {
        await this.db
          .updateTable('sandboxes')
          .set({ lease_check_ms: g.at })
          .where('id', 'in', some)
          .where('state', '=', 'running')
          .where((eb) => (g.lease === null ? eb('lease', 'is', null) : eb('lease', '=', g.lease)))
          .execute();
        return [];
      });
    }
  }

  /** Sandboxes in one of the given states. */
  async sandboxesInStates(states: string[]): Promise<SandboxTable[]> {
    return this.db.selectFrom('sandboxes').selectAll().where('state', 'in', states).execute();
  }

  /** The state of each of these sandboxes that has a row, by id. */
  async sandboxStates(ids: readonly string[]): Promise<Map<string, string>> {
    const rows = await perChunk(ids, (some) => this.db.selectFrom('sandboxes').select(['id', 'state']).where('id', 'in', some).execute());
    return new Map(rows.map((r) => [r.id, r.state]));
  }

  /** Sandboxes of an owner. */
  async sandboxesOfOwner(ownerId: string): Promise<SandboxTable[]> {
    return this.db.selectFrom('sandboxes').selectAll().where('owner_id', '=', ownerId).execute();
  }

  // ---- owners ----

  async insertOwner(row: OwnerTable): Promise<void> {
    await this.db.insertInto('owners').values(row).execute();
  }

  async owner(id: string): Promise<OwnerTable | undefined> {
    return this.db.selectFrom('owners').selectAll().where('id', '=', id).executeTakeFirst();
  }

  async ownersByIds(ids: string[]): Promise<OwnerTable[]> {
    return perChunk(ids, (some) => this.db.selectFrom('owners').selectAll().where('id', 'in', some).execute());
  }

  /** Active owners whose last heartbeat is older than their grace. */
  async expiredOwners(now: number): Promise<OwnerTable[]> {
    const active = await this.db.selectFrom('owners').selectAll().where('state', '=', 'active').execute();
    return active.filter((o) => Date.parse(o.heartbeat_at) + o.grace_ms < now);
  }

  /** Records a heartbeat (an owner that was lost is active again); undefined for a closed or unknown owner. */
  async heartbeatOwner(id: string, at: string): Promise<OwnerTable | undefined> {
    const res = await this.db
      .updateTable('owners')
      .set({ heartbeat_at: at, state: 'active' })
      .where('id', '=', id)
      .where('state', '!=', 'closed')
      .executeTakeFirst();
    return Number(res.numUpdatedRows) === 1 ? this.owner(id) : undefined;
  }

  /** Moves an owner from one of `from` to `to`; true when it moved. */
  async transitionOwner(id: string, from: string[], to: string, closedAt?: string): Promise<boolean> {
    const res = await this.db
      .updateTable('owners')
      .set({ state: to, ...(closedAt ? { closed_at: closedAt } : {}) })
      .where('id', '=', id)
      .where('state', 'in', from)
      .executeTakeFirst();
    return Number(res.numUpdatedRows) === 1;
  }

  /** Active owner sessions of a project. */
  /** Active owner sessions in any of `projectIds` (a tenant's; issue 13 §3 limits). */
  async activeOwnerCountIn(projectIds: string[]): Promise<number> {
    if (projectIds.length === 0) return 0;
    const row = await this.db
      .selectFrom('owners')
      .select((eb) => eb.fn.countAll<number>().as('n'))
      .where('project_id', 'in', projectIds)
      .where('state', '=', 'active')
      .executeTakeFirst();
    return Number(row?.n ?? 0);
  }

  async activeOwnerCount(projectId: string): Promise<number> {
    const row = await this.db
      .selectFrom('owners')
      .select((eb) => eb.fn.countAll<number>().as('n'))
      .where('project_id', '=', projectId)
      .where('state', '=', 'active')
      .executeTakeFirst();
    return Number(row?.n ?? 0);
  }

  /** Deletes lost or closed owners last heard of before `before` that own no sandbox; returns how many. */
  async deleteStaleOwners(before: string): Promise<number> {
    const res = await this.db
      .deleteFrom('owners')
      .where('state', 'in', ['lost', 'closed'])
      .where('heartbeat_at', '<', before)
      .where((eb) => eb.not(eb.exists(eb.selectFrom('sandboxes').select('sandboxes.id').whereRef('sandboxes.owner_id', '=', 'owners.id'))))
      .executeTakeFirst();
    return Number(res.numDeletedRows);
  }

  /** Sandboxes an owner holds now. */
  async ownedCount(ownerId: string): Promise<number> {
    const row = await this.db
      .selectFrom('sandboxes')
      .select((eb) => eb.fn.countAll<number>().as('n'))
      .where('owner_id', '=', ownerId)
      .executeTakeFirst();
    return Number(row?.n ?? 0);
  }

  /** Replaces a sandbox's stored create request (its network policy changed). */
  async setSandboxSpec(id: string, spec: string): Promise<void> {
    await this.db.updateTable('sandboxes').set({ spec }).where('id', '=', id).execute();
  }

  async setSandboxState(id: string, state: string): Promise<void> {
    await this.db
      .updateTable('sandboxes')
      .set({ state, ...this.replicaOf(state) })
      .where('id', '=', id)
      .execute();
  }

  /**
   * Sets every project's usage to what its sandbox rows (its own and its sub-projects') hold, in
   * one transaction: a reservation whose row a crash never wrote, or a row deleted before its
   * reservation went back, no longer counts. Returns the projects that changed, before and after.
   */
  async recomputeUsage(): Promise<Array<{ projectId: string; before: Reservation; after: Reservation }>> {
    return this.db.transaction().execute(async (tx) => {
      const projects = await tx.selectFrom('projects').selectAll().execute();
      const parentOf = new Map(projects.map((p) => [p.id, p.parent_id]));
      const held = new Map<string, Reservation>(projects.map((p) => [p.id, { sandboxes: 0, cpu: 0, memoryMiB: 0 }]));
      for (const s of await tx.selectFrom('sandboxes').select(['project_id', 'cpu', 'memory_mib']).execute()) {
        const seen = new Set<string>();
        for (let id: string | null | undefined = s.project_id; id && !seen.has(id); id = parentOf.get(id)) {
          seen.add(id);
          const r = held.get(id);
          if (!r) continue;
          r.sandboxes += 1;
          r.cpu += s.cpu;
          r.memoryMiB += s.memory_mib;
        }
      }
      const changed: Array<{ projectId: string; before: Reservation; after: Reservation }> = [];
      for (const p of projects) {
        const after = held.get(p.id)!;
        const before = { sandboxes: p.used_sandboxes, cpu: p.used_cpu, memoryMiB: p.used_memory_mib };
        if (before.sandboxes === after.sandboxes && before.cpu === after.cpu && before.memoryMiB === after.memoryMiB) continue;
        await tx
          .updateTable('projects')
          .set({ used_sandboxes: after.sandboxes, used_cpu: after.cpu, used_memory_mib: after.memoryMiB })
          .where('id', '=', p.id)
          .execute();
        changed.push({ projectId: p.id, before, after });
      }
      // Usage is what the rows hold: no replica holds a reservation without a row any more.
      await tx.deleteFrom('replica_reservations').execute();
      return changed;
    });
  }

  /**
   * Deletes a sandbox's row and returns its reservation to the quota, in one transaction. True
   * when this call deleted the row (a row already gone returns nothing to the quota). With
   * `asRead`, only a row still in `row`'s state and tagged with `row`'s replica is deleted (a
   * row another replica moved since it was read is left alone).
   */
  async deleteSandbox(row: SandboxTable, asRead = false): Promise<boolean> {
    return this.db.transaction().execute(async (tx) => {
      let q = tx.deleteFrom('sandboxes').where('id', '=', row.id);
      if (asRead) {
        const tag = row.replica ?? null;
        q = q.where('state', '=', row.state).where((eb) => (tag === null ? eb('replica', 'is', null) : eb('replica', '=', tag)));
      }
      const res = await q.executeTakeFirst();
      if (Number(res.numDeletedRows) !== 1) return false;
      await this.release(tx, row.project_id, { sandboxes: 1, cpu: row.cpu, memoryMiB: row.memory_mib });
      return true;
    });
  }

  /**
   * Deletes the row of a create that failed (on its node or in a store write), keeping its
   * reservation: the create gives that back itself ({@link unreserve}), as one that never wrote a row.
   * False when there was no row (its insert failed, or another replica settled it and gave the
   * reservation back with it).
   */
  async deleteFailedCreateRow(row: Pick<SandboxTable, 'id' | 'project_id' | 'cpu' | 'memory_mib'>): Promise<boolean> {
    return this.db.transaction().execute(async (tx) => {
      // By id, whatever its state: its move to running may have committed with its answer lost.
      const res = await tx.deleteFrom('sandboxes').where('id', '=', row.id).executeTakeFirst();
      if (Number(res.numDeletedRows) !== 1) return false;
      await this.holdReservation(tx, row.project_id, { sandboxes: 1, cpu: row.cpu, memoryMiB: row.memory_mib }, 1);
      return true;
    });
  }

  /** A sandbox row without its labels. */
  async sandboxOnly(id: string): Promise<SandboxTable | undefined> {
    // Compiled once (in the dialect's own placeholders), then run with the id: building and
    // compiling the query each time was most of Kysely's share of an exec (issue 15).
    const compiled = (this.sandboxOnlyQuery ??= this.db.selectFrom('sandboxes').selectAll().where('id', '=', '').compile());
    return (await this.db.executeQuery<SandboxTable>({ ...compiled, parameters: [id] })).rows[0];
  }

  /**
   * A sandbox row without its labels, from memory when the store keeps rows (the embedded store:
   * dropped on every write that may touch a sandbox row), else as {@link sandboxOnly}. For the
   * per-request routing read of execs and file calls (issue 15).
   */
  async sandboxRouted(id: string): Promise<SandboxTable | undefined> {
    return this.sandboxRows ? this.sandboxRows.get(id, () => this.sandboxOnly(id)) : this.sandboxOnly(id);
  }

  /** The query of {@link sandboxOnly}, compiled at its first use. */
  private sandboxOnlyQuery: CompiledQuery<SandboxTable> | undefined;

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
  async listSandboxes(q: {
    projectIds: string[];
    labels: Array<[string, string]>;
    state?: string;
    limit: number;
    after?: string;
  }): Promise<Array<SandboxTable & { labels: Record<string, string> }>> {
    if (q.projectIds.length === 0) return [];
    const [first, ...others] = q.labels;
    // Every condition but the first label's, on sandboxes (all of them without `ids`), after `after`.
    const filtered = (ids?: readonly string[], after = q.after): SelectQueryBuilder<Database, 'sandboxes', SandboxTable> => {
      let query = (ids ? this.sandboxesByIds(ids) : this.db.selectFrom('sandboxes').selectAll()).where('project_id', 'in', q.projectIds);
      for (const [key, value] of ids ? others : q.labels) {
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
      if (after) query = query.where('id', '>', after);
      // A deleted sandbox whose teardown runs behind the DELETE's answer is gone for the API.
      query = query.where('state', '!=', 'stopping');
      // A pool's sandboxes are nobody's until claimed: their ids are revealed only then.
      return query.where('pool_id', 'is', null);
    };
    let rows: SandboxTable[];
    if (!first) rows = await filtered().orderBy('id').limit(q.limit).execute();
    else {
      // By a label: its sandbox ids come in id order (the page's order) from the index
      // (key, value, sandbox_id), a chunk at a time, and only those rows are read and filtered,
      // until the page is full. A planner left to join the two walks every sandbox of the
      // projects in id order instead (seen on PostgreSQL: a merge join over the project index).
      rows = [];
      let after = q.after;
      let chunk = Math.min(Math.max(q.limit, 100), LIST_CHUNK_MAX);
      for (let read = 0; ; read++) {
        if (read === LIST_CHUNKS_PER_PAGE) {
          // The rest of the page from the sandboxes themselves, every label checked there.
          rows.push(
            ...(await filtered(undefined, after)
              .orderBy('id')
              .limit(q.limit - rows.length)
              .execute()),
          );
          break;
        }
        let idq = this.db.selectFrom('sandbox_labels').select('sandbox_id').where('key', '=', first[0]).where('value', '=', first[1]);
        if (after) idq = idq.where('sandbox_id', '>', after);
        const ids = (await idq.orderBy('sandbox_id').limit(chunk).execute()).map((r) => r.sandbox_id);
        if (ids.length === 0) break;
        rows.push(
          ...(await filtered(ids)
            .orderBy('id')
            .limit(q.limit - rows.length)
            .execute()),
        );
        if (rows.length >= q.limit || ids.length < chunk) break;
        after = ids[ids.length - 1];
        chunk = Math.min(chunk * 2, LIST_CHUNK_MAX);
      }
    }
    const labelRows = rows.length ? await this.labelsByIds(rows.map((r) => r.id)) : [];
    const byId = new Map<string, Record<string, string>>();
    for (const l of labelRows) (byId.get(l.sandbox_id) ?? byId.set(l.sandbox_id, {}).get(l.sandbox_id)!)[l.key] = l.value;
    return rows.map((r) => ({ ...r, labels: byId.get(r.id) ?? {} }));
  }

  /**
   * The sandbox rows of `ids`, each looked up by its primary key. On PostgreSQL an `id IN (...)`
   * of a page's ids is a bitmap of the project's index or a scan of the whole table (at a few
   * thousand rows the planner costs 101 probes as much as reading every page), so the ids come
   * from an array, each joined to its row by a lateral lookup (`OFFSET 0` keeps it one: the
   * planner may not turn it into a join of its choosing): O(page) whatever the table's size.
   */
  private sandboxesByIds(ids: readonly string[]): SelectQueryBuilder<Database, 'sandboxes', SandboxTable> {
    if (!this.shared) return this.db.selectFrom('sandboxes').selectAll().where('id', 'in', ids);
    return this.db
      .selectFrom(sql<{ page: string }>`unnest(${ids}::text[])`.as('page'))
      .innerJoinLateral(
        (eb) => eb.selectFrom('sandboxes').selectAll().whereRef('sandboxes.id', '=', sql.ref<string>('page.page')).offset(0).as('sandboxes'),
        (join) => join.onTrue(),
      )
      .selectAll('sandboxes');
  }

  /** The labels of the sandboxes `ids`, looked up by key as {@link sandboxesByIds} looks up rows. */
  private async labelsByIds(ids: readonly string[]): Promise<SandboxLabelTable[]> {
    if (!this.shared) return this.db.selectFrom('sandbox_labels').selectAll().where('sandbox_id', 'in', ids).execute();
    return this.db
      .selectFrom(sql<{ page: string }>`unnest(${ids}::text[])`.as('page'))
      .innerJoinLateral(
        (eb) => eb.selectFrom('sandbox_labels').selectAll().whereRef('sandbox_labels.sandbox_id', '=', sql.ref<string>('page.page')).offset(0).as('labels'),
        (join) => join.onTrue(),
      )
      .selectAll('labels')
      .execute();
  }

  /** Every sandbox row. */
  async allSandboxes(): Promise<SandboxTable[]> {
    return this.db.selectFrom('sandboxes').selectAll().execute();
  }

  /** Every sandbox row placed on one of these nodes (through the index by node). */
  async sandboxesOnNodes(nodes: readonly string[]): Promise<SandboxTable[]> {
    return perChunk(nodes, (some) => this.db.selectFrom('sandboxes').selectAll().where('node', 'in', some).execute());
  }

  /**
   * What a node's share needs of every row ({@link SandboxShareRow}), of one node or all. At a
   * cell's scale (hundreds of thousands of rows) a full read of every row costs the replica a copy
   * of every spec in memory at once; this is about a tenth of it.
   */
  async sandboxShares(node?: string): Promise<SandboxShareRow[]> {
    const cpuClass = this.shared ? sql<string | null>`(spec::json)->'resources'->>'cpuClass'` : sql<string | null>`json_extract(spec, '$.resources.cpuClass')`;
    const labels = this.shared ? sql<string | null>`((spec::json)->'labels')::text` : sql<string | null>`json_extract(spec, '$.labels')`;
    const columns = ['id', 'node', 'state', 'backend', 'cpu', 'memory_mib', 'pool_id', 'paused_at'] as const;
    let q = this.db.selectFrom('sandboxes').select([...columns, cpuClass.as('cpu_class'), labels.as('labels')]);
    if (node !== undefined) q = q.where('node', '=', node);
    try {
      return await q.execute();
    } catch (err) {
      // A spec PostgreSQL will not read as JSON (an escaped NUL or unpaired surrogate, written
      // before the API refused them: JavaScript's JSON keeps both): the specs are read and parsed
      // here instead, slower but whole. SQLite's json_extract reads them.
      const code = (err as { code?: unknown }).code;
      if (!this.shared || typeof code !== 'string' || !code.startsWith('22')) throw err;
      let full = this.db.selectFrom('sandboxes').select([...columns, 'spec']);
      if (node !== undefined) full = full.where('node', '=', node);
      return (await full.execute()).map(({ spec, ...row }) => {
        const parsed = JSON.parse(spec) as SandboxSpec;
        return { ...row, cpu_class: parsed.resources?.cpuClass ?? null, labels: parsed.labels ? JSON.stringify(parsed.labels) : null };
      });
    }
  }

  /** How many rows of node `name` are in each state (through the index by node). */
  async sandboxStatesOn(name: string): Promise<Record<string, number>> {
    const rows = await this.db
      .selectFrom('sandboxes')
      .select(['state', (eb) => eb.fn.countAll<number | string>().as('n')])
      .where('node', '=', name)
      .groupBy('state')
      .execute();
    return Object.fromEntries(rows.map((r) => [r.state, Number(r.n)]));
  }

  /**
   * The id, node, state, expiry and lease of the sandboxes on these nodes (through the index by
   * node): what the watcher compares with those nodes in a pass.
   */
  async sandboxSummaries(nodes: readonly string[]): Promise<SandboxSummary[]> {
    return perChunk(nodes, (some) => this.db.selectFrom('sandboxes').select(SUMMARY_COLUMNS).where('node', 'in', some).execute());
  }

  /** The same of the sandboxes whose lifetime ended by `at` (through the index by expiry): the watcher's expiry pass. */
  async expiredSandboxes(at: string): Promise<SandboxSummary[]> {
    return this.db.selectFrom('sandboxes').select(SUMMARY_COLUMNS).where('expires_at', '<=', at).execute();
  }

  // ---- warm pools ----

  /** Creates a pool, or updates one of the same name; a changed spec gives it a new id (old members go). */
  async putPool(p: {
    projectId: string;
    name: string;
    spec: string;
    resolved: string;
    specKey: string;
    size: number;
    idleTimeoutMs: number;
    maxPools: number;
  }): Promise<{ row: PoolTable; created: boolean }> {
    const out = await this.db.transaction().execute(async (tx) => {
      const t = now();
      const old = await tx.selectFrom('pools').selectAll().where('project_id', '=', p.projectId).where('name', '=', p.name).executeTakeFirst();
      if (old && old.spec_key === p.specKey) {
        const row: PoolTable = { ...old, spec: p.spec, resolved: p.resolved, size: p.size, idle_timeout_ms: p.idleTimeoutMs, last_used_at: t, updated_at: t };
        await tx
          .updateTable('pools')
          .set({ spec: row.spec, resolved: row.resolved, size: row.size, idle_timeout_ms: row.idle_timeout_ms, last_used_at: t, updated_at: t })
          .where('id', '=', old.id)
          .execute();
        return { row, created: false as boolean };
      }
      if (old) await tx.deleteFrom('pools').where('id', '=', old.id).execute();
      else {
        const { n } = await tx
          .selectFrom('pools')
          .select((eb) => eb.fn.countAll<number>().as('n'))
          .where('project_id', '=', p.projectId)
          .executeTakeFirstOrThrow();
        if (Number(n) >= p.maxPools) throw new DsecError('INVALID_ARGUMENT', `name: the project already has ${p.maxPools} pools`, { field: 'name' });
      }
      const row: PoolTable = {
        id: newId('pool'),
        project_id: p.projectId,
        name: p.name,
        spec: p.spec,
        resolved: p.resolved,
        spec_key: p.specKey,
        size: p.size,
        idle_timeout_ms: p.idleTimeoutMs,
        last_used_at: t,
        created_at: old?.created_at ?? t,
        updated_at: t,
      };
      await tx.insertInto('pools').values(row).execute();
      return { row, created: !old };
    });
    await this.catalogChanged();
    return out;
  }

  async pool(projectId: string, name: string): Promise<PoolTable | undefined> {
    return this.db.selectFrom('pools').selectAll().where('project_id', '=', projectId).where('name', '=', name).executeTakeFirst();
  }

  /** Pools of the given projects (every pool without a filter). */
  async pools(projectIds?: string[]): Promise<PoolTable[]> {
    let q = this.db.selectFrom('pools').selectAll();
    if (projectIds) {
      if (projectIds.length === 0) return [];
      q = q.where('project_id', 'in', projectIds);
    }
    return q.orderBy('project_id').orderBy('name').execute();
  }

  async deletePool(id: string): Promise<void> {
    await this.db.deleteFrom('pools').where('id', '=', id).execute();
    await this.catalogChanged();
  }

  /** The spec keys of a project's pools (cached: catalog-cache.ts). */
  async poolSpecKeys(projectId: string): Promise<ReadonlySet<string>> {
    return this.catalog.poolKeys(projectId, async () => {
      const rows = await this.db.selectFrom('pools').select('spec_key').where('project_id', '=', projectId).execute();
      return new Set(rows.map((r) => r.spec_key));
    });
  }

  /** Members of every pool (or of one) by state: pool id -> state -> count. */
  async poolMemberCounts(poolId?: string): Promise<Map<string, Record<string, number>>> {
    let q = this.db.selectFrom('sandboxes').select(['pool_id', 'state', (eb) => eb.fn.countAll<number>().as('n')]);
    q = poolId === undefined ? q.where('pool_id', 'is not', null) : q.where('pool_id', '=', poolId);
    const rows = await q.groupBy(['pool_id', 'state']).execute();
    const out = new Map<string, Record<string, number>>();
    for (const r of rows) {
      const m = out.get(r.pool_id!) ?? out.set(r.pool_id!, {}).get(r.pool_id!)!;
      m[r.state] = Number(r.n);
    }
    return out;
  }

  /** Ready members of a pool, oldest first. */
  async pooledMembers(poolId: string, limit: number): Promise<SandboxTable[]> {
    return this.db.selectFrom('sandboxes').selectAll().where('pool_id', '=', poolId).where('state', '=', 'pooled').orderBy('created_at').limit(limit).execute();
  }

  /**
   * Claims a ready member (the oldest) of a project's pools whose spec hashes to `specKey`, in one
   * transaction: the row leaves its pool and becomes the claimer's (`creating` until its node has
   * handed it over: a claim cut short is a create cut short, tagged with this replica; its spec,
   * labels, lease, owner and lifetime). Undefined when none is ready; a miss counts as use of the matching pools (an
   * idle pool wakes up and refills).
   */
  async claimPooled(c: {
    projectId: string;
    specKey: string;
    spec: string;
    labels: Record<string, string>;
    createdAt: string;
    expiresAt: string;
    lease: string;
    ownerId: string | null;
    /** A pending idempotency key of the claim: it records the claimed id in the claim's transaction. */
    idempotencyKey?: string | undefined;
  }): Promise<SandboxTable | undefined> {
    // Most creates match no pool: the project's pool spec keys come from memory, no read.
    if (!(await this.poolSpecKeys(c.projectId)).has(c.specKey)) return undefined;
    return this.db.transaction().execute(async (tx) => {
      for (;;) {
        const cand = await tx
          .selectFrom('sandboxes')
          .innerJoin('pools', 'pools.id', 'sandboxes.pool_id')
          .select(['sandboxes.id', 'sandboxes.pool_id'])
          .where('pools.project_id', '=', c.projectId)
          .where('pools.spec_key', '=', c.specKey)
          .where('sandboxes.state', '=', 'pooled')
          // No ORDER BY: the index (pool_id, state, created_at) yields a pool's oldest member
          // first, and a sort would make a claim cost O(pool size).
          .limit(1)
          .executeTakeFirst();
        if (!cand) {
          await tx.updateTable('pools').set({ last_used_at: c.createdAt }).where('project_id', '=', c.projectId).where('spec_key', '=', c.specKey).execute();
          return undefined;
        }
        const row = await tx
          .updateTable('sandboxes')
          .set({
            state: 'creating',
            ...this.replicaOf('creating'),
            pool_id: null,
            spec: c.spec,
            created_at: c.createdAt,
            expires_at: c.expiresAt,
            lease: c.lease,
            owner_id: c.ownerId,
            last_active_at: c.createdAt,
            lease_check_ms: null,
          })
          .where('id', '=', cand.id)
          .where('state', '=', 'pooled')
          .returningAll()
          .executeTakeFirst();
        // Another server may have claimed it between the two statements (PostgreSQL): take the next.
        if (!row) continue;
        const entries = Object.entries(c.labels);
        if (entries.length > 0)
          await tx
            .insertInto('sandbox_labels')
            .values(entries.map(([key, value]) => ({ sandbox_id: row.id, key, value })))
            .execute();
        if (c.idempotencyKey !== undefined) await bindIdempotencyKey(tx, c.projectId, c.idempotencyKey, row.id);
        // Idle detection needs the time of use only roughly: skip the write within a second.
        const recent = new Date(Date.parse(c.createdAt) - 1000).toISOString();
        await tx.updateTable('pools').set({ last_used_at: c.createdAt }).where('id', '=', cand.pool_id!).where('last_used_at', '<', recent).execute();
        return row;
      }
    });
  }

  // ---- idempotency keys ----

  /**
   * Takes an idempotency key for a request: `owned` when this caller is the first (the key is
   * now `pending`), else the row of the request that holds it. Expired keys count as absent.
   */
  async acquireIdempotencyKey(k: {
    projectId: string;
    key: string;
    requestHash: string;
    ttlMs: number;
  }): Promise<{ owned: true } | { owned: false; row: IdempotencyKeyTable }> {
    return this.db.transaction().execute(async (tx) => {
      const t = new Date();
      await tx
        .deleteFrom('idempotency_keys')
        .where('project_id', '=', k.projectId)
        .where('key', '=', k.key)
        .where('expires_at', '<=', t.toISOString())
        .execute();
      const res = await tx
        .insertInto('idempotency_keys')
        .values({
          project_id: k.projectId,
          key: k.key,
          request_hash: k.requestHash,
          state: 'pending',
          sandbox_id: null,
          response: null,
          created_at: t.toISOString(),
          expires_at: new Date(t.getTime() + k.ttlMs).toISOString(),
          // Whose request holds it: settled with that replica's work if it dies (reconcile.ts).
          ...(this.sessionTag ? { replica: this.sessionTag } : {}),
        })
        .onConflict((oc) => oc.columns(['project_id', 'key']).doNothing())
        .executeTakeFirst();
      if (Number(res.numInsertedOrUpdatedRows ?? 0) === 1) return { owned: true as const };
      const row = await tx.selectFrom('idempotency_keys').selectAll().where('project_id', '=', k.projectId).where('key', '=', k.key).executeTakeFirstOrThrow();
      return { owned: false as const, row };
    });
  }

  /** Records what a pending key created. */
  async completeIdempotencyKey(projectId: string, key: string, sandboxId: string | null, response: string | null): Promise<void> {
    await this.db
      .updateTable('idempotency_keys')
      .set({ state: 'done', sandbox_id: sandboxId, response })
      .where('project_id', '=', projectId)
      .where('key', '=', key)
      .execute();
  }

  /** Lets go of a pending key whose request failed, so that a retry may try again. */
  async releaseIdempotencyKey(projectId: string, key: string): Promise<void> {
    await this.db.deleteFrom('idempotency_keys').where('project_id', '=', projectId).where('key', '=', key).where('state', '=', 'pending').execute();
  }

  /**
   * Settles pending keys created before `before` (their request died with its server): a key
   * that recorded a sandbox still standing in its project (not a pool's, not half made or half
   * deleted) is done with that sandbox, so that a retry gets it instead of a second one; every
   * other such key is dropped (a retry creates anew). With `replica`, only the keys that replica
   * (gone) holds. Returns the keys settled and the number dropped.
   */
  async settlePendingIdempotencyKeys(before: string, replica?: string): Promise<{ settled: IdempotencyKeyTable[]; dropped: number }> {
    return this.db.transaction().execute(async (tx) => {
      const settled = await tx
        .updateTable('idempotency_keys')
        .set({ state: 'done' })
        .where('state', '=', 'pending')
        .where('created_at', '<', before)
        .$if(replica !== undefined, (q) => q.where('replica', '=', replica!))
        .where((eb) =>
          eb.exists(
            eb
              .selectFrom('sandboxes')
              .select('sandboxes.id')
              .whereRef('sandboxes.id', '=', 'idempotency_keys.sandbox_id')
              .whereRef('sandboxes.project_id', '=', 'idempotency_keys.project_id')
              .where('sandboxes.pool_id', 'is', null)
              .where('sandboxes.state', 'not in', ['creating', 'stopping', 'pooled']),
          ),
        )
        .returningAll()
        .execute();
      const res = await tx
        .deleteFrom('idempotency_keys')
        .where('state', '=', 'pending')
        .where('created_at', '<', before)
        .$if(replica !== undefined, (q) => q.where('replica', '=', replica!))
        .executeTakeFirst();
      return { settled, dropped: Number(res.numDeletedRows) };
    });
  }

  /** Records the first reply of a key settled after a crash (it had none). */
  async setIdempotencyResponse(projectId: string, key: string, response: string): Promise<void> {
    await this.db
      .updateTable('idempotency_keys')
      .set({ response })
      .where('project_id', '=', projectId)
      .where('key', '=', key)
      .where('response', 'is', null)
      .execute();
  }

  /** Forgets expired keys. */
  async purgeIdempotencyKeys(at: string): Promise<void> {
    await this.db.deleteFrom('idempotency_keys').where('expires_at', '<=', at).execute();
  }

  // ---- layers ----

  async addLayer(l: { projectId: string; digest: string; kind: string; name: string | null }): Promise<LayerTable> {
    if (l.name !== null) {
      await this.db.deleteFrom('layers').where('project_id', '=', l.projectId).where('name', '=', l.name).execute();
    } else {
      const existing = await this.db
        .selectFrom('layers')
        .selectAll()
        .where('project_id', '=', l.projectId)
        .where('digest', '=', l.digest)
        .where('name', 'is', null)
        .executeTakeFirst();
      if (existing) return existing;
    }
    // A new name of a shared snapshot is shared too.
    const shared = await this.db
      .selectFrom('layers')
      .select('shared')
      .where('project_id', '=', l.projectId)
      .where('digest', '=', l.digest)
      .where('shared', '=', 1)
      .executeTakeFirst();
    const row: LayerTable = {
      id: newId('lyr'),
      project_id: l.projectId,
      digest: l.digest,
      kind: l.kind,
      name: l.name,
      created_at: now(),
      shared: shared ? 1 : 0,
    };
    await this.db.insertInto('layers').values(row).execute();
    await this.catalogChanged();
    return row;
  }

  /** Shares (or stops sharing) a project's layer with its sub-projects: every row of it in the project. */
  async shareLayer(projectId: string, digest: string, shared: boolean): Promise<void> {
    await this.db
      .updateTable('layers')
      .set({ shared: shared ? 1 : 0 })
      .where('project_id', '=', projectId)
      .where('digest', '=', digest)
      .execute();
    await this.catalogChanged();
  }

  async layers(projectIds: string[]): Promise<LayerTable[]> {
    return this.db.selectFrom('layers').selectAll().where('project_id', 'in', projectIds).orderBy('created_at').execute();
  }

  /** {@link layers} through the cache (catalog-cache.ts): for the create path, which re-reads on a miss. */
  async cachedLayers(projectIds: string[]): Promise<LayerTable[]> {
    return this.catalog.layers(projectIds, () => this.layers(projectIds));
  }

  async removeLayerRows(ids: string[]): Promise<void> {
    if (!ids.length) return;
    await this.db.deleteFrom('layers').where('id', 'in', ids).execute();
    await this.catalogChanged();
  }

  async layerDigestInUse(digest: string): Promise<boolean> {
    const rows = await this.db.selectFrom('sandboxes').select('layers').execute();
    return rows.some((r) => (JSON.parse(r.layers) as string[]).includes(digest));
  }

  async layerRowsForDigest(digest: string): Promise<LayerTable[]> {
    return this.db.selectFrom('layers').selectAll().where('digest', '=', digest).execute();
  }

  // ---- snapshots ----

  /** Records a snapshot layer; an existing record of the same digest is kept. */
  async addSnapshot(row: SnapshotTable): Promise<SnapshotTable> {
    await this.db
      .insertInto('snapshots')
      .values(row)
      .onConflict((oc) => oc.column('digest').doNothing())
      .execute();
    return (await this.snapshot(row.digest)) ?? row;
  }

  async snapshot(digest: string): Promise<SnapshotTable | undefined> {
    return this.db.selectFrom('snapshots').selectAll().where('digest', '=', digest).executeTakeFirst();
  }

  /** Snapshots that sit on the layer `digest` (it is one of their parents). */
  async snapshotsOver(digest: string): Promise<SnapshotTable[]> {
    return this.db.selectFrom('snapshots').selectAll().where('parents', 'like', `%"${digest}"%`).execute();
  }

  async removeSnapshot(digest: string): Promise<void> {
    await this.db.deleteFrom('snapshots').where('digest', '=', digest).execute();
  }

  // ---- trajectories ----

  async trajectory(sandboxId: string): Promise<TrajectoryTable | undefined> {
    return this.db.selectFrom('trajectories').selectAll().where('sandbox_id', '=', sandboxId).executeTakeFirst();
  }

  /** Highest stored seq of a trajectory, or -1. */
  async lastTrajectorySeq(sandboxId: string): Promise<number> {
    const row = await this.db
      .selectFrom('trajectory_steps')
      .select((eb) => eb.fn.max('seq').as('seq'))
      .where('sandbox_id', '=', sandboxId)
      .executeTakeFirst();
    return row?.seq === null || row?.seq === undefined ? -1 : Number(row.seq);
  }

  /**
   * Assigns the next seq of a trajectory from the database (replicas recording steps of one
   * sandbox never give two steps one seq): the first call continues after the stored steps.
   */
  async nextTrajectorySeq(sandboxId: string): Promise<number> {
    const res = await sql<{ last_seq: number }>`
      INSERT INTO trajectory_seqs (sandbox_id, last_seq)
      VALUES (${sandboxId}, (SELECT coalesce(max(seq), -1) + 1 FROM trajectory_steps WHERE sandbox_id = ${sandboxId}))
      ON CONFLICT (sandbox_id) DO UPDATE SET last_seq = trajectory_seqs.last_seq + 1
      RETURNING last_seq`.execute(this.db);
    return Number(res.rows[0]!.last_seq);
  }

  /** The seq the next step of a trajectory will get (from the database's counter). */
  async peekTrajectorySeq(sandboxId: string): Promise<number> {
    const row = await this.db.selectFrom('trajectory_seqs').select('last_seq').where('sandbox_id', '=', sandboxId).executeTakeFirst();
    return row ? Number(row.last_seq) + 1 : (await this.lastTrajectorySeq(sandboxId)) + 1;
  }

  /**
   * Writes a batch of trajectory changes in one transaction: new headers (an existing one is
   * kept), steps (a step already stored is replaced: a command that was running has ended),
   * header counters, and ends.
   */
  async writeTrajectories(batch: {
    headers: TrajectoryTable[];
    steps: TrajectoryStepTable[];
    counters: Array<Pick<TrajectoryTable, 'sandbox_id' | 'steps' | 'bytes' | 'truncated'>>;
    ends: Array<{ sandboxId: string; at: string }>;
    /** Trajectories a byte budget cut short now (not replayable from now on). */
    cuts?: Array<{ sandboxId: string; at: string }>;
  }): Promise<void> {
    await this.db.transaction().execute(async (tx) => {
      // Headers of many new sandboxes in multi-row statements (10 columns each).
      for (let i = 0; i < batch.headers.length; i += 200)
        await tx
          .insertInto('trajectories')
          .values(batch.headers.slice(i, i + 200))
          .onConflict((oc) => oc.column('sandbox_id').doNothing())
          .execute();
      for (let i = 0; i < batch.steps.length; i += 500) {
        await tx
          .insertInto('trajectory_steps')
          .values(batch.steps.slice(i, i + 500))
          .onConflict((oc) => oc.columns(['sandbox_id', 'seq']).doUpdateSet((eb) => ({ bytes: eb.ref('excluded.bytes'), step: eb.ref('excluded.step') })))
          .execute();
      }
      for (const c of batch.counters) {
        await tx.updateTable('trajectories').set({ steps: c.steps, bytes: c.bytes, truncated: c.truncated }).where('sandbox_id', '=', c.sandbox_id).execute();
      }
      for (const e of batch.ends)
        await tx.updateTable('trajectories').set({ ended_at: e.at }).where('sandbox_id', '=', e.sandboxId).where('ended_at', 'is', null).execute();
      for (const c of batch.cuts ?? [])
        await tx.updateTable('trajectories').set({ cut_at: c.at, truncated: 1 }).where('sandbox_id', '=', c.sandboxId).where('cut_at', 'is', null).execute();
    });
  }

  /** Stored trajectory bytes of each project. */
  async trajectoryBytesByProject(): Promise<Array<{ projectId: string; bytes: number }>> {
    const rows = await this.db
      .selectFrom('trajectories')
      .select((eb) => ['project_id', eb.fn.sum<number | string>('bytes').as('bytes')])
      .groupBy('project_id')
      .execute();
    return rows.map((r) => ({ projectId: r.project_id, bytes: Number(r.bytes ?? 0) }));
  }

  /**
   * Deletes finished trajectories (their sandbox is gone), oldest end first, of the projects in
   * `projectIds` (null: of every project), until at least `bytes` are freed or none is left;
   * `keep` are never deleted. Returns what went.
   */
  async evictFinishedTrajectories(
    projectIds: readonly string[] | null,
    bytes: number,
    keep: ReadonlySet<string> = new Set(),
  ): Promise<Array<{ sandboxId: string; projectId: string; bytes: number }>> {
    const gone: Array<{ sandboxId: string; projectId: string; bytes: number }> = [];
    if (projectIds?.length === 0) return gone;
    let freed = 0;
    let after: { at: string; id: string } | undefined;
    while (freed < bytes) {
      let q = this.db
        .selectFrom('trajectories')
        .select(['sandbox_id', 'project_id', 'bytes', 'ended_at'])
        .where('ended_at', 'is not', null)
        .orderBy('ended_at')
        .orderBy('sandbox_id')
        .limit(100);
      if (projectIds) q = q.where('project_id', 'in', [...projectIds]);
      if (after) {
        const a = after;
        q = q.where((eb) => eb.or([eb('ended_at', '>', a.at), eb.and([eb('ended_at', '=', a.at), eb('sandbox_id', '>', a.id)])]));
      }
      const page = await q.execute();
      if (page.length === 0) break;
      const last = page[page.length - 1]!;
      after = { at: last.ended_at!, id: last.sandbox_id };
      const ids: string[] = [];
      for (const r of page) {
        if (freed >= bytes) break;
        if (keep.has(r.sandbox_id)) continue;
        ids.push(r.sandbox_id);
        freed += Number(r.bytes);
        gone.push({ sandboxId: r.sandbox_id, projectId: r.project_id, bytes: Number(r.bytes) });
      }
      if (ids.length === 0) continue;
      await this.db.transaction().execute(async (tx) => {
        await tx.deleteFrom('trajectory_steps').where('sandbox_id', 'in', ids).execute();
        await tx.deleteFrom('trajectory_seqs').where('sandbox_id', 'in', ids).execute();
        await tx.deleteFrom('trajectories').where('sandbox_id', 'in', ids).execute();
      });
    }
    return gone;
  }

  /** Ends the open trajectories whose sandbox row is gone (a destroy a crash cut short); returns how many. */
  async endOrphanTrajectories(at: string): Promise<number> {
    const res = await this.db
      .updateTable('trajectories')
      .set({ ended_at: at })
      .where('ended_at', 'is', null)
      .where((eb) => eb.not(eb.exists(eb.selectFrom('sandboxes').select('sandboxes.id').whereRef('sandboxes.id', '=', 'trajectories.sandbox_id'))))
      .executeTakeFirst();
    return Number(res.numUpdatedRows);
  }

  /** Steps of a trajectory with a seq above `after`, in order. */
  async trajectorySteps(sandboxId: string, after: number, limit: number): Promise<TrajectoryStepTable[]> {
    return this.db
      .selectFrom('trajectory_steps')
      .selectAll()
      .where('sandbox_id', '=', sandboxId)
      .where('seq', '>', after)
      .orderBy('seq')
      .limit(limit)
      .execute();
  }

  /** Deletes trajectories (and their steps) of sandboxes that ended before `before`; returns how many. */
  async pruneTrajectories(before: string): Promise<number> {
    const ended = await this.db.selectFrom('trajectories').select('sandbox_id').where('ended_at', '<', before).limit(1000).execute();
    if (ended.length === 0) return 0;
    const ids = ended.map((r) => r.sandbox_id);
    await this.db.transaction().execute(async (tx) => {
      await tx.deleteFrom('trajectory_steps').where('sandbox_id', 'in', ids).execute();
      await tx.deleteFrom('trajectory_seqs').where('sandbox_id', 'in', ids).execute();
      await tx.deleteFrom('trajectories').where('sandbox_id', 'in', ids).execute();
    });
    return ids.length;
  }
}

/** Records, on a pending key held by the create under way, the id of the sandbox it makes. */
async function bindIdempotencyKey(tx: Transaction<Database>, projectId: string, key: string, sandboxId: string): Promise<void> {
  await tx
    .updateTable('idempotency_keys')
    .set({ sandbox_id: sandboxId })
    .where('project_id', '=', projectId)
    .where('key', '=', key)
    .where('state', '=', 'pending')
    .execute();
}

/** Keys given to one statement at most (each an `IN` parameter): statements stay bounded. */
const KEYS_PER_STATEMENT = 500;

/** Runs `fn` over `keys`, {@link KEYS_PER_STATEMENT} at a time in order, and joins what each gives. */
async function perChunk<K, R>(keys: readonly K[], fn: (chunk: K[]) => Promise<readonly R[]>): Promise<R[]> {
  const out: R[] = [];
  for (let i = 0; i < keys.length; i += KEYS_PER_STATEMENT) out.push(...(await fn(keys.slice(i, i + KEYS_PER_STATEMENT))));
  return out;
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
