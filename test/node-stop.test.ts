// End-to-end: stopping `dsec up` leaves no mount of the node behind once no sandbox is left, and
// `dsec up --clean` leaves none even with sandboxes running. Runs the real CLI as a process on
// a throw-away home and a free loopback port (needs root).
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import type { ChildProcessWithoutNullStreams } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, describe, test } from 'node:test';
import { MNT, mountsUnder, umount } from '@dsec/edge';
import { Sandbox } from '@dsec/sdk';
import { AGENT_BINARY, REPO_ROOT } from './helpers/node.js';

const CLI = path.join(REPO_ROOT, 'packages/cli/dist/main.js');
const START_TIMEOUT_MS = 120_000;
const homes: string[] = [];

/** The node's private run directory of a home (as the edge names it). */
function runDirOf(nodeHome: string): string {
  return path.join('/run/dsec', createHash('sha256').update(path.resolve(nodeHome)).digest('hex').slice(0, 12));
}

/** Mount points of the node of `home`: under the home, or under its run directory. */
async function nodeMounts(home: string): Promise<string[]> {
  const text = await readFile('/proc/self/mountinfo', 'utf8');
  const runDir = runDirOf(path.join(home, 'node'));
  return text
    .split('\n')
    .filter(Boolean)
    .map((line) => line.split(' ')[4] ?? '')
    .filter((target) => target === home || target.startsWith(`${home}/`) || target === runDir || target.startsWith(`${runDir}/`));
}

interface RunningNode {
  child: ChildProcessWithoutNullStreams;
  url: string;
  apiKey: string;
  stderr: () => string;
}

/** Starts `dsec up` on a fresh home and waits until it listens. */
async function up(home: string, extra: string[] = []): Promise<RunningNode> {
  const child = spawn(process.execPath, [CLI, 'up', '--addr', '127.0.0.1:0', ...extra], {
    env: { PATH: process.env.PATH ?? '', DSEC_HOME: home, DSEC_AGENT: AGENT_BINARY },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`dsec up did not listen in time: ${stderr}`)), START_TIMEOUT_MS);
    child.stdout.on('data', (d: Buffer) => {
      stdout += d.toString();
      const m = /listening on (http:\/\/\S+)/.exec(stdout);
      if (m && stdout.includes('admin key')) {
        clearTimeout(timer);
        resolve(m[1]!);
      }
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`dsec up exited with ${code}: ${stderr}`));
    });
  });
  const apiKey = (await readFile(path.join(home, 'admin.key'), 'utf8')).trim();
  return { child, url, apiKey, stderr: () => stderr };
}

/** Stops `dsec up` with `signal` and returns its exit status. */
async function stop(node: RunningNode, signal: NodeJS.Signals): Promise<number | null> {
  const exited = new Promise<number | null>((resolve) => node.child.once('exit', (code) => resolve(code)));
  node.child.kill(signal);
  return exited;
}

async function freshHome(): Promise<string> {
  const home = await mkdtemp(path.join(os.tmpdir(), 'dsec-stop-'));
  homes.push(home);
  return home;
}

after(async () => {
  // A failed test may leave a node behind: take it down the way an operator would, then unmount.
  for (const home of homes) {
    if ((await nodeMounts(home)).length > 0 && existsSync(path.join(home, 'dsec.db'))) {
      const node = await up(home, ['--clean']).catch(() => undefined);
      if (node) await stop(node, 'SIGTERM');
    }
    for (const m of [...(await mountsUnder(runDirOf(path.join(home, 'node'))).catch(() => [])), ...(await mountsUnder(home).catch(() => []))])
      umount(m, MNT.DETACH);
    await rm(home, { recursive: true, force: true });
  }
});

describe('stopping dsec up', () => {
  test('SIGINT with no sandbox left: nothing of the node stays mounted', async () => {
    const home = await freshHome();
    const node = await up(home);
    // Layer mounts and a sandbox's network exist only once a sandbox did.
    const sb = await Sandbox.create(
      { image: { base: 'busybox' }, network: { mode: 'allowlist', allow: [{ host: 'example.invalid' }] } },
      { apiUrl: node.url, apiKey: node.apiKey },
    );
    assert.equal((await sb.exec('echo ok > /tmp/ok && cat /tmp/ok')).stdout, 'ok\n');
    // A hashed diff starts the host-read pool's threads: idle, they must not keep the node up.
    assert.ok((await sb.diff({ hash: true })).entries.some((e) => e.path === '/tmp/ok' && e.sha256));
    assert.ok((await nodeMounts(home)).length > 0, 'the running node has mounts');
    await sb.kill();
    assert.equal(await stop(node, 'SIGINT'), 0, node.stderr());
    assert.deepEqual(await nodeMounts(home), [], 'no mount of the node is left');
  });

  test('SIGTERM with a sandbox running keeps it for the next start; dsec up --clean then removes it all', async () => {
    const home = await freshHome();
    let node = await up(home);
    const sb = await Sandbox.create({ image: { base: 'busybox' } }, { apiUrl: node.url, apiKey: node.apiKey });
    assert.equal(await stop(node, 'SIGTERM'), 0, node.stderr());
    assert.ok((await nodeMounts(home)).length > 0, 'a running sandbox keeps the node mounted');

    node = await up(home, ['--clean']);
    const again = await Sandbox.connect(sb.id, { apiUrl: node.url, apiKey: node.apiKey });
    assert.equal((await again.exec('echo still here')).stdout, 'still here\n', 'the sandbox survived the stop');
    assert.equal(await stop(node, 'SIGINT'), 0, node.stderr());
    assert.deepEqual(await nodeMounts(home), [], '--clean leaves no mount of the node');
  });
});
