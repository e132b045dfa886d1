// The chunk index from a real mkfs.erofs image: the extents it finds tile the data blob exactly
// (every chunk mkfs wrote, none twice), whatever the tree holds (large directories spanning
// blocks, hard links, empty files, files over one chunk, duplicate contents); the binary form
// round-trips and is checked on decode.
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { link, mkdir, mkdtemp, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { mkfsErofs } from './erofs.js';
import { buildChunkIndex, decodeChunkIndex, encodeChunkIndex } from './lazy-index.js';

let dir: string;

before(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-scratch-lazy-index-'));
});

after(async () => {
  await rm(dir, { recursive: true, force: true });
});

test('the chunk extents of an EROFS image tile its data blob', async () => {
  const tree = path.join(dir, 'tree');
  await mkdir(path.join(tree, 'many'), { recursive: true });
  await mkdir(path.join(tree, 'a/b/c'), { recursive: true });
  // A directory of 300 long names spans several blocks.
  for (let i = 0; i < 300; i++) await writeFile(path.join(tree, 'many', `file-with-a-rather-long-name-${i}`), `content ${i}\n`);
  await writeFile(path.join(tree, 'a/b/c/big'), randomBytes(5 * 65536 + 17));
  await writeFile(path.join(tree, 'a/empty'), '');
  const dup = randomBytes(70000);
  await writeFile(path.join(tree, 'dup1'), dup);
  await writeFile(path.join(tree, 'dup2'), dup);
  await link(path.join(tree, 'a/b/c/big'), path.join(tree, 'hardlink'));
  await symlink('a/b/c/big', path.join(tree, 'sym'));
  const meta = path.join(dir, 'meta.erofs');
  const blob = path.join(dir, 'data.blob');
  await mkfsErofs(tree, meta, blob, { chunkSizeBytes: 65536 });
  const index = await buildChunkIndex(meta, blob);
  const blobBytes = (await readFile(blob)).length;
  assert.equal(index.blobBytes, blobBytes);
  let at = 0;
  for (const c of index.chunks) {
    assert.equal(c.offset, at, 'extents are contiguous from the start of the blob');
    assert.equal(c.length % 4096, 0);
    at += c.length;
  }
  assert.equal(at, blobBytes, 'and end at its end');
  // 300 small files + 6 chunks of big + 2 of the duplicated file (stored once).
  assert.equal(index.chunks.length, 300 + 6 + 2);
  const bytes = await readFile(blob);
  for (const c of index.chunks.slice(0, 20)) {
    assert.equal(
      createHash('sha256')
        .update(bytes.subarray(c.offset, c.offset + c.length))
        .digest('hex'),
      c.sha256,
    );
  }
  const encoded = encodeChunkIndex(index);
  assert.deepEqual(decodeChunkIndex(encoded), index);
  const broken = Buffer.from(encoded);
  broken.writeUInt32LE(index.chunks.length + 1, 16);
  assert.throws(() => decodeChunkIndex(broken), /wrong size/);
});
