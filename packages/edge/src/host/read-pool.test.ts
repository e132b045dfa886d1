import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { closeSync, constants, openSync } from 'node:fs';
import { link, mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { after, before, describe, test } from 'node:test';
import { isDsecError } from '@dsec/protocol';
import { ReadPool } from './read-pool.js';

const run = promisify(execFile);

let dir: string;
let outside: string;

before(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-read-pool-'));
  outside = await mkdtemp(path.join(os.tmpdir(), 'dsec-read-pool-outside-'));
  await writeFile(path.join(outside, 'big'), Buffer.alloc(1 << 20, 1));
  await mkdir(path.join(dir, 'a/b'), { recursive: true });
  await writeFile(path.join(dir, 'a/one'), 'hello');
  await writeFile(path.join(dir, 'a/b/two'), 'world!');
  await link(path.join(dir, 'a/b/two'), path.join(dir, 'a/b/two-again'));
  await symlink(outside, path.join(dir, 'a/escape'));
  await symlink(path.join(outside, 'big'), path.join(dir, 'a/b/big'));
});

after(async () => {
  await rm(dir, { recursive: true, force: true });
  await rm(outside, { recursive: true, force: true });
});

describe('host-read pool', () => {
  test('hashes an open fd off the event loop, and refuses past the byte limit', async () => {
    const pool = new ReadPool();
    try {
      const fd = openSync(path.join(dir, 'a/one'), constants.O_RDONLY);
      try {
        const r = await pool.hashFd(fd, 1024);
        assert.equal(r.sha256, createHash('sha256').update('hello').digest('hex'));
        assert.equal(r.bytes, 5);
      } finally {
        closeSync(fd);
      }
      const big = openSync(path.join(outside, 'big'), constants.O_RDONLY);
      try {
        assert.equal((await pool.hashFd(big, 1000)).tooLarge, true);
      } finally {
        closeSync(big);
      }
    } finally {
      await pool.close();
    }
  });

  test('counts a tree without following symlinks (to a directory or a file) and hard links once', async () => {
    const pool = new ReadPool();
    try {
      // a, a/b, a/one, a/b/two, a/b/two-again, a/escape, a/b/big: 7 entries; 5 + 6 bytes.
      assert.deepEqual(await pool.run({ op: 'count-tree', root: dir }), { files: 7, contentBytes: 11 });
    } finally {
      await pool.close();
    }
  });

  test('a task past its deadline fails with TIMEOUT and its thread is replaced; a full queue refuses; an abort drops a queued task', async () => {
    const pool = new ReadPool({ threads: 1, maxQueue: 1, deadlineMs: 300 });
    try {
      const slow = pool.run({ op: 'sleep', ms: 5_000 });
      const ac = new AbortController();
      const queued = pool.run({ op: 'sleep', ms: 1 }, ac.signal);
      await assert.rejects(pool.run({ op: 'sleep', ms: 1 }), (err) => isDsecError(err, 'UNAVAILABLE'));
      ac.abort();
      await assert.rejects(queued, (err) => (err as Error).name === 'AbortError' || isDsecError(err, 'CANCELLED'));
      await assert.rejects(slow, (err) => isDsecError(err, 'TIMEOUT'));
      assert.equal(await pool.run({ op: 'sleep', ms: 1 }), null, 'a fresh thread took over');
    } finally {
      await pool.close();
    }
  });

  test('a process that used the pool exits by itself (idle threads keep nothing alive)', async () => {
    const url = new URL('./read-pool.js', import.meta.url).href;
    const script = `import { readPool } from ${JSON.stringify(url)};
      await readPool().run({ op: 'count-tree', root: ${JSON.stringify(dir)} });
      await readPool().run({ op: 'sleep', ms: 1 });
      console.log('done');`;
    const { stdout } = await run(process.execPath, ['--input-type=module', '-e', script], { timeout: 20_000, cwd: path.dirname(fileURLToPath(url)) });
    assert.equal(stdout.trim(), 'done');
  });
});
