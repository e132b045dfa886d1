// Connection accounting of the egress proxy on every path a client connection can end by:
// each test ends with the sandbox's and the node's open counts back at zero.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import type { RaisedEvent } from '@dsec/protocol';
import { startEgressProxy } from './proxy.js';
import type { EgressProxyHandle, EgressProxyOptions } from './proxy.js';
import { closed, connectTunnel, LogSink, request, SANDBOX_A, SANDBOX_B, startHttpUpstream, staticResolver, TestSandboxes } from './test-fixtures.js';

const HOSTS = { 'api.test': '127.0.0.1' };
const ALLOWED = { allow: ['api.test'], allowAddresses: ['127.0.0.1'] };
/** Liveness bound: a count that does not settle within this is a leak (or a hang). */
const SETTLE_MS = 10_000;

async function waitFor(what: string, pred: () => boolean): Promise<void> {
  const until = Date.now() + SETTLE_MS;
  while (!pred()) {
    if (Date.now() > until) throw new Error(`not within ${SETTLE_MS} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/**
 * A raw CONNECT tunnel that, once open, holds it for `holdMs` (as a client busy with its TLS
 * handshake would), sends one HTTP/1.1 request and resolves with all it read until the close.
 */
function tunnelRequest(port: number, localAddress: string, authority: string, holdMs = 100): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host: '127.0.0.1', port, localAddress });
    let data = '';
    let sent = false;
    s.on('connect', () => s.write(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n\r\n`));
    s.on('data', (d: Buffer) => {
      data += d.toString('latin1');
      if (sent || !data.includes('\r\n\r\n')) return;
      sent = true;
      setTimeout(() => s.write('GET /echo HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n'), holdMs);
    });
    s.on('close', () => resolve(data));
    s.on('error', reject);
  });
}

describe('egress proxy connection accounting', () => {
  let up: Awaited<ReturnType<typeof startHttpUpstream>>;
  let proxy: EgressProxyHandle;
  const sandboxes = new TestSandboxes();
  const sink = new LogSink();
  const events: RaisedEvent[] = [];

  const start = (extra: Partial<EgressProxyOptions> = {}): Promise<EgressProxyHandle> =>
    startEgressProxy({
      address: '127.0.0.1',
      ports: { http: 0 },
      transparentPorts: { http: up.port, tls: up.port },
      sandboxes,
      resolver: staticResolver(HOSTS),
      log: sink.fn,
      raise: (e) => void events.push(e),
      ...extra,
    });
  const settled = async (p: EgressProxyHandle = proxy): Promise<void> => {
    await waitFor('sandbox a back at zero connections', () => p.stats('sb-a').connections === 0);
    await waitFor('node back at zero connections', () => p.gateStats().open === 0 && p.gateStats().waiting === 0);
  };

  before(async () => {
    up = await startHttpUpstream();
    sandboxes.set(SANDBOX_A, 'sb-a', ALLOWED);
    sandboxes.set(SANDBOX_B, 'sb-b', ALLOWED);
    proxy = await start();
  });
  after(async () => {
    await proxy?.close();
    await up?.close();
  });

  test('keep-alive: one counted connection for many requests, released when the client closes it', async () => {
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1, localAddress: SANDBOX_A });
    try {
      for (let i = 0; i < 5; i++) {
        const r = await new Promise<number>((resolve, reject) => {
          const req = http.get({ host: '127.0.0.1', port: proxy.ports.http, path: `http://api.test:${up.port}/echo`, agent }, (res) => {
            res.resume();
            res.on('end', () => resolve(res.statusCode ?? 0));
          });
          req.on('error', reject);
        });
        assert.equal(r, 200);
      }
      assert.equal(proxy.stats('sb-a').connections, 1);
    } finally {
      agent.destroy();
    }
    await settled();
  });

  test('half-close: the client ends its side, the answer still arrives, then both are released', async () => {
    const t = await connectTunnel(proxy.ports.http, SANDBOX_A, `api.test:${up.port}`);
    assert.equal(t.status, 200);
    const s = t.socket!;
    let data = '';
    s.on('data', (d: Buffer) => (data += d.toString()));
    s.end('GET /echo HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n');
    await closed(s);
    assert.match(data, /^HTTP\/1\.1 200/);
    await settled();
  });

  test('resets and aborts: a reset tunnel, an aborted download, a client gone mid-request', async () => {
    const t = await connectTunnel(proxy.ports.http, SANDBOX_A, `api.test:${up.port}`);
    t.socket!.resetAndDestroy();
    await new Promise<void>((resolve, reject) => {
      const req = http.get(
        { host: '127.0.0.1', port: proxy.ports.http, localAddress: SANDBOX_A, path: `http://api.test:${up.port}/bytes?n=${64 * 1024 * 1024}`, agent: false },
        (res) => {
          res.once('data', () => {
            req.destroy();
            resolve();
          });
        },
      );
      req.on('error', (err) => (req.destroyed ? undefined : reject(err)));
    });
    const half = net.connect({ host: '127.0.0.1', port: proxy.ports.http, localAddress: SANDBOX_A });
    half.on('error', () => {});
    await new Promise<void>((r) => half.once('connect', () => r()));
    half.write(`GET http://api.test:${up.port}/echo HTTP/1.1\r\nHost: api.test\r\n`); // headers never finished
    half.destroy();
    await settled();
  });

  test('upstream errors: refused dial, upstream reset mid-tunnel, denied destination', async () => {
    const dead = net.createServer();
    dead.listen(0, '127.0.0.1');
    await new Promise((r) => dead.once('listening', r));
    const deadPort = (dead.address() as net.AddressInfo).port;
    await new Promise<void>((r) => dead.close(() => r()));
    const refused = await connectTunnel(proxy.ports.http, SANDBOX_A, `api.test:${deadPort}`);
    assert.equal(refused.status, 502);
    const viaHttp = await request(proxy.ports.http, { localAddress: SANDBOX_A, target: `http://api.test:${deadPort}/x` });
    assert.equal(viaHttp.status, 502);
    const denied = await connectTunnel(proxy.ports.http, SANDBOX_A, `elsewhere.test:${up.port}`);
    assert.equal(denied.status, 403);
    // An upstream that resets the tunnel.
    const rude = net.createServer((s) => s.resetAndDestroy());
    rude.listen(0, '127.0.0.1');
    await new Promise((r) => rude.once('listening', r));
    try {
      const t = await connectTunnel(proxy.ports.http, SANDBOX_A, `api.test:${(rude.address() as net.AddressInfo).port}`);
      if (t.socket) await closed(t.socket);
    } finally {
      rude.close();
    }
    await settled();
  });

  test('over the limit: waits for a slot, or is refused with 503 naming the limit; waiters that leave are dropped', async () => {
    const p = await start({ limits: { maxConnections: 1, queueTimeoutMs: 300 } });
    events.length = 0;
    try {
      const held = await connectTunnel(p.ports.http, SANDBOX_A, `api.test:${up.port}`);
      assert.equal(held.status, 200);
      const refused = await connectTunnel(p.ports.http, SANDBOX_A, `api.test:${up.port}`);
      assert.equal(refused.status, 503);
      assert.match(refused.body, /connection-limit: sandbox limit of 1 connections \(waited 0 s\)/);
      assert.match(sink.last()?.reason ?? '', /^connection-limit: sandbox limit of 1 connections/);
      const throttled = events.find((e) => e.kind === 'egress.throttled');
      assert.equal(throttled?.sandboxId, 'sb-a');
      assert.equal(throttled?.data?.limit, 'sandbox');
      assert.equal(throttled?.data?.maxConnections, 1);
      // Another sandbox is not held up.
      const other = await connectTunnel(p.ports.http, SANDBOX_B, `api.test:${up.port}`);
      assert.equal(other.status, 200);
      other.socket!.destroy();
      // A waiter that leaves frees its place in the queue.
      const leaver = net.connect({ host: '127.0.0.1', port: p.ports.http, localAddress: SANDBOX_A });
      leaver.on('error', () => {});
      await new Promise<void>((r) => leaver.once('connect', () => r()));
      await waitFor('the leaver waits', () => p.gateStats().waiting === 1);
      leaver.resetAndDestroy();
      await waitFor('the leaver left the queue', () => p.gateStats().waiting === 0);
      // A waiter gets the slot the held tunnel frees.
      const waiter = connectTunnel(p.ports.http, SANDBOX_A, `api.test:${up.port}`);
      await waitFor('the waiter waits', () => p.gateStats().waiting === 1);
      held.socket!.destroy();
      const got = await waiter;
      assert.equal(got.status, 200);
      got.socket!.destroy();
      await settled(p);
    } finally {
      await p.close();
    }
  });

  test('burst: 320 tunnels through a limit of 16 all succeed (slowed, not failed)', async () => {
    const p = await start({ limits: { maxConnections: 16, queueTimeoutMs: 60_000 } });
    events.length = 0;
    sink.entries.length = 0;
    try {
      const answers = await Promise.all(Array.from({ length: 320 }, () => tunnelRequest(p.ports.http, SANDBOX_A, `api.test:${up.port}`)));
      const ok = answers.filter((a) => /^HTTP\/1\.1 200 Connection Established\r\n\r\nHTTP\/1\.1 200/.test(a)).length;
      assert.equal(
        ok,
        320,
        `answers that were not a tunnel and a 200: ${answers
          .filter((a) => !a.includes('200 Connection Established'))
          .slice(0, 3)
          .join(' | ')}`,
      );
      assert.ok(
        events.some((e) => e.kind === 'egress.throttled' && e.data?.limit === 'sandbox'),
        'the sandbox was told it was slowed',
      );
      assert.equal(sink.entries.filter((e) => e.reason?.startsWith('connection-limit')).length, 0, 'nothing refused');
      await settled(p);
    } finally {
      await p.close();
    }
  });
});
