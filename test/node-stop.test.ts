// End-to-end: stopping `dsec up` leaves no mount of the node behind once no sandbox is left, and
// `dsec up --clean` leaves none even with sandboxes running. Runs the real CLI as a process on
// a throw-away home and a free loopback port (needs root).
import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { freshHome as makeHome, nodeMounts, removeHome, stop, up as start } from './helpers/child-platform.js';
import type { RunningNode } from './helpers/child-platform.js';

const homes: string[] = [];

/** Starts `dsec up` on `home` with extra arguments and waits until it listens. */
function up(home: string, extra: string[] = []): Promise<RunningNode> {
  return start(home, { args: extra });
}

async function freshHome(): Promise<string> {
  const home = await makeHome('dsec-stop-');
  homes.push(home);
  return home;
}

after(async () => {
  // A failed test may leave a node behind: take it down the way an operator would, then unmount.
  for (const home of homes) await removeHome(home);
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
