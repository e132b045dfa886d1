import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, test } from 'node:test';
import { DsecError } from '@dsec/protocol';
import { DsecClient } from './client.js';
import { Sandbox } from './sandbox.js';

let server: http.Server;
let client: DsecClient;
let requests = 0;

before(async () => {
  server = http.createServer((req, res) => {
    requests++;
    res.writeHead(500).end();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  client = new DsecClient({ apiUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, apiKey: 'k' });
});
after(() => new Promise<void>((r) => server.close(() => r())));

/** Asserts INVALID_ARGUMENT naming `field`. */
function invalid(field: string) {
  return (err: unknown) => {
    assert.ok(err instanceof DsecError, String(err));
    assert.equal(err.code, 'INVALID_ARGUMENT');
    assert.equal(err.details.field, field);
    return true;
  };
}

test('bad arguments are refused before anything is sent', async () => {
  await assert.rejects(Sandbox.create({ image: { base: 'busybox' }, resources: { memoryMiB: 1 } }, { client }), invalid('resources.memoryMiB'));
  await assert.rejects(Sandbox.create({ image: { base: 'Not A Ref!' } }, { client }), invalid('image.base'));
  await assert.rejects(Sandbox.create({ image: { base: 'busybox' }, labels: { 'bad key': 'v' } }, { client }), invalid('labels.bad key'));
  await assert.rejects(Sandbox.listPage({ limit: 5000 }, { client }), invalid('query.limit'));
  await assert.rejects(Sandbox.connect('../etc', { client }), invalid('id'));
  await assert.rejects(client.layers.upload(Buffer.alloc(0), { kind: 'nope' as 'base' }), invalid('query.kind'));
  await assert.rejects(client.keys.create({ name: 'k', role: 'root' as 'admin' }), invalid('role'));
  assert.equal(requests, 0);
});

test('list validates its filter when called', () => {
  assert.throws(() => Sandbox.list({ state: 'dancing' as 'running' }, { client }), invalid('query.state'));
  assert.equal(requests, 0);
});
