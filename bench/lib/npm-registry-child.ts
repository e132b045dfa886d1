// The install scenario's registry, run inside its network namespace: the shared fixture
// (@dsec/edge testing/npm-registry.ts) over TLS on port 443, and its counters on port 9000
// (GET: read, POST: read and reset). Usage: node npm-registry-child.js <index.json> <address> <tls dir>
import { readFile } from 'node:fs/promises';
import http from 'node:http';
import path from 'node:path';
import { startNpmRegistry } from '@dsec/edge';

const [index, address, tlsDir] = process.argv.slice(2);
if (!index || !address || !tlsDir) throw new Error('usage: npm-registry-child.js <index.json> <address> <tls dir>');
const saved = JSON.parse(await readFile(index, 'utf8')) as { packuments: Array<[string, unknown]>; tarballs: Array<[string, string]> };
const registry = await startNpmRegistry(
  { packuments: new Map(saved.packuments), tarballs: new Map(saved.tarballs) },
  {
    host: address,
    port: 443,
    tls: { key: await readFile(path.join(tlsDir, 'key.pem'), 'utf8'), cert: await readFile(path.join(tlsDir, 'cert.pem'), 'utf8') },
    publicUrl: 'https://registry.npmjs.org',
  },
);
const stats = http.createServer((req, res) => {
  const body = JSON.stringify({ connections: registry.connections, requests: registry.requests });
  if (req.method === 'POST') registry.resetCounters();
  res.writeHead(200, { 'content-type': 'application/json' }).end(body);
});
stats.listen(9000, address, () => process.stdout.write('ready\n'));
