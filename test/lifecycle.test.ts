// Sandbox lifecycle end to end: pause and resume on a real edge (processes, open files and the
// file system kept exactly; memory reclaimed), leases and owner sessions through the API, and a
// trainer process killed mid-command whose sandbox is paused after its grace and taken over by a
// new client that reads the output it missed from its last offset.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { randomBytes } from 'node:crypto';
import { readFile, stat } from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { ZramSwap } from '@dsec/edge';
import { isDsecError } from '@dsec/protocol';
import type { RaisedEvent } from '@dsec/protocol';
import { DsecClient, Sandbox } from '@dsec/sdk';
import type { SandboxInfo } from '@dsec/sdk';
import { REPO_ROOT, startNode } from './helpers/node.js';
import type { TestNode } from './helpers/node.js';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';
import { isCode } from './helpers/assert.js';

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Polls `check` until it returns a value (not undefined) or `timeoutMs` passes. */
async function until<T>(what: string, check: () => Promise<T | undefined>, timeoutMs = 20_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await check();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

/** Numbers printed one per line, checked to run on from 1 without a gap or a repeat. */
function consecutive(text: string, prefix = ''): number {
  const lines = text.split('\n').filter(Boolean);
  lines.forEach((l, i) => assert.equal(l, `${prefix}${i + 1}`, `line ${i + 1} of the output`));
  return lines.length;
}

describe('edge: pause and resume', () => {
  let node: TestNode;

  before(async () => {
    node = await startNode();
    await node.edge.layers.build({ type: 'busybox' }, { kind: 'base', name: 'busybox' });
  });

  after(async () => {
    await node?.cleanup();
  });

  test('a paused sandbox is frozen; on resume the same processes go on with the same open files', async () => {
    const sb = await node.edge.create({ image: { base: 'busybox' }, resources: { memoryMiB: 64 } });
    try {
      if (node.edge.cgroups.mode !== 'v2') {
        const swappiness = await readFile(`/sys/fs/cgroup/memory/${node.cgroupParent}/${sb.id}/memory.swappiness`, 'utf8');
        assert.equal(swappiness.trim(), '0', 'a running sandbox never swaps on its own limit');
      }
      await node.edge.writeFile(sb.id, '/tmp/before', 'written before the pause\n');
      // A counter that keeps fd 3 open on a file and writes to it before and after the pause.
      const counter = await node.edge.spawn(sb.id, { cmd: 'exec 3>>/tmp/ticks; i=0; while true; do i=$((i+1)); echo $i; echo "tick$i" >&3; sleep 0.02; done' });
      let out = '';
      counter.onOutput((ev) => {
        if (ev.kind === 'data') out += ev.data.toString();
      });
      await until('the counter to count', async () => (out.split('\n').length > 10 ? true : undefined));
      const [before] = (await node.edge.processes(sb.id)).filter((p) => p.pid === counter.pid);
      assert.ok(before && before.state === 'running');

      const paused = await node.edge.pause(sb.id);
      assert.equal(node.edge.info(sb.id).state, 'paused');
      assert.equal(await node.edge.cgroups.frozen(sb.id), true);
      assert.ok(paused.memoryAfterBytes <= paused.memoryBeforeBytes, 'a pause never grows memory');
      const ticksFile = path.join(node.edge.upperDir(sb.id), 'tmp/ticks');
      const frozenOut = out.length;
      const frozenTicks = (await stat(ticksFile)).size;
      await sleep(400);
      assert.equal(out.length, frozenOut, 'no output while paused');
      assert.equal((await stat(ticksFile)).size, frozenTicks, 'no writes while paused');
      // The agent is frozen too: calls fail at once instead of hanging; host-side stats answer.
      await assert.rejects(node.edge.readFile(sb.id, '/tmp/before'), isCode('SANDBOX_NOT_RUNNING'));
      await assert.rejects(node.edge.exec(sb.id, { argv: ['true'] }), isCode('SANDBOX_NOT_RUNNING'));
      assert.ok((await node.edge.stats(sb.id)).pids >= 2);
      assert.equal((await node.edge.pause(sb.id)).durationMs, 0, 'pausing a paused sandbox is a no-op');

      await node.edge.resume(sb.id);
      assert.equal(node.edge.info(sb.id).state, 'running');
      await until('the counter to go on', async () => (out.length > frozenOut + 20 ? true : undefined));
      const [afterResume] = (await node.edge.processes(sb.id)).filter((p) => p.pid === counter.pid);
      assert.equal(afterResume?.pid, before.pid, 'the same process');
      assert.equal(afterResume?.state, 'running');
      await counter.kill('SIGKILL');
      await counter.exited;
      // Counted on from where it stopped, through the same open file descriptor.
      const n = consecutive(out);
      const ticks = consecutive((await node.edge.readFile(sb.id, '/tmp/ticks')).toString(), 'tick');
      assert.ok(ticks >= n - 1 && ticks <= n + 1, `ticks ${ticks} and counts ${n} agree`);
      assert.equal((await node.edge.readFile(sb.id, '/tmp/before')).toString(), 'written before the pause\n');
      if (node.edge.cgroups.mode !== 'v2') {
        const swappiness = await readFile(`/sys/fs/cgroup/memory/${node.cgroupParent}/${sb.id}/memory.swappiness`, 'utf8');
        assert.equal(swappiness.trim(), '0', 'resume puts the memory settings back');
      }
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('a pause waits for agent calls under way; calls during a pause wait for it', async () => {
    const sb = await node.edge.create({ image: { base: 'busybox' } });
    try {
      const data = Buffer.alloc(4 * 1024 * 1024, 7);
      const write = node.edge.writeFile(sb.id, '/tmp/big', data);
      const pause = node.edge.pause(sb.id);
      const statDuring = node.edge.stat(sb.id, '/tmp/big');
      await write;
      await pause;
      await assert.rejects(statDuring, isCode('SANDBOX_NOT_RUNNING'), 'a call that waited for the pause finds the sandbox paused');
      const resume = node.edge.resume(sb.id);
      const statAfter = node.edge.stat(sb.id, '/tmp/big');
      await resume;
      assert.equal((await statAfter).size, data.length, 'the write finished before the freeze; the stat waited for the resume');
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('snapshots and pauses of one sandbox run one after another; a snapshot leaves a paused sandbox paused', async () => {
    const sb = await node.edge.create({ image: { base: 'busybox' } });
    try {
      await node.edge.writeFile(sb.id, '/state', 'one');
      // A pause asked for while a snapshot has the sandbox frozen waits for it: the snapshot's
      // thaw must not undo the pause.
      const snap = node.edge.snapshot(sb.id);
      const pause = node.edge.pause(sb.id);
      const [layer] = await Promise.all([snap, pause]);
      assert.equal(layer.kind, 'snapshot');
      assert.equal(node.edge.info(sb.id).state, 'paused');
      assert.equal(await node.edge.cgroups.frozen(sb.id), true, 'frozen after both');
      // A snapshot of the paused sandbox reads it as it is and leaves it frozen; a resume asked
      // for meanwhile waits for it.
      const again = node.edge.snapshot(sb.id);
      const resume = node.edge.resume(sb.id);
      await again;
      await resume;
      assert.equal(node.edge.info(sb.id).state, 'running');
      assert.equal((await node.edge.readFile(sb.id, '/state')).toString(), 'one');
      const paused = node.edge.pause(sb.id);
      await paused;
      await node.edge.snapshot(sb.id);
      assert.equal(node.edge.info(sb.id).state, 'paused');
      assert.equal(await node.edge.cgroups.frozen(sb.id), true, 'a snapshot of a paused sandbox leaves it frozen');
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('a paused sandbox stays paused across an edge restart and can be destroyed', async () => {
    const sb = await node.edge.create({ image: { base: 'busybox' } });
    const counter = await node.edge.spawn(sb.id, { cmd: 'i=0; while true; do i=$((i+1)); echo $i; sleep 0.05; done' });
    await sleep(300);
    await counter.detach();
    await node.edge.pause(sb.id);
    const edge = await node.restart();
    assert.equal(edge.info(sb.id).state, 'paused');
    await edge.resume(sb.id);
    const [proc] = (await edge.processes(sb.id)).filter((p) => p.pid === counter.pid);
    assert.equal(proc?.state, 'running', 'the command survived the pause and the restart');
    await edge.pause(sb.id);
    await edge.destroy(sb.id);
    assert.deepEqual(await edge.cgroups.existing(sb.id), [], 'no cgroup left behind');
  });

  test('with zram swap, a pause swaps the sandbox out and a resume gives it back intact', async (t) => {
    let swap: ZramSwap;
    try {
      swap = await ZramSwap.enable({ sizeMiB: 256 });
    } catch (err) {
      t.skip(`no zram here: ${(err as Error).message}`);
      return;
    }
    const sb = await node.edge.create({ image: { base: 'busybox' }, resources: { memoryMiB: 128 } });
    try {
      // 32 MiB of anonymous memory in a shell variable, plus 16 MiB in a tmpfs file.
      const holder = await node.edge.spawn(sb.id, {
        cmd: 'x=$(head -c 12000000 /dev/urandom | od -An -tx1 | head -c 33554432); echo ready; read line; printf %s "$x" | md5sum',
        keepStdinOpen: true,
        stdin: '',
      });
      let out = '';
      holder.onOutput((ev) => {
        if (ev.kind === 'data') out += ev.data.toString();
      });
      await node.edge.exec(sb.id, { cmd: 'head -c 16777216 /dev/urandom > /tmp/file; md5sum /tmp/file > /tmp/file.md5' });
      await until('the memory to be filled', async () => (out.includes('ready') ? true : undefined), 60_000);
      const r = await node.edge.pause(sb.id);
      assert.ok(r.memoryBeforeBytes > 48 * 1048576, `before: ${r.memoryBeforeBytes}`);
      assert.ok(r.memoryAfterBytes < r.memoryBeforeBytes - 40 * 1048576, `reclaimed: ${r.memoryBeforeBytes} -> ${r.memoryAfterBytes}`);
      assert.ok(r.swapBytes > 40 * 1048576, `in swap: ${r.swapBytes}`);
      await node.edge.resume(sb.id);
      await holder.write('go\n');
      const exit = await holder.exited;
      assert.equal(exit.exitCode, 0);
      assert.match(out, /ready\n[0-9a-f]{32} {2}-\n/);
      const check = await node.edge.exec(sb.id, { cmd: 'md5sum -c /tmp/file.md5' });
      assert.equal(check.exitCode, 0, check.stdout + check.stderr);
    } finally {
      await node.edge.destroy(sb.id);
      await swap.disable();
    }
    assert.ok(!(await ZramSwap.active()).includes(swap.device), 'the swap is off again');
  });
});

describe('platform: leases, owners, reattach', () => {
  let tp: TestPlatform | undefined;
  let client: DsecClient;
  const RUN = `life-${randomBytes(4).toString('hex')}`;
  const events: RaisedEvent[] = [];
  const image = { base: 'busybox' };
  const labels = { run: RUN };

  before(async () => {
    // The node's events (sandbox.paused/resumed) and the control plane's (owner.lost, idle and
    // owner lease.exceeded), which go to the watcher's pipeline.
    tp = await startTestPlatform({ watchIntervalMs: 200, observeEvents: (ev) => events.push(ev) });
    tp.platform.edge.onEvent((ev) => events.push(ev));
    client = new DsecClient({ apiUrl: tp.url, apiKey: tp.adminKey });
  });

  after(async () => {
    try {
      if (client) for await (const s of Sandbox.list({ labels }, { client })) await Sandbox.kill(s.id, { client }).catch(() => undefined);
    } finally {
      await tp?.close();
    }
  });

  const api = async (
    method: string,
    route: string,
    body?: unknown,
  ): Promise<{ status: number; json: { error?: { code: string; field?: string } } & Record<string, unknown> }> => {
    const res = await fetch(`${tp!.url}${route}`, {
      method,
      headers: { authorization: `Bearer ${tp!.adminKey}`, 'content-type': 'application/json' },
      ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
    });
    const text = await res.text();
    return { status: res.status, json: text ? JSON.parse(text) : {} };
  };

  test('bad input: unknown sandboxes and owners are 404; a negative timeout is a 400 naming the field', async () => {
    for (const [method, route] of [
      ['POST', '/v1/sandboxes/nope-0000000000000000/pause'],
      ['POST', '/v1/sandboxes/nope-0000000000000000/resume'],
      ['PATCH', '/v1/sandboxes/nope-0000000000000000'],
      ['GET', '/v1/owners/own_00000000'],
      ['POST', '/v1/owners/own_00000000/heartbeat'],
      ['DELETE', '/v1/owners/own_00000000'],
    ] as const) {
      const r = await api(method, route, method === 'PATCH' ? { lease: { idleTimeoutMs: 1000 } } : undefined);
      assert.equal(r.status, 404, `${method} ${route}: ${JSON.stringify(r.json)}`);
    }
    const bad: Array<[unknown, string]> = [
      [{ image, lease: { idleTimeoutMs: -1 } }, 'lease.idleTimeoutMs'],
      [{ image, lease: { maxLifetimeMs: -5 } }, 'lease.maxLifetimeMs'],
      [{ image, lease: { ownerGraceMs: -1 } }, 'lease.ownerGraceMs'],
      [{ image, timeoutMs: -1 }, 'timeoutMs'],
      [{ image, lease: { onIdle: 'explode' } }, 'lease.onIdle'],
      [{ image, timeoutMs: 60_000, lease: { maxLifetimeMs: 60_000 } }, 'lease.maxLifetimeMs'],
      [{ image, owner: 'someone' }, 'owner'],
    ];
    for (const [body, field] of bad) {
      const r = await api('POST', '/v1/sandboxes', body);
      assert.equal(r.status, 400, JSON.stringify(r.json));
      assert.equal(r.json.error?.field, field);
    }
    const unknownOwner = await api('POST', '/v1/sandboxes', { image, owner: 'own_0123456789abcdef' });
    assert.equal(unknownOwner.status, 404);
    assert.equal(unknownOwner.json.error?.field, 'owner');
    const owner = await api('POST', '/v1/owners', { graceMs: -1 });
    assert.equal(owner.status, 400);
    assert.equal(owner.json.error?.field, 'graceMs');
    // The SDK refuses before sending, naming the same field; nothing was created by any of it.
    await assert.rejects(Sandbox.create({ image, lease: { idleTimeoutMs: -1 } }, { client }), isCode('INVALID_ARGUMENT', 'lease.idleTimeoutMs'));
    const sb = await Sandbox.create({ image, labels }, { client });
    try {
      const patch = await api('PATCH', `/v1/sandboxes/${sb.id}`, { lease: { idleTimeoutMs: -100 } });
      assert.equal(patch.status, 400);
      assert.equal(patch.json.error?.field, 'lease.idleTimeoutMs');
    } finally {
      await sb.kill();
    }
    assert.equal((await Sandbox.list({ labels }, { client }).toArray()).length, 0);
  });

  test('pause and resume through the API; requests resume transparently unless the lease says not to', async () => {
    const nodesBefore = await client.nodes.list();
    const sb = await Sandbox.create({ image, labels, resources: { cpu: 1, memoryMiB: 64 } }, { client });
    try {
      const allocated = async (): Promise<{ cpu: number; memoryMiB: number; sandboxes: number }> => (await client.nodes.list())[0]!.allocated!; // a root key: the allocation is shown
      assert.deepEqual(await allocated(), {
        cpu: nodesBefore[0]!.allocated!.cpu + 1,
        memoryMiB: nodesBefore[0]!.allocated!.memoryMiB + 64,
        sandboxes: nodesBefore[0]!.allocated!.sandboxes + 1,
      });
      await sb.files.write('/tmp/state', 'kept');
      const paused = await sb.pause();
      assert.equal(paused.sandbox.state, 'paused');
      assert.equal(paused.sandbox.pauseReason, 'api');
      assert.ok(paused.sandbox.pausedAt);
      // A paused sandbox gives its CPU back to the node, but keeps its memory and its place.
      assert.deepEqual(await allocated(), {
        cpu: nodesBefore[0]!.allocated!.cpu,
        memoryMiB: nodesBefore[0]!.allocated!.memoryMiB + 64,
        sandboxes: nodesBefore[0]!.allocated!.sandboxes + 1,
      });
      assert.equal((await Sandbox.list({ labels, state: 'paused' }, { client }).toArray()).length, 1);
      assert.ok((await sb.stats()).memoryLimitBytes > 0, 'stats of a paused sandbox do not resume it');
      assert.equal((await sb.info()).state, 'paused');
      // autoResume (the default): the exec resumes the sandbox first.
      const r = await sb.exec('cat /tmp/state');
      assert.equal(r.stdout, 'kept');
      const info = await sb.info();
      assert.equal(info.state, 'running');
      assert.equal(info.pausedAt, null);
      assert.equal((await allocated()).cpu, nodesBefore[0]!.allocated!.cpu + 1);
      // autoResume false: a request is a clear 409 and the sandbox stays paused.
      assert.equal((await sb.setLease({ autoResume: false })).lease.autoResume, false);
      await sb.pause();
      await assert.rejects(sb.exec('true'), isCode('SANDBOX_NOT_RUNNING'));
      await assert.rejects(sb.files.read('/tmp/state'), isCode('SANDBOX_NOT_RUNNING'));
      assert.equal((await sb.info()).state, 'paused');
      const resumed = await sb.resume();
      assert.equal(resumed.sandbox.state, 'running');
      assert.equal((await sb.exec('cat /tmp/state')).stdout, 'kept');
      assert.ok(events.some((e) => e.kind === 'sandbox.paused' && e.sandboxId === sb.id));
      assert.ok(events.some((e) => e.kind === 'sandbox.resumed' && e.sandboxId === sb.id));
    } finally {
      await sb.kill();
    }
    assert.deepEqual((await client.nodes.list())[0]!.allocated, nodesBefore[0]!.allocated, 'destroying a paused sandbox returns exactly what it held');
  });

  test('the lease can be read and changed; maxLifetimeMs moves the expiry', async () => {
    const sb = await Sandbox.create({ image, labels, timeoutMs: 120_000 }, { client });
    try {
      const info = sb.lastInfo as SandboxInfo;
      assert.deepEqual(info.lease, {
        idleTimeoutMs: 600_000,
        maxLifetimeMs: 120_000,
        onIdle: 'pause',
        ownerGraceMs: null,
        onOwnerLost: 'pause',
        autoResume: true,
      });
      assert.equal(Date.parse(info.expiresAt) - Date.parse(info.createdAt), 120_000);
      const changed = await sb.setLease({ idleTimeoutMs: 0, maxLifetimeMs: 300_000, onOwnerLost: 'kill' });
      assert.deepEqual(changed.lease, { idleTimeoutMs: 0, maxLifetimeMs: 300_000, onIdle: 'pause', ownerGraceMs: null, onOwnerLost: 'kill', autoResume: true });
      assert.equal(Date.parse(changed.expiresAt) - Date.parse(changed.createdAt), 300_000);
    } finally {
      await sb.kill();
    }
  });

  test('idle sandboxes are paused (or killed) by their lease; a command being waited for is activity', async () => {
    const idle = await Sandbox.create({ image, labels, lease: { idleTimeoutMs: 1000 } }, { client });
    const doomed = await Sandbox.create({ image, labels, lease: { idleTimeoutMs: 1000, onIdle: 'kill' } }, { client });
    const busy = await Sandbox.create({ image, labels, lease: { idleTimeoutMs: 1000 } }, { client });
    try {
      // A 3 s command with no other request: frozen by an idle pause, it could never finish.
      const long = await busy.exec('sleep 3; echo done', { timeoutMs: 20_000 });
      assert.equal(long.stdout, 'done\n');
      assert.ok(!events.some((e) => e.kind === 'sandbox.paused' && e.sandboxId === busy.id), 'not paused while its command was waited for');
      const paused = await until('the idle sandbox to be paused', async () => {
        const s = await idle.info();
        return s.state === 'paused' ? s : undefined;
      });
      assert.equal(paused.pauseReason, 'idle');
      await until('the idle kill', async () =>
        (await doomed.info().catch((e: unknown) => (isDsecError(e, 'SANDBOX_NOT_FOUND') ? 'gone' : undefined))) === 'gone' ? true : undefined,
      );
      assert.ok(events.some((e) => e.kind === 'lease.exceeded' && e.sandboxId === idle.id && e.data?.lease === 'idleTimeoutMs' && e.data.action === 'pause'));
      assert.ok(events.some((e) => e.kind === 'lease.exceeded' && e.sandboxId === doomed.id && e.data?.action === 'kill'));
      // One pipeline: the control plane's lease.exceeded is stored and served by GET /v1/events.
      await until('the idle lease.exceeded in the event store', async () => {
        const r = await api('GET', `/v1/events?sandbox=${idle.id}&kind=lease.exceeded`);
        return ((r.json.items as unknown[] | undefined)?.length ?? 0) > 0 ? true : undefined;
      });
      // It comes back on the next request.
      assert.equal((await idle.exec('echo back')).stdout, 'back\n');
    } finally {
      for (const s of [idle, busy]) await s.kill().catch(() => undefined);
      await doomed.kill().catch(() => undefined);
    }
  });

  test('an owner that heartbeats keeps its sandboxes; closing it pauses them; a new owner takes them over', async () => {
    const owned = new DsecClient({ apiUrl: tp!.url, apiKey: tp!.adminKey, owner: { graceMs: 1000 } });
    const sb = await Sandbox.create({ image, labels }, { client: owned });
    try {
      const ownerId = sb.lastInfo?.owner;
      assert.match(ownerId ?? '', /^own_/);
      await sleep(2500);
      assert.equal((await sb.info()).state, 'running', 'heartbeats kept it past the grace period');
      const o = await client.owners.get(ownerId!);
      assert.equal(o.state, 'active');
      assert.equal(o.sandboxes, 1);
      assert.ok(o.heartbeatIntervalMs <= 1000 / 3 + 1);
      await owned.close();
      assert.equal((await client.owners.get(ownerId!)).state, 'closed');
      const paused = await until('the owner-closed pause', async () => {
        const s = await Sandbox.connect(sb.id, { client });
        return s.lastInfo?.state === 'paused' ? s.lastInfo : undefined;
      });
      assert.equal(paused.pauseReason, 'owner-closed');
      const next = new DsecClient({ apiUrl: tp!.url, apiKey: tp!.adminKey, owner: true });
      try {
        const [found] = await Sandbox.find({ labels: { ...labels, role: 'none' } }, { client: next });
        assert.equal(found, undefined);
        const again = await Sandbox.connect(sb.id, { client: next });
        assert.equal(again.lastInfo?.state, 'running', 'the new owner taking over resumed it');
        assert.notEqual(again.lastInfo?.owner, ownerId);
        assert.equal(again.lastInfo?.owner, await next.ownerSession!.id());
        await assert.rejects(client.owners.heartbeat(ownerId!), isCode('CONFLICT'));
      } finally {
        await next.close();
      }
    } finally {
      await sb.kill();
      await owned.close();
    }
  });

  test('a client killed mid-command: its sandbox is paused after the grace, a new client reattaches, reads the missed output and goes on', async () => {
    const child = spawn(process.execPath, [path.join(REPO_ROOT, 'test/dist/helpers/lifecycle-child.js'), tp!.url, tp!.adminKey, '1500', RUN], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    let id = '';
    let pid = -1;
    let seen = '';
    let offset = 0;
    try {
      for await (const line of createInterface({ input: child.stdout })) {
        const msg = JSON.parse(line) as { type: string; id?: string; pid?: number; offset?: number; text?: string; end?: number };
        if (msg.type === 'sandbox') id = msg.id!;
        if (msg.type === 'process') pid = msg.pid!;
        if (msg.type === 'output') {
          assert.equal(msg.offset, offset, 'the child saw the output contiguously');
          seen += msg.text ?? '';
          offset = msg.end!;
          if (seen.split('\n').length > 40) break;
        }
      }
      assert.ok(id && pid >= 0, `the child reported its sandbox and process: ${stderr}`);
      // The trainer dies without a word: no close, no more heartbeats.
      child.kill('SIGKILL');
      await exited;

      const paused = await until('the sandbox to be paused after the owner grace', async () => {
        const s = await Sandbox.connect(id, { client });
        return s.lastInfo?.state === 'paused' ? s.lastInfo : undefined;
      });
      assert.equal(paused.pauseReason, 'owner-lost');
      assert.ok(events.some((e) => e.kind === 'owner.lost' && e.data?.owner === paused.owner));
      assert.equal(await tp!.platform.edge.cgroups.frozen(id), true, 'its processes are frozen');

      // A new trainer: its own owner session; it finds the sandbox by its label and takes it over.
      const next = new DsecClient({ apiUrl: tp!.url, apiKey: tp!.adminKey, owner: { graceMs: 5000 } });
      try {
        const [sandbox] = await Sandbox.find({ labels }, { client: next });
        assert.ok(sandbox && sandbox.id === id);
        assert.equal(sandbox.lastInfo?.state, 'running', 'taking it over resumed it');
        const procs = await sandbox.processes();
        const proc = procs.find((p) => p.pid === pid);
        assert.ok(proc && proc.state === 'running', 'the command is still running');
        assert.ok(proc.stdoutBytes > offset, 'it printed more than the dead client saw');
        // Read on from the dead client's offset: exactly the bytes it missed, then more.
        const handle = await sandbox.attach(pid, { fromStdout: offset });
        let rest = '';
        for await (const ev of handle) {
          rest += ev.data.toString();
          if (rest.split('\n').length > 40) break;
        }
        handle.disconnect();
        const all = seen + rest;
        const lines = all.split('\n').slice(0, -1);
        lines.forEach((l, i) => assert.equal(l, `line-${i}`, 'nothing lost, nothing repeated'));
        // And it works on.
        assert.equal((await sandbox.exec('echo still-here')).stdout, 'still-here\n');
        await sandbox.exec(`kill ${procs.find((p) => p.pid === pid)!.osPid}`);
      } finally {
        await next.close();
      }
    } finally {
      if (child.exitCode === null) child.kill('SIGKILL');
      if (id) await Sandbox.kill(id, { client }).catch(() => undefined);
    }
  });

  test('batches, pools, snapshots, diff and networks with leases, owners and pauses', async () => {
    const owner = (await api('POST', '/v1/owners', { graceMs: 60_000 })).json as unknown as { id: string };
    // Batch items get their lease and owner like single creates; a bad one fails alone, named.
    const batch = await api('POST', '/v1/sandboxes:batch', {
      items: [
        { image, labels, owner: owner.id, lease: { idleTimeoutMs: 0, onOwnerLost: 'kill' } },
        { image, labels, lease: { idleTimeoutMs: -1 } },
        { image, labels, timeoutMs: 60_000, lease: { maxLifetimeMs: 60_000 } },
      ],
    });
    assert.equal(batch.status, 200, JSON.stringify(batch.json));
    const items = batch.json.items as Array<{ index: number; sandbox?: SandboxInfo; error?: { code: string; field?: string } }>;
    const made = items[0]?.sandbox;
    assert.ok(made, JSON.stringify(items[0]));
    assert.equal(made.owner, owner.id);
    assert.equal(made.lease.idleTimeoutMs, 0);
    assert.equal(made.lease.onOwnerLost, 'kill');
    assert.equal(items[1]?.error?.field, 'items.1.lease.idleTimeoutMs');
    assert.equal(items[2]?.error?.field, 'items.2.lease.maxLifetimeMs');
    const sb = await Sandbox.connect(made.id, { client, claim: false });
    const pool = `life-${RUN.slice(5)}`;
    try {
      // A paused sandbox: diff, verify, network and snapshots read it as it is; it stays paused.
      await sb.files.write('/note', 'frozen');
      await sb.pause();
      const diff = await api('GET', `/v1/sandboxes/${sb.id}/diff?path=/note`);
      assert.equal(diff.status, 200, JSON.stringify(diff.json));
      assert.equal(diff.json.frozen, true);
      assert.ok((diff.json.entries as Array<{ path: string }>).some((e) => e.path === '/note'));
      const sha = (diff.json.entries as Array<{ path: string; sha256?: string }>).find((e) => e.path === '/note')?.sha256;
      const verify = await api('POST', `/v1/sandboxes/${sb.id}/verify`, { expected: { '/note': sha } });
      assert.equal(verify.json.ok, true, JSON.stringify(verify.json));
      assert.equal((await api('GET', `/v1/sandboxes/${sb.id}/network`)).status, 200);
      const snap = await api('POST', `/v1/sandboxes/${sb.id}/snapshot`, {});
      assert.equal(snap.status, 201, JSON.stringify(snap.json));
      assert.equal((await sb.info()).state, 'paused', 'still paused after diff, verify, network and a snapshot');
      assert.equal(await tp!.platform.edge.cgroups.frozen(sb.id), true, 'and still frozen');
      // The snapshot holds the paused sandbox's files; a sandbox from it runs.
      const child = await Sandbox.create({ snapshot: (snap.json as unknown as { digest: string }).digest, labels }, { client });
      try {
        assert.equal((await child.exec('cat /note')).stdout, 'frozen');
      } finally {
        await child.kill();
      }
      // A pool claim gets the claimer's lease and owner; a pool spec cannot name them.
      const refused = await api('PUT', `/v1/pools/${pool}`, { spec: { image, lease: { idleTimeoutMs: 0 } }, size: 1 });
      assert.equal(refused.status, 400);
      const put = await api('PUT', `/v1/pools/${pool}`, { spec: { image, resources: { memoryMiB: 96 } }, size: 1 });
      assert.equal(put.status, 200, JSON.stringify(put.json));
      await until('the pool to fill', async () => (((await api('GET', `/v1/pools/${pool}`)).json.ready as number) >= 1 ? true : undefined), 60_000);
      const claimedReply = await api('POST', '/v1/sandboxes', {
        image,
        resources: { memoryMiB: 96 },
        labels,
        owner: owner.id,
        lease: { idleTimeoutMs: 5000, autoResume: false },
      });
      assert.equal(claimedReply.status, 201, JSON.stringify(claimedReply.json));
      const claimed = claimedReply.json as unknown as SandboxInfo;
      assert.equal(claimed.owner, owner.id);
      assert.deepEqual(claimed.lease, {
        idleTimeoutMs: 5000,
        maxLifetimeMs: 3_600_000,
        onIdle: 'pause',
        ownerGraceMs: null,
        onOwnerLost: 'pause',
        autoResume: false,
      });
      assert.equal(Date.parse(claimed.expiresAt) - Date.parse(claimed.createdAt), 3_600_000);
      assert.ok(tp!.platform.services.counters.poolClaims >= 1, 'it came from the pool');
      await Sandbox.kill(claimed.id, { client });
    } finally {
      await api('DELETE', `/v1/pools/${pool}`);
      await sb.kill().catch(() => undefined);
      await api('DELETE', `/v1/owners/${owner.id}`);
    }
  });

  test('the CLI pauses and resumes', async () => {
    const sb = await Sandbox.create({ image, labels }, { client });
    try {
      const cli = (args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> =>
        new Promise((resolve) => {
          const c = spawn(process.execPath, [path.join(REPO_ROOT, 'packages/cli/dist/main.js'), ...args], {
            env: { PATH: process.env.PATH ?? '', DSEC_API_URL: tp!.url, DSEC_API_KEY: tp!.adminKey },
          });
          let stdout = '';
          let stderr = '';
          c.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
          c.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
          c.on('close', (code) => resolve({ code, stdout, stderr }));
        });
      const p = await cli(['sandbox', 'pause', sb.id]);
      assert.equal(p.code, 0, p.stderr);
      assert.match(p.stdout, new RegExp(`^${sb.id} paused in `));
      assert.equal((await sb.info()).state, 'paused');
      const r = await cli(['sandbox', 'resume', sb.id, '--json']);
      assert.equal(r.code, 0, r.stderr);
      assert.equal((JSON.parse(r.stdout) as Array<{ sandbox: { state: string } }>)[0]?.sandbox.state, 'running');
      const missing = await cli(['sandbox', 'pause', 'nope-0000000000000000']);
      assert.equal(missing.code, 1);
      assert.match(missing.stderr, /SANDBOX_NOT_FOUND/);
      const bad = await cli(['sandbox', 'lease', sb.id, '--idle-timeout', '-5']);
      assert.notEqual(bad.code, 0);
      assert.match(bad.stderr, /lease\.idleTimeoutMs/);
      const made = await cli([
        'sandbox',
        'create',
        '--base',
        'busybox',
        '--label',
        `run=${RUN}`,
        '--idle-timeout',
        '0',
        '--on-owner-lost',
        'kill',
        '--no-auto-resume',
        '--json',
      ]);
      assert.equal(made.code, 0, made.stderr);
      const info = JSON.parse(made.stdout) as SandboxInfo;
      assert.deepEqual(info.lease, { idleTimeoutMs: 0, maxLifetimeMs: 3_600_000, onIdle: 'pause', ownerGraceMs: null, onOwnerLost: 'kill', autoResume: false });
      const leased = await cli(['sandbox', 'lease', info.id, '--auto-resume', '--json']);
      assert.equal(leased.code, 0, leased.stderr);
      assert.equal((JSON.parse(leased.stdout) as SandboxInfo).lease.autoResume, true);
      await Sandbox.kill(info.id, { client });
    } finally {
      await sb.kill();
    }
  });
});
