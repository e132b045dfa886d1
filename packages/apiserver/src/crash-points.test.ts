import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { test } from 'node:test';
import { BACKEND_CRASH_STEPS, EDGE_CRASH_STEPS, MICROVM_CRASH_STEPS } from '@dsec/protocol';
import { CRASH_AT_ENV, CRASH_STEPS, crashPoint } from './crash-points.js';

const MODULE = new URL('./crash-points.js', import.meta.url).href;

/** Runs a small module in a child with only `env` set. */
function child(code: string, env: Record<string, string>): ReturnType<typeof spawnSync> {
  return spawnSync(process.execPath, ['--input-type=module', '-e', `import { crashPoint } from ${JSON.stringify(MODULE)};\n${code}`], {
    env: { PATH: process.env.PATH ?? '', ...env },
    encoding: 'utf8',
    timeout: 30_000,
  });
}

test('unarmed, every kill point does nothing', () => {
  assert.equal(process.env[CRASH_AT_ENV], undefined, 'the test runs unarmed');
  for (const step of CRASH_STEPS) crashPoint(step);
});

test('armed, the process is SIGKILLed at its step and not before', () => {
  const r = child("crashPoint('create.row'); console.log('before'); crashPoint('create.node'); console.log('after');", { [CRASH_AT_ENV]: 'create.node' });
  assert.equal(r.signal, 'SIGKILL');
  assert.equal(r.stdout, 'before\n');
});

test('a step that is not a kill point is refused when the module loads', () => {
  const r = child("console.log('loaded');", { [CRASH_AT_ENV]: 'create.nowhere' });
  assert.notEqual(r.status, 0);
  assert.match(String(r.stderr), /create\.nowhere is not one of/);
});

test("the edge's, its backends' and its network's steps are kill points of this process too (an in-process node reaches them)", () => {
  for (const step of [...EDGE_CRASH_STEPS, ...BACKEND_CRASH_STEPS, ...MICROVM_CRASH_STEPS]) crashPoint(step);
  const r = child("crashPoint('container.destroy.ended'); console.log('before'); crashPoint('container.destroy.unmounted'); console.log('after');", {
    [CRASH_AT_ENV]: 'container.destroy.unmounted',
  });
  assert.equal(r.signal, 'SIGKILL');
  assert.equal(r.stdout, 'before\n');
  const names = [...CRASH_STEPS, ...EDGE_CRASH_STEPS, ...BACKEND_CRASH_STEPS, ...MICROVM_CRASH_STEPS];
  assert.equal(new Set(names).size, names.length, 'every kill point has a name of its own');
});
