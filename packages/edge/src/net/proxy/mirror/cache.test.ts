import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { MirrorCache } from './cache.js';

async function withUpstream(fn: (base: string, hits: Map<string, number>) => Promise<void>): Promise<void> {
  const hits = new Map<string, number>();
  const server = http.createServer((req, res) => {
    hits.set(req.url!, (hits.get(req.url!) ?? 0) + 1);
    if (req.url === '/moved') return void res.writeHead(302, { location: '/obj/a' }).end();
    if (req.url === '/away') return void res.writeHead(302, { location: 'http://127.0.0.2:1/x' }).end();
    if (req.url === '/missing') return void res.writeHead(404).end('gone');
    const size = Number(req.url!.split('/').pop()!.length) * 1000;
    res.writeHead(200, { 'content-type': 'application/octet-stream' }).end(Buffer.alloc(size, req.url));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  try {
    await fn(`http://127.0.0.1:${(server.address() as AddressInfo).port}`, hits);
  } finally {
    server.close();
  }
}

test('the cache keeps within its size, evicting the least recently used', async () => {
  const dir = await mkdtemp(path.join(tmpdir(), 'dsec-scratch-cache-'));
  try {
    await withUpstream(async (base, hits) => {
      const cache = await MirrorCache.open({ dir, maxBytes: 5000 });
      const always = { fresh: () => true };
      const a = await cache.get(`${base}/obj/aa`, always); // 2000 bytes
      assert.equal(a.source, 'upstream');
      assert.equal((await readFile(a.file!)).length, 2000);
      await cache.get(`${base}/obj/bb`, always); // 4000 in all
      assert.equal((await cache.get(`${base}/obj/aa`, always)).source, 'cache'); // aa is now the most recent
      await cache.get(`${base}/obj/ccc`, always); // 7000 > 5000: bb goes
      const s = cache.stats();
      assert.equal(s.bytes, 5000);
      assert.equal(s.evictions, 1);
      assert.equal((await cache.get(`${base}/obj/aa`, always)).source, 'cache');
      assert.equal((await cache.get(`${base}/obj/bb`, always)).source, 'upstream');
      assert.equal(hits.get('/obj/bb'), 2);

      // Non-200 answers pass through uncached; redirects are followed on the same origin only.
      const missing = await cache.get(`${base}/missing`, always);
      assert.equal(missing.status, 404);
      assert.equal(missing.body?.toString(), 'gone');
      assert.equal((await cache.get(`${base}/moved`, always)).size, 1000);
      await assert.rejects(cache.get(`${base}/away`, always), /redirect .* not followed/);

      // A stale copy is refreshed; a reopened cache finds what is on disk.
      await cache.get(`${base}/obj/aa`, { fresh: () => false });
      assert.equal(hits.get('/obj/aa'), 2);
      const reopened = await MirrorCache.open({ dir, maxBytes: 5000 });
      assert.equal(reopened.stats().bytes, cache.stats().bytes);
      assert.equal((await reopened.get(`${base}/obj/aa`, always)).source, 'cache');
    });
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test('an object over the size limit is refused and leaves nothing behind', async () => {
  const dir = await mkdtemp(path.join(tmpdir(), 'dsec-scratch-cache-'));
  try {
    await withUpstream(async (base) => {
      const cache = await MirrorCache.open({ dir, maxBytes: 10_000, maxObjectBytes: 1500 });
      await assert.rejects(cache.get(`${base}/obj/xx`, { fresh: () => true }), /over the object limit/);
      assert.equal(cache.stats().objects, 0);
      assert.equal(existsSync(dir), true);
      const { readdir } = await import('node:fs/promises');
      assert.deepEqual(await readdir(dir), []);
    });
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test('an object with a SHA-256 is stored by it (one object for any URL) and refused when it does not match', async () => {
  const dir = await mkdtemp(path.join(tmpdir(), 'dsec-scratch-cache-'));
  try {
    await withUpstream(async (base, hits) => {
      const cache = await MirrorCache.open({ dir });
      const always = { fresh: () => true };
      // Both URLs answer the same bytes (the body is the path repeated: same path, same content).
      const body = Buffer.alloc(2000, '/obj/ab');
      const sha256 = createHash('sha256').update(body).digest('hex');
      const first = await cache.get(`${base}/obj/ab`, { ...always, sha256 });
      assert.equal(first.source, 'upstream');
      const again = await cache.get(`${base}/obj/ab?another-url`, { ...always, sha256 });
      assert.equal(again.source, 'cache');
      assert.equal(again.file, first.file);
      assert.equal(hits.get('/obj/ab?another-url'), undefined);
      const wrong = 'f'.repeat(64);
      await assert.rejects(cache.get(`${base}/obj/cd`, { ...always, sha256: wrong }), /SHA-256/);
      assert.equal(await cache.get(`${base}/obj/cd`, { ...always, sha256: wrong }).catch(() => 'refused again'), 'refused again');
      assert.equal(cache.stats().objects, 1);
    });
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
