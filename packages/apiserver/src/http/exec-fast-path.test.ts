import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, test } from 'node:test';
import { getRequestListener } from '@hono/node-server';
import { EXEC_FRAMES_MEDIA_TYPE, ExecFrameDecoder } from '@dsec/protocol';
import { Metrics } from '../metrics.js';
import { harness } from '../testing/harness.js';
import type { Harness } from '../testing/harness.js';
import { WatchService } from '../watch.js';
import { createApp } from './app.js';
import { withRawHandlers } from './exec-fast-path.js';
import type { RawRequestHandler } from './exec-fast-path.js';

describe('the exec route on Node requests (fake node, real store, real HTTP)', () => {
  let h: Harness;
  let watch: WatchService;
  let metrics: Metrics;
  let server: Server;
  let url: string;
  let id: string;
  /** Requests that reached the app (the fast path passed them on). */
  let appRequests = 0;

  before(async () => {
    h = await harness();
    watch = new WatchService(h.store);
    metrics = new Metrics(h.services, watch);
    const raw: RawRequestHandler[] = [];
    const app = createApp(h.services, metrics, () => undefined, watch, { onRequest: (fn) => void raw.push(fn) });
    const listener = getRequestListener(app.fetch);
    server = createServer(
      withRawHandlers(raw, (req, res) => {
        appRequests++;
        return listener(req, res);
      }),
    );
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    id = ((await (await post('/v1/sandboxes', { image: { base: 'busybox' } })).json()) as { id: string }).id;
  });
  after(async () => {
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
    await watch.close();
    await h.close();
  });

  const post = (path: string, body: unknown, headers: Record<string, string> = {}) =>
    fetch(url + path, {
      method: 'POST',
      headers: { authorization: `Bearer ${h.adminKey}`, 'content-type': 'application/json', ...headers },
      body: typeof body === 'string' ? body : JSON.stringify(body),
      signal: AbortSignal.timeout(10_000),
    });

  /** Sends a request and says whether the app saw it. */
  const viaApp = async <T>(fn: () => Promise<T>): Promise<{ value: T; app: boolean }> => {
    const before = appRequests;
    const value = await fn();
    return { value, app: appRequests > before };
  };

  test('a plain exec is answered without the app, recorded in the audit and the metrics as the route', async () => {
    const { value: res, app } = await viaApp(() => post(`/v1/sandboxes/${id}/exec`, { cmd: 'echo hi' }));
    assert.equal(app, false);
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('content-type'), 'application/json');
    const body = (await res.json()) as { stdout: string; exitCode: number };
    assert.equal(body.stdout, 'echo hi\n');
    assert.equal(body.exitCode, 0);
    const audit = await watch.audit.query({ projectIds: 'all', sandboxId: id, order: 'asc', limit: 100 });
    const entry = audit.find((a) => a.route === '/v1/sandboxes/:id/exec' && a.command === 'echo hi');
    assert.ok(entry, 'the exec has its audit entry');
    assert.equal(entry.status, 200);
    assert.equal(entry.exitCode, 0);
    assert.equal(entry.keyId, h.admin.keyId);
    assert.match(await metrics.render(), /dsec_http_requests_total\{method="POST",route="\/v1\/sandboxes\/:id\/exec",status="200"\} \d+/);
  });

  test('a streamed exec asking for frames gets them without the app; ndjson is left to the app', async () => {
    const framed = await viaApp(() =>
      post(`/v1/sandboxes/${id}/exec`, { argv: ['echo', 'bin'] }, { accept: `${EXEC_FRAMES_MEDIA_TYPE}, application/x-ndjson` }),
    );
    assert.equal(framed.app, false);
    assert.equal(framed.value.headers.get('content-type'), EXEC_FRAMES_MEDIA_TYPE);
    const decoder = new ExecFrameDecoder();
    const events = decoder.push(new Uint8Array(await framed.value.arrayBuffer()));
    decoder.end();
    assert.deepEqual(
      events.map((e) => e.type),
      ['start', 'output', 'exit'],
    );
    const out = events[1];
    assert.ok(out?.type === 'output');
    assert.equal(Buffer.from(out.data).toString(), 'echo bin\n');
    const ndjson = await viaApp(() => post(`/v1/sandboxes/${id}/exec`, { argv: ['echo', 'x'] }, { accept: 'application/x-ndjson' }));
    assert.equal(ndjson.app, true);
    assert.equal(ndjson.value.headers.get('content-type'), 'application/x-ndjson');
    assert.equal((await ndjson.value.text()).trim().split('\n').length, 3);
  });

  test('bad input is a 400 naming the field; an unknown sandbox a 404; both answered as the app answers them', async () => {
    const bad = await viaApp(() => post(`/v1/sandboxes/${id}/exec`, { argv: 'echo' }));
    assert.equal(bad.app, false);
    assert.equal(bad.value.status, 400);
    assert.equal(((await bad.value.json()) as { error: { field: string } }).error.field, 'argv');
    const notJson = await post(`/v1/sandboxes/${id}/exec`, '{not json');
    assert.equal(((await notJson.json()) as { error: { field: string } }).error.field, 'body');
    const missing = await post('/v1/sandboxes/sb-none/exec', { cmd: 'true' });
    assert.equal(missing.status, 404);
    assert.equal(((await missing.json()) as { error: { code: string } }).error.code, 'SANDBOX_NOT_FOUND');
  });

  test('what the fast path does not take reaches the app: a bad key, a query string, an encoded id', async () => {
    const unauthenticated = await viaApp(() => post(`/v1/sandboxes/${id}/exec`, { cmd: 'true' }, { authorization: 'Bearer nope' }));
    assert.equal(unauthenticated.app, true);
    assert.equal(unauthenticated.value.status, 401);
    const query = await viaApp(() => post(`/v1/sandboxes/${id}/exec?x=1`, { cmd: 'true' }));
    assert.equal(query.app, true);
    assert.equal(query.value.status, 200);
    const encoded = await viaApp(() => post(`/v1/sandboxes/${encodeURIComponent(id).replace(/-/g, '%2D')}/exec`, { cmd: 'true' }));
    assert.equal(encoded.app, true);
  });
});
