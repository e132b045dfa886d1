// Layers in an OCI registry (Debian's docker-registry with a password, on loopback): every layer
// a node builds is pushed before it is committed; a node that lacks a layer pulls it by digest,
// once however many creates need it; a registry that is down is a clear UNAVAILABLE with a retry
// hint and leaves nothing half made; unused pulled layers are evicted past the cache bound; and
// `dsec image pull` imports an image by reference, only from the registries the node may use.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import { gzipSync } from 'node:zlib';
import { LayerRegistry, LayerStore, layerTag, RegistryClient } from '@dsec/edge';
import { DsecError } from '@dsec/protocol';
import type { LayerInfo } from '@dsec/protocol';
import { DsecClient, Sandbox } from '@dsec/sdk';
import { apiCall, isCode, tarOf } from './helpers/assert.js';
import { startNode } from './helpers/node.js';
import type { TestNode } from './helpers/node.js';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';
import { startRegistry } from './helpers/registry.js';
import type { TestRegistry } from './helpers/registry.js';

let registry: TestRegistry;
const nodes: TestNode[] = [];
let scratch: string;

const endpoint = () => ({ url: registry.url, username: registry.username, password: registry.password });

async function node(extra: { password?: string; cacheMaxBytes?: number } = {}): Promise<TestNode> {
  const n = await startNode({
    edge: {
      registry: {
        ...endpoint(),
        ...(extra.password !== undefined ? { password: extra.password } : {}),
        ...(extra.cacheMaxBytes ? { cacheMaxBytes: extra.cacheMaxBytes } : {}),
      },
    },
  });
  nodes.push(n);
  return n;
}

async function toolkit(n: TestNode, files: Record<string, string>): Promise<LayerInfo> {
  return n.edge.layers.build({ type: 'tar', stream: Readable.from([await tarOf(files)]) }, { kind: 'toolkit' });
}

/** Registry requests that fetched a blob's bytes. */
const blobGets = () => registry.requests().filter((r) => r.startsWith('GET ') && r.includes('/blobs/sha256:'));

before(async () => {
  registry = await startRegistry();
  scratch = await mkdtemp(path.join(os.tmpdir(), 'dsec-registry-test-'));
});

after(async () => {
  for (const n of nodes) await n.cleanup().catch((err: unknown) => console.error('node cleanup:', err));
  await registry?.close();
  await rm(scratch, { recursive: true, force: true });
});

describe('layers in an OCI registry', () => {
  let base: LayerInfo;
  let tool: LayerInfo;
  let second: TestNode;

  test('a layer built on a node is in the registry once the build returns', async () => {
    const first = await node();
    base = await first.edge.layers.build({ type: 'busybox' }, { kind: 'base' });
    tool = await toolkit(first, { 'opt/tool/hello': 'hello from the registry\n' });
    const client = new RegistryClient(endpoint());
    for (const layer of [base, tool]) {
      const manifest = await client.manifest('dsec/layers', layerTag(layer.digest), ['application/vnd.oci.image.manifest.v1+json']);
      assert.ok(manifest, `${layer.digest} is in the registry`);
      const doc = JSON.parse(manifest.body.toString('utf8')) as { annotations: Record<string, string>; layers: unknown[] };
      assert.equal(doc.annotations['dev.dsec.layer.digest'], layer.digest);
      assert.equal(doc.layers.length, 3, 'EROFS metadata image, data blob and chunk index (lazy loading)');
    }
  });

  test('a node that lacks a layer pulls it by digest, once for many concurrent creates', async () => {
    second = await node();
    await assert.rejects(second.edge.layers.resolve(tool.digest), isCode('LAYER_NOT_FOUND'), 'listing does not pull');
    registry.clearLog();
    const spec = { image: { base: base.digest, toolkits: [tool.digest] } };
    const sandboxes = await Promise.all([1, 2, 3, 4].map(() => second.edge.create(spec)));
    try {
      const r = await second.edge.exec(sandboxes[0]!.id, { cmd: 'cat /opt/tool/hello' });
      assert.equal(r.exitCode, 0, r.stderr);
      assert.equal(r.stdout, 'hello from the registry\n');
      // Per layer: a config, a metadata image and a data blob, each fetched once.
      const gets = blobGets();
      assert.equal(gets.length, 6, gets.join('\n'));
      assert.equal(new Set(gets).size, 6, gets.join('\n'));
      const pulled = await second.edge.layers.resolve(tool.digest);
      assert.equal(pulled.kind, 'toolkit');
      assert.equal(pulled.contentBytes, tool.contentBytes);
    } finally {
      for (const sb of sandboxes) await second.edge.destroy(sb.id);
    }
  });

  test('a registry that is down: UNAVAILABLE with a retry hint, nothing half made', async () => {
    const missing = await toolkit(nodes[0]!, { 'opt/late': 'pushed before the registry went down\n' });
    await registry.stop();
    try {
      const before = (await second.edge.list()).length;
      const err = await second.edge.create({ image: { base: base.digest, toolkits: [missing.digest] } }).then(
        () => assert.fail('create succeeded without its layer'),
        (e: unknown) => e,
      );
      assert.ok(err instanceof DsecError);
      assert.equal(err.code, 'UNAVAILABLE', err.message);
      assert.equal(err.details.field, 'image.toolkits.0');
      assert.equal(typeof err.details.retryAfterMs, 'number');
      assert.equal((await second.edge.list()).length, before, 'no sandbox was made');
      await assert.rejects(second.edge.layers.resolve(missing.digest), isCode('LAYER_NOT_FOUND'));
      assert.deepEqual(await readdir(path.join(second.home, 'layers', 'tmp')), [], 'no partial download is left');
      // A build that cannot be pushed is not committed either.
      await assert.rejects(toolkit(second, { 'opt/unpushed': 'x\n' }), isCode('UNAVAILABLE'));
      assert.equal((await second.edge.layers.list({ kind: 'toolkit' })).length, 1, 'only the pulled toolkit');
    } finally {
      await registry.start();
    }
    const sb = await second.edge.create({ image: { base: base.digest, toolkits: [missing.digest] } });
    await second.edge.destroy(sb.id);
  });

  test('wrong credentials are refused with a clear error', async () => {
    const wrong = await node({ password: 'not-the-password' });
    await assert.rejects(toolkit(wrong, { 'opt/x': 'x\n' }), (err: unknown) => {
      assert.ok(err instanceof DsecError);
      assert.equal(err.code, 'UNAVAILABLE');
      assert.match(err.message, /credentials refused/);
      return true;
    });
  });

  test('past the cache bound, unused pulled layers are evicted (least recently used first) and pulled again on demand', async () => {
    const root = path.join(scratch, 'lru');
    const store = new LayerStore({ root, registry: new LayerRegistry(endpoint()), cacheMaxBytes: 1, evictGraceMs: 0, unmountLingerMs: 0 });
    try {
      const a = await store.fetch(tool.digest);
      assert.equal(a.digest, tool.digest);
      // Over the bound with nothing in use: the pulled layer goes as soon as it is not needed.
      const mounted = await store.acquire(tool.digest);
      assert.ok(mounted);
      await store.fetch(base.digest); // a second pull evicts what is unused: `tool` is in use
      assert.equal((await store.resolve(tool.digest)).digest, tool.digest, 'a layer in use stays');
      await store.release(tool.digest);
      await store.fetch(base.digest);
      registry.clearLog();
      const other = await toolkit(nodes[0]!, { 'opt/third': 'third\n' });
      await store.fetch(other.digest);
      await assert.rejects(store.resolve(tool.digest), isCode('LAYER_NOT_FOUND'), 'the unused layer was evicted');
      assert.equal((await store.fetch(tool.digest)).digest, tool.digest, 'and comes back from the registry');
    } finally {
      await store.close();
      await rm(root, { recursive: true, force: true });
    }
  });
});

describe('dsec image pull', () => {
  let platform: TestPlatform;
  let client: DsecClient;
  const ref = () => `${registry.host}/test/hello:v1`;

  before(async () => {
    // A small image in the registry: one gzip layer with a file, its config, its manifest.
    const rc = new RegistryClient(endpoint());
    const put = async (body: Buffer): Promise<{ digest: string; size: number }> => {
      const digest = `sha256:${createHash('sha256').update(body).digest('hex')}`;
      const file = path.join(scratch, digest.slice(7));
      await writeFile(file, body);
      await rc.pushBlob('test/hello', digest, file, body.length);
      return { digest, size: body.length };
    };
    const layer = await put(gzipSync(await tarOf({ 'opt/hello/greeting': 'hello from an OCI image\n' })));
    const config = await put(Buffer.from(JSON.stringify({ architecture: 'amd64', os: 'linux', rootfs: { type: 'layers', diff_ids: [] } })));
    const manifest = {
      schemaVersion: 2,
      mediaType: 'application/vnd.oci.image.manifest.v1+json',
      config: { mediaType: 'application/vnd.oci.image.config.v1+json', ...config },
      layers: [{ mediaType: 'application/vnd.oci.image.layer.v1.tar+gzip', ...layer }],
    };
    await rc.putManifest('test/hello', 'v1', manifest.mediaType, Buffer.from(JSON.stringify(manifest)));
    platform = await startTestPlatform({ pullFrom: [endpoint()] });
    client = new DsecClient({ apiUrl: platform.url, apiKey: platform.adminKey });
  });

  after(async () => {
    await platform?.close();
  });

  test('imports an image by reference from an allowed registry, with progress', async () => {
    const lines: string[] = [];
    const layer = await client.layers.pull({ ref: ref(), kind: 'toolkit', name: 'hello-image' }, { onProgress: (l) => lines.push(l) });
    assert.equal(layer.kind, 'toolkit');
    assert.ok(
      lines.some((l) => l.includes('pulling layer 1/1')),
      lines.join('\n'),
    );
    const sb = await Sandbox.create({ image: { base: 'busybox', toolkits: ['hello-image'] } }, { client });
    try {
      const r = await sb.exec('cat /opt/hello/greeting');
      assert.equal(r.stdout, 'hello from an OCI image\n');
    } finally {
      await sb.kill();
    }
  });

  test('a registry the node may not pull from, a bad reference and a missing image are refused, naming ref', async () => {
    const other = await apiCall(platform.url, platform.adminKey, 'POST', '/v1/layers/pull', { ref: '127.0.0.2:5000/test/hello:v1' });
    assert.equal(other.status, 403, JSON.stringify(other.body));
    assert.equal(other.body.error.field, 'ref');
    const bad = await apiCall(platform.url, platform.adminKey, 'POST', '/v1/layers/pull', { ref: 'no-registry-here' });
    assert.equal(bad.status, 400, JSON.stringify(bad.body));
    assert.equal(bad.body.error.field, 'ref');
    const missing = await apiCall(platform.url, platform.adminKey, 'POST', '/v1/layers/pull', { ref: `${registry.host}/test/absent:v1` });
    assert.equal(missing.status, 404, JSON.stringify(missing.body));
    const layers = await client.layers.list();
    assert.equal(layers.filter((l) => l.names.some((n) => n.startsWith('hello-image'))).length, 1, 'only the one pulled before');
  });
});
