// DELETE /v1/sandboxes/{id} with `Prefer: respond-async`: answered once the row is durably
// `stopping`, the teardown behind the answer (fake node whose destroy is held, real store).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Metrics } from '../metrics.js';
import { harness, responseLines } from '../testing/harness.js';
import type { Harness } from '../testing/harness.js';
import { createApp } from './app.js';
import { prefersRespondAsync } from './routes/sandboxes.js';
import { FOLLOW_MEDIA_TYPE } from './streams.js';

/** Holds the fake node's destroys until released. */
function holdDestroys(h: Harness): { release(err?: Error): void; held(): number } {
  const original = h.edge.destroy.bind(h.edge);
  const waiting: Array<{ resolve(): void; reject(err: Error): void }> = [];
  h.edge.destroy = (id, opts) => new Promise<void>((resolve, reject) => waiting.push({ resolve, reject })).then(() => original(id, opts));
  return {
    release(err) {
      for (const w of waiting.splice(0)) {
        if (err) w.reject(err);
        else w.resolve();
      }
      h.edge.destroy = original;
    },
    held: () => waiting.length,
  };
}

describe('a delete answered before its teardown (Prefer: respond-async)', () => {
  let h: Harness;
  let app: ReturnType<typeof createApp>;
  before(async () => {
    h = await harness();
    app = createApp(h.services, new Metrics(h.services), () => undefined);
  });
  after(async () => h.close());

  const call = async (method: string, path: string, headers: Record<string, string> = {}, body?: unknown) => {
    const res = await app.request(path, {
      method,
      headers: { authorization: `Bearer ${h.adminKey}`, ...headers },
      ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
    });
    const text = await res.text();
    return { status: res.status, body: (text ? JSON.parse(text) : {}) as { items?: Array<{ id: string }>; error?: { code: string } }, headers: res.headers };
  };
  const usage = async () => (await h.store.project(h.admin.projectId))?.used_sandboxes;
  const deletedEvents = (id: string) => h.raised.filter((e) => e.kind === 'sandbox.deleted' && e.sandboxId === id).length;

  test('the Prefer header is read as RFC 7240 says', () => {
    assert.equal(prefersRespondAsync('respond-async'), true);
    assert.equal(prefersRespondAsync('wait=5, Respond-Async'), true);
    assert.equal(prefersRespondAsync('respond-async; foo=1'), true);
    assert.equal(prefersRespondAsync('respond-asyncx'), false);
    assert.equal(prefersRespondAsync(undefined), false);
  });

  test('202 while the node still tears down; the sandbox is gone for the API; the quota comes back after the teardown', async () => {
    const sb = await h.services.sandboxes.create(h.admin, { image: { base: 'busybox' } });
    const node = h.services.nodes.all()[0]!;
    assert.equal(await usage(), 1);
    const hold = holdDestroys(h);
    try {
      const del = await call('DELETE', `/v1/sandboxes/${sb.id}`, { prefer: 'respond-async' });
      assert.equal(del.status, 202);
      assert.equal(del.headers.get('preference-applied'), 'respond-async');
      assert.equal((await h.store.sandboxOnly(sb.id))?.state, 'stopping', 'durably claimed before the answer');
      await new Promise((r) => setTimeout(r, 20));
      assert.equal(hold.held(), 1, 'the teardown waits on the node behind the answer');
      assert.equal((await call('GET', `/v1/sandboxes/${sb.id}`)).status, 404);
      assert.deepEqual((await call('GET', '/v1/sandboxes')).body.items, []);
      assert.equal((await call('POST', `/v1/sandboxes/${sb.id}/exec`, {}, { argv: ['true'] })).status, 404, 'its id is not routed');
      assert.equal((await call('DELETE', `/v1/sandboxes/${sb.id}`, { prefer: 'respond-async' })).status, 404, 'a second delete finds nothing');
      assert.equal(await usage(), 1, 'the quota is held until the node gave the sandbox back');
      assert.equal(node.allocated.sandboxes, 1);
      assert.equal(deletedEvents(sb.id), 1, 'live lists are told at the claim, not at the end of the teardown');
    } finally {
      hold.release();
    }
    await h.services.lifecycle.teardownsIdle();
    assert.equal(await h.store.sandboxOnly(sb.id), undefined);
    assert.equal(h.edge.sandboxes.has(sb.id), false);
    assert.equal(node.allocated.sandboxes, 0);
    assert.equal(await usage(), 0);
    assert.equal(deletedEvents(sb.id), 1, 'and once');
  });

  test('a followed process list ends at the delete, while the node still tears the sandbox down', async () => {
    const sb = await h.services.sandboxes.create(h.admin, { image: { base: 'busybox' } });
    const res = await app.request(`/v1/sandboxes/${sb.id}/processes`, { headers: { authorization: `Bearer ${h.adminKey}`, accept: FOLLOW_MEDIA_TYPE } });
    assert.equal(res.status, 200);
    const it = responseLines(res);
    const hold = holdDestroys(h);
    let timer: NodeJS.Timeout | undefined;
    try {
      const first = JSON.parse((await it.next()).value as string) as { value?: { items?: unknown[] } };
      assert.ok(Array.isArray(first.value?.items), 'the list now');
      assert.equal((await call('DELETE', `/v1/sandboxes/${sb.id}`, { prefer: 'respond-async' })).status, 202);
      const rest = (async () => {
        const seen: string[] = [];
        for await (const line of it) seen.push(line);
        return seen;
      })();
      const seen = await Promise.race([
        rest,
        new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error('the follow did not end within 10 s')), 10_000))),
      ]);
      assert.equal(hold.held(), 1, 'the teardown is still held on the node');
      assert.equal(seen.length, 1, seen.join('\n'));
      assert.match(seen[0] ?? '', /"error":\{"code":"SANDBOX_NOT_FOUND"/);
    } finally {
      clearTimeout(timer);
      hold.release();
      await it.return(undefined);
    }
    await h.services.lifecycle.teardownsIdle();
  });

  test('a teardown the node refuses leaves the row failed: listed and deletable again', async () => {
    const sb = await h.services.sandboxes.create(h.admin, { image: { base: 'busybox' } });
    const hold = holdDestroys(h);
    assert.equal((await call('DELETE', `/v1/sandboxes/${sb.id}`, { prefer: 'respond-async' })).status, 202);
    await new Promise((r) => setTimeout(r, 20));
    hold.release(new Error('busy device'));
    await h.services.lifecycle.teardownsIdle();
    const listed = await h.services.sandboxes.get(h.admin, sb.id);
    assert.equal(listed.state, 'failed');
    assert.ok(h.raised.some((e) => e.kind === 'sandbox.state-changed' && e.sandboxId === sb.id && e.data?.state === 'failed'));
    assert.equal((await call('DELETE', `/v1/sandboxes/${sb.id}`)).status, 204, 'without the preference: answered once gone');
    assert.equal(await h.store.sandboxOnly(sb.id), undefined);
    assert.equal(await usage(), 0);
  });

  test('many deletes at once: every one answered, every teardown done, in bounded parallel', async () => {
    const ids = [];
    for (let i = 0; i < 40; i++) ids.push((await h.services.sandboxes.create(h.admin, { image: { base: 'busybox' } })).id);
    let inFlight = 0;
    let most = 0;
    const original = h.edge.destroy.bind(h.edge);
    h.edge.destroy = async (id, opts) => {
      most = Math.max(most, ++inFlight);
      await new Promise((r) => setTimeout(r, 5));
      inFlight--;
      return original(id, opts);
    };
    try {
      const answers = await Promise.all(ids.map((id) => call('DELETE', `/v1/sandboxes/${id}`, { prefer: 'respond-async' })));
      assert.deepEqual(new Set(answers.map((a) => a.status)), new Set([202]));
      await h.services.lifecycle.teardownsIdle();
    } finally {
      h.edge.destroy = original;
    }
    assert.ok(most > 1 && most <= 16, `teardowns in parallel, bounded: ${most}`);
    for (const id of ids) assert.equal(h.edge.sandboxes.has(id), false);
    assert.equal(await usage(), 0);
  });
});
