// The egress proxy's cost: latency it adds to a small request and the throughput of a large
// download, direct vs through each of its paths, all against local upstreams on loopback.
import { once } from 'node:events';
import http from 'node:http';
import net from 'node:net';
import tls from 'node:tls';
import { makeCertificate, startEgressProxy } from '@dsec/edge';
import type { EgressProxyOptions } from '@dsec/edge';
import { latencyRow } from '../lib/report.js';
import type { Scenario, ScenarioContext } from '../lib/scenario.js';
import { nowMs, progress, summarize } from '../lib/stats.js';

const WARMUP = 20;
/** Source address of the benchmark's "sandbox" (any 127/8 address works on Linux). */
const SOURCE = '127.0.0.2';
const SMALL_BYTES = 1024;

type View = ReturnType<EgressProxyOptions['sandboxes']['bySourceAddress']> & object;

function view(): View {
  return {
    sandboxId: 'bench',
    mode: 'allowlist',
    address: SOURCE,
    policy: { mode: 'allowlist', allow: [{ host: 'upstream.bench' }], allowAddresses: ['127.0.0.1'] },
    version: 1,
    allows: (host: string) => (host === 'upstream.bench' ? { allowed: true, rule: 'allow:upstream.bench' } : { allowed: false, reason: 'no rule matches' }),
    allowsName: (name: string) => ({ allowed: name === 'upstream.bench' }),
    addressAllowed: (ip: string) => ip === '127.0.0.1',
    mirrors: {},
  };
}

/** Reads a whole response; resolves with its byte count. */
function fetchBytes(opts: http.RequestOptions): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = http.request({ agent: false, localAddress: SOURCE, ...opts }, (res) => {
      let n = 0;
      res.on('data', (c: Buffer) => (n += c.length));
      res.on('end', () => (res.statusCode === 200 ? resolve(n) : reject(new Error(`status ${res.statusCode}`))));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

/** GET over a fresh TLS connection (handshake included); resolves with the body's byte count. */
function tlsGet(port: number, ca: string, pathName: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const raw = net.connect({ host: '127.0.0.1', port, localAddress: SOURCE });
    const s = tls.connect({ socket: raw, servername: 'upstream.bench', ca });
    s.on('error', reject);
    s.once('secureConnect', () => {
      const req = http.request({ createConnection: () => s, path: pathName, headers: { host: 'upstream.bench' } }, (res) => {
        let n = 0;
        res.on('data', (c: Buffer) => (n += c.length));
        res.on('end', () => {
          s.destroy();
          resolve(n);
        });
      });
      req.on('error', reject);
      req.end();
    });
  });
}

/** GET through a CONNECT tunnel (tunnel set-up included). */
function connectGet(proxyPort: number, upstreamPort: number, pathName: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: '127.0.0.1',
      port: proxyPort,
      localAddress: SOURCE,
      method: 'CONNECT',
      path: `upstream.bench:${upstreamPort}`,
      agent: false,
    });
    req.on('connect', (res, socket) => {
      if (res.statusCode !== 200) return reject(new Error(`CONNECT: ${res.statusCode}`));
      const inner = http.request({ createConnection: () => socket, path: pathName, headers: { host: 'upstream.bench' } }, (r) => {
        let n = 0;
        r.on('data', (c: Buffer) => (n += c.length));
        r.on('end', () => {
          socket.destroy();
          resolve(n);
        });
      });
      inner.on('error', reject);
      inner.end();
    });
    req.on('error', reject);
    req.end();
  });
}

function bytesHandler(req: http.IncomingMessage, res: http.ServerResponse): void {
  const n = Number(new URL(req.url ?? '/', 'http://x').searchParams.get('n') ?? '0');
  res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': n });
  const chunk = Buffer.alloc(Math.min(n, 256 * 1024) || 1, 0x61);
  let left = n;
  const write = (): void => {
    while (left > 0) {
      const c = chunk.subarray(0, Math.min(left, chunk.length));
      left -= c.length;
      if (!res.write(c)) return void res.once('drain', write);
    }
    res.end();
  };
  res.on('close', () => (left = 0));
  write();
}

export const proxyScenario: Scenario = {
  name: 'proxy',
  title: 'Egress proxy overhead',
  method: [
    'A local HTTP and HTTPS upstream on loopback, a client bound to 127.0.0.2 (the "sandbox"); the proxy runs',
    'in-process with a policy that allows the upstream name. Latency: GET of 1 KiB on a fresh connection each time',
    "(as a sandbox's tools mostly do), direct vs through the explicit forward proxy, a CONNECT tunnel, transparent",
    'HTTP (Host header) and transparent TLS (SNI peeked, TLS handshake end to end); the systems alternate every',
    'iteration. Throughput: a large download, direct vs forward vs CONNECT (alternating, total bytes over total time),',
    'with the per-sandbox bandwidth limit raised out of the way. MiB = 2^20 bytes.',
  ].join(' '),
  async run(ctx: ScenarioContext) {
    const iterations = ctx.quick ? 100 : 1000;
    const bigBytes = (ctx.quick ? 64 : 1024) * 2 ** 20;
    const { key, cert } = await makeCertificate('upstream.bench');

    const upstream = http.createServer(bytesHandler);
    upstream.listen(0, '127.0.0.1');
    await once(upstream, 'listening');
    const upPort = (upstream.address() as net.AddressInfo).port;
    const secure = http.createServer(bytesHandler);
    const tlsServer = tls.createServer({ key, cert }, (s) => secure.emit('connection', s));
    tlsServer.listen(0, '127.0.0.1');
    await once(tlsServer, 'listening');
    const tlsPort = (tlsServer.address() as net.AddressInfo).port;

    const v = view();
    const proxy = await startEgressProxy({
      address: '127.0.0.1',
      ports: { http: 0 },
      transparentPorts: { http: upPort, tls: tlsPort },
      sandboxes: { bySourceAddress: (ip) => (ip === SOURCE ? v : undefined) },
      resolver: { resolve4: (name) => Promise.resolve(name === 'upstream.bench' ? ['127.0.0.1'] : []) },
      log: () => {},
      raise: () => {},
      limits: { bytesPerSecond: 1024 ** 4, burstBytes: 1024 ** 4 },
    });
    try {
      const small = `/bytes?n=${SMALL_BYTES}`;
      const systems: Array<[string, () => Promise<number>]> = [
        ['direct', () => fetchBytes({ host: '127.0.0.1', port: upPort, path: small })],
        ['proxy: HTTP forward', () => fetchBytes({ host: '127.0.0.1', port: proxy.ports.http, path: `http://upstream.bench:${upPort}${small}` })],
        ['proxy: CONNECT', () => connectGet(proxy.ports.http, upPort, small)],
        [
          'proxy: transparent HTTP',
          () => fetchBytes({ host: '127.0.0.1', port: proxy.ports.transparentHttp, path: small, headers: { host: 'upstream.bench' } }),
        ],
        ['direct TLS', () => tlsGet(tlsPort, cert, small)],
        ['proxy: transparent TLS', () => tlsGet(proxy.ports.transparentTls, cert, small)],
      ];
      for (let i = 0; i < WARMUP; i++) for (const [, fn] of systems) await fn();
      const samples = new Map<string, number[]>(systems.map(([n]) => [n, []]));
      for (let i = 0; i < iterations; i++) {
        for (const [name, fn] of systems) {
          const t0 = nowMs();
          const n = await fn();
          samples.get(name)!.push(nowMs() - t0);
          if (n !== SMALL_BYTES) throw new Error(`${name}: got ${n} bytes`);
        }
      }
      for (const [name, xs] of samples) {
        const metric = name.includes('TLS') ? 'GET 1 KiB over TLS, new connection' : 'GET 1 KiB, new connection';
        ctx.record(latencyRow('proxy', metric, name, summarize(xs)));
        progress(`proxy: ${name}: p50 ${summarize(xs).p50.toFixed(3)} ms`);
      }

      const big = `/bytes?n=${bigBytes}`;
      const downloads: Array<[string, () => Promise<number>]> = [
        ['direct', () => fetchBytes({ host: '127.0.0.1', port: upPort, path: big })],
        ['proxy: HTTP forward', () => fetchBytes({ host: '127.0.0.1', port: proxy.ports.http, path: `http://upstream.bench:${upPort}${big}` })],
        ['proxy: CONNECT', () => connectGet(proxy.ports.http, upPort, big)],
      ];
      const reps = ctx.quick ? 1 : 3;
      const totals = new Map<string, { bytes: number; ms: number }>(downloads.map(([n]) => [n, { bytes: 0, ms: 0 }]));
      for (let r = 0; r < reps; r++) {
        for (const [name, fn] of downloads) {
          const t0 = nowMs();
          const n = await fn();
          const t = totals.get(name)!;
          t.ms += nowMs() - t0;
          t.bytes += n;
          if (n !== bigBytes) throw new Error(`${name}: got ${n} of ${bigBytes} bytes`);
        }
      }
      for (const [name, t] of totals) {
        const mibps = t.bytes / 2 ** 20 / (t.ms / 1000);
        ctx.record({
          scenario: 'proxy',
          metric: `download of ${bigBytes / 2 ** 20} MiB`,
          system: name,
          unit: 'MiB/s',
          value: mibps,
          higherIsBetter: true,
          n: reps,
        });
        progress(`proxy: ${name}: ${mibps.toFixed(0)} MiB/s`);
      }
      const stats = proxy.stats('bench');
      ctx.note(
        `The proxy counted ${(stats.bytesIn / 2 ** 20).toFixed(0)} MiB in and ${(stats.bytesOut / 2 ** 10).toFixed(0)} KiB out for the benchmark's sandbox over ${stats.totalConnections} connections.`,
      );
    } finally {
      await proxy.close();
      upstream.closeAllConnections();
      await new Promise<void>((r) => upstream.close(() => r()));
      await new Promise<void>((r) => tlsServer.close(() => r()));
    }
  },
};
