import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { rmdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { test } from 'node:test';
import { Cgroups, detectCgroupMode } from './cgroups.js';

const root = process.getuid?.() === 0;

test(
  'counter files held open read the cgroup of now: a cgroup removed and made again under the same path is read afresh',
  { skip: !root && 'needs root' },
  async () => {
    const cg = new Cgroups(await detectCgroupMode(), `dsec-test-held-${process.pid}`);
    const id = 'sb';
    const children: ChildProcess[] = [];
    // A process in the sandbox's cgroups (every hierarchy's cgroup.procs, as crun puts one there).
    const join = async (procsFiles: string[]): Promise<ChildProcess> => {
      const child = spawn('sleep', ['30'], { stdio: 'ignore' });
      children.push(child);
      for (const f of procsFiles) await writeFile(f, String(child.pid));
      return child;
    };
    const stop = async (child: ChildProcess): Promise<void> => {
      const gone = new Promise((r) => child.once('exit', r));
      child.kill('SIGKILL');
      await gone;
      assert.ok(await cg.waitEmpty(id, 2000));
    };
    try {
      const limits = { memoryBytes: 64 * 2 ** 20, cpu: 1, pids: 16 };
      const procs = await cg.create(id, limits);
      assert.equal(cg.pidsCurrentSync(id), 0);
      assert.equal(cg.oomKillsSync(id), 0);
      const first = await join(procs);
      assert.equal(cg.pidsCurrentSync(id), 1);
      await stop(first);
      // Removed behind the held files' back (crun's own delete does so), then made again.
      await Promise.all(procs.map((f) => rmdir(path.dirname(f))));
      const again = await cg.create(id, limits);
      await join(again);
      assert.equal(cg.pidsCurrentSync(id), 1);
      assert.equal(cg.pidsLimitHitsSync(id), 0);
      assert.equal(cg.oomKillsSync(id), 0);
    } finally {
      for (const c of children) c.kill('SIGKILL');
      await cg.waitEmpty(id, 2000);
      await cg.remove(id);
      await cg.removeParent();
    }
    assert.deepEqual(await cg.existing(id), []);
  },
);
