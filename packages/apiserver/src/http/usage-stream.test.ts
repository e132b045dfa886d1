import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { resolveLimits } from '@dsec/protocol';
import type { NodeUsageSample, SandboxStatsSample } from '@dsec/protocol';
import { Metrics } from '../metrics.js';
import { harness, responseLines } from '../testing/harness.js';
import type { Harness } from '../testing/harness.js';
import { WatchService } from '../watch.js';
import { createApp } from './app.js';

/** Reads ndjson lines from a response body as they come. */
async function* lines(res: Response): AsyncGenerator {
  for await (const line of responseLines(res)) yield JSON.parse(line) as unknown;
}

async function next<T>(it: AsyncGenerator): Promise<T | undefined> {
  const r = await it.next();
  return r.done ? undefined : (r.value as T);
}

describe('usage streams: GET /v1/nodes and /v1/sandboxes/{id}/stats as ndjson (fake node, real store)', () => {
  let h: Harness;
  let app: ReturnType<typeof createApp>;
  before(async () => {
    h = await harness();
    app = createApp(h.services, new Metrics(h.services), () => undefined);
  });
  after(async () => h.close());

  const get = (path: string, ndjson = true, key = h.adminKey) =>
    app.request(path, { headers: { authorization: `Bearer ${key}`, ...(ndjson ? { accept: 'application/x-ndjson' } : {}) } });

  test('the node stream sends a sample at once and then one per interval, with allocation and the machine', async () => {
    const res = await get('/v1/nodes?intervalMs=500');
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type') ?? '', /application\/x-ndjson/);
    const it = lines(res);
    const first = await next<NodeUsageSample>(it);
    const second = await next<NodeUsageSample>(it);
    await it.return(undefined);
    assert.ok(first && second);
    assert.ok(Date.parse(second.at) - Date.parse(first.at) >= 400, 'samples come an interval apart');
    const node = second.items.find((n) => n.name === h.edge.nodeName);
    assert.ok(node, 'the node is in the sample');
    assert.equal(node.state, 'ready');
    assert.equal(typeof node.allocated?.sandboxes, 'number');
    assert.ok(node.capacity.cpu > 0);
    assert.ok(node.machine, 'the in-process node carries the machine use');
    assert.ok(node.machine.memoryTotalBytes > 0 && node.machine.memoryUsedBytes > 0);
    assert.ok(node.machine.cpuPercent >= 0 && node.machine.cpuPercent <= 100);
    // The plain list is unchanged.
    const plain = await get('/v1/nodes', false);
    assert.equal(plain.status, 200);
    assert.ok(((await plain.json()) as { items: unknown[] }).items.length >= 1);
  });

  test('an interval out of bounds is 400 naming query.intervalMs; no key is 401', async () => {
    for (const bad of ['100', '60001', 'x']) {
      const res = await get(`/v1/nodes?intervalMs=${bad}`);
      assert.equal(res.status, 400);
      assert.equal(((await res.json()) as { error: { field: string } }).error.field, 'query.intervalMs');
    }
    const unknown = await get('/v1/nodes?every=1');
    assert.equal(unknown.status, 400);
    assert.equal((await app.request('/v1/nodes', { headers: { accept: 'application/x-ndjson' } })).status, 401);
  });

  test("a sandbox's stats stream: samples until the reader leaves; a deleted sandbox ends it with its error", async () => {
    const sb = await h.services.sandboxes.create(h.admin, { image: { base: 'busybox' } });
    let reads = 0;
    const stats = h.edge.stats.bind(h.edge);
    h.edge.stats = async (id, opts) => {
      reads++;
      return stats(id, opts);
    };
    const res = await get(`/v1/sandboxes/${sb.id}/stats?intervalMs=500`);
    assert.equal(res.status, 200);
    const it = lines(res);
    const a = await next<SandboxStatsSample>(it);
    const b = await next<SandboxStatsSample>(it);
    assert.ok(a?.stats && b?.stats, 'two samples with stats');
    assert.equal(typeof a.stats.memoryBytes, 'number');
    // A reader that leaves stops the reads on the node.
    await it.return(undefined);
    await new Promise((r) => setTimeout(r, 300));
    const after = reads;
    await new Promise((r) => setTimeout(r, 1200));
    assert.equal(reads, after, 'no more reads once the reader left');

    const res2 = await get(`/v1/sandboxes/${sb.id}/stats?intervalMs=500`);
    const it2 = lines(res2);
    assert.ok((await next<SandboxStatsSample>(it2))?.stats);
    await h.services.lifecycle.destroy(h.admin, sb.id);
    const end = await next<SandboxStatsSample>(it2);
    assert.equal(end?.error?.code, 'SANDBOX_NOT_FOUND');
    assert.equal(await next(it2), undefined, 'the stream ends after its error');
  });

  test('a stats stream of an unknown sandbox is refused before it starts (404)', async () => {
    const res = await get('/v1/sandboxes/sb-doesnotexist00/stats');
    assert.equal(res.status, 404);
  });
});

describe('live streams hold a slot of their tenant (limits.streamsPerTenant)', () => {
  let h: Harness;
  let watch: WatchService;
  let app: ReturnType<typeof createApp>;
  before(async () => {
    const limits = resolveLimits({ streamsPerTenant: 2 });
    h = await harness({ limits });
    watch = new WatchService(h.store, { limits });
    await watch.init();
    app = createApp(h.services, new Metrics(h.services), () => undefined, watch);
  });
  after(async () => {
    await watch.close();
    await h.close();
  });

  const open = (path: string, accept: string) => app.request(path, { headers: { authorization: `Bearer ${h.adminKey}`, accept } });

  test('past the limit a usage, stats or event stream is 429 naming the limit; a reader that leaves gives its slot back', async () => {
    const sb = await h.services.sandboxes.create(h.admin, { image: { base: 'busybox' } });
    const nodes = await open('/v1/nodes?intervalMs=500', 'application/x-ndjson');
    const stats = await open(`/v1/sandboxes/${sb.id}/stats?intervalMs=500`, 'application/x-ndjson');
    assert.equal(nodes.status, 200);
    assert.equal(stats.status, 200);
    assert.equal(h.services.slots.inUse('stream', h.admin.tenantId), 2);
    for (const [path, accept] of [
      ['/v1/nodes', 'application/x-ndjson'],
      [`/v1/sandboxes/${sb.id}/stats`, 'application/x-ndjson'],
      ['/v1/events', 'text/event-stream'],
    ] as const) {
      const refused = await open(path, accept);
      assert.equal(refused.status, 429, path);
      const body = (await refused.json()) as { error: { code: string; limit?: string } };
      assert.equal(body.error.code, 'LIMIT_EXCEEDED');
      assert.equal(body.error.limit, 'streamsPerTenant');
    }
    // Plain (not streamed) reads take no slot.
    assert.equal((await app.request('/v1/nodes', { headers: { authorization: `Bearer ${h.adminKey}` } })).status, 200);
    // A reader that leaves frees its slot; an event stream then opens, and its slot goes when it is cancelled.
    await nodes.body!.cancel();
    assert.equal(h.services.slots.inUse('stream', h.admin.tenantId), 1);
    const events = await open('/v1/events', 'text/event-stream');
    assert.equal(events.status, 200);
    assert.equal(h.services.slots.inUse('stream', h.admin.tenantId), 2);
    await events.body!.cancel();
    // A stream that ends by itself (its sandbox deleted) gives its slot back too.
    const it = lines(stats);
    assert.ok((await next<SandboxStatsSample>(it))?.stats);
    await h.services.lifecycle.destroy(h.admin, sb.id);
    assert.equal((await next<SandboxStatsSample>(it))?.error?.code, 'SANDBOX_NOT_FOUND');
    assert.equal(await next(it), undefined);
    assert.equal(h.services.slots.inUse('stream', h.admin.tenantId), 0);
  });
});
