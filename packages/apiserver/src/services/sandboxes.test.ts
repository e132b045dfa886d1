import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { DsecError } from '@dsec/protocol';
import type { EdgeCallOptions, EdgeSandbox, SandboxSpec } from '@dsec/protocol';
import { FakeEdge } from '../testing/fake-edge.js';
import { harness } from '../testing/harness.js';
import type { Harness } from '../testing/harness.js';
import { BATCH_CREATES_IN_FLIGHT } from './sandboxes.js';

describe('sandboxes and their lifecycle (fake node, real store)', () => {
  let h: Harness;
  before(async () => {
    h = await harness();
  });
  after(async () => h.close());

  test('a create resolves the layer name, charges the node and opens a trajectory; destroy gives it all back', async () => {
    const { sandboxes, lifecycle, nodes, trajectories } = h.services;
    const sb = await sandboxes.create(h.admin, { image: { base: 'busybox' }, labels: { run: 'a' } });
    assert.equal(sb.state, 'running');
    assert.match(sb.layers[0] ?? '', /^sha256:[0-9a-f]{64}$/, 'the name resolved to its digest');
    assert.ok(h.edge.sandboxes.has(sb.id), 'created on the node');
    const node = nodes.all()[0]!;
    assert.equal(node.allocated.sandboxes, 1);
    assert.equal((await trajectories.get(h.admin, sb.id, {})).sandboxState, 'running');
    await lifecycle.destroy(h.admin, sb.id);
    assert.equal(node.allocated.sandboxes, 0);
    assert.equal(h.edge.sandboxes.has(sb.id), false);
    await assert.rejects(sandboxes.get(h.admin, sb.id), (err: unknown) => err instanceof DsecError && err.code === 'SANDBOX_NOT_FOUND');
    assert.equal(h.services.counters.sandboxesDestroyed, 1);
  });

  test('an unknown layer is LAYER_NOT_FOUND naming the field, and nothing is left behind', async () => {
    const before = h.edge.sandboxes.size;
    await assert.rejects(
      h.services.sandboxes.create(h.admin, { image: { base: 'nope' } }),
      (err: unknown) => err instanceof DsecError && err.code === 'LAYER_NOT_FOUND' && err.details.field === 'image.base',
    );
    assert.equal(h.edge.sandboxes.size, before);
  });

  test('a node that fails the create leaves no row and no charge', async () => {
    h.edge.failNext.set('create', new Error('disk on fire'));
    await assert.rejects(h.services.sandboxes.create(h.admin, { image: { base: 'busybox' } }), /disk on fire/);
    assert.equal(h.services.nodes.all()[0]!.allocated.sandboxes, 0);
    assert.equal((await h.services.sandboxes.list(h.admin, {})).items.length, 0);
  });

  test('a batch reports a bad item alone and creates the others', async () => {
    const bad = new DsecError('INVALID_ARGUMENT', 'items.1.image: broken', { field: 'items.1.image' });
    const result = await h.services.sandboxes.createBatch(
      h.admin,
      { items: [{ image: { base: 'busybox' } }, {}, { image: { base: 'busybox' } }] },
      {},
      new Map([[1, bad]]),
    );
    assert.equal(result.created, 2);
    assert.equal(result.failed, 1);
    assert.equal(result.items[1]?.error?.code, 'INVALID_ARGUMENT');
    for (const item of result.items) if (item.sandbox) await h.services.lifecycle.destroy(h.admin, item.sandbox.id);
  });

  test('a batch item that fails for an unknown reason reads as a generic INTERNAL; the detail goes to the log', async () => {
    h.edge.failNext.set('create', new Error('secret detail'));
    const result = await h.services.sandboxes.createBatch(h.admin, { spec: { image: { base: 'busybox' } }, count: 1 });
    assert.deepEqual(result.items[0]?.error, { code: 'INTERNAL', message: 'internal error' });
    assert.ok(h.logged.some((l) => l.includes('secret detail')));
  });

  test('pause gives the CPU back, a request on an auto-resume lease resumes it', async () => {
    const { sandboxes, lifecycle, nodes } = h.services;
    const sb = await sandboxes.create(h.admin, { image: { base: 'busybox' }, resources: { cpu: 1 } });
    const node = nodes.all()[0]!;
    const cpuBefore = node.allocated.cpu;
    const paused = await lifecycle.pause(h.admin, sb.id);
    assert.equal(paused.sandbox.state, 'paused');
    assert.ok(node.allocated.cpu < cpuBefore);
    const routed = await lifecycle.route(h.admin, sb.id);
    assert.equal(routed.row.state, 'running', 'resumed by the request');
    assert.equal(node.allocated.cpu, cpuBefore);
    await lifecycle.destroy(h.admin, sb.id);
  });

  test('pause with memory "file" of a paused sandbox asks its node (400 naming memory where the backend cannot); "keep" does not', async () => {
    const { sandboxes, lifecycle } = h.services;
    const sb = await sandboxes.create(h.admin, { image: { base: 'busybox' } });
    await lifecycle.pause(h.admin, sb.id);
    const cannot = new DsecError('INVALID_ARGUMENT', "memory: the container backend cannot write a paused sandbox's memory to a file", { field: 'memory' });
    h.edge.failNext.set('pause', cannot);
    const kept = await lifecycle.pause(h.admin, sb.id, { memory: 'keep' });
    assert.equal(kept.sandbox.state, 'paused');
    assert.equal(h.edge.failNext.get('pause'), cannot, 'a pause with memory kept of a paused sandbox never reaches the node');
    await assert.rejects(
      lifecycle.pause(h.admin, sb.id, { memory: 'file' }),
      (err: unknown) => err instanceof DsecError && err.code === 'INVALID_ARGUMENT' && err.details.field === 'memory',
    );
    assert.equal((await sandboxes.get(h.admin, sb.id)).state, 'paused', 'still paused');
    await lifecycle.destroy(h.admin, sb.id);
  });

  test('an owner that stops its heartbeats is lost (owner.lost) and its idle sandbox is paused', async () => {
    const { owners, sandboxes, lifecycle } = h.services;
    const owner = await owners.create(h.admin, { graceMs: 1000 });
    const sb = await sandboxes.create(h.admin, { image: { base: 'busybox' }, owner: owner.id, lease: { ownerGraceMs: 1000 } });
    await lifecycle.enforceLeases(undefined, Date.now() + 5000);
    assert.ok(h.raised.some((e) => e.kind === 'owner.lost'));
    assert.equal((await sandboxes.get(h.admin, sb.id)).state, 'paused');
    await owners.heartbeat(h.admin, owner.id);
    assert.equal((await sandboxes.get(h.admin, sb.id)).state, 'running', 'the returning owner resumes it');
    await lifecycle.destroy(h.admin, sb.id);
  });

  test('the lease pass skips a sandbox until its idle timeout can be due, then pauses it; a shorter timeout set meanwhile counts at once', async () => {
    const { sandboxes, lifecycle } = h.services;
    const t0 = Date.now();
    const a = await sandboxes.create(h.admin, { image: { base: 'busybox' }, lease: { idleTimeoutMs: 60_000 } });
    const b = await sandboxes.create(h.admin, { image: { base: 'busybox' }, lease: { idleTimeoutMs: 60_000 } });
    const looked = async (at: number): Promise<string[]> => (await h.store.runningLeases(at)).map((l) => l.id).filter((id) => id === a.id || id === b.id);
    assert.deepEqual(await looked(t0 + 1000), [], 'not looked at before their timeout can be due');
    await lifecycle.enforceLeases(undefined, t0 + 1000);
    assert.equal((await sandboxes.get(h.admin, a.id)).state, 'running');
    await sandboxes.update(h.admin, b.id, { lease: { idleTimeoutMs: 1000 } });
    await lifecycle.enforceLeases(undefined, Date.now() + 2000);
    assert.equal((await sandboxes.get(h.admin, b.id)).state, 'paused', 'the shorter timeout set by PATCH was not hidden by the deferred check');
    assert.equal((await sandboxes.get(h.admin, a.id)).state, 'running');
    await lifecycle.enforceLeases(undefined, Date.now() + 61_000);
    assert.equal((await sandboxes.get(h.admin, a.id)).state, 'paused', 'paused once its timeout came');
    await lifecycle.destroy(h.admin, a.id);
    await lifecycle.destroy(h.admin, b.id);
  });

  test("onExpire 'pause': a lost or failed row past its lifetime is destroyed (its quota freed); a paused one is kept", async () => {
    const { sandboxes, lifecycle } = h.services;
    const lease = { maxLifetimeMs: 600_000, onExpire: 'pause' as const };
    const past = new Date(Date.now() - 1000).toISOString();
    const kept = await sandboxes.create(h.admin, { image: { base: 'busybox' }, lease });
    await lifecycle.pause(h.admin, kept.id);
    await h.store.updateSandbox(kept.id, { expires_at: past });
    await lifecycle.expireRow((await h.store.sandbox(kept.id))!);
    assert.equal((await sandboxes.get(h.admin, kept.id)).state, 'paused', 'kept paused');
    for (const dead of ['lost', 'failed']) {
      const sb = await sandboxes.create(h.admin, { image: { base: 'busybox' }, lease });
      assert.ok(await h.store.transitionSandbox(sb.id, ['running'], dead, { expires_at: past }));
      await lifecycle.expireRow((await h.store.sandbox(sb.id))!);
      assert.equal(await h.store.sandbox(sb.id), undefined, `a ${dead} row is destroyed`);
    }
    await lifecycle.destroy(h.admin, kept.id);
  });

  test("onExpire 'pause': each resume after the lifetime ended renews the span granted at creation; none past the longest lifetime", async () => {
    const { sandboxes, lifecycle } = h.services;
    const spanMs = 600_000;
    const sb = await sandboxes.create(h.admin, { image: { base: 'busybox' }, lease: { maxLifetimeMs: spanMs, onExpire: 'pause' } });
    const expireAndResume = async (ageMs: number): Promise<number> => {
      const created = Date.now() - ageMs;
      // The row as the watcher leaves it: created `ageMs` ago, its lifetime ended, paused.
      assert.ok(await h.store.transitionSandbox(sb.id, ['running'], 'running', { created_at: new Date(created).toISOString() }));
      await h.store.updateSandbox(sb.id, { expires_at: new Date(Date.now() - 1000).toISOString() });
      await lifecycle.pause(h.admin, sb.id);
      const before = Date.now();
      const resumed = await lifecycle.resume(h.admin, sb.id, {});
      assert.equal(resumed.sandbox.state, 'running');
      return Date.parse(resumed.sandbox.expiresAt) - before;
    };
    for (const ageMs of [3_600_000, 7_200_000, 18_000_000]) {
      const leftMs = await expireAndResume(ageMs);
      assert.ok(leftMs > spanMs - 60_000 && leftMs <= spanMs + 1000, `resumed at ${ageMs} ms of age: ${leftMs} ms left, not ${spanMs}`);
    }
    // A PATCH of the lifetime (E2B's setTimeout) does not become the renewed span.
    await sandboxes.update(h.admin, sb.id, { lease: { maxLifetimeMs: 36_000_000 } });
    const leftMs = await expireAndResume(30_000_000);
    assert.ok(leftMs > spanMs - 60_000 && leftMs <= spanMs + 1000, `after a PATCH: ${leftMs} ms left, not ${spanMs}`);
    assert.equal('renewMs' in (await sandboxes.get(h.admin, sb.id)).lease, false, 'the stored span stays out of the API');

    // Past the longest lifetime (7 days from creation) a resume is refused and the sandbox stays paused.
    await assert.rejects(expireAndResume(8 * 86_400_000), (err: unknown) => err instanceof DsecError && err.code === 'SANDBOX_NOT_RUNNING');
    assert.equal((await sandboxes.get(h.admin, sb.id)).state, 'paused');
    assert.equal(h.edge.sandboxes.get(sb.id)?.state, 'paused', 'the node was not asked to resume it');
    await lifecycle.destroy(h.admin, sb.id);
  });
});

describe('batch creates over several nodes', () => {
  /** Creates running at once on all counting nodes. */
  const all = { running: 0, most: 0 };
  /** A node that counts the creates it runs at once (each takes 5 ms). */
  class CountingEdge extends FakeEdge {
    running = 0;
    most = 0;
    override async create(spec: SandboxSpec, opts: EdgeCallOptions & { id?: string } = {}): Promise<EdgeSandbox> {
      this.most = Math.max(this.most, ++this.running);
      all.most = Math.max(all.most, ++all.running);
      try {
        await new Promise((r) => setTimeout(r, 5));
        return await super.create(spec, opts);
      } finally {
        this.running--;
        all.running--;
      }
    }
  }

  test('a batch runs its concurrency on each node at once, never more on one node', async () => {
    const a = new CountingEdge('a');
    const b = new CountingEdge('b');
    const h = await harness();
    try {
      // The harness's own node leaves: the batch goes to a and b.
      h.nodes.remove(h.edge.nodeName);
      for (const e of [a, b]) {
        for (const l of h.edge.layerInfos.values()) e.layerInfos.set(l.digest, l);
        h.nodes.add(e);
      }
      const spec = { image: { base: 'busybox' }, resources: { cpu: 0.1, memoryMiB: 32 } };
      const result = await h.services.sandboxes.createBatch(h.admin, { spec, count: 40 }, { concurrency: 3 });
      assert.equal(result.created, 40);
      assert.ok(a.sandboxes.size > 0 && b.sandboxes.size > 0, `spread over both nodes (${a.sandboxes.size} and ${b.sandboxes.size})`);
      assert.equal(a.most, 3, 'node a ran 3 creates at once, no more');
      assert.equal(b.most, 3, 'node b ran 3 creates at once, no more');
    } finally {
      await h.close();
    }
  });

  test('the placed creates of a batch over many nodes stay under the replica-wide bound', async () => {
    const nodes = Array.from({ length: 20 }, (_, i) => new CountingEdge(`n${i}`));
    const h = await harness();
    try {
      h.nodes.remove(h.edge.nodeName);
      for (const e of nodes) {
        for (const l of h.edge.layerInfos.values()) e.layerInfos.set(l.digest, l);
        h.nodes.add(e);
      }
      all.most = 0;
      // 20 nodes x 16 on each could be 320 at once.
      const spec = { image: { base: 'busybox' }, resources: { cpu: 0.1, memoryMiB: 32 } };
      const result = await h.services.sandboxes.createBatch(h.admin, { spec, count: 400 }, { concurrency: 16 });
      assert.equal(result.created, 400);
      assert.ok(all.most <= BATCH_CREATES_IN_FLIGHT, `${all.most} creates ran at once, bound ${BATCH_CREATES_IN_FLIGHT}`);
      assert.ok(nodes.every((n) => n.most <= 16));
    } finally {
      await h.close();
    }
  });
});
