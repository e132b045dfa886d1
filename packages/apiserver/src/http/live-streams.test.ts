import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { resolveLimits } from '@dsec/protocol';
import type { NodeUsageSample } from '@dsec/protocol';
import type { Principal } from '../auth.js';
import { ROOT_PROJECT_ID } from '../db/store.js';
import { Metrics } from '../metrics.js';
import { TenantSlots } from '../tenant-limits.js';
import { harness, responseLines as lines } from '../testing/harness.js';
import type { Harness } from '../testing/harness.js';
import { WatchService } from '../watch.js';
import { createApp } from './app.js';
import { FOLLOW_MEDIA_TYPE, LiveStreams } from './streams.js';

/** The next line that `match` accepts, within `ms` (else a failure naming `what`). */
async function lineWhere(it: AsyncGenerator<string>, match: (line: string) => boolean, what: string, ms = 10_000): Promise<string> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no ${what} within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([
      (async () => {
        for (;;) {
          const r = await it.next();
          if (r.done) throw new Error(`the stream ended before ${what}`);
          if (match(r.value)) return r.value;
        }
      })(),
      timeout,
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/** True once the stream has ended (within `ms`). */
async function ends(it: AsyncGenerator<string>, ms = 10_000): Promise<boolean> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    let timer: NodeJS.Timeout | undefined;
    const r = await Promise.race([it.next(), new Promise<'wait'>((res) => (timer = setTimeout(() => res('wait'), deadline - Date.now())))]);
    clearTimeout(timer);
    if (r === 'wait') return false;
    if (r.done) return true;
  }
  return false;
}

describe('live streams: followed answers, principals checked again, what a tenant sees of the nodes (fake node, real store)', () => {
  let h: Harness;
  let watch: WatchService;
  let app: ReturnType<typeof createApp>;
  const closers: (() => Promise<void>)[] = [];
  let tenantProject = '';
  before(async () => {
    h = await harness();
    watch = new WatchService(h.store);
    await watch.init();
    // A follow is read again after writes here; the periodic reads and re-checks are far apart, so
    // that what these tests see comes from the writes and the revocations themselves.
    app = createApp(h.services, new Metrics(h.services), () => undefined, watch, {
      onClose: (fn) => void closers.push(fn),
      streams: { followMs: 60_000, recheckMs: 60_000 },
    });
    tenantProject = (await h.services.iam.createProject(h.admin, { name: 'tenant-a' })).id;
  });
  after(async () => {
    for (const fn of closers) await fn();
    await watch.close();
    await h.close();
  });

  const call = (method: string, path: string, key: string, accept?: string, body?: unknown) =>
    app.request(path, {
      method,
      headers: {
        authorization: `Bearer ${key}`,
        ...(accept ? { accept } : {}),
        ...(body !== undefined ? { 'content-type': 'application/json' } : {}),
      },
      ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
    });

  test('a followed key list sends the list, then a new line when a key is made (no periodic read needed)', async () => {
    const res = await call('GET', '/v1/keys', h.adminKey, FOLLOW_MEDIA_TYPE);
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type') ?? '', /ndjson/);
    const it = lines(res);
    const first = JSON.parse(await lineWhere(it, () => true, 'the first line')) as { value: { items: { name: string }[] } };
    assert.ok(first.value.items.some((k) => k.name === 'admin'));
    assert.equal((await call('POST', '/v1/keys', h.adminKey, undefined, { name: 'followed-key', role: 'viewer' })).status, 201);
    const line = await lineWhere(it, (l) => l.includes('followed-key'), 'the new key on the followed list', 5000);
    assert.ok((JSON.parse(line) as { value: { items: unknown[] } }).value.items.length >= 2);
    await it.return(undefined);
  });

  test('a followed audit trail shows a write as it is audited', async () => {
    const res = await call('GET', '/v1/audit?limit=50', h.adminKey, FOLLOW_MEDIA_TYPE);
    assert.equal(res.status, 200);
    const it = lines(res);
    await lineWhere(it, () => true, 'the first line');
    await call('PUT', '/v1/pools/followed-pool', h.adminKey, undefined, { size: 0, spec: { image: { base: 'busybox' } } });
    await lineWhere(it, (l) => l.includes('/v1/pools/'), 'the pool write in the followed audit', 5000);
    await it.return(undefined);
  });

  test('a follow of something the key may not see is refused before it starts', async () => {
    assert.equal((await call('GET', '/v1/sandboxes/sb-doesnotexist00/trajectory', h.adminKey, FOLLOW_MEDIA_TYPE)).status, 404);
    const viewer = (await h.services.iam.issueKey(tenantProject, 'tenant-viewer-keys', 'viewer')).key!;
    assert.equal((await call('GET', '/v1/keys', viewer, FOLLOW_MEDIA_TYPE)).status, 403);
  });

  test("a revoked key's open streams (events, usage, follows) end at once with a final message naming the revocation", async () => {
    const key = await h.services.iam.issueKey(tenantProject, 'to-revoke', 'admin');
    const events = lines(await call('GET', '/v1/events', key.key!, 'text/event-stream'));
    const nodes = lines(await call('GET', '/v1/nodes', key.key!, 'application/x-ndjson'));
    const keys = lines(await call('GET', '/v1/keys', key.key!, FOLLOW_MEDIA_TYPE));
    await lineWhere(events, (l) => l.startsWith(': dsec events'), 'the event stream header');
    await lineWhere(nodes, (l) => l.startsWith('{'), 'a node sample');
    await lineWhere(keys, (l) => l.startsWith('{'), 'the key list');
    assert.equal(h.services.slots.limits.streamsPerTenant > 3, true);
    assert.equal((await call('DELETE', `/v1/keys/${key.id}`, h.adminKey)).status, 204);
    const sse = await lineWhere(events, (l) => l.startsWith('event: ended'), 'the SSE ended event', 5000);
    assert.ok(sse);
    const data = await lineWhere(events, (l) => l.startsWith('data:'), 'the ended data');
    assert.match(data, /UNAUTHENTICATED/);
    assert.match(data, /was revoked/);
    assert.ok(await ends(events), 'the event stream ends');
    for (const it of [nodes, keys]) {
      const last = await lineWhere(it, (l) => l.includes('"error"'), 'the final error line', 5000);
      const parsed = JSON.parse(last) as { error: { code: string; message: string } };
      assert.equal(parsed.error.code, 'UNAUTHENTICATED');
      assert.match(parsed.error.message, new RegExp(`key ${key.id} was revoked`));
      assert.ok(await ends(it), 'the stream ends after its final line');
    }
    // And the key is refused for anything new.
    assert.equal((await call('GET', '/v1/nodes', key.key!, 'application/x-ndjson')).status, 401);
  });

  test('a key revoked where this replica was not told (the store alone) is caught by the periodic re-check', async () => {
    const quick = createApp(h.services, new Metrics(h.services), () => undefined, watch, {
      onClose: (fn) => void closers.push(fn),
      streams: { recheckMs: 300 },
    });
    const key = await h.services.iam.issueKey(tenantProject, 'revoked-elsewhere', 'viewer');
    const res = await quick.request('/v1/nodes', { headers: { authorization: `Bearer ${key.key!}`, accept: 'application/x-ndjson' } });
    const it = lines(res);
    await lineWhere(it, (l) => l.startsWith('{'), 'a node sample');
    await h.store.revokeKey(key.id);
    const last = await lineWhere(it, (l) => l.includes('"error"'), 'the final error line', 5000);
    assert.match(last, /UNAUTHENTICATED/);
    assert.ok(await ends(it));
  });

  test('an app that is closed leaves no listener on the authenticator (apps built and closed in one process do not pile up)', async () => {
    const iam = h.services.iam;
    const subscribe = iam.onPrincipalsChanged.bind(iam);
    let listening = 0;
    iam.onPrincipalsChanged = (fn) => {
      listening++;
      const off = subscribe(fn);
      return () => {
        listening--;
        off();
      };
    };
    try {
      const own: (() => Promise<void>)[] = [];
      for (let i = 0; i < 3; i++) createApp(h.services, new Metrics(h.services), () => undefined, watch, { onClose: (fn) => void own.push(fn) });
      assert.equal(listening, 3);
      for (const fn of own) await fn();
      assert.equal(listening, 0);
    } finally {
      iam.onPrincipalsChanged = subscribe;
    }
  });

  test("the node stream gives a tenant's key no cluster allocation, use or machine figures; the root project's viewer gets them", async () => {
    const tenant = (await h.services.iam.issueKey(tenantProject, 'tenant-viewer', 'viewer')).key!;
    const rootViewer = (await h.services.iam.issueKey(h.admin.projectId, 'root-viewer', 'viewer')).key!;
    const sample = async (key: string): Promise<NodeUsageSample> => {
      const it = lines(await call('GET', '/v1/nodes', key, 'application/x-ndjson'));
      const line = await lineWhere(it, (l) => l.startsWith('{'), 'a node sample');
      await it.return(undefined);
      return JSON.parse(line) as NodeUsageSample;
    };
    const t = (await sample(tenant)).items.find((n) => n.name === h.edge.nodeName);
    assert.ok(t);
    assert.ok(t.capacity.cpu > 0, 'capacity is shown');
    assert.equal(t.allocated, null);
    assert.equal(t.allocatable, null);
    assert.equal(t.used, null);
    assert.equal(t.machine, null);
    const r = (await sample(rootViewer)).items.find((n) => n.name === h.edge.nodeName);
    assert.ok(r?.allocated && r.allocatable && r.machine);
  });
});

describe("followed answers wake on their own tenant's writes", () => {
  test("a tenant's write reads again only that tenant's follows; a root write or one without a principal reads every tenant's", async () => {
    const streams = new LiveStreams(new TenantSlots(resolveLimits({})), () => Promise.resolve(), { settleMs: 10, followMs: 60_000, recheckMs: 60_000 });
    const principal = (tenantId: string) => ({ keyId: `key-${tenantId}`, projectId: tenantId, tenantId, role: 'viewer' }) as unknown as Principal;
    const ctl = new AbortController();
    let loads = 0;
    const it = lines(await streams.follow(principal('tenant-b'), ctl.signal, () => Promise.resolve({ n: ++loads })));
    try {
      await lineWhere(it, () => true, 'the first line');
      streams.changed('tenant-a');
      await new Promise((r) => setTimeout(r, 300));
      assert.equal(loads, 1, "another tenant's write does not read tenant-b's follow again");
      streams.changed('tenant-b');
      await lineWhere(it, (l) => l.includes('"n":2'), "the follow read again after its tenant's write", 5000);
      streams.changed(ROOT_PROJECT_ID);
      await lineWhere(it, (l) => l.includes('"n":3'), 'the follow read again after a root write', 5000);
      streams.changed(undefined);
      await lineWhere(it, (l) => l.includes('"n":4'), 'the follow read again after a write without a principal', 5000);
    } finally {
      ctl.abort();
      await it.return(undefined);
      streams.close();
    }
  });

  test('after close() a stream opened later starts no re-check timer and writes start no read', async () => {
    let checks = 0;
    const streams = new LiveStreams(
      new TenantSlots(resolveLimits({})),
      () => {
        checks++;
        return Promise.resolve();
      },
      { settleMs: 10, followMs: 60_000, recheckMs: 20 },
    );
    streams.close();
    const ctl = new AbortController();
    let loads = 0;
    const p = { keyId: 'key-c', projectId: 'tenant-c', tenantId: 'tenant-c', role: 'viewer' } as unknown as Principal;
    const it = lines(await streams.follow(p, ctl.signal, () => Promise.resolve({ n: ++loads })));
    try {
      await lineWhere(it, () => true, 'the first line');
      streams.changed('tenant-c');
      await new Promise((r) => setTimeout(r, 120));
      assert.equal(checks, 0, 'no periodic re-check after close');
      assert.equal(loads, 1, 'no read after a write once closed');
    } finally {
      ctl.abort();
      await it.return(undefined);
    }
  });
});
