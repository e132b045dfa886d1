import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import { qemuPid } from './lifecycle.js';

test("a QEMU pid file is believed only for a process whose command line names the run folder and, if asked, runs as the sandbox's uid", async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-qemupid-'));
  try {
    const pidFile = path.join(dir, 'qemu.pid');
    // This test process stands for a QEMU: its command line names this file (its run folder).
    const runDir = path.basename(process.argv[1] ?? '');
    await writeFile(pidFile, String(process.pid));
    assert.equal(await qemuPid(pidFile, runDir), process.pid);
    assert.equal(await qemuPid(pidFile, runDir, process.getuid!()), process.pid);
    assert.equal(await qemuPid(pidFile, runDir, process.getuid!() + 1), undefined, 'another uid: a reused pid');
    assert.equal(await qemuPid(pidFile, '/var/lib/dsec/other-run'), undefined, 'another run folder');
    await writeFile(pidFile, 'garbage');
    assert.equal(await qemuPid(pidFile, runDir), undefined);
    assert.equal(await qemuPid(path.join(dir, 'missing.pid'), runDir), undefined);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
