// The warm interpreter's stub against `python3 -c` on the host's Debian python3 (the runtime
// layer's version): the same program must give the same output, errors and exit status.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { test } from 'node:test';
import { PYTHON_PROGRAMS } from '../../testing/python-programs.js';
import { WARM_PYTHON_ARGV, warmPythonEligible, warmPythonInput } from './warm-python.js';

const PYTHON = '/usr/bin/python3';

function run(argv: readonly string[], input: Buffer): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(PYTHON, argv.slice(1), { stdio: ['pipe', 'pipe', 'pipe'], env: { PATH: '/usr/bin:/bin', LANG: 'C.UTF-8' }, cwd: '/' });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
    child.stdin.end(input);
  });
}

const programs = [
  ...Object.values(PYTHON_PROGRAMS),
  'import sys, json\nprint(json.dumps({"argv": sys.argv, "main": sorted(globals()), "path0": sys.path[0], "stdin": sys.stdin.read()}))',
];

test('a program in the warm stub prints, fails and exits as under python3 -c', { skip: !existsSync(PYTHON) && 'no /usr/bin/python3' }, async () => {
  for (const code of programs) {
    const warm = await run(WARM_PYTHON_ARGV, warmPythonInput(code, 'a\nb'));
    const cold = await run(['python3', '-c', code], Buffer.from('a\nb'));
    assert.deepEqual(warm, cold, code);
  }
});

test('stdin closed before the whole code: the stub exits 0 without running anything', { skip: !existsSync(PYTHON) && 'no /usr/bin/python3' }, async () => {
  assert.deepEqual(await run(WARM_PYTHON_ARGV, Buffer.from('100\nprint(1)')), { code: 0, stdout: '', stderr: '' });
  assert.deepEqual(await run(WARM_PYTHON_ARGV, Buffer.alloc(0)), { code: 0, stdout: '', stderr: '' });
});

test('only python3 code without an environment of its own runs warm', () => {
  assert.equal(warmPythonEligible({ runtime: 'python3', code: 'print(1)' }), true);
  assert.equal(warmPythonEligible({ runtime: 'python3', code: 'print(1)', env: {} }), true);
  assert.equal(warmPythonEligible({ runtime: 'python3', code: 'print(1)', env: { PYTHONPATH: '/work' } }), false);
  assert.equal(warmPythonEligible({ runtime: 'python3', argv: ['python3', 'main.py'] }), false);
  assert.equal(warmPythonEligible({ runtime: 'bash', code: 'true' }), false);
  assert.equal(warmPythonEligible({ runtime: 'python3', code: 'a\0b' }), false);
  assert.deepEqual(warmPythonInput('é', 'in'), Buffer.from('2\néin'));
});
