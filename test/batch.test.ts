// End-to-end tests of batch creation, admission control and idempotency keys against a real
// platform (apiserver + edge + crun sandboxes) on loopback.
import assert from 'node:assert/strict';
import { readdir } from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { DsecClient, DsecError, Sandbox } from '@dsec/sdk';
import type { BatchItem, SandboxCreateOptions } from '@dsec/sdk';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';
import { isCode } from './helpers/assert.js';

let platform: TestPlatform;
let admin: DsecClient;
let projects = 0;

const SPEC = { image: { base: 'busybox' }, resources: { cpu: 0.1, memoryMiB: 32, diskMiB: 16 } } satisfies SandboxCreateOptions;

interface TestProject {
  id: string;
  client: DsecClient;
  key: string;
}

/** A sub-project with a quota and a member key. */
async function project(quota: { sandboxes?: number; cpu?: number; memoryMiB?: number }, parent?: string): Promise<TestProject> {
  const p = await admin.projects.create({ name: `batch-${projects++}`, quota, ...(parent ? { parent } : {}) });
  const k = await admin.keys.create({ name: `${p.name}-member`, role: 'member', project: p.id });
  return { id: p.id, key: k.key, client: new DsecClient({ apiUrl: platform.url, apiKey: k.key }) };
}

async function usage(p: TestProject): Promise<number> {
  return (await admin.projects.get(p.id)).usage.sandboxes;
}

async function killAll(p: TestProject): Promise<void> {
  for (const s of await Sandbox.list({}, { client: p.client }).toArray()) await Sandbox.kill(s.id, { client: p.client });
}

/** Sandboxes the node runs (its folders), whoever owns them. */
async function nodeSandboxes(): Promise<string[]> {
  return readdir(path.join(platform.home, 'node', 'sandboxes')).catch(() => []);
}

/** A raw request, for headers the SDK does not show. */
async function call(
  key: string,
  method: string,
  route: string,
  json?: unknown,
  headers: Record<string, string> = {},
): Promise<{ status: number; body: any; headers: Headers }> {
  const res = await fetch(platform.url + route, {
    method,
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', ...headers },
    ...(json !== undefined ? { body: JSON.stringify(json) } : {}),
  });
  const text = await res.text();
  return { status: res.status, body: text.startsWith('{') ? JSON.parse(text) : text, headers: res.headers };
}

async function eventually(what: string, check: () => Promise<boolean>, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

before(async () => {
  platform = await startTestPlatform();
  admin = new DsecClient({ apiUrl: platform.url, apiKey: platform.adminKey });
});

after(async () => {
  await platform?.close();
});

describe('batch create', () => {
  test('a batch larger than the quota admits exactly the quota, answers every item, and leaves nothing behind', async () => {
    const p = await project({ sandboxes: 5 });
    const before = (await nodeSandboxes()).length;
    const seen: BatchItem[] = [];
    const result = await Sandbox.createBatch({ spec: { ...SPEC, labels: { batch: 'q' } }, count: 12 }, { onItem: (i) => seen.push(i) }, { client: p.client });
    assert.equal(result.items.length, 12);
    assert.equal(result.created, 5);
    assert.equal(result.failed, 7);
    assert.equal(seen.length, 12, 'progress reported every item');
    assert.deepEqual(
      result.items.map((i) => i.index),
      [...Array(12).keys()],
    );
    for (const item of result.items) {
      assert.ok(Boolean(item.sandbox) !== Boolean(item.error), `item ${item.index} has exactly one of sandbox and error`);
      if (item.error) {
        assert.equal(item.error.code, 'QUOTA_EXCEEDED');
        assert.equal(typeof item.error.details.retryAfterMs, 'number');
      }
    }
    const ids = result.sandboxes.map((s) => s.id);
    assert.equal(new Set(ids).size, 5);
    assert.equal(await usage(p), 5);
    const listed = await Sandbox.list({ labels: { batch: 'q' } }, { client: p.client }).toArray();
    assert.deepEqual(listed.map((s) => s.id).sort(), [...ids].sort());
    assert.equal((await nodeSandboxes()).length, before + 5);
    // Every created sandbox works.
    assert.equal((await result.sandboxes[4]!.exec('echo ok')).stdout, 'ok\n');
    await killAll(p);
    assert.equal(await usage(p), 0);
    assert.equal((await nodeSandboxes()).length, before);
  });

  test('a count or a list over the limit is a 400 naming the field; a bad spec with count fails the request', async () => {
    const p = await project({ sandboxes: 5 });
    const count = await call(p.key, 'POST', '/v1/sandboxes:batch', { spec: SPEC, count: 10_001 });
    assert.equal(count.status, 400);
    assert.equal(count.body.error.field, 'count');
    const items = await call(p.key, 'POST', '/v1/sandboxes:batch', { items: Array.from({ length: 10_001 }, () => SPEC) });
    assert.equal(items.status, 400);
    assert.equal(items.body.error.field, 'items');
    const both = await call(p.key, 'POST', '/v1/sandboxes:batch', { spec: SPEC, count: 2, items: [SPEC] });
    assert.equal(both.status, 400);
    assert.equal(both.body.error.field, 'items');
    const noCount = await call(p.key, 'POST', '/v1/sandboxes:batch', { spec: SPEC });
    assert.equal(noCount.body.error.field, 'count');
    await assert.rejects(
      Sandbox.createBatch({ spec: { image: { base: 'busybox' }, resources: { memoryMiB: 1 } }, count: 2 }, {}, { client: p.client }),
      isCode('INVALID_ARGUMENT', 'spec.resources.memoryMiB'),
    );
    const streamed = await call(p.key, 'POST', '/v1/sandboxes:batch', { spec: SPEC, count: 0 }, { accept: 'application/x-ndjson' });
    assert.equal(streamed.status, 400, 'a streamed batch is still validated before its stream starts');
    assert.equal(streamed.body.error.field, 'count');
    assert.equal(await usage(p), 0);
  });

  test('a bad item fails alone with its field named; the others are created', async () => {
    const p = await project({ sandboxes: 5 });
    const result = await Sandbox.createBatch(
      {
        items: [
          SPEC,
          { image: { base: 'no-such-layer' } },
          { ...SPEC, resources: { memoryMiB: 1 } },
          { ...SPEC, bogus: true },
          { ...SPEC, labels: { n: '4' } },
        ],
      },
      {},
      { client: p.client },
    );
    assert.equal(result.created, 2);
    assert.ok(result.items[0]!.sandbox);
    assert.ok(result.items[4]!.sandbox);
    assert.equal(result.items[4]!.sandbox?.lastInfo?.labels.n, '4');
    assert.equal(result.items[1]!.error?.code, 'LAYER_NOT_FOUND');
    assert.equal(result.items[1]!.error?.details.field, 'items.1.image.base');
    assert.equal(result.items[2]!.error?.code, 'INVALID_ARGUMENT');
    assert.equal(result.items[2]!.error?.details.field, 'items.2.resources.memoryMiB');
    assert.equal(result.items[3]!.error?.details.field, 'items.3.bogus');
    assert.equal(await usage(p), 2);
    await killAll(p);
  });

  test('an item no node can hold fails with CAPACITY_EXHAUSTED and returns its quota', async () => {
    const p = await project({ sandboxes: 5, cpu: 1000 });
    const before = (await nodeSandboxes()).length;
    const result = await Sandbox.createBatch({ items: [SPEC, { ...SPEC, resources: { cpu: 200, memoryMiB: 32, diskMiB: 16 } }] }, {}, { client: p.client });
    assert.ok(result.items[0]!.sandbox);
    assert.equal(result.items[1]!.error?.code, 'CAPACITY_EXHAUSTED');
    const prj = await admin.projects.get(p.id);
    assert.equal(prj.usage.sandboxes, 1);
    assert.equal(prj.usage.memoryMiB, 32);
    assert.ok(Math.abs(prj.usage.cpu - 0.1) < 1e-9, `cpu usage ${prj.usage.cpu}`);
    assert.equal((await nodeSandboxes()).length, before + 1);
    await killAll(p);
  });
});

describe('admission', () => {
  test('a create over the quota is a 429 with Retry-After and retryAfterMs', async () => {
    const p = await project({ sandboxes: 1 });
    const first = await call(p.key, 'POST', '/v1/sandboxes', SPEC);
    assert.equal(first.status, 201);
    const refused = await call(p.key, 'POST', '/v1/sandboxes', SPEC);
    assert.equal(refused.status, 429);
    assert.equal(refused.body.error.code, 'QUOTA_EXCEEDED');
    assert.match(refused.headers.get('retry-after') ?? '', /^\d+$/);
    assert.ok(Number(refused.headers.get('retry-after')) >= 1);
    assert.equal(typeof refused.body.error.retryAfterMs, 'number');
    await killAll(p);
  });

  test('a waiting create is admitted when a sandbox is destroyed; a wait that times out is a 429 saying so', async () => {
    const p = await project({ sandboxes: 1 });
    const holder = await Sandbox.create(SPEC, { client: p.client });
    await assert.rejects(Sandbox.create({ ...SPEC, admission: { wait: true, timeoutMs: 300 } }, { client: p.client }), (err: unknown) => {
      assert.ok(err instanceof DsecError);
      assert.equal(err.code, 'QUOTA_EXCEEDED');
      assert.equal(err.status, 429);
      assert.equal(err.details.reason, 'wait-timeout');
      return true;
    });
    const waiting = Sandbox.create({ ...SPEC, labels: { waited: 'yes' }, admission: { wait: true, timeoutMs: 30_000 } }, { client: p.client });
    let settled = false;
    void waiting.then(
      () => (settled = true),
      () => (settled = true),
    );
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(settled, false, 'the create waits while the quota is full');
    await holder.kill();
    const admitted = await waiting;
    assert.equal(admitted.lastInfo?.labels.waited, 'yes');
    assert.equal(await usage(p), 1);
    await killAll(p);
  });

  test('waiters of different projects are admitted round-robin as capacity frees', async () => {
    // Two sub-projects share a parent whose quota holds one sandbox.
    const parent = await project({ sandboxes: 1 });
    const a = await project({ sandboxes: 1 }, parent.id);
    const b = await project({ sandboxes: 1 }, parent.id);
    const holder = await Sandbox.create(SPEC, { client: parent.client });
    const order: string[] = [];
    const wait = (p: TestProject, name: string): Promise<Sandbox> =>
      Sandbox.create({ ...SPEC, labels: { name }, admission: { wait: true, timeoutMs: 60_000 } }, { client: p.client }).then((s) => (order.push(name), s));
    const a1 = wait(a, 'a1');
    await new Promise((r) => setTimeout(r, 200));
    const a2 = wait(a, 'a2');
    await new Promise((r) => setTimeout(r, 200));
    const b1 = wait(b, 'b1');
    await new Promise((r) => setTimeout(r, 200));
    await holder.kill();
    await (await a1).kill();
    await (await b1).kill();
    await (await a2).kill();
    assert.deepEqual(order, ['a1', 'b1', 'a2'], 'b1 is not starved by a2, which queued before it');
  });

  test('a cancelled waiting create leaves the queue and creates nothing', async () => {
    const p = await project({ sandboxes: 1 });
    const holder = await Sandbox.create(SPEC, { client: p.client });
    const ac = new AbortController();
    const cancelled = Sandbox.create(
      { ...SPEC, labels: { cancelled: 'yes' }, admission: { wait: true, timeoutMs: 30_000 }, signal: ac.signal },
      { client: p.client },
    );
    await new Promise((r) => setTimeout(r, 300));
    ac.abort();
    await assert.rejects(cancelled);
    await holder.kill();
    // The next waiter gets the room; the cancelled one never does.
    const next = await Sandbox.create({ ...SPEC, admission: { wait: true, timeoutMs: 10_000 } }, { client: p.client });
    await new Promise((r) => setTimeout(r, 300));
    assert.deepEqual((await Sandbox.list({ labels: { cancelled: 'yes' } }, { client: p.client }).toArray()).length, 0);
    assert.equal(await usage(p), 1);
    await next.kill();
  });

  test('a waiting batch whose client goes away gives back what it had not created', async () => {
    const p = await project({ sandboxes: 2 });
    const created: Sandbox[] = [];
    const ac = new AbortController();
    const batch = Sandbox.createBatch(
      { spec: SPEC, count: 6, admission: { wait: true, timeoutMs: 60_000 } },
      { signal: ac.signal, onItem: (i) => i.sandbox && created.push(i.sandbox) },
      { client: p.client },
    );
    await eventually('two sandboxes', async () => created.length === 2);
    ac.abort();
    await assert.rejects(batch);
    for (const s of created) await s.kill();
    // The four items that were waiting left the queue: the freed quota stays free.
    await new Promise((r) => setTimeout(r, 500));
    assert.equal(await usage(p), 0);
    assert.deepEqual(await Sandbox.list({}, { client: p.client }).toArray(), []);
    const next = await Sandbox.create({ ...SPEC, admission: { wait: true, timeoutMs: 5_000 } }, { client: p.client });
    await next.kill();
  });

  test('a waiting batch creates what fits, then the rest as sandboxes are destroyed', async () => {
    const p = await project({ sandboxes: 3 });
    const created: Sandbox[] = [];
    const batch = Sandbox.createBatch(
      { spec: SPEC, count: 5, admission: { wait: true, timeoutMs: 60_000 } },
      { onItem: (i) => i.sandbox && created.push(i.sandbox) },
      { client: p.client },
    );
    await eventually('three sandboxes', async () => created.length === 3);
    await new Promise((r) => setTimeout(r, 200));
    assert.equal(created.length, 3, 'no item is created past the quota');
    await created[0]!.kill();
    await created[1]!.kill();
    const result = await batch;
    assert.equal(result.created, 5);
    assert.equal(result.failed, 0);
    assert.equal(await usage(p), 3);
    await killAll(p);
  });
});

describe('idempotency keys', () => {
  test('sequential retries with a key create once; the replay says so', async () => {
    const p = await project({ sandboxes: 5 });
    const first = await call(p.key, 'POST', '/v1/sandboxes', SPEC, { 'idempotency-key': 'episode-1' });
    const again = await call(p.key, 'POST', '/v1/sandboxes', SPEC, { 'idempotency-key': 'episode-1' });
    assert.equal(first.status, 201);
    assert.equal(again.status, 201);
    assert.equal(again.body.id, first.body.id);
    assert.equal(again.headers.get('idempotent-replayed'), 'true');
    assert.equal(first.headers.get('idempotent-replayed'), null);
    const sdk = await Sandbox.create({ ...SPEC, idempotencyKey: 'episode-1' }, { client: p.client });
    assert.equal(sdk.id, first.body.id);
    assert.equal(await usage(p), 1);
    // Keys are per project: another project's same key is its own.
    const q = await project({ sandboxes: 5 });
    const other = await Sandbox.create({ ...SPEC, idempotencyKey: 'episode-1' }, { client: q.client });
    assert.notEqual(other.id, first.body.id);
    await killAll(p);
    await killAll(q);
  });

  test('concurrent retries with a key create once', async () => {
    const p = await project({ sandboxes: 5 });
    const all = await Promise.all(Array.from({ length: 6 }, () => Sandbox.create({ ...SPEC, idempotencyKey: 'concurrent-1' }, { client: p.client })));
    assert.equal(new Set(all.map((s) => s.id)).size, 1);
    assert.equal(await usage(p), 1);
    assert.equal((await Sandbox.list({}, { client: p.client }).toArray()).length, 1);
    await killAll(p);
  });

  test('the same key with another request is a 422 naming the header; a bad key is a 400', async () => {
    const p = await project({ sandboxes: 5 });
    await Sandbox.create({ ...SPEC, idempotencyKey: 'k-1' }, { client: p.client });
    await assert.rejects(
      Sandbox.create({ ...SPEC, labels: { other: 'x' }, idempotencyKey: 'k-1' }, { client: p.client }),
      isCode('IDEMPOTENCY_KEY_REUSED', 'Idempotency-Key'),
    );
    const bad = await call(p.key, 'POST', '/v1/sandboxes', SPEC, { 'idempotency-key': 'has#hash' });
    assert.equal(bad.status, 400);
    assert.equal(bad.body.error.field, 'Idempotency-Key');
    assert.equal(await usage(p), 1);
    await killAll(p);
  });

  test('a create that failed releases its key: the retry creates', async () => {
    const p = await project({ sandboxes: 1 });
    const holder = await Sandbox.create(SPEC, { client: p.client });
    await assert.rejects(Sandbox.create({ ...SPEC, idempotencyKey: 'retry-me' }, { client: p.client }), isCode('QUOTA_EXCEEDED'));
    await holder.kill();
    const sb = await Sandbox.create({ ...SPEC, idempotencyKey: 'retry-me' }, { client: p.client });
    assert.equal((await Sandbox.create({ ...SPEC, idempotencyKey: 'retry-me' }, { client: p.client })).id, sb.id);
    await killAll(p);
  });

  test('a retried batch creates only what the first did not; another batch under its key is refused', async () => {
    const p = await project({ sandboxes: 3 });
    const first = await Sandbox.createBatch({ spec: SPEC, count: 4 }, { idempotencyKey: 'batch-1' }, { client: p.client });
    assert.equal(first.created, 3);
    assert.equal(first.items[3]!.error?.code, 'QUOTA_EXCEEDED');
    await first.sandboxes[0]!.kill();
    const again = await Sandbox.createBatch({ spec: SPEC, count: 4 }, { idempotencyKey: 'batch-1' }, { client: p.client });
    assert.equal(again.created, 4);
    // Items 1 and 2 are the same sandboxes; item 0's replay is its first reply (it is gone); item 3 is new.
    assert.equal(again.items[1]!.sandbox!.id, first.items[1]!.sandbox!.id);
    assert.equal(again.items[2]!.sandbox!.id, first.items[2]!.sandbox!.id);
    assert.equal(again.items[0]!.sandbox!.id, first.items[0]!.sandbox!.id);
    assert.ok(!first.sandboxes.some((s) => s.id === again.items[3]!.sandbox!.id));
    assert.equal(await usage(p), 3);
    await assert.rejects(Sandbox.createBatch({ spec: SPEC, count: 2 }, { idempotencyKey: 'batch-1' }, { client: p.client }), isCode('IDEMPOTENCY_KEY_REUSED'));
    await killAll(p);
  });
});
