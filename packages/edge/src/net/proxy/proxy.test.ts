// The egress proxy end to end on loopback: clients bound to 127.0.0.x source addresses play the
// sandboxes, local HTTP and TLS servers play the internet, a static map plays DNS.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import tls from 'node:tls';
import { startEgressProxy } from './proxy.js';
import type { EgressProxyHandle } from './proxy.js';
import {
  closed,
  connectTunnel,
  exchangeLine,
  LogSink,
  NO_SANDBOX,
  request,
  SANDBOX_A,
  SANDBOX_B,
  SANDBOX_C,
  startHttpUpstream,
  startTlsUpstream,
  staticResolver,
  TestSandboxes,
  tlsFrom,
} from './test-fixtures.js';
import { makeCertificate } from './certificate.js';

const HOSTS = { 'api.test': '127.0.0.1', 'secure.test': '127.0.0.1', 'evil.test': '127.0.0.1', 'rebind.test': '127.0.0.1' };
const ALLOWED = { allow: ['api.test', 'secure.test', 'rebind.test'], allowAddresses: ['127.0.0.1'] };

describe('egress proxy', () => {
  let up: Awaited<ReturnType<typeof startHttpUpstream>>;
  let tlsUp: Awaited<ReturnType<typeof startTlsUpstream>>;
  let cert: { key: string; cert: string };
  let proxy: EgressProxyHandle;
  const sandboxes = new TestSandboxes();
  const sink = new LogSink();

  before(async () => {
    up = await startHttpUpstream();
    cert = await makeCertificate('secure.test');
    tlsUp = await startTlsUpstream('secure.test', cert);
    sandboxes.set(SANDBOX_A, 'sb-a', ALLOWED);
    sandboxes.set(SANDBOX_B, 'sb-b', ALLOWED);
    // C may use rebind.test by name, but not the loopback address it resolves to.
    sandboxes.set(SANDBOX_C, 'sb-c', { allow: ['api.test', 'rebind.test'] });
    proxy = await startEgressProxy({
      address: '127.0.0.1',
      ports: { http: 0 },
      transparentPorts: { http: up.port, tls: tlsUp.port },
      sandboxes,
      resolver: staticResolver(HOSTS),
      log: sink.fn,
      raise: () => {},
    });
  });
  after(async () => {
    await proxy?.close();
    await up?.close();
    await tlsUp?.close();
  });

  test('an allowed domain works through the explicit HTTP forward proxy', async () => {
    const res = await request(proxy.ports.http, {
      localAddress: SANDBOX_A,
      target: `http://api.test:${up.port}/echo?x=1`,
      headers: { 'proxy-authorization': 'Basic c2VjcmV0', 'x-client': 'yes' },
    });
    assert.equal(res.status, 200);
    const seen = JSON.parse(res.body.toString());
    assert.equal(seen.path, '/echo?x=1');
    assert.equal(seen.headers.host, `api.test:${up.port}`);
    assert.equal(seen.headers['x-client'], 'yes');
    assert.equal(seen.headers['proxy-authorization'], undefined, 'proxy credentials stay on their hop');
    const entry = sink.last((e) => e.host === 'api.test');
    assert.deepEqual(
      { ...entry, at: undefined },
      { at: undefined, sandboxId: 'sb-a', via: 'http', host: 'api.test', port: up.port, address: '127.0.0.1', verdict: 'allowed', rule: 'allow:api.test' },
    );
  });

  test('a POST body goes upstream', async () => {
    const res = await request(proxy.ports.http, { localAddress: SANDBOX_A, target: `http://api.test:${up.port}/echo`, method: 'POST', body: 'payload-123' });
    assert.equal(JSON.parse(res.body.toString()).body, 'payload-123');
  });

  test('an allowed domain works through CONNECT (plain bytes and TLS inside)', async () => {
    const t = await connectTunnel(proxy.ports.http, SANDBOX_A, `secure.test:${tlsUp.port}`);
    assert.equal(t.status, 200);
    const s = tls.connect({ socket: t.socket!, servername: 'secure.test', ca: cert.cert });
    await new Promise<void>((resolve, reject) => s.once('secureConnect', resolve).once('error', reject));
    assert.equal(s.authorized, true);
    assert.equal(await exchangeLine(s, 'ping'), 'hello from secure.test: ping');
    s.destroy();

    const plain = await connectTunnel(proxy.ports.http, SANDBOX_A, `api.test:${up.port}`);
    assert.equal(plain.status, 200);
    plain.socket!.write('GET /echo HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n');
    const chunks: Buffer[] = [];
    for await (const c of plain.socket!) chunks.push(c as Buffer);
    assert.match(Buffer.concat(chunks).toString(), /^HTTP\/1\.1 200 OK/);
  });

  test('an allowed domain works through transparent HTTP (Host header)', async () => {
    const res = await request(proxy.ports.transparentHttp, { localAddress: SANDBOX_A, target: '/echo', host: 'api.test' });
    assert.equal(res.status, 200);
    const seen = JSON.parse(res.body.toString());
    assert.equal(seen.headers.host, `api.test:${up.port}`);
    assert.equal(sink.last()?.via, 'transparent-http');
    // Several requests on one kept-alive connection are each decided on their own.
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1, localAddress: SANDBOX_A });
    try {
      for (const host of ['api.test', 'evil.test', 'api.test']) {
        const status = await new Promise<number>((resolve, reject) => {
          const req = http.request({ host: '127.0.0.1', port: proxy.ports.transparentHttp, path: '/echo', headers: { host }, agent }, (r) => {
            r.resume();
            r.on('end', () => resolve(r.statusCode ?? 0));
          });
          req.on('error', reject);
          req.end();
        });
        assert.equal(status, host === 'evil.test' ? 403 : 200, host);
      }
    } finally {
      agent.destroy();
    }
  });

  test('Upgrade requests are decided, then spliced', async () => {
    for (const [port, target, host] of [
      [proxy.ports.http, `http://api.test:${up.port}/ws`, undefined],
      [proxy.ports.transparentHttp, '/ws', 'api.test'],
    ] as const) {
      const socket = await new Promise<net.Socket>((resolve, reject) => {
        const req = http.request({
          host: '127.0.0.1',
          port,
          localAddress: SANDBOX_A,
          path: target,
          agent: false,
          headers: { connection: 'Upgrade', upgrade: 'echo', ...(host ? { host } : {}) },
        });
        req.on('upgrade', (res, s: net.Socket) => {
          assert.equal(res.headers['x-seen-host'], `api.test:${up.port}`);
          resolve(s);
        });
        req.on('response', (res) => reject(new Error(`status ${res.statusCode}`)));
        req.on('error', reject);
        req.end();
      });
      assert.equal(await exchangeLine(socket, 'over the upgrade'), 'over the upgrade');
      socket.destroy();
    }
    const denied = await new Promise<number>((resolve, reject) => {
      const req = http.request({
        host: '127.0.0.1',
        port: proxy.ports.http,
        localAddress: SANDBOX_A,
        path: `http://evil.test:${up.port}/ws`,
        agent: false,
        headers: { connection: 'Upgrade', upgrade: 'echo' },
      });
      req.on('upgrade', () => reject(new Error('upgraded')));
      req.on('response', (res) => resolve(res.statusCode ?? 0));
      req.on('error', reject);
      req.end();
    });
    assert.equal(denied, 403);
  });

  test('TLS through the transparent port: SNI routes it, the handshake runs end to end', async () => {
    const s = tlsFrom(SANDBOX_A, proxy.ports.transparentTls, { servername: 'secure.test', ca: cert.cert });
    await new Promise<void>((resolve, reject) => s.once('secureConnect', resolve).once('error', reject));
    // Verified against the upstream's own certificate: the proxy never had a key to terminate with.
    assert.equal(s.authorized, true);
    assert.equal(s.getPeerCertificate().subject.CN, 'secure.test');
    assert.equal(await exchangeLine(s, 'through'), 'hello from secure.test: through');
    s.destroy();
    const entry = sink.last((e) => e.via === 'transparent-tls');
    assert.equal(entry?.verdict, 'allowed');
    assert.equal(entry?.host, 'secure.test');
  });

  test('a denied domain fails on every path', async () => {
    const fwd = await request(proxy.ports.http, { localAddress: SANDBOX_A, target: `http://evil.test:${up.port}/echo` });
    assert.equal(fwd.status, 403);
    assert.equal(fwd.headers['x-dsec-egress'], 'denied; reason=policy');
    const tr = await request(proxy.ports.transparentHttp, { localAddress: SANDBOX_A, target: '/echo', host: 'evil.test' });
    assert.equal(tr.status, 403);
    const c = await connectTunnel(proxy.ports.http, SANDBOX_A, `evil.test:${tlsUp.port}`);
    assert.equal(c.status, 403);
    assert.match(c.body, /evil\.test.*denied \(policy/);
    await assert.rejects(tlsHandshake(proxy.ports.transparentTls, SANDBOX_A, 'evil.test', cert.cert), /access denied|ECONNRESET|socket disconnected/i);
    const denied = sink.entries.filter((e) => e.host === 'evil.test' && e.verdict === 'denied').map((e) => e.via);
    assert.deepEqual(new Set(denied), new Set(['http', 'transparent-http', 'connect', 'transparent-tls']));
    assert.ok(proxy.stats('sb-a').denied >= 4);
  });

  test('IP literals are refused in Host, CONNECT and SNI, numeric shorthands included', async () => {
    for (const target of [
      `http://127.0.0.1:${up.port}/echo`,
      `http://2130706433:${up.port}/echo`,
      `http://0x7f.1:${up.port}/echo`,
      `http://[::1]:${up.port}/echo`,
    ]) {
      const res = await request(proxy.ports.http, { localAddress: SANDBOX_A, target });
      assert.equal(res.status, 403, target);
      assert.equal(res.headers['x-dsec-egress'], 'denied; reason=ip-literal', target);
    }
    const tr = await request(proxy.ports.transparentHttp, { localAddress: SANDBOX_A, target: '/echo', host: '127.0.0.1' });
    assert.equal(tr.status, 403);
    const c = await connectTunnel(proxy.ports.http, SANDBOX_A, `127.0.0.1:${tlsUp.port}`);
    assert.equal(c.status, 403);
    await assert.rejects(tlsHandshake(proxy.ports.transparentTls, SANDBOX_A, '2130706433', cert.cert));
    assert.match(
      sink.last((e) => e.via === 'transparent-tls')?.reason ?? '',
      /^ip-literal: a loopback IPv4 address/,
      'every spelling is judged as the address it means',
    );
    assert.equal(up.hits > 0, true);
  });

  test('DNS rebinding: an allowed name resolving to 127.0.0.1 is refused without address permission', async () => {
    const before = up.hits;
    const fwd = await request(proxy.ports.http, { localAddress: SANDBOX_C, target: `http://rebind.test:${up.port}/echo` });
    assert.equal(fwd.status, 403);
    assert.equal(fwd.headers['x-dsec-egress'], 'denied; reason=restricted-address');
    const c = await connectTunnel(proxy.ports.http, SANDBOX_C, `rebind.test:${up.port}`);
    assert.equal(c.status, 403);
    await assert.rejects(tlsHandshake(proxy.ports.transparentTls, SANDBOX_C, 'rebind.test', cert.cert));
    assert.equal(up.hits, before, 'nothing reached the upstream');
    const entry = sink.last((e) => e.host === 'rebind.test');
    assert.equal(entry?.sandboxId, 'sb-c');
    assert.match(entry?.reason ?? '', /^restricted-address: rebind\.test resolves to 127\.0\.0\.1/);
    // The same name is fine for A, whose policy names the address.
    assert.equal((await request(proxy.ports.http, { localAddress: SANDBOX_A, target: `http://rebind.test:${up.port}/echo` })).status, 200);
  });

  test('a ClientHello without SNI, garbage on the TLS port and unknown sources are refused', async () => {
    await assert.rejects(tlsHandshake(proxy.ports.transparentTls, SANDBOX_A, undefined, cert.cert));
    assert.equal(proxy.recent({ sandboxId: 'sb-a' }).at(-1)?.reason, 'no-sni');

    const g = net.connect({ host: '127.0.0.1', port: proxy.ports.transparentTls, localAddress: SANDBOX_A });
    g.on('error', () => {});
    g.write('GET / HTTP/1.1\r\nHost: api.test\r\n\r\n');
    await closed(g);
    assert.equal(proxy.recent({ sandboxId: 'sb-a' }).at(-1)?.reason, 'bad-request');

    const res = await request(proxy.ports.http, { localAddress: NO_SANDBOX, target: `http://api.test:${up.port}/echo` });
    assert.equal(res.status, 403);
    assert.equal(res.headers['x-dsec-egress'], 'denied; reason=unknown-source');
    assert.equal(proxy.recent().at(-1)?.source, NO_SANDBOX);
  });

  test('bytes in and out are counted per sandbox and per connection', async () => {
    const before = proxy.stats('sb-a');
    const res = await request(proxy.ports.http, {
      localAddress: SANDBOX_A,
      target: `http://api.test:${up.port}/bytes?n=300000`,
      method: 'POST',
      body: 'x'.repeat(5000),
    });
    assert.equal(res.body.length, 300000);
    const after = proxy.stats('sb-a');
    assert.ok(after.bytesIn - before.bytesIn >= 300000, `in: ${after.bytesIn - before.bytesIn}`);
    assert.ok(after.bytesOut - before.bytesOut >= 5000, `out: ${after.bytesOut - before.bytesOut}`);
    const rec = proxy.recent({ sandboxId: 'sb-a' }).at(-1)!;
    assert.ok(rec.bytesIn >= 300000 && rec.bytesIn < 301000, String(rec.bytesIn));
    assert.ok(rec.closedAt);
    assert.equal(after.totalConnections > before.totalConnections, true);
  });

  test('policyChanged closes the open tunnels the new policy denies, and only those', async () => {
    const a = await connectTunnel(proxy.ports.http, SANDBOX_A, `api.test:${up.port}`);
    const b = await connectTunnel(proxy.ports.http, SANDBOX_B, `api.test:${up.port}`);
    const s = await connectTunnel(proxy.ports.http, SANDBOX_A, `secure.test:${tlsUp.port}`);
    assert.equal(a.status, 200);
    assert.equal(b.status, 200);
    assert.equal(s.status, 200);
    assert.equal(proxy.stats('sb-a').connections >= 2, true);
    sandboxes.set(SANDBOX_A, 'sb-a', { allow: ['secure.test', 'rebind.test'], allowAddresses: ['127.0.0.1'] });
    proxy.policyChanged('sb-a');
    await closed(a.socket!);
    const tls1 = tls.connect({ socket: s.socket!, servername: 'secure.test', ca: cert.cert });
    await new Promise<void>((resolve, reject) => tls1.once('secureConnect', resolve).once('error', reject));
    assert.equal(await exchangeLine(tls1, 'still here'), 'hello from secure.test: still here');
    assert.equal(b.socket!.destroyed, false, "another sandbox's tunnel stays open");
    const entry = sink.last((e) => e.sandboxId === 'sb-a' && e.verdict === 'denied');
    assert.equal(entry?.host, 'api.test');
    assert.match(entry?.reason ?? '', /^policy-changed: now denied: policy/);
    tls1.destroy();
    b.socket!.destroy();
    sandboxes.set(SANDBOX_A, 'sb-a', ALLOWED);
  });

  test('forget closes everything of a sandbox and drops its counters', async () => {
    const t = await connectTunnel(proxy.ports.http, SANDBOX_B, `api.test:${up.port}`);
    assert.equal(t.status, 200);
    proxy.forget('sb-b');
    await closed(t.socket!);
    assert.deepEqual(proxy.stats('sb-b'), { bytesIn: 0, bytesOut: 0, connections: 0, totalConnections: 0, denied: 0 });
  });
});

describe('egress proxy limits', () => {
  test('connections over the per-sandbox limit are refused and logged', async () => {
    const up = await startHttpUpstream();
    const sandboxes = new TestSandboxes();
    sandboxes.set(SANDBOX_A, 'sb-a', ALLOWED);
    sandboxes.set(SANDBOX_B, 'sb-b', ALLOWED);
    const sink = new LogSink();
    const proxy = await startEgressProxy({
      address: '127.0.0.1',
      ports: { http: 0 },
      sandboxes,
      resolver: staticResolver(HOSTS),
      log: sink.fn,
      raise: () => {},
      limits: { maxConnections: 2, queueTimeoutMs: 0 },
    });
    try {
      const t1 = await connectTunnel(proxy.ports.http, SANDBOX_A, `api.test:${up.port}`);
      const t2 = await connectTunnel(proxy.ports.http, SANDBOX_A, `api.test:${up.port}`);
      assert.equal(t1.status, 200);
      assert.equal(t2.status, 200);
      // No queue: refused at once with a 503 that names the limit.
      const third = await connectTunnel(proxy.ports.http, SANDBOX_A, `api.test:${up.port}`);
      assert.equal(third.status, 503);
      assert.match(third.body, /sandbox limit of 2 connections/);
      assert.match(sink.last()?.reason ?? '', /^connection-limit: sandbox limit of 2/);
      // Another sandbox has its own allowance.
      const other = await connectTunnel(proxy.ports.http, SANDBOX_B, `api.test:${up.port}`);
      assert.equal(other.status, 200);
      other.socket!.destroy();
      // A closed connection frees its slot.
      t1.socket!.destroy();
      for (let i = 0; i < 100 && proxy.stats('sb-a').connections >= 2; i++) await new Promise((r) => setTimeout(r, 10));
      const t3 = await connectTunnel(proxy.ports.http, SANDBOX_A, `api.test:${up.port}`);
      assert.equal(t3.status, 200);
      t2.socket!.destroy();
      t3.socket!.destroy();
    } finally {
      await proxy.close();
      await up.close();
    }
  });

  test('bandwidth is held to the bucket: bytes delivered never exceed burst + rate x elapsed', async () => {
    const up = await startHttpUpstream();
    const sandboxes = new TestSandboxes();
    sandboxes.set(SANDBOX_A, 'sb-a', ALLOWED);
    const rate = 256 * 1024;
    const burst = 64 * 1024;
    const proxy = await startEgressProxy({
      address: '127.0.0.1',
      ports: { http: 0 },
      sandboxes,
      resolver: staticResolver(HOSTS),
      log: () => {},
      raise: () => {},
      limits: { bytesPerSecond: rate, burstBytes: burst },
    });
    const total = 64 * 1024 * 1024;
    try {
      const t0 = performance.now();
      let received = 0;
      await new Promise<void>((resolve, reject) => {
        const req = http.request(
          { host: '127.0.0.1', port: proxy.ports.http, localAddress: SANDBOX_A, path: `http://api.test:${up.port}/bytes?n=${total}`, agent: false },
          (res) => {
            res.on('data', (c: Buffer) => {
              received += c.length;
              if (received >= 400 * 1024) {
                req.destroy();
                resolve();
              }
            });
            res.on('error', () => {});
          },
        );
        req.on('error', reject);
        req.end();
      });
      const elapsedS = (performance.now() - t0) / 1000;
      const counted = proxy.stats('sb-a').bytesIn;
      // Headers are counted too (< 1 KiB); slices leave the bucket 64 KiB at a time.
      const bound = burst + rate * elapsedS + 64 * 1024 + 1024;
      assert.ok(counted <= bound, `counted ${counted} bytes in ${elapsedS.toFixed(2)} s, bound ${bound.toFixed(0)}`);
      assert.ok(counted < total / 4, 'the download was held back');
    } finally {
      await proxy.close();
      await up.close();
    }
  });
});

/** A TLS handshake to the transparent port; rejects when the proxy refuses it. */
function tlsHandshake(port: number, localAddress: string, servername: string | undefined, ca: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const s = tlsFrom(localAddress, port, { ca, ...(servername !== undefined ? { servername } : {}) });
    s.once('secureConnect', () => {
      s.destroy();
      resolve();
    });
    s.once('error', (err: Error) => {
      s.destroy();
      reject(err);
    });
    s.once('close', () => reject(new Error('socket disconnected')));
  });
}
