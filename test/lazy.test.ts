// Lazily loaded layers (real registry, real mounts): a node that lacks a layer mounts it from its
// EROFS metadata and chunk index alone, over a FUSE view of the data blob (dsec-lazyfs) whose
// missing chunks its lazy server fetches from the registry by range request, checks and caches.
// Data read is byte-identical to the layer; only the chunks read are fetched; a chunk in two
// layers is fetched once; concurrent cold starts fetch each chunk once; a registry that dies
// mid-read gives EIO and `layer.fetch-failed`, never a hang, and the node stays usable; a chunk
// that fails its digest is refused (`layer.corrupt`); the bounded cache never evicts a chunk a
// mounted layer needs; an edge restart keeps the servers and the cache. The layers' contents are
// fixed (made from their names), so that the layers are built once per machine into the test
// cache (DSEC_TEST_CACHE, default /var/tmp/dsec-test-cache) and only pushed to this run's registry.
// The profile case's second cold start runs on a whole platform (apiserver + edge, lazy loading
// on): its create, exec and figures go through HTTP, `GET /v1/nodes/{name}`'s `layerCache` and
// a sandbox's `layerBytesFetched` among them.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { execFile, spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';
import { buildThroughCache, BUSYBOX_PATH, LayerRegistry, LayerStore, MNT, mountsUnder, umount } from '@dsec/edge';
import type { LayerProfile, LazyServerStats } from '@dsec/edge';
import type { LayerInfo, RaisedEvent } from '@dsec/protocol';
import { ROOT_PROJECT_ID } from '@dsec/apiserver';
import { apiCall } from './helpers/assert.js';
import { REPO_ROOT, startNode } from './helpers/node.js';
import type { TestNode } from './helpers/node.js';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';
import { startRegistry } from './helpers/registry.js';
import type { TestRegistry } from './helpers/registry.js';

const MiB = 1024 * 1024;
const execFileP = promisify(execFile);
/** Persistent cache of the built layers (outside every test home). */
const CACHE_DIR = path.join(process.env.DSEC_TEST_CACHE ?? '/var/tmp/dsec-test-cache', 'lazy-layers');
let registry: TestRegistry;
let scratch: string;
let lazy: TestNode;
const nodes: TestNode[] = [];
const events: RaisedEvent[] = [];
/**
 * `n` bytes that look random and are the same in every run (sha256 in counter mode over `label`):
 * fixed layer contents, so that the built layers can be cached.
 */
function fixedBytes(label: string, n: number): Buffer {
  const out = Buffer.alloc(n);
  for (let i = 0, at = 0; at < n; i++, at += 32) createHash('sha256').update(`${label}:${i}`).digest().copy(out, at);
  return out;
}
const big = fixedBytes('big', 3 * MiB + 100);
const files: Record<string, Buffer> = { 'opt/data/big': big, 'opt/data/hello': Buffer.from('hello, lazily\n') };
for (let i = 0; i < 8; i++) files[`opt/data/f${i}`] = fixedBytes(`f${i}`, 64 * 1024);
let base: LayerInfo;
let toolA: LayerInfo;
let toolB: LayerInfo;
let toolC: LayerInfo;
const cFiles = { 'opt/c/one': fixedBytes('c/one', 2 * MiB), 'opt/c/two': fixedBytes('c/two', MiB / 2) };
/** Layers no read has touched before the failure tests (read-ahead would have cached chunks). */
let toolCorrupt: LayerInfo;
let toolGone: LayerInfo;
const corruptFile = fixedBytes('corrupt', 200 * 1024);
const goneFile = fixedBytes('gone', 200 * 1024);
/** Many small files read together (what an interpreter's start does): neighbours share requests. */
const smallFiles: Record<string, Buffer> = { 'opt/p/unread': fixedBytes('p/unread', 2 * MiB) };
for (let i = 0; i < 240; i++) smallFiles[`opt/p/s${String(i).padStart(3, '0')}`] = fixedBytes(`p/s${i}`, 8 * 1024);
const smallSum = createHash('sha256')
  .update(
    Buffer.concat(
      Object.keys(smallFiles)
        .filter((k) => k !== 'opt/p/unread')
        .sort()
        .map((k) => smallFiles[k]!),
    ),
  )
  .digest('hex');
let toolP: LayerInfo;
let toolD: LayerInfo;
const deadFiles = {
  'opt/d/first': fixedBytes('d/first', 64 * 1024),
  'opt/d/second': fixedBytes('d/second', 300 * 1024),
  'opt/d/third': fixedBytes('d/third', 300 * 1024),
};
/** A platform with the default read-ahead and an empty cache: the next cold start of what `lazy` ran, through HTTP. */
let lazy2: TestPlatform;

const endpoint = () => ({ url: registry.url, username: registry.username, password: registry.password });
const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');

/**
 * What the cached layers depend on besides their contents: the layer format's code (EROFS
 * builder, busybox tree), the host's busybox and mkfs.erofs's version. A change builds them again.
 */
async function builderKey(): Promise<string> {
  const h = createHash('sha256');
  for (const f of ['erofs.js', 'busybox.js']) h.update(await readFile(path.join(REPO_ROOT, 'packages/edge/dist/layers', f)));
  h.update(await readFile(BUSYBOX_PATH));
  const version = await execFileP('mkfs.erofs', ['--version']).then(
    (r) => r.stdout,
    (err: unknown) => (err as { stdout?: string }).stdout ?? '',
  );
  return h.update(version).digest('hex');
}

/** A layer from the machine-wide cache (built there first when missing), keyed by its contents, pushed to this run's registry. */
async function cachedLayer(store: LayerStore, key: string, name: string, content: Record<string, Buffer> | 'busybox'): Promise<LayerInfo> {
  const h = createHash('sha256').update(key);
  if (content !== 'busybox') for (const rel of Object.keys(content).sort()) h.update(`${rel}\0${sha(content[rel]!)}\0`);
  const info = await buildThroughCache(store, CACHE_DIR, `lazy-${name}-${h.digest('hex').slice(0, 16)}`, async (build) => {
    if (content === 'busybox') return build.build({ type: 'busybox' }, { kind: 'base' });
    const dir = path.join(scratch, name);
    for (const [rel, data] of Object.entries(content)) {
      await mkdir(path.dirname(path.join(dir, rel)), { recursive: true });
      await writeFile(path.join(dir, rel), data);
    }
    return build.build({ type: 'dir', path: dir }, { kind: 'toolkit' });
  });
  await new LayerRegistry(endpoint()).push(store.imageFiles(info.digest), info);
  return info;
}

async function stats() {
  const s = await lazy.edge.layers.lazyStats();
  assert.ok(s, 'lazy loading is on');
  return s;
}

async function layerStats(layer: LayerInfo) {
  const s = await lazy.edge.layers.lazy!.serverStats(layer.digest.slice(7));
  assert.ok(s, `${layer.digest} has a lazy server`);
  return s;
}

/** Blob GETs of the registry log that named `digest`'s data blob (the range requests). */
function rangeGets(blobDigest: string): number {
  return registry.requests().filter((r) => r === `GET /v2/dsec/layers/blobs/${blobDigest}`).length;
}

/** The data blob's digest of a lazy layer on the node whose home is `home`. */
async function blobDigestOf(home: string, layer: LayerInfo): Promise<string> {
  const rec = JSON.parse(await readFile(path.join(home, 'layers', 'blobs', layer.digest.slice(7), 'lazy.json'), 'utf8')) as { blobDigest: string };
  return rec.blobDigest;
}

before(async () => {
  registry = await startRegistry();
  scratch = await mkdtemp(path.join(os.tmpdir(), 'dsec-scratch-lazy-'));
  // The base and every toolkit the tests use, from the machine-wide cache into a store of this
  // run (hard links), each pushed to the registry; the node and the platform start meanwhile.
  const layers = (async () => {
    const key = await builderKey();
    const store = new LayerStore({ root: path.join(scratch, 'layers'), unmountLingerMs: 0 });
    try {
      [base, toolA, toolB, toolC, toolCorrupt, toolGone, toolP, toolD] = await Promise.all([
        cachedLayer(store, key, 'base', 'busybox'),
        cachedLayer(store, key, 'a', files),
        cachedLayer(store, key, 'b', { 'opt/other/big': big, 'opt/other/note': Buffer.from('the same big file, another layer\n') }),
        cachedLayer(store, key, 'c', cFiles),
        cachedLayer(store, key, 'corrupt', { 'opt/e/file': corruptFile }),
        cachedLayer(store, key, 'gone', { 'opt/f/file': goneFile }),
        cachedLayer(store, key, 'profiled', smallFiles),
        cachedLayer(store, key, 'dead', deadFiles),
      ]);
    } finally {
      await store.close();
    }
  })();
  // A read-ahead of one small file's worth, so that the tests can tell what was read from what was not.
  const node = startNode({ edge: { registry: { ...endpoint(), lazy: true, fetchDeadlineMs: 3000, chunkCacheMaxBytes: 1, readAheadBytes: 64 * 1024 } } }).then(
    (n) => {
      nodes.push(n);
      n.edge.onEvent((ev) => events.push(ev));
      return n;
    },
  );
  const platform = startTestPlatform({ registry: { ...endpoint(), lazy: true, fetchDeadlineMs: 3000 } });
  // Each is kept (for `after`) even when another fails.
  const [l, n, p] = await Promise.allSettled([layers, node, platform]);
  if (n.status === 'fulfilled') lazy = n.value;
  if (p.status === 'fulfilled') lazy2 = p.value;
  for (const r of [l, n, p]) if (r.status === 'rejected') throw r.reason;
});

after(async () => {
  for (const n of nodes) await n.cleanup().catch((err: unknown) => console.error('node cleanup:', err));
  await lazy2?.close();
  await registry?.close();
  await rm(scratch, { recursive: true, force: true });
});

describe('lazily loaded layers', () => {
  let sandboxId: string;
  let failing: { id: string };

  test('a sandbox starts from a layer the node lacks and reads it byte for byte, fetching only what it reads', async () => {
    registry.clearLog();
    const sb = await lazy.edge.create({ image: { base: base.digest, toolkits: [toolA.digest] } });
    sandboxId = sb.id;
    assert.equal(lazy.edge.layers.isLazy(toolA.digest), true);
    assert.equal(lazy.edge.layers.isLazy(base.digest), true);
    const layerDir = path.join(lazy.home, 'layers', 'blobs', toolA.digest.slice(7));
    assert.ok(!(await readdir(layerDir)).includes('data.blob'), 'the data blob was not pulled');
    const r = await lazy.edge.exec(sb.id, { cmd: 'cat /opt/data/hello' });
    assert.equal(r.exitCode, 0, r.stderr);
    assert.equal(r.stdout, 'hello, lazily\n');
    const blobDigest = await blobDigestOf(lazy.home, toolA);
    const afterHello = rangeGets(blobDigest);
    assert.ok(afterHello >= 1 && afterHello <= 3, `a small file is one chunk (and read-ahead): ${afterHello} range requests`);
    assert.equal(registry.requests().filter((l) => l === `GET /v2/dsec/layers/blobs/${blobDigest}`).length, afterHello);
    const s1 = await layerStats(toolA);
    assert.ok(s1.fetchedBytes < toolA.blobBytes / 2, `fetched ${s1.fetchedBytes} of ${toolA.blobBytes}`);
    // Every file, byte for byte.
    const sums = await lazy.edge.exec(sb.id, { cmd: 'cd /opt/data && sha256sum big f0 f7' });
    assert.equal(sums.exitCode, 0, sums.stderr);
    assert.equal(sums.stdout, [`${sha(big)}  big`, `${sha(files['opt/data/f0']!)}  f0`, `${sha(files['opt/data/f7']!)}  f7`, ''].join('\n'));
    const s2 = await layerStats(toolA);
    assert.ok(s2.fetchedBytes >= big.length, 'the big file came from the registry');
    assert.ok(s2.fetchedBytes < toolA.blobBytes, 'f1..f6 were never read, never fetched');
    assert.equal(s2.corrupt, 0);
    const node = await stats();
    assert.ok(node.cacheBytes >= s2.fetchedBytes, 'the cache holds what was fetched');
    assert.ok(node.hits > 0 && node.misses > 0 && node.hitRate !== null);
    assert.deepEqual(await lazy.edge.layers.cacheStats(), { ...(await stats()), hitRate: (await stats()).hitRate }, 'what GET /v1/nodes/{name} reports');
    const sbStats = await lazy.edge.stats(sb.id);
    assert.ok((sbStats.layerBytesFetched ?? 0) >= s2.fetchedBytes, 'the sandbox counts the bytes fetched for its layers');
  });

  test('a file present in two layers is fetched once', async () => {
    const before = await stats();
    const sb = await lazy.edge.create({ image: { base: base.digest, toolkits: [toolB.digest] } });
    try {
      const r = await lazy.edge.exec(sb.id, { cmd: 'sha256sum /opt/other/big' });
      assert.equal(r.exitCode, 0, r.stderr);
      assert.equal(r.stdout, `${sha(big)}  /opt/other/big\n`);
      const after = await stats();
      assert.ok(
        after.fetchedBytes - before.fetchedBytes < MiB,
        `the big file's chunks came from the cache (fetched ${after.fetchedBytes - before.fetchedBytes} bytes)`,
      );
    } finally {
      await lazy.edge.destroy(sb.id);
    }
  });

  test('concurrent cold starts of one layer fetch each chunk once', async () => {
    const tool = toolC;
    registry.clearLog();
    const sbs = await Promise.all([1, 2, 3].map(() => lazy.edge.create({ image: { base: base.digest, toolkits: [tool.digest] } })));
    try {
      const runs = await Promise.all(sbs.map((sb) => lazy.edge.exec(sb.id, { cmd: 'cat /opt/c/one /opt/c/two | sha256sum' })));
      for (const r of runs) assert.equal(r.exitCode, 0, r.stderr);
      assert.equal(new Set(runs.map((r) => r.stdout)).size, 1);
      const server = await lazy.edge.layers.lazy!.serverStats(tool.digest.slice(7));
      assert.ok(server, 'the layer has a lazy server');
      assert.equal(server.fetchedChunks, 3, 'two chunks of one, one of two');
      const gets = rangeGets(await blobDigestOf(lazy.home, tool));
      assert.equal(gets, server.requests, 'the range requests the server counts are those the registry saw');
      assert.ok(gets <= 3, `each chunk fetched once, neighbours together: ${gets} range requests for 3 chunks`);
    } finally {
      for (const sb of sbs) await lazy.edge.destroy(sb.id);
    }
  });

  test('a chunk that fails its digest is refused and raised as layer.corrupt', async () => {
    failing = await lazy.edge.create({ image: { base: base.digest, toolkits: [toolCorrupt.digest, toolGone.digest] } });
    const blobDigest = await blobDigestOf(lazy.home, toolCorrupt);
    const file = registry.blobFile(blobDigest);
    const original = await readFile(file);
    const damaged = Buffer.from(original);
    for (let i = 0; i < damaged.length; i += 4096) damaged[i] = damaged[i]! ^ 0xff;
    await writeFile(file, damaged);
    try {
      const r = await lazy.edge.exec(failing.id, { cmd: 'cat /opt/e/file > /dev/null', timeoutMs: 20_000 });
      assert.notEqual(r.exitCode, 0, 'the read failed');
      assert.match(r.stderr, /Input\/output error/);
      const ev = events.find((e) => e.kind === 'layer.corrupt');
      assert.ok(ev, 'layer.corrupt raised');
      assert.equal(ev.data?.layer, toolCorrupt.digest);
      assert.ok((await stats()).corrupt >= 1);
    } finally {
      await writeFile(file, original);
    }
    const again = await lazy.edge.exec(failing.id, { cmd: 'sha256sum /opt/e/file' });
    assert.equal(again.stdout, `${sha(corruptFile)}  /opt/e/file\n`, 'good bytes once the registry serves them');
  });

  test('registry gone mid-read: EIO within the deadline, layer.fetch-failed, the node and what is cached stay usable', async () => {
    await registry.stop();
    try {
      const t0 = Date.now();
      const r = await lazy.edge.exec(failing.id, { cmd: 'cat /opt/f/file > /dev/null', timeoutMs: 30_000 });
      const took = Date.now() - t0;
      assert.notEqual(r.exitCode, 0);
      assert.match(r.stderr, /Input\/output error/);
      assert.ok(took < 25_000, `failed in ${took} ms, not hung`);
      const ev = events.find((e) => e.kind === 'layer.fetch-failed');
      assert.ok(ev, 'layer.fetch-failed raised');
      assert.equal(ev.data?.layer, toolGone.digest);
      // The sandboxes still read what is cached; the node still makes sandboxes from its layers.
      const cached = await lazy.edge.exec(sandboxId, { cmd: 'cat /opt/data/hello' });
      assert.equal(cached.stdout, 'hello, lazily\n');
      const same = await lazy.edge.exec(failing.id, { cmd: 'sha256sum /opt/e/file' });
      assert.equal(same.stdout, `${sha(corruptFile)}  /opt/e/file\n`);
      const other = await lazy.edge.create({ image: { base: base.digest } });
      const ok = await lazy.edge.exec(other.id, { cmd: 'echo fine' });
      assert.equal(ok.stdout, 'fine\n');
      await lazy.edge.destroy(other.id);
    } finally {
      await registry.start();
    }
    const later = await lazy.edge.exec(failing.id, { cmd: 'sha256sum /opt/f/file' });
    assert.equal(later.stdout, `${sha(goneFile)}  /opt/f/file\n`, 'read again once the registry is back');
    await lazy.edge.destroy(failing.id);
  });

  test('missed neighbours come in one request; the first run records a profile, the next cold start prefetches it', async () => {
    registry.clearLog();
    const first = await lazy.edge.create({ image: { base: base.digest, toolkits: [toolP.digest] } });
    let profile: LayerProfile | undefined;
    let firstRun: LazyServerStats;
    try {
      const r = await lazy.edge.exec(first.id, { cmd: 'cat /opt/p/s* | sha256sum' });
      assert.equal(r.stdout, `${smallSum}  -\n`, r.stderr);
      firstRun = await layerStats(toolP);
      assert.ok(firstRun.fetchedChunks >= 240, `${firstRun.fetchedChunks} chunks`);
      assert.ok(firstRun.requests * 4 <= firstRun.fetchedChunks, `${firstRun.requests} range requests for ${firstRun.fetchedChunks} small files`);
      assert.ok(firstRun.fetchedBytes < toolP.blobBytes, 'the unread file was not fetched');
      // The first command's end stores the layer's access profile beside it in the registry.
      const reg = new LayerRegistry(endpoint());
      const until = Date.now() + 30_000;
      while ((profile = await reg.profile(toolP.digest, path.join(scratch, 'profile.json'))) === undefined && Date.now() < until) await sleep(100);
      assert.ok(profile, 'the profile is in the registry');
      assert.equal(profile.chunks.length, firstRun.touched, 'every chunk read, in first-read order');
      assert.ok(profile.chunks.length >= 240 && profile.chunks.every((c) => c < firstRun.chunks), 'chunk indexes of the layer');
    } finally {
      await lazy.edge.destroy(first.id);
    }
    // A cold start on another node, a platform's, through HTTP: the profile's chunks come before
    // any read, merged; the node's layer cache and the sandbox's bytes fetched are in the API.
    const edge2 = lazy2.platform.edge;
    const call = (method: string, route: string, json?: unknown) => apiCall(lazy2.url, lazy2.adminKey, method, route, json);
    // The layers as the catalog knows a layer another node built and pushed.
    for (const l of [base, toolP]) await lazy2.platform.services.layers.register(ROOT_PROJECT_ID, l, null);
    const created = await call('POST', '/v1/sandboxes', { image: { base: base.digest, toolkits: [toolP.digest] } });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    const id = created.body.id as string;
    try {
      const hex = toolP.digest.slice(7);
      let s = await edge2.layers.lazy!.serverStats(hex);
      const until = Date.now() + 30_000;
      while ((s?.prefetches ?? 0) < 1 && Date.now() < until) {
        await sleep(100);
        s = await edge2.layers.lazy!.serverStats(hex);
      }
      assert.ok(s && s.prefetches === 1, `the profile was prefetched (${JSON.stringify(s)})`);
      assert.equal(s.prefetchedChunks, profile.chunks.length);
      assert.ok(s.requests * 8 <= s.prefetchedChunks, `${s.requests} range requests for ${s.prefetchedChunks} prefetched chunks`);
      registry.clearLog();
      const r = await call('POST', `/v1/sandboxes/${id}/exec`, { cmd: 'cat /opt/p/s* | sha256sum' });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      assert.equal(r.body.stdout, `${smallSum}  -\n`, r.body.stderr);
      const after = await edge2.layers.lazy!.serverStats(hex);
      assert.ok(after);
      assert.equal(after.misses, 0, 'no read waited for the registry');
      assert.equal(
        rangeGets(await blobDigestOf(path.join(lazy2.home, 'node'), toolP)),
        0,
        `the second run's reads sent no range request (the first run's sent ${firstRun.requests})`,
      );
      // GET /v1/nodes/{name}: the node's chunk cache as the edge counts it.
      const list = await call('GET', '/v1/nodes');
      assert.equal(list.status, 200, JSON.stringify(list.body));
      const name = (list.body.items ?? list.body)[0].name as string;
      const node = await call('GET', `/v1/nodes/${encodeURIComponent(name)}`);
      assert.equal(node.status, 200, JSON.stringify(node.body));
      const cache = node.body.layerCache;
      assert.ok(cache, `layerCache is reported: ${JSON.stringify(node.body)}`);
      assert.deepEqual(await edge2.layers.cacheStats(), cache, 'the figures the edge counts, unchanged');
      assert.ok(cache.fetchedBytes >= s.fetchedBytes && cache.fetchedChunks >= profile.chunks.length, 'the prefetched chunks were fetched');
      assert.ok(cache.cacheBytes >= s.fetchedBytes && cache.cacheChunks >= profile.chunks.length, 'and are in the cache');
      assert.ok(cache.hits >= profile.chunks.length && cache.hitRate > 0, `the reads were hits: ${JSON.stringify(cache)}`);
      assert.equal(cache.failures, 0);
      assert.equal(cache.corrupt, 0);
      assert.ok(cache.lazyLayers >= 1, 'the toolkit is a lazy layer');
      // GET /v1/sandboxes/{id}/stats: the bytes fetched for its layers.
      const st = await call('GET', `/v1/sandboxes/${id}/stats`);
      assert.equal(st.status, 200, JSON.stringify(st.body));
      assert.ok(st.body.layerBytesFetched >= s.fetchedBytes, `layerBytesFetched ${st.body.layerBytesFetched} >= the toolkit's ${s.fetchedBytes}`);
      assert.ok(st.body.layerBytesFetched <= cache.fetchedBytes, 'no more than the node fetched');
    } finally {
      const del = await fetch(`${lazy2.url}/v1/sandboxes/${id}`, { method: 'DELETE', headers: { authorization: `Bearer ${lazy2.adminKey}` } });
      assert.equal(del.status, 204);
    }
  });

  test('a FUSE server (dsec-lazyfs) or a whole lazy server killed under a mounted layer is replaced on the same connection; one that cannot start again loses its sandboxes, the next one gets a new server', async () => {
    const sb = await lazy.edge.create({ image: { base: base.digest, toolkits: [toolD.digest] } });
    const r = await lazy.edge.exec(sb.id, { cmd: 'sha256sum /opt/d/first' });
    assert.equal(r.stdout, `${sha(deadFiles['opt/d/first'])}  /opt/d/first\n`, r.stderr);
    const hex = toolD.digest.slice(7);
    const pid = await lazy.edge.layers.lazy!.serverPid(hex);
    assert.ok(pid, 'the layer has a server');
    const fuseChild = async (): Promise<number> => Number((await readFile(`/proc/${pid}/task/${pid}/children`, 'utf8')).trim().split(/\s+/)[0]);
    const fusePid = await fuseChild();
    assert.ok(fusePid > 0, 'dsec-lazyfs runs under the server');
    // The FUSE process dies (a crash) as the sandbox reads a file not fetched yet: the server
    // holds the FUSE connection's descriptor and a new dsec-lazyfs takes it over.
    const reading = lazy.edge.exec(sb.id, { cmd: 'sha256sum /opt/d/second' });
    process.kill(fusePid, 'SIGKILL');
    const second = await reading;
    assert.equal(second.stdout, `${sha(deadFiles['opt/d/second'])}  /opt/d/second\n`, second.stderr);
    const both = await lazy.edge.exec(sb.id, { cmd: 'cat /opt/d/first /opt/d/second | sha256sum' });
    assert.equal(both.stdout.split(' ')[0], sha(Buffer.concat([deadFiles['opt/d/first'], deadFiles['opt/d/second']])), both.stderr);
    assert.equal(await lazy.edge.layers.lazy!.serverPid(hex), pid, 'the same server');
    assert.notEqual(await fuseChild(), fusePid, 'a new dsec-lazyfs');
    assert.equal((await lazy.edge.layers.lazy!.serverStats(hex))?.fuseRestarts, 1);
    assert.equal(
      events.find((e) => e.kind === 'sandbox.lost' && e.sandboxId === sb.id),
      undefined,
      'the sandbox was not lost',
    );
    // The whole server dies (its process group, dsec-lazyfs with it) as the sandbox reads a file
    // not fetched yet: the edge holds a copy of the FUSE connection's descriptor and starts a new
    // server on it, which answers the read the dead one had taken.
    const third = lazy.edge.exec(sb.id, { cmd: 'sha256sum /opt/d/third' });
    process.kill(-pid, 'SIGKILL');
    const readThird = await third;
    assert.equal(readThird.stdout, `${sha(deadFiles['opt/d/third'])}  /opt/d/third\n`, readThird.stderr);
    const revived = await lazy.edge.layers.lazy!.serverPid(hex);
    assert.ok(revived !== undefined && revived !== pid, 'a new server serves the same mount');
    const all = await lazy.edge.exec(sb.id, { cmd: 'cat /opt/d/first /opt/d/second /opt/d/third | sha256sum' });
    assert.equal(all.stdout.split(' ')[0], sha(Buffer.concat([deadFiles['opt/d/first'], deadFiles['opt/d/second'], deadFiles['opt/d/third']])), all.stderr);
    assert.equal(
      events.find((e) => e.kind === 'layer.server-lost'),
      undefined,
      'the layer was not lost',
    );
    assert.equal(
      events.find((e) => e.kind === 'sandbox.lost' && e.sandboxId === sb.id),
      undefined,
      'the sandbox was not lost',
    );
    // A server that cannot start again (its configuration gone): the edge lets the connection go,
    // the layer's mount would answer ENOTCONN from now on, and its sandboxes are lost.
    await rm(path.join(lazy.home, 'layers', 'lazy', hex, 'server.json'));
    process.kill(-revived, 'SIGKILL');
    const until = Date.now() + 30_000;
    const lost = () => events.find((e) => e.kind === 'sandbox.lost' && e.sandboxId === sb.id);
    while (lost() === undefined && Date.now() < until) await sleep(100);
    const layerLost = events.find((e) => e.kind === 'layer.server-lost');
    assert.equal(layerLost?.data?.layer, toolD.digest, 'layer.server-lost names the layer');
    assert.equal(lost()?.data?.reason, 'layer-server-lost', 'its sandbox is marked lost');
    await assert.rejects(lazy.edge.exec(sb.id, { cmd: 'true' }), /not found|SANDBOX_NOT_FOUND/i);
    const next = await lazy.edge.create({ image: { base: base.digest, toolkits: [toolD.digest] } });
    try {
      const again = await lazy.edge.exec(next.id, { cmd: 'sha256sum /opt/d/first /opt/d/second' });
      assert.equal(again.stdout, `${sha(deadFiles['opt/d/first'])}  /opt/d/first\n${sha(deadFiles['opt/d/second'])}  /opt/d/second\n`, again.stderr);
      const fresh = await lazy.edge.layers.lazy!.serverPid(hex);
      assert.ok(fresh !== undefined && fresh !== pid && fresh !== revived, 'a new server');
    } finally {
      await lazy.edge.destroy(next.id);
    }
  });

  test('an edge killed while a lazy layer is read: the read completes, a new edge adopts the server', async () => {
    const tool = toolB; // not mounted on this node's lazy store: it pulls it anew
    const root = path.join(scratch, 'killed-store');
    const holder = spawn(
      process.execPath,
      [path.join(REPO_ROOT, 'test/dist/helpers/lazy-holder.js'), root, registry.url, registry.username, registry.password, tool.digest],
      {
        stdio: ['ignore', 'pipe', 'inherit'],
      },
    );
    const mountDir = await new Promise<string>((resolve, reject) => {
      createInterface({ input: holder.stdout }).once('line', resolve);
      holder.once('exit', (code) => reject(new Error(`holder exited with ${code}`)));
    });
    const store = new LayerStore({
      root,
      registry: new LayerRegistry(endpoint()),
      unmountLingerMs: 0,
      lazy: { lazyfsBinary: path.join(REPO_ROOT, 'chronus/build/dsec-lazyfs') },
    });
    try {
      const reading = execFileP('sha256sum', [path.join(mountDir, 'opt/other/big')]);
      holder.kill('SIGKILL');
      const { stdout } = await reading;
      assert.equal(stdout.split(' ')[0], sha(big), 'the read in progress completed with the right bytes');
      // A new process on the same store adopts the mount and its server, then tears both down.
      await store.init();
      assert.equal(await store.lazy!.running(tool.digest.slice(7)), true);
      const adopted = await store.lazy!.serverPid(tool.digest.slice(7));
      await store.acquire(tool.digest);
      await store.release(tool.digest);
      await store.settled();
      // Unmounted, the layer's server is kept idle: the next user mounts over it at once.
      assert.equal(await store.lazy!.serverPid(tool.digest.slice(7)), adopted, 'the server is kept after the last release');
      const again = await store.acquire(tool.digest);
      assert.equal((await readFile(path.join(again, 'opt/other/big'))).length, big.length);
      assert.equal(await store.lazy!.serverPid(tool.digest.slice(7)), adopted, 'the next user mounted over the idle server');
      await store.release(tool.digest);
      await store.close();
      const until = Date.now() + 10_000;
      while (Date.now() < until && (await store.lazy!.running(tool.digest.slice(7)))) await new Promise((resolve) => setTimeout(resolve, 100));
      assert.equal(await store.lazy!.running(tool.digest.slice(7)), false, 'the idle server stopped with the store');
    } finally {
      if (holder.exitCode === null) holder.kill('SIGKILL');
      await store.close();
      for (const m of (await mountsUnder(root)).reverse()) umount(m, MNT.DETACH);
    }
  });

  test('an edge restart keeps the lazy servers and the cache; eviction spares mounted layers', async () => {
    const before = await stats();
    assert.ok(before.cacheBytes > 1, 'over the bound of 1 byte, yet the mounted layer keeps its chunks');
    await lazy.restart();
    lazy.edge.onEvent((ev) => events.push(ev));
    const r = await lazy.edge.exec(sandboxId, { cmd: 'sha256sum /opt/data/big /opt/data/f6' });
    assert.equal(r.exitCode, 0, r.stderr);
    assert.equal(r.stdout, `${sha(big)}  /opt/data/big\n${sha(files['opt/data/f6']!)}  /opt/data/f6\n`);
    await lazy.edge.destroy(sandboxId);
    // Once the layers are unmounted (close: no linger) their servers stop and the bound applies.
    await lazy.edge.layers.close();
    await lazy.edge.layers.lazy!.evict();
    assert.equal((await stats()).cacheChunks, 0, 'unmounted layers leave the cache to its bound');
    assert.deepEqual(await readdir(path.join(lazy.home, 'layers', 'lazy')), [], 'no lazy server is left');
    assert.ok((await stat(path.join(lazy.home, 'layers', 'chunks'))).isDirectory());
  });
});
