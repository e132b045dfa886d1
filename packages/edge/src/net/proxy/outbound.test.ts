// The operator's settings on the way out: an upstream HTTP proxy (CONNECT to the checked
// address, with its credentials) and CA certificates for the mirrors' TLS fetches; and the
// sandbox-side trust bundle.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import { once } from 'node:events';
import { bundleWithOperatorCas, loadCaCertificates } from '../trust.js';
import { makeCertificateAuthority } from './certificate.js';
import type { TestCertificateAuthority } from './certificate.js';
import { Outbound, parseUpstreamProxy } from './outbound.js';
import { startEgressProxy } from './proxy.js';
import { connectTunnel, exchangeLine, LogSink, SANDBOX_A, startHttpUpstream, staticResolver, TestSandboxes } from './test-fixtures.js';

/** A corporate proxy: records each CONNECT target and its Proxy-Authorization, then splices. */
async function startCorporateProxy(): Promise<{ port: number; seen: Array<{ target: string; auth?: string }>; close(): Promise<void> }> {
  const seen: Array<{ target: string; auth?: string }> = [];
  const server = http.createServer((_req, res) => res.writeHead(405).end());
  const sockets = new Set<net.Socket>();
  server.on('connection', (s: net.Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  server.on('connect', (req: http.IncomingMessage, client: net.Socket, head: Buffer) => {
    seen.push({ target: req.url ?? '', ...(req.headers['proxy-authorization'] ? { auth: req.headers['proxy-authorization'] } : {}) });
    const [host, port] = (req.url ?? '').split(':');
    const up = net.connect({ host: host!, port: Number(port) }, () => {
      client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
      if (head.length) up.write(head);
      client.pipe(up).pipe(client);
    });
    up.on('error', () => client.destroy());
    client.on('error', () => up.destroy());
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return {
    port: (server.address() as net.AddressInfo).port,
    seen,
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}

let corp: Awaited<ReturnType<typeof startCorporateProxy>>;
let up: Awaited<ReturnType<typeof startHttpUpstream>>;
let ca: TestCertificateAuthority;

before(async () => {
  corp = await startCorporateProxy();
  up = await startHttpUpstream();
  ca = await makeCertificateAuthority();
});
after(async () => {
  await corp?.close();
  await up?.close();
});

test('upstream proxy URLs: http only, no path; credentials become Basic', () => {
  assert.deepEqual(parseUpstreamProxy('http://u%40x:p@proxy.corp:8080'), {
    host: 'proxy.corp',
    port: 8080,
    authorization: `Basic ${Buffer.from('u@x:p').toString('base64')}`,
  });
  assert.deepEqual(parseUpstreamProxy('http://[::1]:3128/'), { host: '::1', port: 3128 });
  assert.throws(() => parseUpstreamProxy('https://proxy.corp'), /http:\/\/ only/);
  assert.throws(() => parseUpstreamProxy('http://proxy.corp/x'), /no path/);
});

test('the egress proxy tunnels through the operator proxy to the address it checked', async () => {
  const sandboxes = new TestSandboxes();
  sandboxes.set(SANDBOX_A, 'sb-a', { allow: ['api.test'], allowAddresses: ['127.0.0.1'] });
  const proxy = await startEgressProxy({
    address: '127.0.0.1',
    ports: { http: 0 },
    sandboxes,
    resolver: staticResolver({ 'api.test': '127.0.0.1' }),
    log: new LogSink().fn,
    raise: () => {},
    outbound: { upstreamProxy: `http://dsec:secret@127.0.0.1:${corp.port}` },
  });
  try {
    const t = await connectTunnel(proxy.ports.http, SANDBOX_A, `api.test:${up.port}`);
    assert.equal(t.status, 200);
    const line = await exchangeLine(t.socket!, 'GET /echo HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r');
    assert.match(line, /^HTTP\/1\.1 200/);
    t.socket!.destroy();
    // The name was resolved and checked by the node; the corporate proxy got the address.
    assert.deepEqual(corp.seen.at(-1), { target: `127.0.0.1:${up.port}`, auth: `Basic ${Buffer.from('dsec:secret').toString('base64')}` });
  } finally {
    await proxy.close();
  }
});

test("mirror fetches: keep-alive sockets through the operator proxy, TLS checked against the operator's CA", async () => {
  const pair = await ca.issue(['registry.test']);
  let connections = 0;
  const server = https.createServer({ ...pair, keepAliveTimeout: 10_000 }, (_req, res) => res.end('ok'));
  server.on('connection', () => connections++);
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const port = (server.address() as net.AddressInfo).port;
  const get = (o: Outbound): Promise<string> =>
    new Promise((resolve, reject) => {
      const url = new URL(`https://registry.test:${port}/x`);
      https
        .get(url, { agent: o.agentFor(url) }, (res) => {
          let body = '';
          res.on('data', (c: Buffer) => (body += c.toString()));
          res.on('end', () => resolve(body));
        })
        .on('error', reject);
    });
  const resolver = staticResolver({ 'registry.test': '127.0.0.1' });
  const trusting = new Outbound({ resolver, upstreamProxy: `http://127.0.0.1:${corp.port}`, caCertificates: ca.cert });
  const untrusting = new Outbound({ resolver });
  try {
    const before = corp.seen.length;
    for (let i = 0; i < 5; i++) assert.equal(await get(trusting), 'ok');
    assert.equal(connections, 1, 'five fetches over one kept-alive connection');
    assert.deepEqual(corp.seen.slice(before), [{ target: `127.0.0.1:${port}` }]);
    await assert.rejects(get(untrusting), /unable to verify|self[- ]signed|local issuer/i);
  } finally {
    trusting.close();
    untrusting.close();
    server.closeAllConnections();
    server.close();
  }
});

test('operator CAs: PEM or paths, CA certificates only; the bundle gets them once', async () => {
  const pem = await loadCaCertificates([ca.cert]);
  assert.match(pem, /^-----BEGIN CERTIFICATE-----/);
  const leaf = await ca.issue(['not-a-ca.test']);
  await assert.rejects(loadCaCertificates([leaf.cert]), /caCertificates\.0: .*not a CA certificate/);
  await assert.rejects(loadCaCertificates(['relative.pem']), /caCertificates\.0: neither PEM text nor an absolute path/);
  await assert.rejects(loadCaCertificates(['/nonexistent/ca.pem']), /caCertificates\.0: \/nonexistent\/ca\.pem/);
  const system = '-----BEGIN CERTIFICATE-----\nSYSTEM\n-----END CERTIFICATE-----\n';
  const once1 = bundleWithOperatorCas(system, pem);
  assert.ok(once1.startsWith(system));
  assert.equal(bundleWithOperatorCas(once1, pem), once1, 'installing again changes nothing');
  assert.equal(once1.split(pem).length, 2);
  assert.ok(bundleWithOperatorCas(undefined, pem).includes(pem));
});
