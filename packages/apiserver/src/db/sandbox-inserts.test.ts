import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import Database from 'better-sqlite3';
import { SqliteDialect } from 'kysely';
import type { DatabaseConnection, Dialect, Driver, Kysely, TransactionSettings } from 'kysely';
import type { SandboxTable } from './schema.js';
import { ROOT_PROJECT_ID, StateStore } from './store.js';

let store: StateStore;
before(async () => {
  store = await StateStore.openSqlite(new Database(':memory:'));
});
after(async () => store.close());

function row(id: string, extra: Partial<SandboxTable> = {}): SandboxTable {
  const now = new Date().toISOString();
  return {
    id,
    project_id: ROOT_PROJECT_ID,
    node: 'n1',
    backend: 'container',
    state: 'creating',
    spec: '{}',
    layers: '[]',
    cpu: 1,
    memory_mib: 64,
    created_at: now,
    expires_at: now,
    pool_id: null,
    owner_id: null,
    lease: null,
    last_active_at: now,
    paused_at: null,
    pause_reason: null,
    ...extra,
  };
}

test('inserts started together are written as one group, with their labels', async () => {
  const before = { ...store.inserts.written };
  await Promise.all(Array.from({ length: 250 }, (_, i) => store.insertSandbox(row(`g-${i}`), { job: 'grouped', n: String(i) })));
  assert.equal(store.inserts.written.rows - before.rows, 250);
  assert.equal(store.inserts.written.groups - before.groups, 1, 'one transaction for the 250');
  const got = await store.sandbox('g-249');
  assert.deepEqual(got?.labels, { job: 'grouped', n: '249' });
  assert.equal((await store.db.selectFrom('sandboxes').select('id').where('id', 'like', 'g-%').execute()).length, 250);
});

test('a row that cannot be written fails alone; rows without the optional columns are written', async () => {
  await store.insertSandbox(row('dup'), {});
  const { owner_id: _o, lease: _l, last_active_at: _a, paused_at: _p, pause_reason: _r, ...bare } = row('bare');
  const results = await Promise.allSettled([
    store.insertSandbox(row('ok-1'), { a: '1' }),
    store.insertSandbox(row('dup', { spec: '{"another":true}' }), {}),
    store.insertSandbox(bare, {}),
  ]);
  assert.equal(results[0].status, 'fulfilled');
  assert.equal(results[1].status, 'rejected', 'the duplicate id is refused');
  assert.equal(results[2].status, 'fulfilled');
  assert.deepEqual((await store.sandbox('ok-1'))?.labels, { a: '1' });
  assert.equal((await store.sandboxOnly('bare'))?.lease, null);
});

test('the lease pass reads only the lease columns of running rows', async () => {
  await store.insertSandbox(row('run-1', { state: 'running', owner_id: null }), {});
  const leases = await store.runningLeases(Date.now());
  const one = leases.find((l) => l.id === 'run-1');
  assert.ok(one);
  assert.deepEqual(Object.keys(one).sort(), ['created_at', 'expires_at', 'id', 'last_active_at', 'lease', 'owner_id']);
  assert.ok(
    leases.every((l) => !l.id.startsWith('g-')),
    'rows in other states are not read',
  );
});

/** SQLite whose next `lose` COMMITs are applied but answered with an error (a connection lost at COMMIT). */
class LosingCommits implements Dialect {
  lose = 0;
  private readonly inner: SqliteDialect;
  constructor(database: Database.Database) {
    this.inner = new SqliteDialect({ database });
  }
  createAdapter(): ReturnType<Dialect['createAdapter']> {
    return this.inner.createAdapter();
  }
  createQueryCompiler(): ReturnType<Dialect['createQueryCompiler']> {
    return this.inner.createQueryCompiler();
  }
  createIntrospector(db: Kysely<unknown>): ReturnType<Dialect['createIntrospector']> {
    return this.inner.createIntrospector(db);
  }
  createDriver(): Driver {
    const d = this.inner.createDriver();
    return {
      init: () => d.init(),
      acquireConnection: () => d.acquireConnection(),
      beginTransaction: (c: DatabaseConnection, s: TransactionSettings) => d.beginTransaction(c, s),
      commitTransaction: async (c: DatabaseConnection) => {
        await d.commitTransaction(c);
        if (this.lose > 0) {
          this.lose--;
          throw new Error('Connection terminated unexpectedly');
        }
      },
      rollbackTransaction: (c: DatabaseConnection) => d.rollbackTransaction(c),
      releaseConnection: (c: DatabaseConnection) => d.releaseConnection(c),
      destroy: () => d.destroy(),
    };
  }
}

test('a group whose COMMIT was applied but whose answer was lost reports its rows as written, not as failed', async () => {
  const dialect = new LosingCommits(new Database(':memory:'));
  const s = await StateStore.open(dialect);
  try {
    dialect.lose = 1;
    const results = await Promise.allSettled(Array.from({ length: 3 }, (_, i) => s.insertSandbox(row(`lost-${i}`), { job: 'lost' })));
    assert.deepEqual(
      results.map((r) => r.status),
      ['fulfilled', 'fulfilled', 'fulfilled'],
    );
    assert.equal(dialect.lose, 0, 'the COMMIT was lost once');
    assert.deepEqual((await s.sandbox('lost-2'))?.labels, { job: 'lost' });
    dialect.lose = 1;
    await s.insertSandbox(row('lost-alone'), {});
    assert.equal(dialect.lose, 0);
    assert.equal((await s.db.selectFrom('sandboxes').select('id').where('id', 'like', 'lost-%').execute()).length, 4);
    // A row that is not this create's (an id taken by another) is still refused.
    await assert.rejects(s.insertSandbox(row('lost-0', { spec: '{"another":true}' }), {}));
  } finally {
    await s.close();
  }
});

test('the lease pass reads a running row again only when its check is due, it has an owner, or its lease or owner was written', async () => {
  const now = Date.now();
  const later = now + 60_000;
  const lease = JSON.stringify({ idleTimeoutMs: 60_000 });
  await Promise.all([
    store.insertSandbox(row('lc-later', { state: 'running', lease, lease_check_ms: later }), {}),
    store.insertSandbox(row('lc-due', { state: 'running', lease, lease_check_ms: now - 1 }), {}),
    store.insertSandbox(row('lc-unknown', { state: 'running', lease }), {}),
    store.insertSandbox(row('lc-owned', { state: 'running', lease, lease_check_ms: later, owner_id: 'own-1' }), {}),
    store.insertSandbox(row('lc-patched', { state: 'running', lease, lease_check_ms: later }), {}),
    store.insertSandbox(row('lc-resumed', { state: 'paused', lease, lease_check_ms: later }), {}),
  ]);
  const read = async (): Promise<string[]> =>
    (await store.runningLeases(now))
      .map((l) => l.id)
      .filter((id) => id.startsWith('lc-'))
      .sort();
  assert.deepEqual(await read(), ['lc-due', 'lc-owned', 'lc-unknown'], 'a row whose check lies ahead is not read');
  // A lease written (PATCH, a resume's renewal) is looked at on the next pass, whatever was deferred.
  await store.updateSandbox('lc-patched', { lease: JSON.stringify({ idleTimeoutMs: 1000 }) });
  assert.ok(await store.transitionSandbox('lc-resumed', ['paused'], 'running', { lease: JSON.stringify({ idleTimeoutMs: 1000 }) }));
  assert.deepEqual(await read(), ['lc-due', 'lc-owned', 'lc-patched', 'lc-resumed', 'lc-unknown']);
  // A deferral judged on a lease that changed meanwhile does not hide the new one.
  await store.deferLeaseChecks([
    { at: later, lease, ids: ['lc-due', 'lc-unknown', 'lc-patched'] },
    { at: later, lease: null, ids: ['lc-resumed'] },
  ]);
  assert.deepEqual(await read(), ['lc-owned', 'lc-patched', 'lc-resumed']);
  assert.deepEqual(
    (await store.runningLeases(later))
      .map((l) => l.id)
      .filter((id) => id.startsWith('lc-'))
      .sort(),
    ['lc-due', 'lc-later', 'lc-owned', 'lc-patched', 'lc-resumed', 'lc-unknown'],
    'every one is read once its check comes',
  );
});
