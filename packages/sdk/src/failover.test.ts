// Several API URLs: the client fails over when a replica cannot be reached or answers 503, and a
// create carries an automatic Idempotency-Key so that the retry on the next replica is the same
// create.
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import type { AddressInfo } from 'node:net';
import { after, before, describe, test } from 'node:test';
import { DsecClient } from './client.js';
import { Sandbox } from './sandbox.js';

interface Seen {
  server: string;
  method: string;
  url: string;
  key: string | undefined;
}

describe('failover between API URLs', () => {
  const seen: Seen[] = [];
  const servers: http.Server[] = [];
  let down = '';
  let unavailable = '';
  let good = '';

  const serve = async (name: string, status: number): Promise<string> => {
    const server = http.createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        seen.push({ server: name, method: req.method ?? '', url: req.url ?? '', key: req.headers['idempotency-key'] as string | undefined });
        if (status !== 200) {
          res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify({ error: { code: 'UNAVAILABLE', message: 'store unreachable' } }));
          return;
        }
        const body = req.url === '/healthz' ? { status: 'ok' } : { id: 'sbx-1', state: 'running' };
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(body));
      });
    });
    servers.push(server);
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  };

  before(async () => {
    // A port nothing listens on: bound and closed again.
    const probe = net.createServer();
    await new Promise<void>((r) => probe.listen(0, '127.0.0.1', r));
    down = `http://127.0.0.1:${(probe.address() as AddressInfo).port}`;
    await new Promise<void>((r) => probe.close(() => r()));
    unavailable = await serve('unavailable', 503);
    good = await serve('good', 200);
  });
  after(async () => {
    for (const s of servers) await new Promise<void>((r) => s.close(() => r()));
  });

  test('takes several URLs, as a list or comma-separated', () => {
    assert.deepEqual(new DsecClient({ apiUrl: `${down}, ${good}/`, apiKey: 'k' }).apiUrls, [down, good]);
    assert.deepEqual(new DsecClient({ apiUrl: [good], apiKey: 'k' }).apiUrl, good);
    assert.throws(() => new DsecClient({ apiUrl: ' , ' }), { code: 'INVALID_ARGUMENT' });
  });

  test('a refused connection goes to the next URL for any request, and stays there', async () => {
    const client = new DsecClient({ apiUrl: [down, good], apiKey: 'k', requestTimeoutMs: 5000 });
    seen.length = 0;
    assert.equal(await client.health(), true);
    await client.request({ method: 'POST', path: '/v1/anything', body: {} });
    assert.deepEqual(
      seen.map((s) => s.server),
      ['good', 'good'],
    );
    assert.equal(client.target.apiUrl.toString().replace(/\/$/, ''), good);
  });

  test('a 503 fails over only what is safe to repeat', async () => {
    const client = new DsecClient({ apiUrl: [unavailable, good], apiKey: 'k', requestTimeoutMs: 5000 });
    seen.length = 0;
    await assert.rejects(client.request({ method: 'POST', path: '/v1/sandboxes/x/exec', body: {} }), { status: 503 });
    assert.deepEqual(
      seen.map((s) => s.server),
      ['unavailable'],
      'a POST without a key may have had an effect: not repeated',
    );
    seen.length = 0;
    await client.request({ method: 'GET', path: '/v1/sandboxes' });
    assert.deepEqual(
      seen.map((s) => s.server),
      ['unavailable', 'good'],
    );
  });

  test('a create carries an automatic idempotency key, the same on every URL it tries', async () => {
    const client = new DsecClient({ apiUrl: [unavailable, good], apiKey: 'k', requestTimeoutMs: 5000 });
    seen.length = 0;
    const sb = await Sandbox.create({ image: { base: 'busybox' } }, { client });
    assert.equal(sb.id, 'sbx-1');
    const creates = seen.filter((s) => s.method === 'POST' && s.url === '/v1/sandboxes');
    assert.deepEqual(
      creates.map((s) => s.server),
      ['unavailable', 'good'],
    );
    assert.match(creates[0]!.key ?? '', /^auto-[0-9a-f-]{36}$/);
    assert.equal(creates[1]!.key, creates[0]!.key);
    seen.length = 0;
    await Sandbox.create({ image: { base: 'busybox' } }, { client });
    assert.notEqual(seen[0]!.key, creates[0]!.key, 'each create has its own key');
    await Sandbox.create({ image: { base: 'busybox' }, idempotencyKey: 'mine' }, { client });
    assert.equal(seen.at(-1)!.key, 'mine');
  });
});
