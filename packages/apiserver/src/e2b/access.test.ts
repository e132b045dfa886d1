// The E2B access token and the data plane's guards, through app.request() (fake node, real
// store): the token never shows in labels and only members read it; /v1 cannot set `e2b.`
// labels; data-plane calls take the tenant's rate; failed look-ups are limited by source; envd
// forgets sandboxes that ended by any path.
import { LiveStreams } from '../http/streams.js';
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Hono } from 'hono';
import { ROOT_PROJECT_ID } from '../db/store.js';
import { createApp } from '../http/app.js';
import type { Env } from '../http/env.js';
import { Metrics } from '../metrics.js';
import { harness } from '../testing/harness.js';
import type { Harness } from '../testing/harness.js';
import type { Envd } from './envd.js';
import { mountE2b } from './index.js';
import { TOKEN_LABEL, sandboxPrincipal } from './sandboxes.js';

describe('E2B access token and data-plane guards', () => {
  let h: Harness;
  let v1: ReturnType<typeof createApp>;
  let e2b: Hono<Env>;
  let envd: Envd;
  let viewerKey: string;
  const closers: Array<() => Promise<void>> = [];
  let address = '192.0.2.1';

  before(async () => {
    h = await harness();
    v1 = createApp(h.services, new Metrics(h.services), () => undefined, undefined, { onClose: (fn) => void closers.push(fn), e2b: { buildOnDemand: false } });
    e2b = new Hono<Env>();
    e2b.use('*', async (c, next) => {
      c.set('clientAddress', address);
      await next();
    });
    const deps = {
      services: h.services,
      metrics: new Metrics(h.services),
      log: () => undefined,
      streams: new LiveStreams(h.services.slots, async () => undefined),
    };
    const mounted = mountE2b(e2b, deps, { buildOnDemand: false });
    envd = mounted.envd;
    closers.push(
      async () => envd.close(),
      async () => mounted.templates.close(),
    );
    viewerKey = (await h.services.iam.issueKey(ROOT_PROJECT_ID, 'viewer', 'viewer')).key ?? '';
  });
  after(async () => {
    for (const fn of closers) await fn();
    await h.close();
  });

  const json = async (res: Response) => ({ status: res.status, body: (await res.json()) as Record<string, unknown> });
  const create = async () => {
    const r = await json(
      await e2b.request('/sandboxes', {
        method: 'POST',
        headers: { 'x-api-key': h.adminKey, 'content-type': 'application/json' },
        body: JSON.stringify({ templateID: 'busybox', timeout: 120 }),
      }),
    );
    assert.equal(r.status, 201, JSON.stringify(r.body));
    return { id: r.body.sandboxID as string, token: r.body.envdAccessToken as string };
  };

  test('the token is in no label of /v1 or E2B replies; only member+ keys read envdAccessToken', async () => {
    const { id, token } = await create();
    assert.match(token, /^[0-9a-f]{48}$/);
    for (const key of [h.adminKey, viewerKey]) {
      const one = await json(await v1.request(`/v1/sandboxes/${id}`, { headers: { authorization: `Bearer ${key}` } }));
      const labels = one.body.labels as Record<string, string>;
      assert.equal(labels[TOKEN_LABEL], undefined);
      assert.equal(labels['e2b.template'], 'busybox');
      const list = await json(await v1.request('/v1/sandboxes', { headers: { authorization: `Bearer ${key}` } }));
      assert.ok(!JSON.stringify(list.body).includes(token));
    }
    const asAdmin = await json(await e2b.request(`/sandboxes/${id}`, { headers: { 'x-api-key': h.adminKey } }));
    assert.equal(asAdmin.body.envdAccessToken, token);
    const asViewer = await json(await e2b.request(`/sandboxes/${id}`, { headers: { 'x-api-key': viewerKey } }));
    assert.equal(asViewer.status, 200);
    assert.equal(asViewer.body.envdAccessToken, null);
    const connect = await json(await e2b.request(`/sandboxes/${id}/connect`, { method: 'POST', headers: { 'x-api-key': viewerKey } }));
    assert.equal(connect.body.envdAccessToken, null);
    assert.ok(!JSON.stringify(connect.body).includes(token));
    const listed = await e2b.request('/v2/sandboxes', { headers: { 'x-api-key': viewerKey } });
    assert.ok(!(await listed.text()).includes(token));
    // Without the token the viewer's data-plane calls are refused; with it they pass.
    const start = await e2b.request('/process.Process/Start', {
      method: 'POST',
      headers: { 'e2b-sandbox-id': id, 'content-type': 'application/json', authorization: `Bearer ${viewerKey}` },
      body: '{}',
    });
    assert.equal(start.status, 401);
    assert.equal((await e2b.request('/health', { headers: { 'e2b-sandbox-id': id, 'x-access-token': token } })).status, 204);
  });

  test('/v1 creates, batches and forks that set e2b. labels are refused naming the label', async () => {
    const post = async (path: string, body: unknown) =>
      json(await v1.request(path, { method: 'POST', headers: { authorization: `Bearer ${h.adminKey}` }, body: JSON.stringify(body) }));
    const one = await post('/v1/sandboxes', { image: { base: 'busybox' }, labels: { [TOKEN_LABEL]: 'mine' } });
    assert.equal(one.status, 400);
    assert.equal((one.body.error as { field: string }).field, `labels.${TOKEN_LABEL}`);
    const batch = await post('/v1/sandboxes:batch', { spec: { image: { base: 'busybox' }, labels: { 'e2b.template': 'x' } }, count: 1 });
    assert.equal(batch.status, 400);
    const { id } = await create();
    const fork = await post(`/v1/sandboxes/${id}/fork`, { count: 1, labels: { [TOKEN_LABEL]: 'mine' } });
    assert.equal(fork.status, 400);
    assert.equal((fork.body.error as { field: string }).field, `labels.${TOKEN_LABEL}`);
  });

  test('data-plane calls take the tenant rate of the sandbox', async () => {
    const { id, token } = await create();
    const row = (await h.services.lifecycle.rowById(id))!;
    const p = sandboxPrincipal(row, await h.services.iam.tenantOf(row.project_id));
    // Spend the bucket, then call at once: some calls must be refused (refill is 100/s).
    for (let i = 0; i < 5000; i++) {
      const spent = await h.services.iam.rateLimited(p).then(
        () => false,
        () => true,
      );
      if (spent) break;
    }
    const codes = await Promise.all(
      Array.from({ length: 50 }, async () => (await e2b.request('/health', { headers: { 'e2b-sandbox-id': id, 'x-access-token': token } })).status),
    );
    assert.ok(codes.includes(429), codes.join(','));
  });

  test('a source whose look-ups keep failing is refused before the store is asked', async () => {
    address = '192.0.2.99';
    const codes: number[] = [];
    for (let i = 0; i < 80; i++) codes.push((await e2b.request('/health', { headers: { 'e2b-sandbox-id': `nope-${i}` } })).status);
    assert.equal(codes[0], 502);
    assert.ok(codes.includes(429), codes.join(','));
    address = '192.0.2.1';
  });

  test('envd forgets a sandbox deleted through /v1 (the sweep)', async () => {
    const { id, token } = await create();
    assert.equal((await e2b.request('/health', { headers: { 'e2b-sandbox-id': id, 'x-access-token': token } })).status, 204);
    const before = envd.held().sandboxes;
    assert.ok(before >= 1);
    const del = await v1.request(`/v1/sandboxes/${id}`, { method: 'DELETE', headers: { authorization: `Bearer ${h.adminKey}` } });
    assert.equal(del.status, 204);
    await envd.sweep();
    assert.equal(envd.held().sandboxes, before - 1);
  });

  test('control-plane bodies are read up to 4 MiB only, chunked or not', async () => {
    const { id } = await create();
    const chunk = new Uint8Array(1024 * 1024).fill(32);
    let sent = 0;
    const body = new ReadableStream<Uint8Array>({
      pull(ctl) {
        if (sent++ < 64) ctl.enqueue(chunk);
        else ctl.close();
      },
    });
    const r = await e2b.request(`/sandboxes/${id}/timeout`, {
      method: 'POST',
      headers: { 'x-api-key': h.adminKey, 'content-type': 'application/json' },
      body,
      duplex: 'half',
    });
    assert.equal(r.status, 413);
    assert.ok(sent < 64, `read ${sent} MiB`);
  });
});
