import assert from 'node:assert/strict';
import { mkdtemp, open, readFile, rm, stat } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import { copySavedState, readSavedState, writeSavedManifest } from './migration.js';
import { guestNetScript } from './network.js';

test("a saved state copied for a fork keeps its holes, its manifest comes with it, and the copy reads back as the source's", async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-fork-state-'));
  try {
    const file = path.join(dir, 'memory.state');
    // 64 MiB with 4 KiB of data at each end: a guest's state is mostly zero pages.
    const f = await open(file, 'w');
    await f.write(Buffer.alloc(4096, 1), 0, 4096, 0);
    await f.write(Buffer.alloc(4096, 2), 0, 4096, 64 * 1024 * 1024 - 4096);
    await f.close();
    await writeSavedManifest({ file, bytes: 64 * 1024 * 1024, sha256: 'ab'.repeat(32), durationMs: 1, savedAt: new Date().toISOString() });
    const copy = await copySavedState(await readSavedState(file), path.join(dir, 'copy.state'));
    const read = await readSavedState(copy.file);
    assert.equal(read.bytes, 64 * 1024 * 1024);
    assert.equal(read.sha256, 'ab'.repeat(32));
    assert.deepEqual(await readFile(copy.file), await readFile(file));
    assert.ok((await stat(copy.file)).blocks * 512 < 1024 * 1024, 'the copy is sparse');
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("a guest's network script given a MAC first drops what the guest had (a fork with memory has its source's address and MAC)", () => {
  const link = { address: '10.0.0.2', gateway: '10.0.0.1' };
  const plain = guestNetScript('eth0', link);
  assert.equal(plain, 'ip link set eth0 up && ip addr add 10.0.0.2 peer 10.0.0.1 dev eth0 && ip route add default via 10.0.0.1 dev eth0');
  assert.equal(
    guestNetScript('eth0', link, 'ip', '02:00:00:00:00:01'),
    `ip link set eth0 down && ip addr flush dev eth0 && ip link set eth0 address 02:00:00:00:00:01 && ${plain}`,
  );
});
