import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, rmdir, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { splitMaskedPaths } from './bundle.js';

let dir: string;

before(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-bundle-'));
});

after(async () => {
  await rm(dir, { recursive: true, force: true });
});

test('masked paths are split at every call: a directory that disappears goes back to crun, which skips it', async () => {
  const zone = path.join(dir, 'powercap');
  const file = path.join(dir, 'kcore');
  const missing = path.join(dir, 'asound');
  await mkdir(zone);
  await writeFile(file, '');
  assert.deepEqual(splitMaskedPaths([zone, file, missing]), { dirs: [zone], others: [file, missing] });
  // Gone after the node started (a module unloaded): no longer a bind destination crun would have to make.
  await rmdir(zone);
  assert.deepEqual(splitMaskedPaths([zone, file, missing]), { dirs: [], others: [zone, file, missing] });
  await mkdir(missing);
  assert.deepEqual(splitMaskedPaths([zone, file, missing]), { dirs: [missing], others: [zone, file] });
});
