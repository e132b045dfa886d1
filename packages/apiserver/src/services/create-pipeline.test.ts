// Which node creates share a createMany message: a node answers a group once all its items
// settle, and the message has a frame limit, so only small container creates are grouped. A
// create whose store write fails gives back everything it held.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { sql } from 'kysely';
import { DsecError } from '@dsec/protocol';
import type { SandboxSpec } from '@dsec/protocol';
import { harness } from '../testing/harness.js';
import type { Harness } from '../testing/harness.js';
import { groupable } from './create-pipeline.js';

const base: SandboxSpec = { image: { base: `sha256:${'a'.repeat(64)}` } };

test('small container creates are grouped; VM boots, forks with memory and large specs go alone', () => {
  assert.equal(groupable(base), true);
  assert.equal(groupable({ ...base, backend: 'container', env: { A: 'x'.repeat(1000) } }), true);
  assert.equal(groupable({ ...base, backend: 'microvm' }), false);
  assert.equal(groupable({ ...base, backend: 'vm' }), false);
  assert.equal(groupable({ ...base, backend: 'microvm', memoryOf: 'sb-source' }), false);
  // An env of 128 KiB: 500 such items would make a frame beyond the node protocol's 64 MiB.
  assert.equal(groupable({ ...base, env: { BIG: 'x'.repeat(128 * 1024) } }), false);
});

describe('a create whose store write fails', () => {
  let h: Harness;
  before(async () => {
    h = await harness();
  });
  after(async () => h.close());

  /** What the create held, each of which must be given back. */
  const held = async () => ({
    nodeSandboxes: h.nodes.get(h.edge.nodeName)!.allocated.sandboxes,
    usedSandboxes: (await h.store.project(h.admin.projectId))?.used_sandboxes,
    rows: (await h.store.db.selectFrom('sandboxes').select('id').execute()).length,
    onNode: h.edge.sandboxes.size,
  });
  const nothing = { nodeSandboxes: 0, usedSandboxes: 0, rows: 0, onNode: 0 };
  const create = () => h.services.sandboxes.create(h.admin, { image: { base: 'busybox' }, labels: { job: 'undo' } });

  test('gives back the node charge, the quota, the row and the node sandbox, whichever write failed', async () => {
    // A real failure of the database, not a stand-in: triggers that refuse the writes.
    await sql`CREATE TRIGGER refuse_insert BEFORE INSERT ON sandboxes BEGIN SELECT RAISE(ABORT, 'insert refused by the test'); END`.execute(h.store.db);
    await assert.rejects(create(), /insert refused by the test/);
    assert.deepEqual(await held(), nothing, 'the insert failed: nothing held');
    await sql`DROP TRIGGER refuse_insert`.execute(h.store.db);

    // The row is written and the node creates the sandbox; moving it to running fails.
    await sql`CREATE TRIGGER refuse_running BEFORE UPDATE OF state ON sandboxes WHEN NEW.state = 'running' BEGIN SELECT RAISE(ABORT, 'running refused by the test'); END`.execute(
      h.store.db,
    );
    await assert.rejects(create(), /running refused by the test/);
    assert.deepEqual(await held(), nothing, 'the state move failed: nothing held, the node sandbox destroyed');
    await sql`DROP TRIGGER refuse_running`.execute(h.store.db);

    const sb = await create();
    assert.equal(sb.state, 'running');
    assert.deepEqual(await held(), { nodeSandboxes: 1, usedSandboxes: 1, rows: 1, onNode: 1 });
  });

  test('a create whose row another replica settled meanwhile fails, its node sandbox destroyed and its quota given back once', async () => {
    const before = await held();
    // What a live replica does to the work of one it takes for gone: the row deleted and its
    // reservation given back, here the moment the insert commits.
    await sql`CREATE TRIGGER settle_elsewhere AFTER INSERT ON sandboxes BEGIN
      DELETE FROM sandboxes WHERE id = NEW.id;
      UPDATE projects SET used_sandboxes = used_sandboxes - 1, used_cpu = used_cpu - NEW.cpu, used_memory_mib = used_memory_mib - NEW.memory_mib WHERE id = NEW.project_id;
    END`.execute(h.store.db);
    try {
      await assert.rejects(h.services.sandboxes.create(h.admin, { image: { base: 'busybox' } }), (err: unknown) => {
        assert.ok(err instanceof DsecError && err.code === 'UNAVAILABLE', String(err));
        assert.match(err.message, /settled by another replica/);
        return true;
      });
    } finally {
      await sql`DROP TRIGGER settle_elsewhere`.execute(h.store.db);
    }
    assert.deepEqual(await held(), before, 'no sandbox answered without a row, and the quota not given back twice');
  });

  test("on a shared store, a replica's reservations without a row come back to nothing on every path", async () => {
    // Each create reserves (+1 for this replica), its row takes the reservation over (-1), a
    // failed create's row deleted hands it back (+1) and the give-back ends it (-1).
    const reservations = () => h.store.db.selectFrom('replica_reservations').selectAll().execute();
    const setQuota = (n: number) => h.store.db.updateTable('projects').set({ quota_sandboxes: n }).where('id', '=', h.admin.projectId).execute();
    const quota = (await h.store.project(h.admin.projectId))!.quota_sandboxes;
    h.store.sessionTag = 'replica-under-test';
    try {
      await sql`CREATE TRIGGER refuse_insert BEFORE INSERT ON sandboxes BEGIN SELECT RAISE(ABORT, 'insert refused by the test'); END`.execute(h.store.db);
      await assert.rejects(create(), /insert refused by the test/);
      await sql`DROP TRIGGER refuse_insert`.execute(h.store.db);
      assert.deepEqual(await reservations(), [], 'the insert failed');

      h.edge.failNext.set('create', new Error('node refused by the test'));
      await assert.rejects(create(), /node refused by the test/);
      assert.deepEqual(await reservations(), [], 'the node refused');

      await sql`CREATE TRIGGER refuse_running BEFORE UPDATE OF state ON sandboxes WHEN NEW.state = 'running' BEGIN SELECT RAISE(ABORT, 'running refused by the test'); END`.execute(
        h.store.db,
      );
      await assert.rejects(create(), /running refused by the test/);
      await sql`DROP TRIGGER refuse_running`.execute(h.store.db);
      assert.deepEqual(await reservations(), [], 'the move to running failed');

      await setQuota((await h.store.project(h.admin.projectId))!.used_sandboxes);
      await assert.rejects(create(), (err: Error & { code?: string }) => err.code === 'QUOTA_EXCEEDED');
      await setQuota(quota);
      assert.deepEqual(await reservations(), [], 'the quota refused');

      const sb = await create();
      assert.equal((await h.store.sandboxOnly(sb.id))?.replica, null, 'running: no replica tag');
      assert.deepEqual(await reservations(), [], 'the row holds the reservation');
      await h.services.lifecycle.destroy(h.admin, sb.id, { wait: true });
      assert.deepEqual(await reservations(), []);
    } finally {
      h.store.sessionTag = undefined;
      await sql`DROP TRIGGER IF EXISTS refuse_insert`.execute(h.store.db);
      await sql`DROP TRIGGER IF EXISTS refuse_running`.execute(h.store.db);
      await setQuota(quota);
      h.edge.failNext.delete('create');
    }
  });
});
