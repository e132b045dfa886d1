import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { ROOT_PROJECT_ID } from './db/store.js';
import { hashOf } from './idempotency.js';
import { NodeRegistry } from './nodes.js';
import { GoneReplicas, reconcileAtStart, reconcileGoneReplica, reconcileOwnNodes, reconcileWasClean } from './reconcile.js';
import { harness } from './testing/harness.js';
import type { Harness } from './testing/harness.js';

describe('reconcile at start (fake node, real store)', () => {
  let h: Harness;
  before(async () => {
    h = await harness();
  });
  after(async () => h.close());

  const reconcile = () =>
    reconcileAtStart({
      store: h.store,
      nodes: h.services.nodes,
      log: () => undefined,
      toSandbox: (row) => h.services.lifecycle.toSandbox(row),
      rowEvents: h.services.lifecycle.rowEvents,
    });
  const create = async (labels: Record<string, string> = {}) => (await h.services.sandboxes.create(h.admin, { image: { base: 'busybox' }, labels })).id;
  const used = async () => (await h.store.project(ROOT_PROJECT_ID))!.used_sandboxes;

  test('rows a crash left in every transitional state end final, orphans go, usage and keys are recomputed', async () => {
    const { store, edge } = h;
    const [creating, stopping, pausing, resuming, vanished, paused, kept] = await Promise.all(Array.from({ length: 7 }, () => create()));
    // A crash in each pipeline leaves the row where that pipeline was.
    await store.setSandboxState(creating!, 'creating');
    await store.setSandboxState(stopping!, 'stopping');
    await store.setSandboxState(pausing!, 'pausing');
    await edge.pause(pausing!);
    await store.setSandboxState(resuming!, 'resuming');
    await edge.pause(resuming!);
    await store.setSandboxState(paused!, 'paused');
    edge.sandboxes.delete(vanished!);
    // A sandbox on the node with no row (its row's insert never committed), and a pooled row whose node lost it.
    await edge.create({ image: { base: 'busybox' } }, { id: 'node-orphan' });
    const pooled = await create();
    await store.setSandboxState(pooled, 'pooled');
    await store.db.updateTable('sandboxes').set({ pool_id: 'pool_gone' }).where('id', '=', pooled).execute();
    edge.sandboxes.delete(pooled);
    // A reservation whose row a crash never wrote, and a key of a request that died.
    await store.reserve(ROOT_PROJECT_ID, { sandboxes: 3, cpu: 3, memoryMiB: 3 });
    await store.acquireIdempotencyKey({ projectId: ROOT_PROJECT_ID, key: 'k1', requestHash: 'h', ttlMs: 60_000 });
    await new Promise((r) => setTimeout(r, 5));
    // What the log buffers is written before a crash (a process that starts has nothing buffered).
    await h.services.trajectory.flush();

    const mark = h.raised.length;
    const report = await reconcile();
    const to = new Map(report.settled.map((s) => [s.id, s.to]));
    // A live list (the dashboard's) follows the rows through their events, as the services raise them.
    const rowEvents = new Map(
      h.raised
        .slice(mark)
        .filter((e) => e.kind.startsWith('sandbox.'))
        .map((e) => [
          e.sandboxId,
          [e.kind, e.data?.['state'], e.data?.['from']]
            .filter((x) => x !== undefined)
            .map(String)
            .join(' '),
        ]),
    );
    assert.deepEqual(
      Object.fromEntries(rowEvents),
      {
        [creating!]: 'sandbox.deleted creating',
        [stopping!]: 'sandbox.deleted stopping',
        [pausing!]: 'sandbox.state-changed running pausing',
        [resuming!]: 'sandbox.state-changed running resuming',
        [vanished!]: 'sandbox.state-changed lost running',
        [paused!]: 'sandbox.state-changed running paused',
      },
      'every settled row but the pool member raises its event',
    );
    assert.equal(to.get(creating!), 'deleted');
    assert.equal(to.get(stopping!), 'deleted');
    assert.equal(to.get(pausing!), 'running');
    assert.equal(to.get(resuming!), 'running');
    assert.equal(to.get(vanished!), 'lost');
    assert.equal(to.get(paused!), 'running', 'the node runs it: the row follows');
    assert.equal(to.get(pooled), 'deleted');
    assert.equal(to.has(kept!), false, 'a consistent row is left alone');
    assert.deepEqual(report.orphans, ['node-orphan']);
    assert.equal(report.idempotencyKeys, 1);
    assert.ok(report.usage.some((u) => u.projectId === ROOT_PROJECT_ID));

    assert.equal(edge.sandboxes.has(creating!), false, 'a create cut short is rolled back on the node');
    assert.equal(edge.sandboxes.has(stopping!), false);
    assert.equal(edge.sandboxes.has('node-orphan'), false);
    assert.equal(edge.sandboxes.get(pausing!)?.state, 'running');
    assert.equal(edge.sandboxes.get(resuming!)?.state, 'running');
    const rows = await store.allSandboxes();
    assert.equal(await used(), rows.length, 'usage equals the rows');
    assert.ok(rows.every((r) => ['running', 'lost'].includes(r.state)));

    // Every row left can be deleted, and a second reconcile has nothing to do.
    for (const r of rows) await h.services.lifecycle.destroyRow(r);
    assert.equal(await used(), 0);
    assert.equal(edge.sandboxes.size, 0);
    await h.services.trajectory.flush();
    const again = await reconcile();
    assert.ok(reconcileWasClean(again), JSON.stringify(again));
  });

  test('a node that does not answer leaves its rows as they are', async () => {
    const id = await create();
    await h.store.setSandboxState(id, 'creating');
    const list = h.edge.list.bind(h.edge);
    h.edge.list = () => Promise.reject(new Error('unreachable'));
    try {
      const report = await reconcile();
      assert.deepEqual(report.unreachable, [h.services.nodes.all()[0]!.name]);
      assert.equal((await h.store.sandboxOnly(id))?.state, 'creating');
    } finally {
      h.edge.list = list;
    }
    await reconcile();
    assert.equal(await h.store.sandboxOnly(id), undefined);
    assert.equal(await used(), 0);
  });

  test('a key whose sandbox stands is settled with it (a retry gets it); one whose sandbox went is dropped', async () => {
    const { store } = h;
    const req = { image: { base: 'busybox' }, labels: { k: 'v' } };
    // Two creates that died after their row was written with the key's id: one sandbox stands,
    // the other's create was cut short (its row rolled back by the reconcile).
    const standing = await create({ k: 'v' });
    const cut = await create({ k: 'v' });
    await store.setSandboxState(cut, 'creating');
    for (const [key, id] of [
      ['stands', standing],
      ['cut', cut],
    ] as const) {
      await store.acquireIdempotencyKey({ projectId: ROOT_PROJECT_ID, key, requestHash: hashOf(req), ttlMs: 60_000 });
      await store.db.updateTable('idempotency_keys').set({ sandbox_id: id }).where('key', '=', key).execute();
    }
    await new Promise((r) => setTimeout(r, 5));
    const report = await reconcileAtStart({
      store,
      nodes: h.services.nodes,
      log: () => undefined,
      toSandbox: (row) => h.services.lifecycle.toSandbox(row),
    });
    assert.deepEqual(report.idempotencySettled, [`stands -> ${standing}`]);
    assert.equal(report.idempotencyKeys, 1);
    const again = await h.services.sandboxes.create(h.admin, req, { idempotencyKey: 'stands' });
    assert.equal(again.id, standing, 'the retry gets the standing sandbox');
    const other = await h.services.sandboxes.create(h.admin, req, { idempotencyKey: 'cut' });
    assert.notEqual(other.id, cut, 'a key whose create was rolled back creates anew');
    // Deleted later, the sandbox's first reply (recorded at the reconcile) still answers.
    await h.services.lifecycle.destroyRow((await store.sandboxOnly(standing))!);
    assert.equal((await h.services.sandboxes.create(h.admin, req, { idempotencyKey: 'stands' })).id, standing);
    await h.services.lifecycle.destroyRow((await store.sandboxOnly(other.id))!);
  });

  test('a pause or resume a crash cut short, settled when the allocations are loaded, raises its row event', async () => {
    const [pausing, resuming] = [await create(), await create()];
    await h.store.setSandboxState(pausing, 'pausing');
    await h.edge.pause(pausing);
    await h.store.setSandboxState(resuming, 'resuming');
    const mark = h.raised.length;
    await h.services.lifecycle.loadAllocations(true);
    const events = h.raised.slice(mark).map((e) => `${e.sandboxId} ${e.kind} ${String(e.data?.['state'])} ${String(e.data?.['from'])}`);
    assert.deepEqual(events.sort(), [`${pausing} sandbox.state-changed paused pausing`, `${resuming} sandbox.state-changed running resuming`].sort());
    for (const id of [pausing, resuming]) await h.services.lifecycle.destroyRow((await h.store.sandboxOnly(id))!);
  });

  test('beside live replicas, loading the allocations leaves a pause or resume under way to its replica', async () => {
    const [pausing, resuming] = [await create(), await create()];
    await h.store.setSandboxState(pausing, 'pausing');
    await h.edge.pause(pausing);
    await h.store.setSandboxState(resuming, 'resuming');
    const mark = h.raised.length;
    await h.services.lifecycle.loadAllocations(false);
    assert.deepEqual(h.raised.slice(mark), [], 'no row event');
    assert.equal((await h.store.sandboxOnly(pausing))?.state, 'pausing', 'not driven to a final state');
    assert.equal((await h.store.sandboxOnly(resuming))?.state, 'resuming');
    assert.equal(h.edge.sandboxes.get(pausing)?.state, 'paused', 'not resumed on its node');
    for (const id of [pausing, resuming]) {
      await h.store.setSandboxState(id, 'running');
      await h.services.lifecycle.destroyRow((await h.store.sandboxOnly(id))!);
    }
  });
});

describe("a gone replica's work, settled beside live replicas (fake node, real store)", () => {
  let h: Harness;
  before(async () => {
    h = await harness();
  });
  after(async () => h.close());

  const create = async () => (await h.services.sandboxes.create(h.admin, { image: { base: 'busybox' } })).id;
  const tag = (id: string, state: string, replica: string) => h.store.db.updateTable('sandboxes').set({ state, replica }).where('id', '=', id).execute();
  const row = async (id: string) => {
    const r = await h.store.sandboxOnly(id);
    return `${r?.state} ${r?.replica}`;
  };
  /** Settles replica `gone`'s work while `between` runs when its node is listed (after the rows were read). */
  const settle = async (between: () => Promise<void>, reachable: boolean) => {
    const list = h.edge.list.bind(h.edge);
    h.edge.list = async () => {
      await between();
      if (!reachable) throw new Error('unreachable');
      return list();
    };
    try {
      return await reconcileGoneReplica({ store: h.store, nodes: h.services.nodes, log: () => undefined }, 'gone');
    } finally {
      h.edge.list = list;
    }
  };
  const cleanUp = async (ids: string[]) => {
    for (const id of ids) {
      if (!(await h.store.sandboxOnly(id))) continue;
      await h.store.db.updateTable('sandboxes').set({ state: 'running', replica: null }).where('id', '=', id).execute();
      await h.services.lifecycle.destroyRow((await h.store.sandboxOnly(id))!);
    }
  };

  test('on a node it does not reach, a row a live replica took up again after the read is left alone', async () => {
    const [retaken, left, deleting] = [await create(), await create(), await create()];
    await tag(retaken, 'pausing', 'gone');
    await tag(left, 'pausing', 'gone');
    await tag(deleting, 'creating', 'gone');
    try {
      // A live replica settled `retaken` (running) and its user paused it again; `deleting` was
      // settled and is being deleted by that replica: both now tagged with the live one.
      const report = await settle(async () => {
        await tag(retaken, 'pausing', 'live');
        await tag(deleting, 'stopping', 'live');
      }, false);
      assert.deepEqual(report.settled, [{ id: left, from: 'pausing', to: 'failed' }]);
      assert.equal(await row(retaken), 'pausing live', 'the live pause is not failed');
      assert.equal(await row(deleting), 'stopping live', 'the live delete keeps its row');
      assert.equal(await row(left), 'failed null', 'out of an in-flight state, untagged');
    } finally {
      await cleanUp([retaken, left, deleting]);
    }
  });

  /** The fake node's allocation, and what its rows hold (as a recount counts them). */
  const allocation = async () => {
    const node = h.nodes.get(h.edge.nodeName)!;
    const held = { cpu: 0, memoryMiB: 0, sandboxes: 0 };
    for (const r of await h.store.sandboxesOnNodes([node.name])) {
      if (r.state === 'lost') continue;
      const share = h.services.lifecycle.shareOf(r);
      held.cpu += share.cpu;
      held.memoryMiB += share.memoryMiB;
      held.sandboxes += 1;
    }
    return { node, held };
  };

  test("a node's session recounts it as the start does: a pool's member and a failed row are counted and kept, a lost one destroyed", async () => {
    const [kept, pooled, failed, lost] = [await create(), await create(), await create(), await create()];
    const t = new Date().toISOString();
    const pool = {
      id: 'pool-recount',
      project_id: h.admin.projectId,
      name: 'recount',
      spec: '{}',
      resolved: '{}',
      spec_key: 'recount',
      size: 1,
      idle_timeout_ms: 60_000,
      last_used_at: t,
      created_at: t,
      updated_at: t,
    };
    await h.store.db.insertInto('pools').values(pool).execute();
    await h.store.db.updateTable('sandboxes').set({ state: 'pooled', pool_id: pool.id }).where('id', '=', pooled).execute();
    await h.store.db.updateTable('sandboxes').set({ state: 'failed' }).where('id', '=', failed).execute();
    await h.store.db.updateTable('sandboxes').set({ state: 'lost' }).where('id', '=', lost).execute();
    try {
      const { node, held } = await allocation();
      await h.services.nodeAdmin.reconcile(node);
      assert.deepEqual(node.allocated, held);
      assert.equal(held.sandboxes, 3, 'the running, pooled and failed rows');
      assert.ok(h.edge.sandboxes.has(pooled), "the pool's member is not destroyed (before: destroyed, its row still pooled)");
      assert.ok(h.edge.sandboxes.has(failed), 'the failed one waits for its delete');
      assert.equal(h.edge.sandboxes.has(lost), false, 'a lost one may run elsewhere: destroyed');
      // Deleting the failed row gives its share back once: the node holds what its rows hold
      // (before: the failed row was not counted, and its delete took the running one's share).
      await h.services.lifecycle.destroyRow((await h.store.sandboxOnly(failed))!);
      assert.deepEqual(node.allocated, (await allocation()).held);
    } finally {
      await h.store.db.updateTable('sandboxes').set({ pool_id: null }).where('id', '=', pooled).execute();
      await h.store.db.deleteFrom('pools').where('id', '=', pool.id).execute();
      await cleanUp([kept, pooled, failed, lost]);
    }
  });

  test("a start beside live replicas settles a gone replica's rows on its own node against it, destroys orphans, leaves the rest", async () => {
    const [pausing, claimed, mine, untagged, kept] = [await create(), await create(), await create(), await create(), await create()];
    await tag(pausing, 'pausing', 'gone');
    await h.edge.pause(pausing);
    // A create (a pool claim is one too) the gone replica had under way.
    await tag(claimed, 'creating', 'gone');
    // This process's own create under way, and an untagged one: not a gone replica's.
    await tag(mine, 'creating', 'self');
    await h.store.db.updateTable('sandboxes').set({ state: 'creating' }).where('id', '=', untagged).execute();
    await h.edge.create({ image: { base: 'busybox' } }, { id: 'sbx-orphan' });
    h.store.sessionTag = 'self';
    try {
      assert.deepEqual(await h.store.replicasWithoutSessions(), ['gone']);
      const report = await reconcileOwnNodes({ store: h.store, nodes: h.services.nodes, log: () => undefined });
      assert.deepEqual(Object.fromEntries(report.settled.map((s) => [s.id, `${s.from} -> ${s.to}`])), {
        [pausing]: 'pausing -> running',
        [claimed]: 'creating -> deleted',
      });
      assert.deepEqual(report.orphans, ['sbx-orphan']);
      assert.equal(h.edge.sandboxes.get(pausing)?.state, 'running', 'the pause cut short is undone on the node');
      assert.deepEqual([...h.edge.sandboxes.keys()].sort(), [pausing, mine, untagged, kept].sort());
      assert.equal(await row(mine), 'creating self', "this process's create is left to it");
      assert.equal(await row(untagged), 'creating null');
      assert.equal(await row(kept), 'running null');
      assert.equal(await row(pausing), 'running null');
      assert.deepEqual(await h.store.replicasWithoutSessions(), [], 'nothing of the gone replica left');
    } finally {
      h.store.sessionTag = undefined;
      await cleanUp([pausing, claimed, mine, untagged, kept]);
    }
  });

  test("settling a gone replica's rows on a node this replica reaches gives their shares back: the node holds what its rows hold", async () => {
    const [kept, vanished, rolled] = [await create(), await create(), await create()];
    await tag(vanished, 'pausing', 'gone');
    h.edge.sandboxes.delete(vanished);
    await tag(rolled, 'creating', 'gone');
    try {
      // The node's session opens here after the gone replica held it: its allocation is recounted.
      const { node } = await allocation();
      await h.services.nodeAdmin.reconcile(node);
      assert.equal(node.allocated.sandboxes, 3);
      const gone = new GoneReplicas(
        { store: h.store, nodes: h.services.nodes, log: () => undefined },
        (r, to) => h.services.lifecycle.settledElsewhere(r, to),
        1000,
      );
      const t0 = Date.now();
      assert.deepEqual(await gone.pass(t0), [], 'first seen: not yet');
      assert.deepEqual(await gone.pass(t0 + 1000), ['gone']);
      assert.equal(await row(vanished), 'lost null');
      assert.equal(await h.store.sandboxOnly(rolled), undefined);
      const { held } = await allocation();
      assert.deepEqual(held.sandboxes, 1);
      // Before the fix the lost row's share stayed: 2 sandboxes counted against 1.
      assert.deepEqual(node.allocated, held);
      // Deleting the lost row gives nothing back a second time.
      await h.services.lifecycle.destroyRow((await h.store.sandboxOnly(vanished))!);
      assert.deepEqual(node.allocated, held);
    } finally {
      await cleanUp([kept, vanished, rolled]);
    }
  });

  test("a gone replica's rows settled by a replica without the node: the one that reaches it gives their shares back in its lease pass", async () => {
    const [kept, deleting, rolled] = [await create(), await create(), await create()];
    await tag(deleting, 'stopping', 'gone');
    await tag(rolled, 'creating', 'gone');
    try {
      const { node } = await allocation();
      await h.services.nodeAdmin.reconcile(node);
      assert.equal(node.allocated.sandboxes, 3);
      // Another replica, which does not reach the node, settles them in the store alone.
      const elsewhere = await reconcileGoneReplica({ store: h.store, nodes: new NodeRegistry(), log: () => undefined }, 'gone');
      assert.deepEqual(elsewhere.settled.map((x) => x.to).sort(), ['deleted', 'deleted']);
      assert.equal(node.allocated.sandboxes, 3, 'nothing here saw them go');
      assert.deepEqual((await h.services.lifecycle.giveBackEndedElsewhere()).sort(), [deleting, rolled].sort());
      const { held } = await allocation();
      assert.deepEqual(node.allocated, held);
      assert.equal(held.sandboxes, 1);
      assert.deepEqual(await h.services.lifecycle.giveBackEndedElsewhere(), [], 'once');
      assert.deepEqual(h.services.nodes.recounted(), []);
    } finally {
      await cleanUp([kept, deleting, rolled]);
    }
  });

  test('a row a live replica took up again between the read and the settle is not acted on at its node', async () => {
    const [paused, finished] = [await create(), await create()];
    await tag(paused, 'pausing', 'gone');
    await h.edge.pause(paused);
    await tag(finished, 'creating', 'gone');
    try {
      // A live replica pauses `paused` again; `finished`'s replica, only cut off, finished its create.
      const report = await settle(async () => {
        await tag(paused, 'pausing', 'live');
        await h.store.db.updateTable('sandboxes').set({ state: 'running', replica: null }).where('id', '=', finished).execute();
      }, true);
      assert.deepEqual(report.settled, []);
      // Before the fix the settle resumed the live pause on the node and destroyed the finished sandbox.
      assert.equal(h.edge.sandboxes.get(paused)?.state, 'paused', 'not resumed under the live pause');
      assert.equal(h.edge.sandboxes.has(finished), true, 'not destroyed');
      assert.equal(await row(paused), 'pausing live');
      assert.equal(await row(finished), 'running null');
    } finally {
      await cleanUp([paused, finished]);
    }
  });

  test('on a node it reaches, a row a live replica took up again after the read is left alone', async () => {
    const [retaken, left] = [await create(), await create()];
    await tag(retaken, 'resuming', 'gone');
    await tag(left, 'resuming', 'gone');
    try {
      const report = await settle(() => tag(retaken, 'pausing', 'live').then(() => undefined), true);
      assert.deepEqual(report.settled, [{ id: left, from: 'resuming', to: 'running' }]);
      assert.equal(await row(retaken), 'pausing live');
      assert.equal(await row(left), 'running null');
    } finally {
      await cleanUp([retaken, left]);
    }
  });
});
