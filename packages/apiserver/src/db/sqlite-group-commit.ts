// Group commit for the embedded SQLite store. better-sqlite3 commits synchronously: with
// `synchronous = FULL` every COMMIT is an fsync that holds the event loop, and a create + exec +
// kill cost ~10 of them, one after the other, for every request in flight. This driver (Kysely's
// single-connection SQLite driver, rewritten) runs every statement as it comes, inside one open
// transaction shared by all the statements and transactions that arrive until the next turn of
// the event loop (or until the fsync of the previous group has returned), then commits that
// group once. Nothing is answered before its group's COMMIT has returned: a statement's result,
// a read's rows (they may show the group's other writes), a transaction's end all settle after
// the commit, so durability is what it was (`synchronous = FULL` stays) with one fsync per group
// instead of one per write.
//
// Kysely's own transactions become savepoints inside the group: a rollback undoes its own
// writes only; a failed statement outside a transaction fails alone (SQLite undoes a failed
// statement, not its transaction); a failure that ends SQLite's transaction (disk full, I/O
// error) or a failed COMMIT fails every member of the group, none of which had been answered.
import { CompiledQuery, SelectQueryNode, SqliteAdapter, SqliteIntrospector, SqliteQueryCompiler } from 'kysely';
import type { DatabaseConnection, Dialect, Driver, Kysely, QueryCompiler, QueryResult } from 'kysely';

/** The subset of better-sqlite3's Database the driver uses. */
export interface GroupCommitDatabase {
  close(): void;
  prepare(sql: string): unknown;
  /** True while a transaction is open (better-sqlite3's `inTransaction`). */
  readonly inTransaction: boolean;
}

/** The subset of better-sqlite3's Statement the driver uses. */
interface Statement {
  readonly reader: boolean;
  readonly readonly: boolean;
  /** The statement's SQL. */
  readonly source: string;
  all(params: readonly unknown[]): unknown[];
  run(params: readonly unknown[]): { changes?: number | bigint; lastInsertRowid?: number | bigint };
  iterate(params: readonly unknown[]): Iterable<unknown>;
}

/** The savepoint a Kysely transaction is inside its group. */
const TX_SAVEPOINT = 'dsec_group_tx';

interface Waiter {
  ok: () => void;
  fail: (err: unknown) => void;
}

/** One open SQLite transaction shared by the statements and transactions of a group. */
class Group {
  readonly waiters: Waiter[] = [];
  /** A Kysely transaction open in it (at most one: the connection's mutex serialises them). */
  inTx = false;
  /** Its commit is due and waits for the open transaction's end. */
  due = false;
  /** Set when SQLite ended the transaction under the group (every member fails with it). */
  failed: Error | undefined;
}

/** Figures of a store's group commits (tests and reports). */
export interface GroupCommitFigures {
  /** Groups committed. */
  groups: number;
  /** Statements and transactions that waited for a group's commit. */
  members: number;
}

class Mutex {
  private held: Promise<void> | undefined;
  private free: (() => void) | undefined;

  async lock(): Promise<void> {
    while (this.held) await this.held;
    this.held = new Promise((r) => (this.free = r));
  }

  unlock(): void {
    const free = this.free;
    this.held = undefined;
    this.free = undefined;
    free?.();
  }
}

/** The single connection, as one caller holds it (Kysely passes it back to every call). */
class Lease implements DatabaseConnection {
  /** False once the caller let go of the connection early (waiting for a commit without it). */
  holds = true;
  /** The group of the Kysely transaction this lease has open. */
  tx: Group | undefined;

  constructor(private readonly driver: GroupCommitDriver) {}

  executeQuery<R>(query: CompiledQuery): Promise<QueryResult<R>> {
    return this.driver.execute(this, query) as Promise<QueryResult<R>>;
  }

  async *streamQuery<R>(query: CompiledQuery): AsyncIterableIterator<QueryResult<R>> {
    if (!SelectQueryNode.is(query.query)) throw new Error('the SQLite driver streams only select queries');
    await this.driver.durable(this);
    const stmt = this.driver.prepare(query.sql);
    for (const row of stmt.iterate(query.parameters)) yield { rows: [row as R] };
  }
}

function result(stmt: Statement, params: readonly unknown[]): QueryResult<unknown> {
  if (stmt.reader) return { rows: stmt.all(params) };
  const { changes, lastInsertRowid } = stmt.run(params);
  const out: { -readonly [K in keyof QueryResult<unknown>]: QueryResult<unknown>[K] } = { rows: [] };
  if (changes !== undefined && changes !== null) out.numAffectedRows = BigInt(changes);
  if (lastInsertRowid !== undefined && lastInsertRowid !== null) out.insertId = BigInt(lastInsertRowid);
  return out;
}

/** The lease Kysely passes back (always one of this driver's). */
function leaseOf(connection: DatabaseConnection): Lease {
  if (!(connection instanceof Lease)) throw new Error('not a connection of the group commit driver');
  return connection;
}

/** A savepoint's name as an SQL identifier. */
function quoteName(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}

/** Kysely's driver for one better-sqlite3 connection, with group commit. */
export class GroupCommitDriver implements Driver {
  private readonly mutex = new Mutex();
  private group: Group | undefined;
  private scheduled = false;
  readonly figures: GroupCommitFigures = { groups: 0, members: 0 };
  /**
   * Told of every statement that may write (its SQL; `rollback` when a failed group was undone),
   * once it has run and before anything waits on its result: caches of rows hang on it
   * (sandbox-row-cache.ts).
   */
  onWrite: ((sql: string) => void) | undefined;

  constructor(private readonly db: GroupCommitDatabase) {}

  async init(): Promise<void> {}

  async acquireConnection(): Promise<DatabaseConnection> {
    await this.mutex.lock();
    return new Lease(this);
  }

  async releaseConnection(connection: DatabaseConnection): Promise<void> {
    const lease = leaseOf(connection);
    if (lease.holds) {
      lease.holds = false;
      this.mutex.unlock();
    }
  }

  prepare(sql: string): Statement {
    return this.db.prepare(sql) as Statement;
  }

  /** Runs a statement now; settles once what it saw or wrote is committed. */
  async execute(lease: Lease, query: CompiledQuery): Promise<QueryResult<unknown>> {
    if (!lease.holds) {
      // A caller holding the connection for several statements (`db.connection()`) takes it
      // back after waiting for a commit without it.
      await this.mutex.lock();
      lease.holds = true;
    }
    const stmt = this.prepare(query.sql);
    const tx = lease.tx;
    if (tx) {
      if (tx.failed) throw tx.failed;
      return this.run(tx, stmt, query.parameters);
    }
    // A read with no group open sees only committed rows: answered at once.
    if (!this.group && stmt.readonly) return result(stmt, query.parameters);
    const group = this.open();
    const out = this.run(group, stmt, query.parameters);
    const done = this.member(group);
    // The connection is free for the next statement while this one waits for its commit.
    await this.releaseConnection(lease);
    await done;
    return out;
  }

  /** Waits until everything the connection has shown so far is committed. */
  async durable(lease: Lease): Promise<void> {
    if (this.group && !lease.tx) await this.member(this.group);
  }

  async beginTransaction(connection: DatabaseConnection): Promise<void> {
    const lease = leaseOf(connection);
    const group = this.open();
    this.run(group, this.prepare(`savepoint ${TX_SAVEPOINT}`), []);
    group.inTx = true;
    lease.tx = group;
  }

  async commitTransaction(connection: DatabaseConnection): Promise<void> {
    const lease = leaseOf(connection);
    const group = lease.tx!;
    lease.tx = undefined;
    group.inTx = false;
    if (group.failed) throw group.failed;
    this.run(group, this.prepare(`release ${TX_SAVEPOINT}`), []);
    const done = this.member(group);
    await this.releaseConnection(lease);
    this.afterTransaction(group);
    await done;
  }

  async rollbackTransaction(connection: DatabaseConnection): Promise<void> {
    const lease = leaseOf(connection);
    const group = lease.tx!;
    lease.tx = undefined;
    group.inTx = false;
    if (!group.failed && this.db.inTransaction) {
      this.run(group, this.prepare(`rollback to ${TX_SAVEPOINT}`), []);
      this.run(group, this.prepare(`release ${TX_SAVEPOINT}`), []);
    }
    this.afterTransaction(group);
  }

  async savepoint(connection: DatabaseConnection, name: string): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw(`savepoint ${quoteName(name)}`));
  }

  async rollbackToSavepoint(connection: DatabaseConnection, name: string): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw(`rollback to ${quoteName(name)}`));
  }

  async releaseSavepoint(connection: DatabaseConnection, name: string): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw(`release ${quoteName(name)}`));
  }

  async destroy(): Promise<void> {
    if (this.group && !this.group.inTx) this.commit();
    // A group a transaction still holds open is not committed: its members fail.
    if (this.group) this.fail(this.group, new Error('the store was closed before the commit'));
    this.db.close();
  }

  /** The open group, or a new one (BEGIN), with its commit scheduled. */
  private open(): Group {
    if (!this.group) {
      this.prepare('begin').run([]);
      this.group = new Group();
    }
    this.schedule();
    return this.group;
  }

  private member(group: Group): Promise<void> {
    this.figures.members++;
    return new Promise((ok, fail) => group.waiters.push({ ok, fail }));
  }

  /** Runs a statement in `group`; a failure that ended SQLite's transaction fails the group. */
  private run(group: Group, stmt: Statement, params: readonly unknown[]): QueryResult<unknown> {
    try {
      return result(stmt, params);
    } catch (err) {
      if (!this.db.inTransaction) this.fail(group, err instanceof Error ? err : new Error(String(err)));
      throw err;
    } finally {
      if (!stmt.readonly) this.onWrite?.(stmt.source);
    }
  }

  private schedule(): void {
    if (this.scheduled) return;
    this.scheduled = true;
    // Whatever else this turn of the event loop writes joins the group.
    setImmediate(() => {
      this.scheduled = false;
      const group = this.group;
      if (!group) return;
      if (group.inTx) group.due = true;
      else this.commit();
    });
  }

  private afterTransaction(group: Group): void {
    if (group !== this.group) return;
    // A group whose commit came due during the transaction commits now (a chain of
    // transactions never holds it open); otherwise at the turn's end.
    if (group.due) this.commit();
    else this.schedule();
  }

  private commit(): void {
    const group = this.group;
    if (!group) return;
    this.group = undefined;
    try {
      this.prepare('commit').run([]);
    } catch (err) {
      if (this.db.inTransaction) {
        try {
          this.prepare('rollback').run([]);
        } catch {
          // The rollback's failure adds nothing to the commit's.
        }
      }
      this.fail(group, err instanceof Error ? err : new Error(String(err)));
      return;
    }
    this.figures.groups++;
    for (const w of group.waiters) w.ok();
  }

  private fail(group: Group, err: Error): void {
    // The group's writes are undone: whatever was read of them is gone too.
    this.onWrite?.('rollback');
    group.failed = err;
    if (this.group === group) this.group = undefined;
    for (const w of group.waiters) w.fail(err);
    group.waiters.length = 0;
  }
}

/** Kysely's SQLite dialect on a {@link GroupCommitDriver}. */
export class GroupCommitSqliteDialect implements Dialect {
  readonly driver: GroupCommitDriver;

  constructor(database: GroupCommitDatabase) {
    this.driver = new GroupCommitDriver(database);
  }

  createDriver(): Driver {
    return this.driver;
  }

  createQueryCompiler(): QueryCompiler {
    return new SqliteQueryCompiler();
  }

  createAdapter(): SqliteAdapter {
    return new SqliteAdapter();
  }

  createIntrospector(db: Kysely<unknown>): SqliteIntrospector {
    return new SqliteIntrospector(db);
  }
}
