// Forks of a full VM (`backend: "vm"`) under `npm run test:long` (DSEC_LONG=1): each fork is one
// more boot of OVMF, the kernel and systemd (tens of seconds under TCG). A running VM is forked:
// the fork boots the snapshot of its disk (the files written before, a deleted image file
// absent), gets a sandbox, QEMU and disk of its own, and the two diverge while the source's
// writer runs on; a fork of the fork boots the chain (image, first snapshot, second snapshot); a
// paused VM is snapshotted as it is and stays paused. `npm test` keeps one snapshot, exported
// and imported back (test/vm.test.ts).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { DsecClient, Sandbox } from '@dsec/sdk';
import type { Layer } from '@dsec/protocol';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';
import { sh } from './helpers/assert.js';
import { qemuPids } from './helpers/qemu.js';

const LONG = process.env.DSEC_LONG === '1';

let tp: TestPlatform;
let client: DsecClient;
let image: Layer;
const made: Sandbox[] = [];

/** The counter the source's writer has reached (one line a 200 ms; 0 before its first line). */
async function count(sb: Sandbox): Promise<number> {
  return Number((await sh(sb, 'cat /root/count 2>/dev/null | wc -l')).trim());
}

async function until(what: string, fn: () => Promise<boolean>, ms = 30_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await fn())) {
    if (Date.now() > end) assert.fail(`${what}: not within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

describe('vm forks', { skip: LONG ? false : 'DSEC_LONG=1 (npm run test:long): boots three VMs' }, () => {
  before(async () => {
    tp = await startTestPlatform({ vm: {} });
    client = new DsecClient({ apiUrl: tp.url, apiKey: tp.adminKey, requestTimeoutMs: 600_000 });
    // Built once per input machine-wide (test/vm.test.ts builds the same image).
    image = await client.layers.buildVm({ name: 'vm-test' }, { onProgress: (line) => process.stderr.write(`vm image: ${line}\n`) });
  });
  after(async () => {
    for (const sb of made) await sb.kill().catch(() => undefined);
    await client?.close();
    await tp?.close();
  });

  test('a running VM forked, the fork forked again; a paused VM snapshotted as it is', async () => {
    const source = await Sandbox.create({ backend: 'vm', image: { base: 'vm-test' }, resources: { cpu: 1, memoryMiB: 512, diskMiB: 1024 } }, { client });
    made.push(source);
    await source.files.write('/root/before.txt', 'written before the fork');
    await sh(source, 'rm /etc/motd');
    // A writer that runs through the snapshot (its writes wait while the disk is frozen).
    await sh(source, 'setsid sh -c "while :; do echo x >> /root/count; sleep 0.2; done" </dev/null >/dev/null 2>&1 &');
    await until('the writer writes', async () => (await count(source)) > 2);

    const { snapshot, sandboxes } = await source.fork(1);
    const [fork] = sandboxes;
    assert.ok(fork);
    made.push(fork);
    assert.ok(snapshot, 'a fork without memory is made from a snapshot');
    assert.equal(snapshot.kind, 'snapshot');
    assert.deepEqual(snapshot.snapshot?.parents, [image.digest]);
    assert.deepEqual((await fork.info()).layers, [image.digest, snapshot.digest]);
    assert.equal((await fork.info()).backend, 'vm');

    // The fork: the source's disk at the snapshot, on a QEMU and a disk of its own.
    assert.equal(await fork.files.read('/root/before.txt'), 'written before the fork');
    assert.equal((await fork.exec('test -e /etc/motd')).exitCode, 1, 'the deleted image file stays deleted');
    assert.match(await sh(fork, 'cat /proc/1/comm'), /^systemd$/m);
    const [sourcePid] = await qemuPids(source.id);
    const [forkPid] = await qemuPids(fork.id);
    assert.ok(sourcePid && forkPid && sourcePid !== forkPid, 'one QEMU each');
    // The writer was a process of the source: its file came along, it did not (disk, not memory).
    const carried = await count(fork);
    assert.ok(carried > 2, `the writer's lines up to the snapshot: ${carried}`);
    await new Promise((r) => setTimeout(r, 1000));
    assert.equal(await count(fork), carried, 'no writer runs in the fork');
    // The source ran on through it all, and the two diverge.
    const before = await count(source);
    await until('the source writes on', async () => (await count(source)) > before);
    assert.ok((await count(source)) > carried);
    await source.files.write('/root/who', 'source');
    await fork.files.write('/root/who', 'fork');
    assert.equal(await source.files.read('/root/who'), 'source');
    assert.equal(await fork.files.read('/root/who'), 'fork');

    // A fork of the fork: the chain image -> first snapshot -> second snapshot, booted as its top.
    await fork.files.write('/root/second.txt', 'second generation');
    const again = await fork.fork(1);
    const [grandchild] = again.sandboxes;
    assert.ok(grandchild);
    made.push(grandchild);
    assert.ok(again.snapshot);
    assert.deepEqual(again.snapshot.snapshot?.parents, [image.digest, snapshot.digest]);
    assert.deepEqual((await grandchild.info()).layers, [image.digest, snapshot.digest, again.snapshot.digest]);
    assert.equal(await grandchild.files.read('/root/before.txt'), 'written before the fork');
    assert.equal(await grandchild.files.read('/root/second.txt'), 'second generation');
    assert.equal(await grandchild.files.read('/root/who'), 'fork');
    await grandchild.kill();

    // A paused VM (vCPUs stopped, memory kept) is copied as it is and stays paused.
    await fork.pause();
    const paused = await fork.snapshot();
    assert.equal(paused.kind, 'snapshot');
    assert.equal((await fork.info()).state, 'paused');
    await fork.resume();
    assert.equal(await fork.files.read('/root/second.txt'), 'second generation');
  });
});
