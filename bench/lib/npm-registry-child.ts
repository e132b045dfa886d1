// The install scenario's registry, run inside its network namespace: the shared fixture
// (@dsec/edge testing/npm-registry.ts) over TLS behind a relay on port 443 that delays every
// piece of data by the one-way delay in each direction (and a new connection by one round trip,
// its handshake; delay-relay.ts): this kernel has no netem, the link's rate is a tbf qdisc. Its counters on port
// 9000 (GET: read, POST: read and reset). With a fifth argument, a directory served as plain HTTP
// on port 80 behind the same kind of relay (the Debian repository of the apt part; counters at
// /apt on port 9000).
// Usage: node npm-registry-child.js <index.json> <address> <tls dir> <one-way delay ms> [<static dir>]
import { readFile } from 'node:fs/promises';
import http from 'node:http';
import type net from 'node:net';
import path from 'node:path';
import { startNpmRegistry, startStaticRepo } from '@dsec/edge';
import { startDelayRelay } from './delay-relay.js';

const [index, address, tlsDir, delayArg, staticDir] = process.argv.slice(2);
const delayMs = Number(delayArg ?? '0');
if (!index || !address || !tlsDir) throw new Error('usage: npm-registry-child.js <index.json> <address> <tls dir>');
const saved = JSON.parse(await readFile(index, 'utf8')) as { packuments: Array<[string, unknown]>; tarballs: Array<[string, string]> };
const registry = await startNpmRegistry(
  { packuments: new Map(saved.packuments), tarballs: new Map(saved.tarballs) },
  {
    host: '127.0.0.1',
    port: 0,
    tls: { key: await readFile(path.join(tlsDir, 'key.pem'), 'utf8'), cert: await readFile(path.join(tlsDir, 'cert.pem'), 'utf8') },
    publicUrl: 'https://registry.npmjs.org',
  },
);
const repo = staticDir ? await startStaticRepo(staticDir, { host: '127.0.0.1' }) : undefined;
const stats = http.createServer((req, res) => {
  const counted = req.url === '/apt' ? repo : registry;
  if (!counted) return void res.writeHead(404).end();
  const body = JSON.stringify({ connections: counted.connections, requests: counted.requests });
  if (req.method === 'POST') counted.resetCounters();
  res.writeHead(200, { 'content-type': 'application/json' }).end(body);
});

/** A relay on `port` of the namespace's address to a local server's port, delayed each way (delay-relay.ts). */
const relay = (port: number, upstreamPort: number): net.Server => startDelayRelay({ host: address, port }, { host: '127.0.0.1', port: upstreamPort }, delayMs);
relay(443, Number(new URL(registry.url).port));
if (repo) relay(80, Number(new URL(repo.url).port));
stats.listen(9000, address, () => process.stdout.write('ready\n'));
