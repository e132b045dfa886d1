// Debian base layer through mmdebstrap. Slow (downloads from the host's configured Debian
// mirror, ~1-2 min), so it lives apart from store.test.ts.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, statSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { mountsUnder, MNT, umount } from '../sys/linux.js';
import { LayerStore } from './index.js';
import { hostMirrors } from './debian.js';

let dir = '';
let store: LayerStore;

before(async () => {
  dir = await mkdtemp(join(tmpdir(), 'dsec-layers-debian-'));
  store = new LayerStore({ root: join(dir, 'layers'), unmountLingerMs: 0 });
  await store.init();
});

after(async () => {
  await store.close().catch(() => undefined);
  for (const m of await mountsUnder(dir)) umount(m, MNT.DETACH);
  await rm(dir, { recursive: true, force: true });
});

test('host apt sources are rewritten for the requested suite', async () => {
  const lines = await hostMirrors('bookworm');
  assert.ok(lines.length > 0, 'the host has a Debian source configured');
  for (const l of lines) assert.match(l, /^deb (\[signed-by=\S+\] )?\S+ bookworm(-updates|-security)? \S/);
});

test('python3 and git on a minbase bookworm', { timeout: 600_000 }, async () => {
  const progress: string[] = [];
  const info = await store.build(
    { type: 'debian', suite: 'bookworm', packages: ['python3', 'git'], variant: 'minbase' },
    { kind: 'base', name: 'debian/python-git', onProgress: (m) => progress.push(m) },
  );
  assert.ok(
    progress.some((m) => m.startsWith('I: ')),
    'mmdebstrap progress reaches onProgress',
  );
  assert.deepEqual(info.names, ['debian/python-git:latest']);
  assert.deepEqual(readdirSync(join(dir, 'layers/tmp')), [], 'build dir removed');
  const mnt = await store.acquire(info.digest);
  try {
    for (const bin of ['usr/bin/python3', 'usr/bin/git', 'bin/sh']) assert.ok(existsSync(join(mnt, bin)), bin);
    assert.ok(statSync(join(mnt, 'usr/bin/python3')).mode & 0o111);
    assert.deepEqual(
      readdirSync(join(mnt, 'var/cache/apt/archives')).filter((f) => f.endsWith('.deb')),
      [],
      'no cached .debs',
    );
    assert.deepEqual(
      readdirSync(join(mnt, 'var/lib/apt/lists')).filter((f) => f.endsWith('Packages')),
      [],
      'no apt lists',
    );
  } finally {
    await store.release(info.digest);
  }
});
