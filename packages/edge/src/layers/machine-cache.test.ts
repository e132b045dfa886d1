// The machine-wide cache of built layers: a build that asks for it lands in the cache once, and a
// second node home takes the layer from there by hard link, without building.
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readdir, rm, stat, utimes, writeFile } from 'node:fs/promises';
import os from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { cacheEntryOf, inCacheScratch } from './machine-cache.js';
import { LayerStore } from './store.js';

const dirs: string[] = [];
after(async () => {
  for (const d of dirs) await rm(d, { recursive: true, force: true });
});

test('a build through the machine cache is built once; another home adopts it by hard link', async () => {
  const dir = await mkdtemp(join(os.tmpdir(), 'dsec-machine-cache-'));
  dirs.push(dir);
  const cache = join(dir, 'cache');
  const src = join(dir, 'src');
  await mkdir(join(src, 'etc'), { recursive: true });
  await writeFile(join(src, 'etc', 'hello'), 'from the cache\n');
  const a = new LayerStore({ root: join(dir, 'a'), unmountLingerMs: 0, machineCacheDir: cache });
  const b = new LayerStore({ root: join(dir, 'b'), unmountLingerMs: 0, machineCacheDir: cache });
  try {
    const name = 'e2b/base-0123456789abcdef';
    const built = await a.build({ type: 'dir', path: src }, { kind: 'base', name, machineCache: true });
    const entry = cacheEntryOf(cache, name);
    assert.equal(entry, join(cache, 'e2b_base-0123456789abcdef'));
    assert.ok((await readdir(entry)).includes('layer.json'));
    assert.deepEqual(
      (await readdir(cache)).filter((n) => n.startsWith('.build-')),
      [],
      'no scratch store is left',
    );
    // The source is gone: the second home can only take the layer from the cache.
    await rm(src, { recursive: true });
    const adopted = await b.build({ type: 'dir', path: src }, { kind: 'base', name, machineCache: true });
    assert.equal(adopted.digest, built.digest);
    assert.equal((await b.resolve(name)).digest, built.digest);
    const hex = built.digest.slice('sha256:'.length);
    const [inCache, inB] = await Promise.all([stat(join(entry, 'data.blob')), stat(join(dir, 'b', 'blobs', hex, 'data.blob'))]);
    assert.equal(inB.ino, inCache.ino, 'hard link, not a copy');
    // Without the option the store builds on its own (and fails here: the source is gone).
    await assert.rejects(b.build({ type: 'dir', path: src }, { kind: 'base', name: 'other' }), /not a directory/);
  } finally {
    await a.close();
    await b.close();
  }
});

test('a build in the cache (the VM image cache too) removes what killed builds left a day ago, and its own scratch even when it fails', async () => {
  const cache = await mkdtemp(join(os.tmpdir(), 'dsec-machine-cache-'));
  dirs.push(cache);
  const dead = join(cache, '.build-vm-deadbeef');
  const fresh = join(cache, '.build-vm-0123abcd');
  await mkdir(join(dead, 'root'), { recursive: true });
  await mkdir(fresh);
  const dayAgo = new Date(Date.now() - 25 * 3600_000);
  await utimes(dead, dayAgo, dayAgo);
  let scratch = '';
  await assert.rejects(
    inCacheScratch(cache, 'vm', 0o755, async (dir) => {
      scratch = dir;
      await writeFile(join(dir, 'partial'), 'x');
      throw new Error('killed halfway');
    }),
    /killed halfway/,
  );
  assert.match(scratch, /\/\.build-vm-[0-9a-f]{8}$/);
  assert.deepEqual((await readdir(cache)).sort(), ['.build-vm-0123abcd'], 'the stale build and the failed one are gone; a live one stays');
});
