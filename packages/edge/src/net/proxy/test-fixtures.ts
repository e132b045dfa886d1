// What the egress proxy's tests share: policies for source addresses on loopback, a static name
// resolver, local upstreams (HTTP, TLS with a certificate from certificate.ts, a fake npm registry)
// and clients bound to chosen source addresses. Everything listens and connects on 127.0.0.0/8.
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import http from 'node:http';
import type { IncomingHttpHeaders } from 'node:http';
import net from 'node:net';
import tls from 'node:tls';
import { gzipSync } from 'node:zlib';
import type { Mirror, NetworkPreset } from '@dsec/protocol';
import type { EgressLogEntry, EgressPolicyView, EgressVerdict, NameResolver, SandboxResolver } from '../types.js';

/** Source addresses the tests' "sandboxes" connect from. */
export const SANDBOX_A = '127.0.0.2';
export const SANDBOX_B = '127.0.0.3';
export const SANDBOX_C = '127.0.0.4';
export const NO_SANDBOX = '127.0.0.9';

/** What a test policy allows. */
export interface TestPolicy {
  mode?: 'none' | 'allowlist';
  /** Hosts (names or IPv4 literals) allowed on any port. */
  allow?: string[];
  /** Addresses of special ranges (loopback here) the proxy may dial. */
  allowAddresses?: string[];
  mirrors?: Partial<Record<NetworkPreset, Mirror>>;
}

/**
 * A policy view with the contract's semantics, small enough to read at a glance: names and IP
 * literals are allowed when listed; loopback and private addresses only when listed.
 */
export function testView(sandboxId: string, address: string, p: TestPolicy): EgressPolicyView {
  const allow = new Set(p.allow ?? []);
  const special = (ip: string): boolean => /^(127\.|10\.|192\.168\.|169\.254\.|0\.)/.test(ip) || /^172\.(1[6-9]|2\d|3[01])\./.test(ip);
  return {
    sandboxId,
    mode: p.mode ?? 'allowlist',
    address,
    policy: { mode: p.mode ?? 'allowlist' },
    version: 1,
    allows(host: string): EgressVerdict {
      return allow.has(host) ? { allowed: true, rule: `allow:${host}` } : { allowed: false, reason: 'no rule matches' };
    },
    allowsName(name: string): EgressVerdict {
      return this.allows(name, 443);
    },
    addressAllowed(ip: string): boolean {
      return !special(ip) || (p.allowAddresses ?? []).includes(ip) || allow.has(ip);
    },
    mirrors: p.mirrors ?? {},
  };
}

/** Source address -> policy, changeable while the proxy runs. */
export class TestSandboxes implements SandboxResolver {
  readonly views = new Map<string, EgressPolicyView>();
  set(address: string, sandboxId: string, p: TestPolicy): void {
    this.views.set(address, testView(sandboxId, address, p));
  }
  bySourceAddress(ip: string): EgressPolicyView | undefined {
    return this.views.get(ip);
  }
}

/** A resolver that knows only its map (the node's static hosts), asking no one else. */
export function staticResolver(hosts: Record<string, string>): NameResolver & { asked: string[] } {
  const asked: string[] = [];
  return {
    asked,
    resolve4(name: string) {
      asked.push(name);
      const ip = hosts[name.toLowerCase().replace(/\.$/, '')];
      return Promise.resolve(ip ? [ip] : []);
    },
  };
}

/** Collects what the proxy logs. */
export class LogSink {
  readonly entries: EgressLogEntry[] = [];
  readonly fn = (e: EgressLogEntry): void => void this.entries.push(e);
  last(pred: (e: EgressLogEntry) => boolean = () => true): EgressLogEntry | undefined {
    return [...this.entries].reverse().find(pred);
  }
}

/** An HTTP upstream on loopback: `/echo` answers what it got, `/bytes?n=N` sends N bytes. */
export async function startHttpUpstream(): Promise<{ port: number; hits: number; close(): Promise<void> }> {
  const state = { port: 0, hits: 0, close: async () => {} };
  const server = http.createServer((req, res) => {
    state.hits++;
    const url = new URL(req.url ?? '/', 'http://x');
    if (url.pathname === '/bytes') {
      const n = Number(url.searchParams.get('n') ?? '0');
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': n });
      const chunk = Buffer.alloc(64 * 1024, 0x61);
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
      return write();
    }
    const body: Buffer[] = [];
    req.on('data', (c: Buffer) => body.push(c));
    req.on('end', () => {
      const payload = JSON.stringify({ method: req.method, path: req.url, headers: req.headers, body: Buffer.concat(body).toString() });
      res.writeHead(200, { 'content-type': 'application/json', 'x-upstream': 'plain' });
      res.end(payload);
    });
  });
  // Upgrade: answers 101, then echoes what it gets.
  server.on('upgrade', (req: http.IncomingMessage, socket: net.Socket, head: Buffer) => {
    state.hits++;
    socket.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\nX-Seen-Host: ${req.headers.host}\r\n\r\n`);
    if (head.length) socket.write(head);
    socket.on('data', (d: Buffer) => socket.write(d));
    socket.on('end', () => socket.end());
    socket.on('error', () => {});
  });
  const sockets = new Set<net.Socket>();
  server.on('connection', (s: net.Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  state.port = (server.address() as net.AddressInfo).port;
  state.close = () =>
    new Promise<void>((r) => {
      for (const s of sockets) s.destroy(); // upgraded ones included
      server.close(() => r());
    });
  return state;
}

/** A TLS upstream on loopback that answers every line with `hello from <name>: <line>`. */
export async function startTlsUpstream(name: string, pair: { key: string; cert: string }): Promise<{ port: number; close(): Promise<void> }> {
  const sockets = new Set<net.Socket>();
  const server = tls.createServer({ key: pair.key, cert: pair.cert }, (s) => {
    s.on('error', () => {});
    s.on('data', (d: Buffer) => s.write(`hello from ${name}: ${d.toString().trim()}\n`));
  });
  server.on('connection', (s: net.Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return {
    port: (server.address() as net.AddressInfo).port,
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}

/** A response read in full. */
export interface TestResponse {
  status: number;
  headers: IncomingHttpHeaders;
  body: Buffer;
}

/** An HTTP request from `localAddress` to the proxy (`target` is absolute-form or a path). */
export function request(
  port: number,
  opts: { localAddress: string; target: string; host?: string; method?: string; headers?: Record<string, string>; body?: string },
): Promise<TestResponse> {
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        host: '127.0.0.1',
        port,
        localAddress: opts.localAddress,
        method: opts.method ?? 'GET',
        path: opts.target,
        agent: false,
        headers: { ...(opts.host ? { host: opts.host } : {}), ...opts.headers },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end(opts.body);
  });
}

/** Sends CONNECT; resolves with the status and, on 200, the tunnel socket. */
export function connectTunnel(port: number, localAddress: string, authority: string): Promise<{ status: number; socket?: net.Socket; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, localAddress, method: 'CONNECT', path: authority, agent: false });
    req.on('connect', (res, socket, head: Buffer) => {
      if (res.statusCode === 200) {
        if (head.length) socket.unshift(head);
        return resolve({ status: 200, socket, body: '' });
      }
      const chunks: Buffer[] = [head];
      socket.on('data', (c: Buffer) => chunks.push(c));
      socket.on('close', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }));
    });
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }));
    });
    req.on('error', reject);
    req.end();
  });
}

/** A TLS client from `localAddress` (bound on the TCP socket underneath). */
export function tlsFrom(localAddress: string, port: number, opts: tls.ConnectionOptions): tls.TLSSocket {
  const raw = net.connect({ host: '127.0.0.1', port, localAddress });
  return tls.connect({ ...opts, socket: raw });
}

/** Writes `line` and resolves with the first line that comes back. */
export function exchangeLine(socket: net.Socket | tls.TLSSocket, line: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let buf = '';
    const onData = (d: Buffer): void => {
      buf += d.toString();
      const nl = buf.indexOf('\n');
      if (nl >= 0) {
        socket.off('data', onData);
        resolve(buf.slice(0, nl));
      }
    };
    socket.on('data', onData);
    socket.once('error', reject);
    socket.once('close', () => reject(new Error(`closed before a line came back (got ${JSON.stringify(buf)})`)));
    socket.write(line + '\n');
  });
}

/** Resolves when the socket closes. */
export function closed(socket: net.Socket): Promise<void> {
  return socket.destroyed ? Promise.resolve() : once(socket, 'close').then(() => undefined);
}

/** One version of a fake npm package. */
export interface FakeVersion {
  version: string;
  published: string;
}

/** A package tarball as npm makes them: package/package.json (+ index.js) in a gzipped tar. */
export function npmTarball(name: string, version: string): Buffer {
  const files: Array<[string, string]> = [
    ['package/package.json', JSON.stringify({ name, version, main: 'index.js' })],
    ['package/index.js', `module.exports = ${JSON.stringify(version)};\n`],
  ];
  const blocks: Buffer[] = [];
  for (const [file, content] of files) {
    const data = Buffer.from(content);
    const h = Buffer.alloc(512);
    h.write(file, 0, 100);
    h.write('0000644\0', 100);
    h.write('0000000\0', 108);
    h.write('0000000\0', 116);
    h.write(data.length.toString(8).padStart(11, '0') + '\0', 124);
    h.write('00000000000\0', 136);
    h.write('        ', 148);
    h.write('0', 156);
    h.write('ustar\0', 257);
    h.write('00', 263);
    let sum = 0;
    for (const b of h) sum += b;
    h.write(sum.toString(8).padStart(6, '0') + '\0 ', 148);
    blocks.push(h, data, Buffer.alloc((512 - (data.length % 512)) % 512));
  }
  blocks.push(Buffer.alloc(1024));
  return gzipSync(Buffer.concat(blocks));
}

/** A fake npm registry on loopback: full packuments with publish times, tarballs, hit counts. */
export async function startFakeRegistry(
  packages: Record<string, FakeVersion[]>,
  opts: { delayMs?: number } = {},
): Promise<{ url: string; origin: string; hits: Map<string, number>; tarballs: Map<string, Buffer>; close(): Promise<void> }> {
  const hits = new Map<string, number>();
  const tarballs = new Map<string, Buffer>();
  let origin = '';
  const packument = (name: string, versions: FakeVersion[]): unknown => {
    const base = name.includes('/') ? name.split('/')[1]! : name;
    const out: Record<string, unknown> = {};
    const time: Record<string, string> = { created: versions[0]!.published, modified: versions[versions.length - 1]!.published };
    for (const v of versions) {
      const file = `${base}-${v.version}.tgz`;
      const tgz = npmTarball(name, v.version);
      tarballs.set(`/${name}/-/${file}`, tgz);
      out[v.version] = {
        name,
        version: v.version,
        main: 'index.js',
        dist: {
          tarball: `${origin}/${name}/-/${file}`,
          shasum: createHash('sha1').update(tgz).digest('hex'),
          integrity: 'sha512-' + createHash('sha512').update(tgz).digest('base64'),
        },
      };
      time[v.version] = v.published;
    }
    const latest = [...versions].reverse().find((v) => !v.version.includes('-')) ?? versions[versions.length - 1]!;
    return { _id: name, _rev: '7-abc', name, 'dist-tags': { latest: latest.version }, versions: out, time };
  };
  const docs = new Map<string, unknown>();
  const server = http.createServer((req, res) => {
    const p = decodeURIComponent((req.url ?? '/').split('?')[0]!);
    hits.set(p, (hits.get(p) ?? 0) + 1);
    const reply = (): void => {
      const doc = docs.get(p.slice(1));
      if (doc) {
        res.writeHead(200, { 'content-type': 'application/json' });
        return void res.end(JSON.stringify(doc));
      }
      const tgz = tarballs.get(p);
      if (tgz) {
        res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': tgz.length });
        return void res.end(tgz);
      }
      res.writeHead(404, { 'content-type': 'application/json' });
      res.end('{"error":"Not found"}');
    };
    if (opts.delayMs) setTimeout(reply, opts.delayMs);
    else reply();
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  origin = `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`;
  for (const [name, versions] of Object.entries(packages)) docs.set(name, packument(name, versions));
  return {
    url: origin + '/',
    origin,
    hits,
    tarballs,
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}
