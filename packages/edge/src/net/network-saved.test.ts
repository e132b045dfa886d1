// A starting edge removes the saved network policies of sandboxes it did not recover (an edge
// killed between a sandbox's teardown and its network's removal left them for good).
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import { NodeNetwork } from './network.js';

test('forgetSavedExcept removes the saved policies (and half-written ones) of every sandbox not kept, and nothing else', async () => {
  const home = await mkdtemp(path.join(os.tmpdir(), 'dsec-net-saved-'));
  try {
    const dir = path.join(home, 'net');
    await mkdir(path.join(dir, 'mirrors'), { recursive: true });
    const policy = JSON.stringify({ policy: { mode: 'allowlist', allow: [] }, slot: 3 });
    for (const f of ['n-live.json', 'n-gone.json', 'n-gone2.json.tmp', 'n-live.json.tmp']) await writeFile(path.join(dir, f), policy);
    const network = new NodeNetwork({}, { home, nflogBinary: '/nonexistent', netlinkBinary: '/nonexistent', raise: () => undefined });
    const removed = await network.forgetSavedExcept((id) => id === 'n-live');
    assert.deepEqual(removed.sort(), ['n-gone', 'n-gone2']);
    assert.deepEqual((await readdir(dir)).sort(), ['mirrors', 'n-live.json', 'n-live.json.tmp']);
    // A home whose node never had a networked sandbox: nothing to do.
    const bare = new NodeNetwork({}, { home: path.join(home, 'bare'), nflogBinary: '/nonexistent', netlinkBinary: '/nonexistent', raise: () => undefined });
    assert.deepEqual(await bare.forgetSavedExcept(() => false), []);
  } finally {
    await rm(home, { recursive: true, force: true });
  }
});
