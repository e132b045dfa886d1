// `dsec db copy`: moves a state store into another (a one-machine SQLite home into the
// PostgreSQL of a cluster). Both are opened, and so migrated to the same schema, first; the
// target must be empty (a fresh database: only its root project); everything is written in one
// transaction, so a copy that fails leaves the target as it was.
import { existsSync } from 'node:fs';
import Database from 'better-sqlite3';
import { sql } from 'kysely';
import type { Transaction } from 'kysely';
import { DsecError } from '@dsec/protocol';
import type { Database as Tables } from './schema.js';
import { ROOT_PROJECT_ID, StateStore } from './store.js';

/** Tables in the order their rows can be inserted (referenced rows first), with their keys. */
const TABLES: ReadonlyArray<{ name: keyof Tables; key: string[] }> = [
  { name: 'projects', key: ['id'] },
  { name: 'api_keys', key: ['id'] },
  { name: 'owners', key: ['id'] },
  { name: 'pools', key: ['id'] },
  { name: 'sandboxes', key: ['id'] },
  { name: 'sandbox_labels', key: ['sandbox_id', 'key'] },
  { name: 'layers', key: ['id'] },
  { name: 'idempotency_keys', key: ['project_id', 'key'] },
  { name: 'trajectories', key: ['sandbox_id'] },
  { name: 'trajectory_steps', key: ['sandbox_id', 'seq'] },
  { name: 'trajectory_seqs', key: ['sandbox_id'] },
  { name: 'snapshots', key: ['digest'] },
  { name: 'events', key: ['id'] },
  { name: 'audit', key: ['id'] },
  { name: 'rules', key: ['id'] },
];

/** Tables that are not copied: rate buckets refill by themselves; WebSocket tickets live 30 s. */
const NOT_COPIED = ['rate_buckets', 'ws_tickets', 'replica_reservations'];

/** Rows read and written per statement. */
const COPY_BATCH = 500;

/** Rows copied, per table. */
export type CopyReport = Record<string, number>;

type Row = Record<string, unknown>;

/** Parents before children. */
function projectOrder(rows: Row[]): Row[] {
  const byId = new Map(rows.map((r) => [r.id as string, r]));
  const depth = (r: Row): number => {
    let d = 0;
    for (let p = r.parent_id as string | null; p && d <= rows.length; p = (byId.get(p)?.parent_id as string | null) ?? null) d++;
    return d;
  };
  return [...rows].sort((a, b) => depth(a) - depth(b));
}

/** Copies every row of `from` into the empty store `to`; returns the rows copied per table. */
export async function copyStore(from: StateStore, to: StateStore, log: (line: string) => void = () => undefined): Promise<CopyReport> {
  const report: CopyReport = {};
  await to.db.transaction().execute(async (tx) => {
    // Replicas already running on the target would write meanwhile: the copy waits for none, so
    // the target must be empty, and stays locked against a second copy.
    if (to.shared) await sql`SELECT pg_advisory_xact_lock(hashtext('dsec:copy'))`.execute(tx);
    const { n } = await tx
      .selectFrom('projects')
      .select((eb) => eb.fn.countAll<number>().as('n'))
      .where('id', '!=', ROOT_PROJECT_ID)
      .executeTakeFirstOrThrow();
    const keys = await tx.selectFrom('api_keys').select('id').limit(1).execute();
    const sandboxes = await tx.selectFrom('sandboxes').select('id').limit(1).execute();
    if (Number(n) > 0 || keys.length > 0 || sandboxes.length > 0) {
      throw new DsecError('CONFLICT', 'the target store is not empty (it has projects, keys or sandboxes): copy into a fresh database');
    }
    await tx.deleteFrom('projects').where('id', '=', ROOT_PROJECT_ID).execute();
    for (const t of TABLES) report[t.name] = await copyTable(from, tx, t.name, t.key);
    // Tables this list does not name yet (a later migration's): copied after the known ones.
    const known = new Set<string>([...TABLES.map((t) => t.name), ...NOT_COPIED]);
    for (const t of await from.db.introspection.getTables()) {
      if (known.has(t.name) || t.name.startsWith('kysely_')) continue;
      report[t.name] = await copyTable(from, tx, t.name as keyof Tables, []);
    }
    for (const [name, count] of Object.entries(report)) if (count > 0) log(`dsec: copied ${count} ${name}`);
  });
  return report;
}

async function copyTable(from: StateStore, tx: Transaction<Tables>, table: keyof Tables, key: string[]): Promise<number> {
  const db = from.db.withoutPlugins();
  let copied = 0;
  if (table === 'projects') {
    const rows = projectOrder(await db.selectFrom(table).selectAll().execute());
    for (let i = 0; i < rows.length; i += COPY_BATCH)
      await tx
        .insertInto(table)
        .values(rows.slice(i, i + COPY_BATCH) as never)
        .execute();
    return rows.length;
  }
  for (let offset = 0; ; offset += COPY_BATCH) {
    let q = db.selectFrom(table).selectAll();
    for (const k of key) q = q.orderBy(sql.ref(k));
    const rows = (await q.limit(COPY_BATCH).offset(offset).execute()) as Row[];
    if (rows.length > 0) await tx.insertInto(table).values(rows).execute();
    copied += rows.length;
    if (rows.length < COPY_BATCH) return copied;
  }
}

/** Copies the SQLite store in `file` (a home's `dsec.db`) into the empty PostgreSQL database at `url`. */
export async function copySqliteToPostgres(file: string, url: string, log: (line: string) => void = () => undefined): Promise<CopyReport> {
  if (!existsSync(file)) throw new DsecError('INVALID_ARGUMENT', `from: ${file} does not exist`, { field: 'from' });
  const from = await StateStore.openSqlite(new Database(file, { fileMustExist: true }));
  try {
    const to = await StateStore.openPostgres(url, { log });
    try {
      return await copyStore(from, to, log);
    } finally {
      await to.close();
    }
  } finally {
    await from.close();
  }
}
