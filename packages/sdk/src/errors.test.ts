import assert from 'node:assert/strict';
import { test } from 'node:test';
import { DsecError, ERROR_STATUS, isDsecError } from '@dsec/protocol';
import { CommandExitError } from './errors.js';
import type { ExecResult } from './types.js';

const result: ExecResult = {
  pid: 7,
  exitCode: 3,
  signal: null,
  timedOut: false,
  oomKilled: false,
  durationMs: 12,
  cpuUserMs: 1,
  cpuSysMs: 1,
  peakMemoryKiB: 900,
  stdoutBytes: 4,
  stderrBytes: 20,
  stdout: 'out\n',
  stderr: 'one\ntwo\nthree\nfour\n',
  truncated: false,
};

test('CommandExitError is a DsecError with code COMMAND_FAILED and carries the result', () => {
  const err = new CommandExitError(result, 'make test', 'node1-abc');
  assert.ok(err instanceof DsecError);
  assert.ok(err instanceof CommandExitError);
  assert.ok(isDsecError(err, 'COMMAND_FAILED'));
  assert.equal(err.status, ERROR_STATUS.COMMAND_FAILED);
  assert.equal(err.name, 'CommandExitError');
  assert.equal(err.exitCode, 3);
  assert.equal(err.signal, null);
  assert.equal(err.stdout, 'out\n');
  assert.equal(err.stderr, result.stderr);
  assert.equal(err.pid, 7);
  assert.equal(err.timedOut, false);
  assert.equal(err.command, 'make test');
  assert.deepEqual(err.result, result);
  assert.deepEqual(err.details, { sandboxId: 'node1-abc', pid: 7, exitCode: 3, signal: null, timedOut: false });
  // The message names how it ended and the last lines of stderr.
  assert.equal(err.message, 'command exited with 3: make test\ntwo\nthree\nfour');
  assert.equal(err.toJSON().error.code, 'COMMAND_FAILED');
});

test('CommandExitError says how a command that did not exit ended', () => {
  assert.match(
    new CommandExitError({ ...result, exitCode: null, signal: 'SIGKILL', stderr: '' }, 'sleep 9').message,
    /^command was killed by SIGKILL: sleep 9$/,
  );
  assert.match(
    new CommandExitError({ ...result, exitCode: null, signal: 'SIGKILL', timedOut: true, stderr: '' }, 'sleep 9').message,
    /^command timed out: sleep 9$/,
  );
  assert.equal(new CommandExitError(result, 'x').details.sandboxId, undefined);
});
