import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { Kysely, sql } from 'kysely';
import { GroupCommitSqliteDialect } from './sqlite-group-commit.js';

interface Db {
  t: { id: number; v: string };
}

describe('SQLite group commit (real database files)', () => {
  let dir: string;
  let file: string;
  let db: Kysely<Db>;
  let dialect: GroupCommitSqliteDialect;
  /** A second connection to the same file: it sees only what is committed. */
  let other: Database.Database;

  before(async () => {
    dir = await mkdtemp(path.join(tmpdir(), 'dsec-group-commit-'));
    file = path.join(dir, 'store.db');
    const main = new Database(file);
    main.pragma('journal_mode = WAL');
    main.pragma('synchronous = FULL');
    dialect = new GroupCommitSqliteDialect(main);
    db = new Kysely<Db>({ dialect });
    await sql`create table t (id integer primary key, v text not null)`.execute(db);
    other = new Database(file, { readonly: true });
  });

  after(async () => {
    other?.close();
    await db?.destroy();
    await rm(dir, { recursive: true, force: true });
  });

  const committed = (id: number): boolean => other.prepare('select 1 from t where id = ?').get(id) !== undefined;

  test('writes and transactions of one turn share one commit; each settles once its row is committed', async () => {
    const groups = dialect.driver.figures.groups;
    const seenCommitted: boolean[] = [];
    const writes = Array.from({ length: 20 }, (_, i) =>
      db
        .insertInto('t')
        .values({ id: 100 + i, v: 'w' })
        .execute()
        .then(() => seenCommitted.push(committed(100 + i))),
    );
    const txs = Array.from({ length: 5 }, (_, i) =>
      db
        .transaction()
        .execute(async (tx) => {
          await tx
            .insertInto('t')
            .values({ id: 200 + i, v: 'a' })
            .execute();
          await tx
            .insertInto('t')
            .values({ id: 300 + i, v: 'b' })
            .execute();
        })
        .then(() => seenCommitted.push(committed(200 + i) && committed(300 + i))),
    );
    await Promise.all([...writes, ...txs]);
    assert.equal(seenCommitted.length, 25);
    assert.ok(
      seenCommitted.every((c) => c),
      'no write settled before another connection could read it',
    );
    assert.ok(dialect.driver.figures.groups - groups <= 2, `25 writes took ${dialect.driver.figures.groups - groups} commits`);
  });

  test('a failed statement fails alone and a rolled-back transaction undoes only its own writes', async () => {
    const dup = db.insertInto('t').values({ id: 100, v: 'dup' }).execute();
    const ok = db.insertInto('t').values({ id: 400, v: 'ok' }).execute();
    const rolledBack = db.transaction().execute(async (tx) => {
      await tx.insertInto('t').values({ id: 401, v: 'gone' }).execute();
      throw new Error('changed my mind');
    });
    const ok2 = db.insertInto('t').values({ id: 402, v: 'ok' }).execute();
    await assert.rejects(dup, /UNIQUE/);
    await assert.rejects(rolledBack, /changed my mind/);
    await ok;
    await ok2;
    assert.ok(committed(400) && committed(402));
    assert.ok(!committed(401), 'the rolled-back row is not stored');
    assert.equal((await db.selectFrom('t').select('v').where('id', '=', 100).executeTakeFirstOrThrow()).v, 'w');
  });

  test('a read made while a group is open settles after its commit; an idle read needs no commit', async () => {
    const write = db.insertInto('t').values({ id: 500, v: 'x' }).execute();
    const row = await db.selectFrom('t').select('v').where('id', '=', 500).executeTakeFirst();
    assert.equal(row?.v, 'x');
    assert.ok(committed(500), 'the read that showed the row settled after the row was committed');
    await write;
    const groups = dialect.driver.figures.groups;
    assert.equal((await db.selectFrom('t').select('v').where('id', '=', 500).executeTakeFirst())?.v, 'x');
    assert.equal(dialect.driver.figures.groups, groups, 'an idle read opens no group');
  });

  test('a transaction that spans turns is never committed in part; writes made meanwhile wait for it', async () => {
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    let firstWritten!: () => void;
    const written = new Promise<void>((r) => (firstWritten = r));
    const tx = db.transaction().execute(async (t) => {
      await t.insertInto('t').values({ id: 600, v: 'first' }).execute();
      firstWritten();
      await gate;
      await t.insertInto('t').values({ id: 601, v: 'second' }).execute();
    });
    await written;
    const meanwhile = db.insertInto('t').values({ id: 602, v: 'meanwhile' }).execute();
    await new Promise((r) => setTimeout(r, 50));
    assert.ok(!committed(600), 'half a transaction is not committed');
    release();
    await tx;
    await meanwhile;
    assert.ok(committed(600) && committed(601) && committed(602));
  });
});
