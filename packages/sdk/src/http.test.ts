import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, test } from 'node:test';
import { DsecError } from '@dsec/protocol';
import { DsecClient } from './client.js';
import { buildPath, errorFromReply } from './http.js';
import { readNdjson } from './ndjson.js';

describe('http', () => {
  let server: http.Server;
  let url: string;
  const seen: Array<{ method: string; url: string; auth: string | undefined; body: string }> = [];

  before(async () => {
    server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        seen.push({ method: req.method ?? '', url: req.url ?? '', auth: req.headers.authorization, body: Buffer.concat(chunks).toString() });
        if (req.url?.startsWith('/v1/nodes')) {
          res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ items: [{ name: 'n1' }] }));
        } else if (req.url?.startsWith('/v1/slow')) {
          setTimeout(() => res.writeHead(200).end('{}'), 500);
        } else if (req.url?.startsWith('/v1/limited')) {
          res.writeHead(429, { 'retry-after': '3' }).end(JSON.stringify({ error: { code: 'RATE_LIMITED', message: 'slow down' } }));
        } else {
          res
            .writeHead(404, { 'content-type': 'application/json' })
            .end(JSON.stringify({ error: { code: 'SANDBOX_NOT_FOUND', message: 'no such sandbox', sandboxId: 'x' } }));
        }
      });
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  after(() => new Promise<void>((r) => server.close(() => r())));

  test('sends the key and parses JSON', async () => {
    const client = new DsecClient({ apiUrl: url, apiKey: 'dsec_test' });
    assert.deepEqual(await client.nodes.list(), [{ name: 'n1' }]);
    assert.equal(seen.at(-1)?.auth, 'Bearer dsec_test');
  });

  test('an error body becomes a DsecError with code, status and details', async () => {
    const client = new DsecClient({ apiUrl: url, apiKey: 'k' });
    await assert.rejects(client.json({ method: 'GET', path: '/v1/sandboxes/x' }), (err: unknown) => {
      assert.ok(err instanceof DsecError);
      assert.equal(err.code, 'SANDBOX_NOT_FOUND');
      assert.equal(err.status, 404);
      assert.equal(err.details.sandboxId, 'x');
      return true;
    });
    await assert.rejects(
      client.json({ method: 'GET', path: '/v1/limited' }),
      (err: unknown) => err instanceof DsecError && err.code === 'RATE_LIMITED' && err.details.retryAfterMs === 3000,
    );
  });

  test('request timeout and caller abort', async () => {
    const client = new DsecClient({ apiUrl: url, requestTimeoutMs: 50 });
    await assert.rejects(client.json({ method: 'GET', path: '/v1/slow' }), (err: unknown) => err instanceof DsecError && err.code === 'TIMEOUT');
    const ac = new AbortController();
    const p = new DsecClient({ apiUrl: url }).json({ method: 'GET', path: '/v1/slow' }, { signal: ac.signal });
    ac.abort(new Error('stop'));
    await assert.rejects(p, /stop/);
  });

  test('a refused connection is UNAVAILABLE', async () => {
    const probe = http.createServer();
    await new Promise<void>((r) => probe.listen(0, '127.0.0.1', r));
    const port = (probe.address() as AddressInfo).port;
    await new Promise<void>((r) => probe.close(() => r()));
    const client = new DsecClient({ apiUrl: `http://127.0.0.1:${port}` });
    await assert.rejects(client.nodes.list(), (err: unknown) => err instanceof DsecError && err.code === 'UNAVAILABLE' && err.status === 503);
  });

  test('a bad apiUrl is INVALID_ARGUMENT', () => {
    assert.throws(
      () => new DsecClient({ apiUrl: 'not a url' }),
      (err: unknown) => err instanceof DsecError && err.details.field === 'apiUrl',
    );
  });
});

test('buildPath repeats array keys and drops undefined', () => {
  assert.equal(buildPath('/v1/sandboxes', { label: ['a=1', 'b=2'], state: undefined, limit: 5 }), '/v1/sandboxes?label=a%3D1&label=b%3D2&limit=5');
  assert.equal(buildPath('/x', {}), '/x');
});

test('errorFromReply falls back on the status for bodies that are not errors', () => {
  const err = errorFromReply(502, Buffer.from('Bad Gateway'));
  assert.equal(err.code, 'BACKEND_FAILED');
  assert.match(err.message, /Bad Gateway/);
  assert.equal(errorFromReply(418, Buffer.from('{}')).status, 418);
});

test('readNdjson splits lines across chunks', async () => {
  async function* chunks() {
    yield Buffer.from('{"a":1}\n{"b"');
    yield Buffer.from(':2}\n\n{"c":3}');
  }
  const out: unknown[] = [];
  for await (const v of readNdjson(chunks())) out.push(v);
  assert.deepEqual(out, [{ a: 1 }, { b: 2 }, { c: 3 }]);
});
