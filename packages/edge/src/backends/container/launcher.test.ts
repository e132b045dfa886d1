import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { mkdir, mkdtemp, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, test } from 'node:test';
import { LaunchServer } from './launcher.js';

// packages/edge/dist/backends/container -> repository root.
const LAUNCHER = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../../../chronus/build/dsec-launch');

let dir: string;
let server: LaunchServer;

before(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-launcher-'));
  await mkdir(path.join(dir, 'lower1'));
  await mkdir(path.join(dir, 'lower2'));
  await mkdir(path.join(dir, 'root'));
  server = new LaunchServer(LAUNCHER);
});

after(async () => {
  await server.close();
  await rm(dir, { recursive: true, force: true });
});

/** Launch arguments for a read-only overlay of two empty directories, then `argv` on the host. */
const launch = (argv: string[]): string[] => [
  '--rootfs',
  path.join(dir, 'root'),
  '--lower',
  `${path.join(dir, 'lower1')}:${path.join(dir, 'lower2')}`,
  '--',
  ...argv,
];

test('the launch server answers exit codes, writes output to the log, passes only the agent socket', async () => {
  const log = path.join(dir, 'a.log');
  // stat(2) only (no descriptor opened to look): fd 3 is the listening socket, nothing else
  // above stdio is open.
  const script =
    '[ -S /proc/$$/fd/3 ] && echo socket; n=4; while [ $n -lt 256 ]; do [ -e /proc/$$/fd/$n ] && echo "leak $n"; n=$((n+1)); done; echo out; exit 7';
  assert.equal(await server.run({ log, socket: path.join(dir, 'a.sock'), args: launch(['/bin/sh', '-c', script]), timeoutMs: 30_000 }), 7);
  assert.equal(await readFile(log, 'utf8'), 'socket\nout\n');
});

test('launches run side by side; a hung one is killed at its timeout; a failed mount is an exit code', async () => {
  const started = Date.now();
  const [slow, fast, bad] = await Promise.all([
    server.run({ log: path.join(dir, 'b.log'), socket: path.join(dir, 'b.sock'), args: launch(['/bin/sleep', '30']), timeoutMs: 300 }),
    server.run({ log: path.join(dir, 'c.log'), socket: path.join(dir, 'c.sock'), args: launch(['/bin/true']) }),
    server.run({
      log: path.join(dir, 'd.log'),
      socket: path.join(dir, 'd.sock'),
      args: ['--rootfs', path.join(dir, 'root'), '--lower', path.join(dir, 'missing'), '--', '/bin/true'],
    }),
  ]);
  assert.equal(slow, 128 + 9);
  assert.equal(fast, 0);
  assert.equal(bad, 125);
  assert.match(await readFile(path.join(dir, 'd.log'), 'utf8'), /^dsec-launch: open .*missing/m);
  assert.ok(Date.now() - started < 20_000);
});

test('the server comes back after it was closed', async () => {
  const s = new LaunchServer(LAUNCHER);
  try {
    assert.equal(await s.run({ log: path.join(dir, 'e.log'), socket: path.join(dir, 'e.sock'), args: launch(['/bin/true']) }), 0);
    await s.close();
    assert.equal(await s.run({ log: path.join(dir, 'f.log'), socket: path.join(dir, 'f.sock'), args: launch(['/bin/true']) }), 0);
  } finally {
    await s.close();
  }
});

test('an idle server does not keep its process alive, and dies with it', async () => {
  // A child Node process runs one launch and drops its server without closing it: the process
  // must still exit, and its server with it (PR_SET_PDEATHSIG).
  const module = path.join(path.dirname(fileURLToPath(import.meta.url)), 'launcher.js');
  const script = [
    `const { LaunchServer } = await import(${JSON.stringify(module)});`,
    `const s = new LaunchServer(${JSON.stringify(LAUNCHER)});`,
    `const code = await s.run(${JSON.stringify({ log: path.join(dir, 'g.log'), socket: path.join(dir, 'g.sock'), args: launch(['/bin/true']) })});`,
    `console.log(code, s.pid);`,
  ].join('\n');
  const child = spawn(process.execPath, ['--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  const exited = await Promise.race([once(child, 'exit').then(() => true), sleep(15_000, false, { ref: false })]);
  if (!exited) child.kill('SIGKILL');
  assert.ok(exited, 'the process exited with an idle server');
  const [code, pid] = out.trim().split(' ').map(Number);
  assert.equal(code, 0);
  assert.ok(pid && pid > 0, `the server's pid: ${out}`);
  for (let i = 0; i < 100 && existsSync(`/proc/${pid}`); i++) await sleep(50);
  assert.equal(existsSync(`/proc/${pid}`), false, 'the server died with its parent');
});

test('a server that dies mid-launch takes its launches with it (the edge undoes them: none may finish later)', async () => {
  const s = new LaunchServer(LAUNCHER);
  try {
    const pidFile = path.join(dir, 'h.pid');
    const run = s.run({
      log: path.join(dir, 'h.log'),
      socket: path.join(dir, 'h.sock'),
      args: launch(['/bin/sh', '-c', `echo $$ > ${pidFile}; exec sleep 30`]),
      timeoutMs: 30_000,
    });
    const refused = assert.rejects(run, /dsec-launch --serve/);
    let pid = 0;
    for (let i = 0; i < 200 && !pid; i++) {
      pid = Number(await readFile(pidFile, 'utf8').catch(() => '0'));
      if (!pid) await sleep(25);
    }
    assert.ok(pid > 0, 'the launch started');
    assert.ok(s.pid);
    process.kill(s.pid, 'SIGKILL');
    await refused;
    for (let i = 0; i < 100 && existsSync(`/proc/${pid}`); i++) await sleep(50);
    assert.equal(existsSync(`/proc/${pid}`), false, 'the launch died with its server');
  } finally {
    await s.close();
  }
});
