// Package mirrors through the egress proxy, against a fake npm registry on loopback: the freeze
// hides later versions in metadata and refuses their tarballs, the node cache serves every
// sandbox from one download, and a real npm client installs through it.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { startEgressProxy } from './proxy.js';
import type { EgressProxyHandle } from './proxy.js';
import {
  connectTunnel,
  LogSink,
  request,
  SANDBOX_A,
  SANDBOX_B,
  SANDBOX_C,
  startFakeRegistry,
  staticResolver,
  TestSandboxes,
  tlsFrom,
} from './test-fixtures.js';
import { makeCertificate } from './certificate.js';

const FREEZE = '2022-01-01';
const PACKAGES = {
  'leftpad-x': [
    { version: '1.0.0', published: '2020-01-01T00:00:00.000Z' },
    { version: '1.1.0', published: '2021-06-01T00:00:00.000Z' },
    { version: '1.2.0-beta.1', published: '2021-07-01T00:00:00.000Z' },
    { version: '2.0.0', published: '2023-03-01T00:00:00.000Z' },
  ],
  '@scope/thing': [{ version: '1.0.0', published: '2020-02-02T00:00:00.000Z' }],
  'brand-new': [{ version: '1.0.0', published: '2024-01-01T00:00:00.000Z' }],
};

interface Packument {
  'dist-tags': Record<string, string>;
  versions: Record<string, { dist: { tarball: string } }>;
  time: Record<string, string>;
}

describe('package mirrors', () => {
  let registry: Awaited<ReturnType<typeof startFakeRegistry>>;
  let proxy: EgressProxyHandle;
  let dir: string;
  const sandboxes = new TestSandboxes();
  const sink = new LogSink();

  before(async () => {
    dir = await mkdtemp(path.join(tmpdir(), 'dsec-scratch-mirror-'));
    registry = await startFakeRegistry(PACKAGES, { delayMs: 100 });
    sandboxes.set(SANDBOX_A, 'frozen', { mirrors: { npm: { upstream: registry.url, freeze: FREEZE } } });
    sandboxes.set(SANDBOX_B, 'live', { mirrors: { npm: { upstream: registry.url } } });
    // A mirror on an origin the node was not told about is refused.
    sandboxes.set(SANDBOX_C, 'rogue', { mirrors: { npm: { upstream: 'http://127.0.0.1:1/' } } });
    proxy = await startEgressProxy({
      address: '127.0.0.1',
      ports: { http: 0 },
      sandboxes,
      resolver: staticResolver({}),
      log: sink.fn,
      raise: () => {},
      mirrors: { cacheDir: path.join(dir, 'cache'), origins: [registry.origin] },
    });
  });
  after(async () => {
    await proxy?.close();
    await registry?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  const get = (from: string, p: string, port?: number) => request(port ?? proxy.ports.http, { localAddress: from, target: `http://registry.npmjs.org${p}` });

  test('a frozen mirror hides versions published after the cutoff', async () => {
    const res = await get(SANDBOX_A, '/leftpad-x');
    assert.equal(res.status, 200);
    assert.match(String(res.headers['x-dsec-mirror']), /npm; freeze=2022-01-01/);
    const doc = JSON.parse(res.body.toString()) as Packument;
    assert.deepEqual(Object.keys(doc.versions).sort(), ['1.0.0', '1.1.0', '1.2.0-beta.1']);
    assert.equal(doc['dist-tags'].latest, '1.1.0', 'latest moves to the newest stable version left');
    assert.equal(doc.time['2.0.0'], undefined);
    assert.equal(doc.time.modified, '2021-07-01T00:00:00.000Z');
    // Tarballs point back at the public name over plain HTTP, i.e. through the proxy again.
    assert.equal(doc.versions['1.1.0']!.dist.tarball, 'http://registry.npmjs.org/leftpad-x/-/leftpad-x-1.1.0.tgz');
  });

  test("a hidden version's tarball is refused, a visible one is served", async () => {
    const hidden = await get(SANDBOX_A, '/leftpad-x/-/leftpad-x-2.0.0.tgz');
    assert.equal(hidden.status, 404);
    assert.match(hidden.body.toString(), /published after the mirror's cutoff/);
    const entry = sink.last();
    assert.equal(entry?.verdict, 'denied');
    assert.equal(entry?.via, 'mirror');
    assert.match(entry?.reason ?? '', /^mirror-hidden/);
    assert.equal(registry.hits.get('/leftpad-x/-/leftpad-x-2.0.0.tgz'), undefined, 'never fetched');

    const ok = await get(SANDBOX_A, '/leftpad-x/-/leftpad-x-1.1.0.tgz');
    assert.equal(ok.status, 200);
    assert.deepEqual(ok.body, registry.tarballs.get('/leftpad-x/-/leftpad-x-1.1.0.tgz'));
    assert.equal(sink.last()?.verdict, 'allowed');
  });

  test('a package first published after the cutoff does not exist', async () => {
    assert.equal((await get(SANDBOX_A, '/brand-new')).status, 404);
    assert.equal((await get(SANDBOX_B, '/brand-new')).status, 200);
  });

  test('an unfrozen mirror shows everything; one download serves every sandbox', async () => {
    const res = await get(SANDBOX_B, '/leftpad-x');
    const doc = JSON.parse(res.body.toString()) as Packument;
    assert.equal(doc['dist-tags'].latest, '2.0.0');
    assert.ok(doc.versions['2.0.0']);
    assert.equal(registry.hits.get('/leftpad-x'), 1, 'the frozen sandbox already fetched this packument');
    const tgz = await get(SANDBOX_B, '/leftpad-x/-/leftpad-x-1.1.0.tgz');
    assert.equal(tgz.status, 200);
    assert.equal(registry.hits.get('/leftpad-x/-/leftpad-x-1.1.0.tgz'), 1);
    assert.equal((await get(SANDBOX_B, '/leftpad-x/-/leftpad-x-2.0.0.tgz')).status, 200);
  });

  test('concurrent identical requests become one upstream fetch', async () => {
    const all = await Promise.all([SANDBOX_A, SANDBOX_B, SANDBOX_A, SANDBOX_B, SANDBOX_A].map((s) => get(s, '/@scope%2fthing')));
    for (const r of all) assert.equal(r.status, 200);
    assert.equal(registry.hits.get('/@scope/thing'), 1);
    const stats = proxy.mirrorStats()!;
    assert.ok(stats.coalesced + stats.hits >= 4, JSON.stringify(stats));
    const doc = JSON.parse(all[0]!.body.toString()) as Packument;
    assert.equal(doc.versions['1.0.0']!.dist.tarball, 'http://registry.npmjs.org/@scope/thing/-/thing-1.0.0.tgz');
  });

  test('transparent HTTP to the registry name is served by the mirror too', async () => {
    const tport = (proxy.ports as { transparentHttp: number }).transparentHttp;
    const res = await request(tport, { localAddress: SANDBOX_A, target: '/leftpad-x', host: 'registry.npmjs.org' });
    assert.equal(res.status, 200);
    assert.equal((JSON.parse(res.body.toString()) as Packument)['dist-tags'].latest, '1.1.0');
  });

  test('TLS to a mirrored name is refused (it would bypass the mirror and its freeze)', async () => {
    const c = await connectTunnel(proxy.ports.http, SANDBOX_A, 'registry.npmjs.org:443');
    assert.equal(c.status, 403);
    assert.match(c.body, /mirror-requires-http: use http:\/\/registry\.npmjs\.org\//);
    const cert = await makeCertificate('registry.npmjs.org');
    const s = tlsFrom(SANDBOX_A, proxy.ports.transparentTls, { servername: 'registry.npmjs.org', ca: cert.cert });
    await assert.rejects(new Promise((resolve, reject) => s.once('secureConnect', resolve).once('error', reject)));
    s.destroy();
    assert.match(sink.last()?.reason ?? '', /^mirror-requires-http/);
  });

  test('frozen: search is refused, writes are refused, an unconfigured upstream is refused', async () => {
    assert.equal((await get(SANDBOX_A, '/-/v1/search?text=leftpad')).status, 404);
    const put = await request(proxy.ports.http, { localAddress: SANDBOX_B, target: 'http://registry.npmjs.org/leftpad-x', method: 'PUT', body: '{}' });
    assert.equal(put.status, 405);
    const rogue = await get(SANDBOX_C, '/leftpad-x');
    assert.equal(rogue.status, 502);
    assert.equal(rogue.headers['x-dsec-egress'], 'denied; reason=mirror-not-configured');
  });

  test('the cache survives a restart of the proxy', async () => {
    const sandboxesAgain = new TestSandboxes();
    sandboxesAgain.set(SANDBOX_A, 'frozen', { mirrors: { npm: { upstream: registry.url, freeze: FREEZE } } });
    const second = await startEgressProxy({
      address: '127.0.0.1',
      ports: { http: 0 },
      sandboxes: sandboxesAgain,
      resolver: staticResolver({}),
      log: () => {},
      raise: () => {},
      mirrors: { cacheDir: path.join(dir, 'cache'), origins: [registry.origin] },
    });
    try {
      const before = registry.hits.get('/leftpad-x/-/leftpad-x-1.1.0.tgz');
      const res = await get(SANDBOX_A, '/leftpad-x/-/leftpad-x-1.1.0.tgz', second.ports.http);
      assert.equal(res.status, 200);
      assert.equal(registry.hits.get('/leftpad-x/-/leftpad-x-1.1.0.tgz'), before);
      assert.equal(registry.hits.get('/leftpad-x'), 1);
    } finally {
      await second.close();
    }
  });

  test('npm itself installs through the frozen mirror and cannot get the hidden version', async () => {
    // npm runs on this host and connects from 127.0.0.1: give that address the frozen policy.
    sandboxes.set('127.0.0.1', 'npm-client', { mirrors: { npm: { upstream: registry.url, freeze: FREEZE } } });
    const project = path.join(dir, 'project');
    const guard = path.join(dir, 'loopback-only.cjs');
    // Belt and braces for the network rule: npm may open connections to loopback only.
    await writeFile(
      guard,
      `const net = require('net'); const orig = net.Socket.prototype.connect;
net.Socket.prototype.connect = function (...args) {
  const o = args[0] && typeof args[0] === 'object' ? (Array.isArray(args[0]) ? args[0][0] : args[0]) : { port: args[0], host: args[1] };
  if (o && o.path === undefined && !/^(127\\.|::1$|localhost$)/.test(String(o.host ?? 'localhost'))) throw new Error('test guard: connection to ' + o.host + ' refused');
  return orig.apply(this, args);
};
const dns = require('dns'); dns.lookup = function (h, o, cb) { (typeof o === 'function' ? o : cb)(Object.assign(new Error('test guard: no DNS for ' + h), { code: 'ENOTFOUND' })); };
`,
    );
    const { mkdir } = await import('node:fs/promises');
    await mkdir(project, { recursive: true });
    await writeFile(path.join(project, 'package.json'), JSON.stringify({ name: 'p', version: '1.0.0', private: true }));
    await writeFile(path.join(dir, 'npmrc'), '');
    const env = {
      PATH: process.env.PATH ?? '/usr/bin:/bin',
      HOME: dir,
      NODE_OPTIONS: `--require ${guard}`,
      NPM_CONFIG_USERCONFIG: path.join(dir, 'npmrc'),
      NPM_CONFIG_GLOBALCONFIG: path.join(dir, 'npmrc-global'),
      NPM_CONFIG_CACHE: path.join(dir, 'npm-cache'),
      NPM_CONFIG_REGISTRY: 'http://registry.npmjs.org/',
      NPM_CONFIG_PROXY: `http://127.0.0.1:${proxy.ports.http}`,
      NPM_CONFIG_UPDATE_NOTIFIER: 'false',
      NPM_CONFIG_AUDIT: 'false',
      NPM_CONFIG_FUND: 'false',
      NPM_CONFIG_FETCH_RETRIES: '0',
    };
    const run = promisify(execFile);
    await run('npm', ['install', 'leftpad-x'], { cwd: project, env, timeout: 120_000 });
    const installed = JSON.parse(await readFile(path.join(project, 'node_modules/leftpad-x/package.json'), 'utf8')) as { version: string };
    assert.equal(installed.version, '1.1.0');
    await assert.rejects(run('npm', ['install', 'leftpad-x@2.0.0'], { cwd: project, env, timeout: 120_000 }), /ETARGET|No matching version/);
    sandboxes.views.delete('127.0.0.1');
  });
});
