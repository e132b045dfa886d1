// Sandbox rows written in groups: every insert asked for while the previous group is being
// written (or in the same turn of the event loop) goes into the next group. A batch create's
// items, and concurrent single creates, so cost a few statements together instead of a
// transaction each. On PostgreSQL a group is one statement (data-modifying CTEs: the rows, their
// labels, their idempotency keys and whatever the store adds, from JSON parameters): one round
// trip, atomic on its own. The embedded SQLite store, whose round trips cost nothing, writes a
// group in one transaction of multi-row INSERTs. Each caller's promise settles when its row is
// committed (the create pipeline's order holds: the row is written before the node is asked); a
// group that fails is written again row by row, so that one bad row fails alone.
import { sql } from 'kysely';
import type { Kysely, RawBuilder, Transaction } from 'kysely';
import type { Database, SandboxTable } from './schema.js';
import { WriteGroups } from './write-groups.js';

/** Rows per INSERT statement (17 columns: well under SQLite's and PostgreSQL's bound on parameters). */
const ROWS_PER_STATEMENT = 200;
/**
 * About this many bytes of rows at most in one statement (specs can be large: an `env` of
 * megabytes): a larger group is written in a transaction of statements each under it.
 */
const STATEMENT_BYTES = 16 * 1024 * 1024;
/** Labels per INSERT statement (3 columns). */
const LABELS_PER_STATEMENT = 1000;

/** One sandbox row to insert. */
export interface SandboxInsert {
  row: SandboxTable;
  labels: Record<string, string>;
  /** An idempotency key (pending, held by this create) that records the row's id in the same transaction. */
  idempotencyKey?: string | undefined;
}

/** Binds an idempotency key to a sandbox id inside a transaction. */
export type BindIdempotencyKey = (tx: Transaction<Database>, projectId: string, key: string, sandboxId: string) => Promise<void>;

/** What a group's write does besides its rows and labels: the store's part. */
export interface SandboxInsertsOptions {
  /** Binds an idempotency key (the transaction's path). */
  bind: BindIdempotencyKey;
  /** Run in each transaction that writes rows, after them (the store's accounting of reservations turned into rows). */
  afterRows: (tx: Transaction<Database>, rows: readonly SandboxTable[]) => Promise<void>;
  /**
   * Given: a group is one statement (PostgreSQL), and these further CTEs (`name AS (...)`, names
   * other than the rows', labels' and keys') do in it what `afterRows` does. Absent: a transaction.
   */
  alsoInStatement?: ((rows: readonly SandboxTable[]) => Array<RawBuilder<unknown>>) | undefined;
}

/** Groups sandbox inserts into multi-row statements (one writer per store). */
export class SandboxInserts {
  private readonly groups = new WriteGroups<SandboxInsert, void>((_key, group) => this.writeGroup(group), Number.MAX_SAFE_INTEGER);
  /** Groups written and rows in them (for tests and the cell's report). */
  readonly written = { groups: 0, rows: 0 };

  constructor(
    private readonly db: Kysely<Database>,
    private readonly opts: SandboxInsertsOptions,
  ) {}

  /** Inserts a row (and its labels, and binds its key); resolves once it is committed. */
  insert(item: SandboxInsert): Promise<void> {
    return this.groups.submit('sandboxes', item);
  }

  private async writeGroup(group: readonly SandboxInsert[]): Promise<Array<undefined | Error>> {
    try {
      await this.write(group);
      this.written.groups++;
      this.written.rows += group.length;
      return group.map(() => undefined);
    } catch (err) {
      // The COMMIT itself may have been applied with its answer lost (a connection that
      // dropped): rows found as written are this group's, and are not written again.
      const rest = new Set(await this.notCommitted(group).catch(() => group));
      this.written.groups++;
      this.written.rows += group.length - rest.size;
      const failed = err instanceof Error ? err : new Error(String(err));
      const again = rest.size === 1 ? new Map([[[...rest][0]!, failed]]) : await this.oneByOne([...rest]);
      return group.map((g) => (rest.has(g) ? again.get(g) : undefined));
    }
  }

  /**
   * After a failed group: resolves the members whose row is stored as this group wrote it (same
   * project, node, creation time and spec: ids are random, and a group commits whole or not at
   * all) and returns the others.
   */
  private async notCommitted(group: readonly SandboxInsert[]): Promise<readonly SandboxInsert[]> {
    const stored = new Map<string, Pick<SandboxTable, 'project_id' | 'node' | 'created_at' | 'spec'>>();
    for (let i = 0; i < group.length; i += ROWS_PER_STATEMENT) {
      const rows = await this.db
        .selectFrom('sandboxes')
        .select(['id', 'project_id', 'node', 'created_at', 'spec'])
        .where(
          'id',
          'in',
          group.slice(i, i + ROWS_PER_STATEMENT).map((p) => p.row.id),
        )
        .execute();
      for (const r of rows) stored.set(r.id, r);
    }
    const same = (p: SandboxInsert): boolean => {
      const r = stored.get(p.row.id);
      return r !== undefined && r.project_id === p.row.project_id && r.node === p.row.node && r.created_at === p.row.created_at && r.spec === p.row.spec;
    };
    // All or none: a group is one transaction. Anything else is not understood: every row is
    // tried again alone (one already stored is then refused), so that no caller waits forever.
    return group.every(same) ? [] : group;
  }

  /** Writes each row in a transaction of its own: what each failed with (undefined: written). */
  private async oneByOne(group: readonly SandboxInsert[]): Promise<Map<SandboxInsert, Error | undefined>> {
    const out = new Map<SandboxInsert, Error | undefined>();
    for (const p of group) {
      try {
        await this.write([p]);
        out.set(p, undefined);
      } catch (err) {
        out.set(p, err instanceof Error ? err : new Error(String(err)));
      }
    }
    return out;
  }

  /** Writes a group whole or not at all. */
  private async write(group: readonly SandboxInsert[]): Promise<void> {
    const rows = sameColumns(group);
    const labels = group.flatMap((g) => Object.entries(g.labels).map(([key, value]) => ({ sandbox_id: g.row.id, key, value })));
    if (!this.opts.alsoInStatement || rowBytes(rows) > STATEMENT_BYTES) {
      await this.db.transaction().execute((tx) => this.writeIn(tx, group, rows, labels));
      return;
    }
    // Each part reads its JSON parameter as typed records: the rows as the table's row type
    // (only the columns given are written, the others keep their defaults).
    const columns = sql.join(Object.keys(rows[0]!).map((c) => sql.id(c)));
    const keys = group.flatMap((g) => (g.idempotencyKey === undefined ? [] : [{ project_id: g.row.project_id, key: g.idempotencyKey, sandbox_id: g.row.id }]));
    const parts = [
      sql`rows_in AS (INSERT INTO sandboxes (${columns})
        SELECT ${columns} FROM jsonb_populate_recordset(NULL::sandboxes, ${JSON.stringify(rows)}::jsonb))`,
      ...(labels.length === 0
        ? []
        : [
            sql`labels_in AS (INSERT INTO sandbox_labels (sandbox_id, key, value)
              SELECT sandbox_id, key, value FROM jsonb_to_recordset(${JSON.stringify(labels)}::jsonb) AS l(sandbox_id text, key text, value text))`,
          ]),
      ...(keys.length === 0
        ? []
        : [
            sql`keys_bound AS (UPDATE idempotency_keys k SET sandbox_id = b.sandbox_id
              FROM jsonb_to_recordset(${JSON.stringify(keys)}::jsonb) AS b(project_id text, key text, sandbox_id text)
              WHERE k.project_id = b.project_id AND k.key = b.key AND k.state = 'pending')`,
          ]),
      ...this.opts.alsoInStatement(rows),
    ];
    // Every data-modifying CTE runs to completion whatever the outer query reads; the labels'
    // foreign key is checked at the statement's end, when the rows are there.
    await sql`WITH ${sql.join(parts)} SELECT 1`.execute(this.db);
  }

  /** The group in a transaction: multi-row INSERTs, the keys bound, then `afterRows`. */
  private async writeIn(
    tx: Transaction<Database>,
    group: readonly SandboxInsert[],
    rows: readonly SandboxTable[],
    labels: ReadonlyArray<{ sandbox_id: string; key: string; value: string }>,
  ): Promise<void> {
    for (let i = 0; i < rows.length;) {
      // Up to ROWS_PER_STATEMENT rows and STATEMENT_BYTES (at least one row) a statement.
      let n = 1;
      for (let bytes = rowBytes([rows[i]!]); n < ROWS_PER_STATEMENT && i + n < rows.length; n++) {
        bytes += rowBytes([rows[i + n]!]);
        if (bytes > STATEMENT_BYTES) break;
      }
      await tx
        .insertInto('sandboxes')
        .values(rows.slice(i, i + n))
        .execute();
      i += n;
    }
    for (const g of group) if (g.idempotencyKey !== undefined) await this.opts.bind(tx, g.row.project_id, g.idempotencyKey, g.row.id);
    for (let i = 0; i < labels.length; i += LABELS_PER_STATEMENT) {
      await tx
        .insertInto('sandbox_labels')
        .values(labels.slice(i, i + LABELS_PER_STATEMENT))
        .execute();
    }
    // Last: on a shared store this takes the replica's reservation row of the project, which
    // every reservation of the project takes too; held from here to the COMMIT only.
    await this.opts.afterRows(tx, rows);
  }
}

/** About what rows weigh in a statement (their JSON columns; the rest is small). */
function rowBytes(rows: readonly SandboxTable[]): number {
  let bytes = 0;
  for (const r of rows) bytes += 256 + r.spec.length + r.layers.length + (r.lease?.length ?? 0);
  return bytes;
}

/** The group's rows with the same columns (one statement's rows must name the same): a column some row leaves out is NULL. */
function sameColumns(group: readonly SandboxInsert[]): SandboxTable[] {
  const columns = new Set(group.flatMap((g) => Object.keys(g.row)));
  return group.map((g) => {
    const row: Record<string, unknown> = {};
    for (const c of columns) row[c] = (g.row as unknown as Record<string, unknown>)[c] ?? null;
    return row as unknown as SandboxTable;
  });
}
