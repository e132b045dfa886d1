// Sandbox rows written in groups: every insert asked for while the previous group is being
// written (or in the same turn of the event loop) goes into the next group, which is one
// transaction with one multi-row INSERT for the rows and one for their labels. A batch create's
// items, and concurrent single creates, so cost a few statements together instead of a
// transaction each. Each caller's promise settles when its row is committed (the create
// pipeline's order holds: the row is written before the node is asked); a group that fails is
// written again row by row, so that one bad row fails alone.
import type { Kysely, Transaction } from 'kysely';
import type { Database, SandboxTable } from './schema.js';
import { WriteGroups } from './write-groups.js';

/** Rows per INSERT statement (17 columns: well under SQLite's and PostgreSQL's bound on parameters). */
const ROWS_PER_STATEMENT = 200;
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

/** Groups sandbox inserts into multi-row statements (one writer per store). */
export class SandboxInserts {
  private readonly groups = new WriteGroups<SandboxInsert, void>((_key, group) => this.writeGroup(group), Number.MAX_SAFE_INTEGER);
  /** Groups written and rows in them (for tests and the cell's report). */
  readonly written = { groups: 0, rows: 0 };

  constructor(
    private readonly db: Kysely<Database>,
    private readonly bind: BindIdempotencyKey,
    /** Run in each transaction that writes rows, after them (the store's accounting of reservations turned into rows). */
    private readonly onWrite: (tx: Transaction<Database>, rows: readonly SandboxTable[]) => Promise<void> = async () => undefined,
  ) {}

  /** Inserts a row (and its labels, and binds its key); resolves once it is committed. */
  insert(item: SandboxInsert): Promise<void> {
    return this.groups.submit('sandboxes', item);
  }

  private async writeGroup(group: readonly SandboxInsert[]): Promise<Array<undefined | Error>> {
    try {
      await this.db.transaction().execute((tx) => this.write(tx, group));
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
        await this.db.transaction().execute((tx) => this.write(tx, [p]));
        out.set(p, undefined);
      } catch (err) {
        out.set(p, err instanceof Error ? err : new Error(String(err)));
      }
    }
    return out;
  }

  private async write(tx: Transaction<Database>, group: readonly SandboxInsert[]): Promise<void> {
    // One statement's rows must name the same columns: a column some row leaves out is NULL.
    const columns = new Set(group.flatMap((g) => Object.keys(g.row)));
    const rows = group.map((g) => {
      const row: Record<string, unknown> = {};
      for (const c of columns) row[c] = (g.row as unknown as Record<string, unknown>)[c] ?? null;
      return row as unknown as SandboxTable;
    });
    for (let i = 0; i < rows.length; i += ROWS_PER_STATEMENT) {
      await tx
        .insertInto('sandboxes')
        .values(rows.slice(i, i + ROWS_PER_STATEMENT))
        .execute();
    }
    for (const g of group) if (g.idempotencyKey !== undefined) await this.bind(tx, g.row.project_id, g.idempotencyKey, g.row.id);
    const labels = group.flatMap((g) => Object.entries(g.labels).map(([key, value]) => ({ sandbox_id: g.row.id, key, value })));
    for (let i = 0; i < labels.length; i += LABELS_PER_STATEMENT) {
      await tx
        .insertInto('sandbox_labels')
        .values(labels.slice(i, i + LABELS_PER_STATEMENT))
        .execute();
    }
    // Last: on a shared store this takes the replica's reservation row of the project, which
    // every reservation of the project takes too; held from here to the COMMIT only.
    await this.onWrite(
      tx,
      group.map((g) => g.row),
    );
  }
}
