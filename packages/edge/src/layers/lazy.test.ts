// Lazy layers, without a registry: a server that cannot start leaves none of the layer's chunks
// pinned (they may be evicted again, and stats() polls no dead socket).
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { CHUNK_INDEX_FILE, LazyLayers } from './lazy.js';
import { encodeChunkIndex } from './lazy-index.js';
import { LayerRegistry } from './remote.js';

let dir: string;

before(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-scratch-lazy-'));
});

after(async () => {
  await rm(dir, { recursive: true, force: true });
});

test('a lazy server that fails to start unpins its chunks', async () => {
  const layerDir = path.join(dir, 'layer');
  await mkdir(layerDir);
  const sha = randomBytes(32).toString('hex');
  await writeFile(path.join(layerDir, CHUNK_INDEX_FILE), encodeChunkIndex({ blobBytes: 4096, chunks: [{ offset: 0, length: 4096, sha256: sha }] }));
  // No lazy record beside the index: the start fails after the chunks were pinned.
  const lazy = new LazyLayers(path.join(dir, 'store'), new LayerRegistry({ url: 'http://127.0.0.1:9' }), { lazyfsBinary: '/nonexistent/dsec-lazyfs' });
  const hex = randomBytes(32).toString('hex');
  await assert.rejects(lazy.start(hex, layerDir));
  assert.equal((await lazy.stats()).lazyLayers, 0);
});
