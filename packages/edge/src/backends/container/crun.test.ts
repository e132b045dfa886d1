import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { openSync, readFileSync, readlinkSync, writeSync, closeSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { test } from 'node:test';
import { EXEC_SEALS, sealsOf } from '../../sys/linux.js';
import { Crun, processRunning, processStartTime, sealedExecutable } from './crun.js';

test('crun runs from a sealed memfd copy made once per process', async () => {
  const exe = sealedExecutable('crun');
  assert.match(exe, new RegExp(`^/proc/${process.pid}/fd/\\d+$`));
  assert.equal(sealedExecutable('crun'), exe, 'one copy per process');
  const fd = Number(exe.slice(exe.lastIndexOf('/') + 1));
  assert.match(readlinkSync(exe), /^\/memfd:crun/);
  assert.equal(sealsOf(fd), EXEC_SEALS);
  // Nobody can change the copy, not even through a writable open of the same file.
  assert.throws(() => {
    const w = openSync(exe, 'r+');
    try {
      writeSync(w, Buffer.from('x'), 0, 1, 0);
    } finally {
      closeSync(w);
    }
  });
  // The copy runs.
  assert.match(execFileSync(exe, ['--version'], { encoding: 'utf8' }), /^crun version/);
  const res = await new Crun([], '/nonexistent-dsec-state').run(['--version']);
  assert.equal(res.code, 0);
});

test('a binary that is not there is run by its name (the spawn error names it)', () => {
  assert.equal(sealedExecutable('dsec-no-such-runtime'), 'dsec-no-such-runtime');
});

test('a zombie not reaped yet is not running (a killed protected-path server stays one a while)', async (t) => {
  // The shell's background child exits; the shell then becomes a sleep that never reaps it.
  const parent = spawn('sh', ['-c', 'sleep 0 & exec sleep 30'], { stdio: 'ignore' });
  t.after(() => parent.kill('SIGKILL'));
  const pid = parent.pid ?? 0;
  const state = (p: number) => {
    const stat = readFileSync(`/proc/${p}/stat`, 'utf8');
    return stat.charAt(stat.lastIndexOf(')') + 2);
  };
  let zombie = 0;
  for (let i = 0; i < 200 && !zombie; i++) {
    const child = Number(readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').split(' ')[0]);
    if (child > 0 && state(child) === 'Z') zombie = child;
    else await sleep(10);
  }
  assert.ok(zombie > 0, 'the zombie appeared');
  const zombieStart = processStartTime(zombie);
  assert.ok(zombieStart !== undefined, 'a zombie still has a start time');
  assert.equal(processRunning(zombie, zombieStart), false);
  const parentStart = processStartTime(pid) ?? 0;
  assert.equal(processRunning(pid, parentStart), true);
  assert.equal(processRunning(pid, parentStart + 1), false, 'another start time: a reused pid');
});
