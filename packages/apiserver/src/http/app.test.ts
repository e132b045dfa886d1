import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { EXEC_FRAMES_MEDIA_TYPE, ExecFrameDecoder } from '@dsec/protocol';
import { Metrics } from '../metrics.js';
import { harness } from '../testing/harness.js';
import type { Harness } from '../testing/harness.js';
import { createApp } from './app.js';

/** The fields of the replies these tests read. */
interface Reply {
  error: { code: string; message: string; field?: string };
  id: string;
  stdout: string;
}

describe('routing and validation through app.request() (fake node, real store)', () => {
  let h: Harness;
  let app: ReturnType<typeof createApp>;
  const logged: string[] = [];
  before(async () => {
    h = await harness();
    app = createApp(h.services, new Metrics(h.services), (l) => void logged.push(l));
  });
  after(async () => h.close());

  const call = async (method: string, path: string, body?: unknown, headers: Record<string, string> = {}) => {
    const res = await app.request(path, {
      method,
      headers: { authorization: `Bearer ${h.adminKey}`, ...headers },
      ...(body !== undefined ? { body: typeof body === 'string' ? body : JSON.stringify(body) } : {}),
    });
    const text = await res.text();
    return { status: res.status, json: (text ? JSON.parse(text) : {}) as Reply, headers: res.headers };
  };

  test('no key is 401; an unknown route is 404', async () => {
    assert.equal((await app.request('/v1/sandboxes')).status, 401);
    assert.equal((await call('GET', '/v1/nope')).json.error.code, 'NOT_FOUND');
  });

  test('a layer ref ending in /disk is the layer (no route hides it); a disk image is fetched under /v1/disk-images', async () => {
    const named = await call('GET', '/v1/layers/team/disk');
    assert.equal(named.json.error.code, 'LAYER_NOT_FOUND');
    assert.match(named.json.error.message, /team\/disk/);
    const image = await call('GET', '/v1/disk-images/team/disk?format=vmdk');
    assert.equal(image.status, 400);
    assert.equal(image.json.error.field, 'query.format');
  });

  test('a bad body is 400 naming the field; bad JSON names the body; a bad query names query.<field>', async () => {
    const bad = await call('POST', '/v1/sandboxes', { image: { base: 7 } });
    assert.equal(bad.status, 400);
    assert.equal(bad.json.error.field, 'image.base');
    assert.equal((await call('POST', '/v1/sandboxes', '{not json')).json.error.field, 'body');
    const q = await call('GET', '/v1/sandboxes?limit=0');
    assert.equal(q.status, 400);
    assert.equal(q.json.error.field, 'query.limit');
    const key = await call('POST', '/v1/sandboxes', { image: { base: 'busybox' } }, { 'idempotency-key': 'has space' });
    assert.equal(key.json.error.field, 'Idempotency-Key');
    assert.equal((await call('PUT', '/v1/pools/Bad_Name', { spec: { image: { base: 'busybox' } }, size: 1 })).json.error.field, 'name');
  });

  test('create, exec (JSON and ndjson), files, then delete, with typed input all the way', async () => {
    const created = await call('POST', '/v1/sandboxes', { image: { base: 'busybox' } });
    assert.equal(created.status, 201);
    const id = created.json.id;
    const exec = await call('POST', `/v1/sandboxes/${id}/exec`, { cmd: 'echo hi' });
    assert.equal(exec.json.stdout, 'echo hi\n');
    const stream = await app.request(`/v1/sandboxes/${id}/exec`, {
      method: 'POST',
      headers: { authorization: `Bearer ${h.adminKey}`, accept: 'application/x-ndjson' },
      body: JSON.stringify({ argv: ['echo', 'x'] }),
    });
    const lines = (await stream.text())
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { type: string });
    assert.deepEqual(
      lines.map((l) => l.type),
      ['start', 'output', 'exit'],
    );
    const put = await app.request(`/v1/sandboxes/${id}/files?path=/tmp/f`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${h.adminKey}` },
      body: 'content',
    });
    assert.equal(put.status, 204);
    const got = await app.request(`/v1/sandboxes/${id}/files?path=/tmp/f`, { headers: { authorization: `Bearer ${h.adminKey}` } });
    assert.equal(await got.text(), 'content');
    assert.equal((await call('GET', `/v1/sandboxes/${id}/files?path=relative`)).json.error.field, 'query.path');
    assert.equal((await call('DELETE', `/v1/sandboxes/${id}`)).status, 204);
    assert.equal((await call('GET', `/v1/sandboxes/${id}`)).status, 404);
  });

  test('a streamed exec comes as binary frames when asked for first, as ndjson otherwise (old clients)', async () => {
    const id = (await call('POST', '/v1/sandboxes', { image: { base: 'busybox' } })).json.id;
    const stream = (accept: string) =>
      app.request(`/v1/sandboxes/${id}/exec`, {
        method: 'POST',
        headers: { authorization: `Bearer ${h.adminKey}`, accept },
        body: JSON.stringify({ argv: ['echo', 'bin'] }),
      });
    const framed = await stream(`${EXEC_FRAMES_MEDIA_TYPE}, application/x-ndjson`);
    assert.equal(framed.headers.get('content-type'), EXEC_FRAMES_MEDIA_TYPE);
    const decoder = new ExecFrameDecoder();
    const events = decoder.push(new Uint8Array(await framed.arrayBuffer()));
    decoder.end();
    assert.deepEqual(
      events.map((e) => e.type),
      ['start', 'output', 'exit'],
    );
    const out = events[1];
    assert.ok(out?.type === 'output' && out.data instanceof Uint8Array);
    assert.equal(Buffer.from(out.data).toString(), 'echo bin\n');
    const ndjson = await stream('application/x-ndjson');
    assert.equal(ndjson.headers.get('content-type'), 'application/x-ndjson');
    const line = (await ndjson.text()).split('\n').map((l) => (l ? (JSON.parse(l) as { type: string; data?: string }) : undefined))[1];
    assert.equal(Buffer.from(line?.data ?? '', 'base64').toString(), 'echo bin\n');
  });

  test('an unexpected error is a generic 500: its message is logged, never sent', async () => {
    const id = (await call('POST', '/v1/sandboxes', { image: { base: 'busybox' } })).json.id;
    h.edge.failNext.set('stats', new Error('password=hunter2'));
    const res = await call('GET', `/v1/sandboxes/${id}/stats`);
    assert.equal(res.status, 500);
    assert.deepEqual(res.json, { error: { code: 'INTERNAL', message: 'internal error' } });
    assert.ok(logged.some((l) => l.includes('password=hunter2')));
  });
});
