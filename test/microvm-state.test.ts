// A microVM paused with its memory in a file (QEMU migrates to a unix socket the edge writes to a
// file, then exits) and resumed from it: one TCG boot carries every check. Then edge restarts:
// a second boot, on a bare node, adopted by each restarted edge (running, paused in memory,
// paused to a file), and lost when its adopted QEMU dies. Under DSEC_LONG=1 (npm run test:long)
// a full VM (`vm`) is adopted the same way (its boot takes about a minute under TCG).
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { open, rename, stat } from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { DsecClient, Sandbox } from '@dsec/sdk';
import type { Edge } from '@dsec/edge';
import type { RaisedEvent } from '@dsec/protocol';
import { startNode } from './helpers/node.js';
import type { TestNode } from './helpers/node.js';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';
import { apiCall, sh } from './helpers/assert.js';
import { qemuPids } from './helpers/qemu.js';

const LONG = process.env.DSEC_LONG === '1';
let tp: TestPlatform;
let client: DsecClient;
const made: Sandbox[] = [];

async function until(what: string, fn: () => Promise<boolean> | boolean, ms = 30_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await fn())) {
    if (Date.now() > end) assert.fail(`${what}: not within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Flips one byte of a file in place (same size: only the digest can tell). */
async function flipByte(file: string, at: number): Promise<void> {
  const fh = await open(file, 'r+');
  try {
    const b = Buffer.alloc(1);
    await fh.read(b, 0, 1, at);
    b[0] = (b[0] ?? 0) ^ 0xff;
    await fh.write(b, 0, 1, at);
  } finally {
    await fh.close();
  }
}

/** A VM sandbox set up for the adoption tests: a secret on a tmpfs and a counting shell in it. */
interface Adoptable {
  id: string;
  secret: string;
  /** The counting shell's pid. */
  pid: number;
  /** Its QEMU's pid. */
  qemu: number;
}

/** Creates a `backend` sandbox on `node` with the adoption tests' state in it (a tmpfs secret, a counting shell). */
async function adoptable(
  node: TestNode,
  backend: 'microvm' | 'vm',
  base: string,
  resources: { cpu: number; memoryMiB: number; diskMiB: number },
): Promise<Adoptable> {
  const sb = await node.edge.create({ backend, image: { base }, resources });
  const id = sb.id;
  const secret = randomBytes(8).toString('hex');
  await node.edge.exec(id, { cmd: `mkdir -p /mnt/ram && mount -t tmpfs ram /mnt/ram && echo ${secret} > /mnt/ram/secret` });
  const counter = await node.edge.spawn(id, { cmd: 'i=0; while :; do i=$((i+1)); echo $i; sleep 0.2; done' });
  await counter.detach();
  const [qemu] = await qemuPids(id);
  assert.ok(qemu, 'its QEMU runs');
  return { id, secret, pid: counter.pid, qemu };
}

/** The tmpfs secret still reads back through `edge`. */
async function secretKept(edge: Edge, vm: Adoptable): Promise<void> {
  assert.equal((await edge.exec(vm.id, { cmd: 'cat /mnt/ram/secret' })).stdout.trim(), vm.secret);
}

/** Restarts the edge over a running VM: listed running, the same QEMU reconnected, its tmpfs kept. */
async function adoptedRunning(node: TestNode, vm: Adoptable): Promise<Edge> {
  const edge = await node.restart();
  assert.deepEqual(
    (await edge.list()).map((s) => [s.id, s.state]),
    [[vm.id, 'running']],
  );
  assert.deepEqual(await qemuPids(vm.id), [vm.qemu], 'the same QEMU process, not a new boot');
  await secretKept(edge, vm);
  return edge;
}

/** Pauses the VM in memory and restarts the edge: still paused with the same QEMU; the resume goes on. */
async function adoptedPaused(node: TestNode, vm: Adoptable): Promise<Edge> {
  await node.edge.pause(vm.id);
  const edge = await node.restart();
  assert.equal(edge.info(vm.id).state, 'paused');
  assert.deepEqual(await qemuPids(vm.id), [vm.qemu]);
  await edge.resume(vm.id);
  await secretKept(edge, vm);
  return edge;
}

before(async () => {
  tp = await startTestPlatform({ microvm: {} });
  client = new DsecClient({ apiUrl: tp.url, apiKey: tp.adminKey, requestTimeoutMs: 180_000 });
});
after(async () => {
  for (const sb of made) await sb.kill().catch(() => undefined);
  await client?.close();
  await tp?.close();
});

describe('microvm memory to a file', () => {
  test('a container cannot pause to a file: 400 naming memory', async () => {
    const sb = await Sandbox.create({ image: { base: 'busybox' } }, { client });
    made.push(sb);
    const r = await apiCall(tp.url, tp.adminKey, 'POST', `/v1/sandboxes/${sb.id}/pause`, { memory: 'file' });
    assert.equal(r.status, 400, JSON.stringify(r.body));
    assert.match(JSON.stringify(r.body), /"memory"/);
    const bad = await apiCall(tp.url, tp.adminKey, 'POST', `/v1/sandboxes/${sb.id}/pause`, { memory: 'disk' });
    assert.equal(bad.status, 400, JSON.stringify(bad.body));
    assert.equal((await sb.info()).state, 'running');
    await sb.kill();
    made.pop();
  });

  test('pause to a file frees QEMU; resume restores processes and RAM; a damaged or missing file keeps it paused', async () => {
    const sb = await Sandbox.create({ backend: 'microvm', image: { base: 'busybox' }, resources: { cpu: 1, memoryMiB: 160, diskMiB: 32 } }, { client });
    made.push(sb);
    const secret = randomBytes(8).toString('hex');
    // A file in guest RAM only (tmpfs) and a process whose counter lives in its shell's memory.
    await sh(sb, `mkdir -p /mnt/ram && mount -t tmpfs ram /mnt/ram && echo ${secret} > /mnt/ram/secret`);
    const counter = await sb.spawn('i=0; while :; do i=$((i+1)); echo $i; sleep 0.2; done');
    // A reader stays attached through the pause to a file (its stream goes quiet, then on).
    let live = '';
    const reading = (async () => {
      for await (const ev of counter) live += Buffer.from(ev.data).toString();
    })().catch(() => undefined);
    // More streams than the guest has extra agent ports (3), each with its reader: every one reads
    // on after the resume too (a command's stream goes back to the main connection).
    const others = await Promise.all([1, 2, 3, 4].map((n) => sb.spawn(`while :; do echo o${n}; sleep 0.3; done`)));
    const heardOthers = others.map(() => '');
    const readingOthers = others.map((h, n) =>
      (async () => {
        for await (const ev of h) heardOthers[n] = (heardOthers[n] ?? '') + Buffer.from(ev.data).toString();
      })().catch(() => undefined),
    );
    const stdoutOf = async (): Promise<number> => (await sb.processes()).find((p) => p.pid === counter.pid)?.stdoutBytes ?? 0;
    await until('the counter runs', async () => (await stdoutOf()) >= 4);
    const [qemu] = await qemuPids(sb.id);
    assert.ok(qemu, 'its QEMU runs');

    const paused = await sb.pause({ memory: 'file' });
    assert.equal(paused.sandbox.state, 'paused');
    await new Promise((r) => setTimeout(r, 1500));
    assert.equal((await sb.info()).state, 'paused', 'the attached reader did not resume it');
    assert.ok(paused.memoryAfterBytes < paused.memoryBeforeBytes / 4, `memory ${paused.memoryBeforeBytes} -> ${paused.memoryAfterBytes}`);
    assert.deepEqual(await qemuPids(sb.id), [], 'no QEMU runs while paused to a file');
    const stateFile = path.join(tp.platform.edge.home, 'microvm', sb.id, 'memory.state');
    const size = (await stat(stateFile)).size;
    assert.ok(size > 1024 * 1024 && size < 240 * 1024 * 1024, `state file ${size} bytes`);

    // A damaged file: a clear error, the sandbox stays paused, the file stays.
    await flipByte(stateFile, Math.floor(size / 2));
    const damaged = await apiCall(tp.url, tp.adminKey, 'POST', `/v1/sandboxes/${sb.id}/resume`, {});
    assert.ok(damaged.status >= 500, JSON.stringify(damaged.body));
    assert.match(JSON.stringify(damaged.body), /damaged/);
    assert.equal((await sb.info()).state, 'paused');
    assert.deepEqual(await qemuPids(sb.id), [], 'the failed restore left no QEMU');
    await flipByte(stateFile, Math.floor(size / 2));

    // A missing file: the same.
    await rename(stateFile, `${stateFile}.away`);
    const missing = await apiCall(tp.url, tp.adminKey, 'POST', `/v1/sandboxes/${sb.id}/resume`, {});
    assert.ok(missing.status >= 500, JSON.stringify(missing.body));
    assert.match(JSON.stringify(missing.body), /missing/);
    assert.equal((await sb.info()).state, 'paused');
    await rename(`${stateFile}.away`, stateFile);

    // Resumed from the intact file: the same processes, the same RAM.
    const before = await stdoutOf();
    await sb.resume();
    assert.equal((await sh(sb, 'cat /mnt/ram/secret')).trim(), secret, 'tmpfs contents survived');
    await until('the counter goes on', async () => (await stdoutOf()) > before + 8);
    const again = await sb.attach(counter.pid, { fromStdout: 0 });
    let seen = '';
    for await (const ev of again) {
      seen += ev.data.toString();
      if (seen.split('\n').length > 14) break;
    }
    again.disconnect();
    const liveBefore = live.length;
    await until('the attached reader reads on', () => live.length > liveBefore + 8);
    const othersBefore = heardOthers.map((t) => t.length);
    await until('every other stream reads on', () => heardOthers.every((t, n) => t.length > (othersBefore[n] ?? 0) + 6));
    for (const h of others) await h.kill();
    await Promise.all(readingOthers);
    const heard = live.slice(0, live.lastIndexOf('\n')).split('\n').map(Number);
    assert.deepEqual(
      heard,
      heard.map((_, i) => i + 1),
      'the reader attached before the pause heard every line once, in order',
    );
    counter.disconnect();
    await reading;
    const numbers = seen.trim().split('\n').map(Number);
    assert.deepEqual(
      numbers,
      numbers.map((_, i) => i + 1),
      'the counter counted on from where it was (the same shell, its memory intact)',
    );
    await assert.rejects(stat(stateFile), 'the state file is removed once resumed');

    // A second round (the resumed VM can pause to a file again), then destroy leaves nothing.
    await sb.pause({ memory: 'file' });
    await sb.resume();
    assert.equal((await sh(sb, 'cat /mnt/ram/secret')).trim(), secret);
    await sb.kill();
    made.pop();
    await until('nothing left', async () => (await qemuPids(sb.id)).length === 0 && (await tp.platform.edge.cgroups.existing(sb.id)).length === 0);
    await assert.rejects(stat(path.join(tp.platform.edge.home, 'microvm', sb.id)));
  });
});

describe('microvm adopted by a restarted edge', () => {
  let node: TestNode | undefined;
  after(async () => {
    await node?.cleanup();
  });

  /** The stdout of `edge`'s command `pid` from offset `from` until it holds `lines` lines. */
  async function readLines(edge: Edge, id: string, pid: number, from: number, lines: number): Promise<string> {
    const att = await edge.attach(id, pid, { stdout: from });
    let seen = '';
    for await (const ev of att) {
      if (ev.kind === 'data') seen += ev.data.toString();
      if (seen.split('\n').length > lines) break;
    }
    await att.detach();
    return seen;
  }

  test('a running, a paused and a paused-to-file microVM survive edge restarts; an adopted QEMU that dies is lost', async () => {
    node = await startNode({ edge: { microvm: {} } });
    await node.edge.layers.build({ type: 'busybox' }, { kind: 'base', name: 'busybox' });
    const vm = await adoptable(node, 'microvm', 'busybox', { cpu: 1, memoryMiB: 160, diskMiB: 32 });
    const { id, pid } = vm;

    // Running: the same QEMU, reconnected; the command runs on and is read from an offset.
    let edge = await adoptedRunning(node, vm);
    const first = await readLines(edge, id, pid, 0, 6);
    assert.deepEqual(first.trim().split('\n').slice(0, 6).map(Number), [1, 2, 3, 4, 5, 6]);

    // Paused in memory: still paused after the restart, with the same QEMU; resume goes on.
    edge = await adoptedPaused(node, vm);

    // Paused to a file: no QEMU across the restart; the resume restores it from the file.
    await edge.pause(id, { memory: 'file' });
    assert.deepEqual(await qemuPids(id), []);
    edge = await node.restart();
    assert.equal(edge.info(id).state, 'paused');
    assert.deepEqual(await qemuPids(id), [], 'the restarted edge started no QEMU for it');
    await edge.resume(id);
    await secretKept(edge, vm);
    const numbers = (await readLines(edge, id, pid, 0, 12)).trim().split('\n').slice(0, 12).map(Number);
    assert.deepEqual(
      numbers,
      numbers.map((_, i) => i + 1),
      'the same shell counted on through every restart',
    );

    // An adopted QEMU (watched through its QMP connection) that dies: lost, nothing left.
    edge = await node.restart();
    const [adopted] = await qemuPids(id);
    assert.ok(adopted, 'its QEMU runs');
    const events: RaisedEvent[] = [];
    edge.onEvent((ev) => events.push(ev));
    process.kill(adopted, 'SIGKILL');
    await until('lost', () => events.some((ev) => ev.kind === 'sandbox.lost' && ev.sandboxId === id));
    await until(
      'nothing left',
      async () => (await edge.cgroups.existing(id)).length === 0 && !(await stat(path.join(node!.home, 'microvm', id)).catch(() => false)),
    );
  });
});

describe('vm adopted by a restarted edge', { skip: LONG ? false : 'DSEC_LONG=1 (npm run test:long): a full VM boot, about a minute under TCG' }, () => {
  let node: TestNode | undefined;
  after(async () => {
    await node?.cleanup();
  });

  test('a running and a paused vm survive edge restarts with the same QEMU; destroy leaves nothing', async () => {
    node = await startNode({ edge: { vm: {} } });
    // The image is cached machine-wide by its inputs (minutes from an empty cache).
    await node.edge.layers.build({ type: 'vm' }, { kind: 'base', name: 'vm-adopt' });
    const vm = await adoptable(node, 'vm', 'vm-adopt', { cpu: 1, memoryMiB: 512, diskMiB: 2048 });
    const { id, pid } = vm;

    // Running: the same QEMU, reconnected; its tmpfs and its command are there.
    let edge = await adoptedRunning(node, vm);
    assert.ok(
      (await edge.processes(id)).some((p) => p.pid === pid && p.state === 'running'),
      'the command runs on',
    );

    // Paused in memory: still paused after the restart, the same QEMU; the resume goes on.
    edge = await adoptedPaused(node, vm);

    await edge.destroy(id);
    assert.deepEqual(await qemuPids(id), []);
    assert.deepEqual(await edge.cgroups.existing(id), []);
  });
});
