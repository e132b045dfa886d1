// sb.kill(): a plain DELETE waits for the teardown (204); `wait: false` asks for `Prefer: respond-async` (202).
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, test } from 'node:test';
import { DsecClient } from './client.js';
import { Sandbox } from './sandbox.js';

const seen: Array<{ method: string; url: string; prefer: string | undefined }> = [];
let server: http.Server;
let client: DsecClient;

before(async () => {
  server = http.createServer((req, res) => {
    const prefer = req.headers.prefer;
    seen.push({ method: req.method ?? '', url: req.url ?? '', prefer: typeof prefer === 'string' ? prefer : undefined });
    res.writeHead(prefer === 'respond-async' ? 202 : 204).end();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  client = new DsecClient({ apiUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, apiKey: 'k' });
});
after(() => new Promise<void>((r) => server.close(() => r())));

test('kill() waits for the teardown; kill({ wait: false }) asks for the answer before it', async () => {
  const sb = Sandbox.fromId('sbx_1', { client });
  await sb.kill();
  await sb.kill({ wait: false });
  await Sandbox.kill('sbx_2', { client });
  assert.deepEqual(seen, [
    { method: 'DELETE', url: '/v1/sandboxes/sbx_1', prefer: undefined },
    { method: 'DELETE', url: '/v1/sandboxes/sbx_1', prefer: 'respond-async' },
    { method: 'DELETE', url: '/v1/sandboxes/sbx_2', prefer: undefined },
  ]);
});
