// The lease pass's sweep of abandoned deletes: a `stopping` row that no teardown of this process
// owns (its replica died between the claim and the row's delete) is finished after a bound, its
// quota returned once; a row this process is tearing down is left to its teardown.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { DsecError } from '@dsec/protocol';
import { harness } from '../testing/harness.js';
import type { Harness } from '../testing/harness.js';

describe('abandoned `stopping` rows', () => {
  let h: Harness;
  before(async () => {
    h = await harness();
  });
  after(async () => h.close());

  const usage = async () => (await h.store.project(h.admin.projectId))?.used_sandboxes;
  const create = async () => (await h.services.sandboxes.create(h.admin, { image: { base: 'busybox' } })).id;

  test('a row left stopping is finished after the bound, once; one torn down here is not touched', async () => {
    const left = await create();
    const mine = await create();
    assert.equal(await usage(), 2);
    // A replica's claim, committed, and then nothing more (it crashed).
    assert.equal(await h.store.transitionSandbox(left, ['running'], 'stopping'), true);
    const leftRow = (await h.store.sandboxOnly(left))!;
    // This process's own delete, answered and held on the node.
    const original = h.edge.destroy.bind(h.edge);
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    h.edge.destroy = async (id, opts) => {
      if (id === mine) await held;
      return original(id, opts);
    };
    try {
      await h.services.lifecycle.destroy(h.admin, mine, { wait: false });
      assert.equal((await h.store.sandboxOnly(mine))?.state, 'stopping');
      const bound = 1000;
      const t0 = Date.now();
      assert.deepEqual(await h.services.lifecycle.finishAbandonedStopping(undefined, t0, bound), [], 'first seen: not yet');
      assert.deepEqual(await h.services.lifecycle.finishAbandonedStopping(undefined, t0 + bound - 1, bound), [], 'within the bound');
      // Two passes at once (as two replicas would run them): one finishes it.
      const passes = await Promise.all([
        h.services.lifecycle.finishAbandonedStopping(undefined, t0 + bound, bound),
        h.services.lifecycle.finishAbandonedStopping(undefined, t0 + bound, bound),
      ]);
      assert.deepEqual(passes.flat(), [left]);
      assert.equal(await h.store.sandboxOnly(left), undefined);
      assert.equal(h.edge.sandboxes.has(left), false, 'destroyed on its node');
      assert.equal(await usage(), 1, 'its quota returned once; the one torn down here still holds its own');
      assert.equal(h.raised.filter((e) => e.kind === 'sandbox.deleted' && e.sandboxId === left).length, 1);
      assert.equal((await h.store.sandboxOnly(mine))?.state, 'stopping', 'the row torn down here is not taken');
      assert.equal(h.edge.sandboxes.has(mine), true);
      assert.deepEqual(await h.services.lifecycle.finishAbandonedStopping(undefined, t0 + 10 * bound, bound), []);
    } finally {
      release();
      await h.services.lifecycle.teardownsIdle();
      h.edge.destroy = original;
    }
    assert.equal(await h.store.sandboxOnly(mine), undefined);
    assert.equal(await usage(), 0);
    assert.equal(await h.store.deleteSandbox(leftRow), false, 'a second delete of the row returns nothing');
    assert.equal(await usage(), 0);
  });

  test('of two deletes of one row at once, the loser does not unmark the winner', async () => {
    const id = await create();
    const original = h.edge.destroy.bind(h.edge);
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    h.edge.destroy = async (sid, opts) => {
      await held;
      return original(sid, opts);
    };
    try {
      const both = await Promise.allSettled([
        h.services.lifecycle.destroy(h.admin, id, { wait: false }),
        h.services.lifecycle.destroy(h.admin, id, { wait: false }),
      ]);
      assert.deepEqual(both.map((r) => r.status).sort(), ['fulfilled', 'rejected']);
      const t0 = Date.now();
      await h.services.lifecycle.finishAbandonedStopping(undefined, t0, 10);
      assert.deepEqual(await h.services.lifecycle.finishAbandonedStopping(undefined, t0 + 10, 10), []);
      assert.equal((await h.store.sandboxOnly(id))?.state, 'stopping');
    } finally {
      release();
      await h.services.lifecycle.teardownsIdle();
      h.edge.destroy = original;
    }
    assert.equal(await h.store.sandboxOnly(id), undefined);
    assert.equal(await usage(), 0);
  });

  test('a row whose sandbox the node no longer has (SANDBOX_NOT_FOUND) is finished all the same', async () => {
    const id = await create();
    assert.equal(await h.store.transitionSandbox(id, ['running'], 'stopping'), true);
    h.edge.sandboxes.delete(id);
    const original = h.edge.destroy.bind(h.edge);
    h.edge.destroy = async (sid) => {
      throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${sid} not found`);
    };
    try {
      const t0 = Date.now();
      await h.services.lifecycle.finishAbandonedStopping(undefined, t0, 10);
      assert.deepEqual(await h.services.lifecycle.finishAbandonedStopping(undefined, t0 + 10, 10), [id]);
    } finally {
      h.edge.destroy = original;
    }
    assert.equal(await h.store.sandboxOnly(id), undefined);
    assert.equal(await usage(), 0);
  });

  test("a node's recount counts its `stopping` rows; their teardown and the pass that finishes an abandoned one give them back", async () => {
    const node = h.services.nodes.get(h.edge.nodeName)!;
    const torn = await create();
    const left = await create();
    assert.equal(await h.store.transitionSandbox(left, ['running'], 'stopping'), true);
    const original = h.edge.destroy.bind(h.edge);
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    h.edge.destroy = async (id, opts) => {
      if (id === torn) await held;
      return original(id, opts);
    };
    try {
      await h.services.lifecycle.destroy(h.admin, torn, { wait: false });
      await h.services.nodeAdmin.reconcile(node);
      assert.equal(node.allocated.sandboxes, 2, 'both teardowns still hold the node');
      const memory = node.allocated.memoryMiB;
      assert.ok(memory > 0);
      const t0 = Date.now();
      await h.services.lifecycle.finishAbandonedStopping(undefined, t0, 10);
      assert.deepEqual(await h.services.lifecycle.finishAbandonedStopping(undefined, t0 + 10, 10), [left]);
      assert.equal(node.allocated.sandboxes, 1, 'the abandoned row gave its share back');
      assert.equal(node.allocated.memoryMiB, memory / 2);
    } finally {
      release();
      await h.services.lifecycle.teardownsIdle();
      h.edge.destroy = original;
    }
    assert.equal(node.allocated.sandboxes, 0, 'the teardown gave its share back');
    assert.equal(node.allocated.memoryMiB, 0);
    assert.equal(node.allocated.cpu, 0);
  });

  test('the recount at start counts `stopping` rows as recounted: the pass that finishes an abandoned one gives its share back', async () => {
    const node = h.services.nodes.get(h.edge.nodeName)!;
    const left = await create();
    assert.equal(await h.store.transitionSandbox(left, ['running'], 'stopping'), true);
    // A restart: the allocation is rebuilt from the rows alone.
    h.services.nodes.setAllocated(node.name, { cpu: 0, memoryMiB: 0, sandboxes: 0 }, new Map(), 0, new Map());
    await h.services.lifecycle.loadAllocations(true);
    assert.equal(node.allocated.sandboxes, 1, 'the row being deleted still holds the node');
    assert.ok(node.allocated.memoryMiB > 0 && node.allocated.cpu > 0);
    const t0 = Date.now();
    await h.services.lifecycle.finishAbandonedStopping(undefined, t0, 10);
    assert.deepEqual(await h.services.lifecycle.finishAbandonedStopping(undefined, t0 + 10, 10), [left]);
    // Before the fix the share stayed: 1 sandbox and its memory counted on the node for good.
    assert.deepEqual(node.allocated, { cpu: 0, memoryMiB: 0, sandboxes: 0 });
  });

  test('a create in flight at a recount, then lost, gives its share back once when deleted', async () => {
    const node = h.services.nodes.get(h.edge.nodeName)!;
    const other = await create();
    const original = h.edge.create.bind(h.edge);
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    let started!: () => void;
    const inFlight = new Promise<void>((r) => (started = r));
    h.edge.create = async (spec, opts) => {
      started();
      await held;
      return original(spec, opts);
    };
    let id: string;
    try {
      const creating = create();
      await inFlight;
      // The node's session opens while the create is under way: its `creating` row is counted.
      await h.services.nodeAdmin.reconcile(node);
      assert.equal(node.allocated.sandboxes, 2);
      release();
      id = await creating;
    } finally {
      release();
      h.edge.create = original;
    }
    const one = { cpu: node.allocated.cpu / 2, memoryMiB: node.allocated.memoryMiB / 2, sandboxes: 1 };
    // The watcher finds it missing from its node: lost, its share given back.
    assert.equal(await h.services.nodeAdmin.sandboxLost(id), true);
    assert.deepEqual(node.allocated, one);
    await h.services.lifecycle.destroy(h.admin, id, { wait: true });
    assert.deepEqual(node.allocated, one, 'the lost row gave nothing back a second time');
    await h.services.lifecycle.destroy(h.admin, other, { wait: true });
    assert.deepEqual(node.allocated, { cpu: 0, memoryMiB: 0, sandboxes: 0 });
  });
});
