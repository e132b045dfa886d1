import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { openSync, readlinkSync, writeSync, closeSync } from 'node:fs';
import { test } from 'node:test';
import { EXEC_SEALS, sealsOf } from '../../sys/linux.js';
import { Crun, sealedExecutable } from './crun.js';

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
