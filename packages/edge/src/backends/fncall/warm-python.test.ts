// The warm interpreter's stub against `python3 -c` on the host's Debian python3 (the runtime
// layer's version): the same program must give the same output, errors and exit status.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import { PYTHON_PROGRAMS } from '../../testing/python-programs.js';
import { WARM_PYTHON_ARGV, warmPythonEligible, warmPythonInput } from './warm-python.js';

const PYTHON = '/usr/bin/python3';

function run(
  argv: readonly string[],
  input: Buffer,
  opts: { home?: string; beforeInput?: () => Promise<void> } = {},
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const env = { PATH: '/usr/bin:/bin', LANG: 'C.UTF-8', ...(opts.home !== undefined ? { HOME: opts.home } : {}) };
    const child = spawn(PYTHON, argv.slice(1), { stdio: ['pipe', 'pipe', 'pipe'], env, cwd: '/' });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
    void (opts.beforeInput ?? (() => Promise.resolve()))().then(
      () => child.stdin.end(input),
      (err: unknown) => {
        child.kill();
        reject(err instanceof Error ? err : new Error(String(err)));
      },
    );
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

test(
  "a user site the call's files made after the interpreter started is on sys.path, where python3 -c has it",
  { skip: !existsSync(PYTHON) && 'no /usr/bin/python3' },
  async () => {
    const home = await mkdtemp(path.join(os.tmpdir(), 'dsec-warm-home-'));
    try {
      const site = (await run(['python3', '-c', 'import site; print(site.getusersitepackages(), end="")'], Buffer.alloc(0), { home })).stdout;
      assert.ok(site.startsWith(home), site);
      const code = `import sys, lowsmod\nprint(lowsmod.X, [p for p in sys.path if p.startswith(${JSON.stringify(home)})], sys.path.index(${JSON.stringify(site)}) < len(sys.path) - 1)`;
      const makeSite = async (): Promise<void> => {
        await mkdir(site, { recursive: true });
        await writeFile(path.join(site, 'lowsmod.py'), 'X = 4\n');
        await writeFile(path.join(site, 'extra.pth'), `${path.join(home, 'extra')}\n`);
        await mkdir(path.join(home, 'extra'), { recursive: true });
      };
      // Warm: the interpreter starts with no user site; the call's files make it before its code is sent.
      const warm = await run(WARM_PYTHON_ARGV, warmPythonInput(code, ''), { home, beforeInput: () => new Promise((r) => setTimeout(r, 150)).then(makeSite) });
      const cold = await run(['python3', '-c', code], Buffer.alloc(0), { home });
      assert.equal(cold.code, 0, cold.stderr);
      assert.deepEqual(warm, cold);
    } finally {
      await rm(home, { recursive: true, force: true });
    }
  },
);

test('only python3 code without an environment of its own runs warm', () => {
  assert.equal(warmPythonEligible({ runtime: 'python3', code: 'print(1)' }), true);
  assert.equal(warmPythonEligible({ runtime: 'python3', code: 'print(1)', env: {} }), true);
  assert.equal(warmPythonEligible({ runtime: 'python3', code: 'print(1)', env: { PYTHONPATH: '/work' } }), false);
  assert.equal(warmPythonEligible({ runtime: 'python3', argv: ['python3', 'main.py'] }), false);
  assert.equal(warmPythonEligible({ runtime: 'bash', code: 'true' }), false);
  assert.equal(warmPythonEligible({ runtime: 'python3', code: 'a\0b' }), false);
  assert.deepEqual(warmPythonInput('é', 'in'), Buffer.from('2\néin'));
});
