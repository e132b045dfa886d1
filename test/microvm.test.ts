// The microVM backend end to end: one QEMU microvm (TCG on this machine) carries every check, so
// the file boots the guest once (plus the node's cached accelerator probe).
import assert from 'node:assert/strict';
import { watch } from 'node:fs';
import { readdir, readFile, readlink } from 'node:fs/promises';
import http from 'node:http';
import { randomBytes } from 'node:crypto';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { DsecClient, Sandbox } from '@dsec/sdk';
import { DsecError } from '@dsec/protocol';
import type { RaisedEvent, SandboxSpec } from '@dsec/protocol';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';
import { apiCall, sh } from './helpers/assert.js';
import { qemuPids } from './helpers/qemu.js';

/** A loopback /24 of this run's own: an allowed upstream and one the policy does not name. */
const NET = `127.${1 + ((randomBytes(1)[0] ?? 0) % 250)}.${randomBytes(1)[0] ?? 0}`;
const ALLOWED = `${NET}.2`;
const OTHER = `${NET}.3`;
const servers: http.Server[] = [];
/** Port of a host service listening on every address. */
let hostPort = 0;

let tp: TestPlatform;
let client: DsecClient;
const events: RaisedEvent[] = [];
const made: Sandbox[] = [];

/** An HTTP GET with busybox nc (busybox wget crashes under TCG here; nc stops at stdin's end, hence the sleep). */
function get(host: string, port = 80): string {
  return `(printf 'GET / HTTP/1.0\\r\\nHost: ${host}\\r\\n\\r\\n'; sleep 4) | timeout 8 nc ${host} ${port}`;
}

async function until(what: string, fn: () => Promise<boolean> | boolean, ms = 30_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await fn())) {
    if (Date.now() > end) assert.fail(`${what}: not within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

before(async () => {
  for (const address of [ALLOWED, OTHER]) {
    const server = http.createServer((_req, res) => res.end(`hello from ${address}\n`));
    await new Promise<void>((resolve) => server.listen(80, address, resolve));
    servers.push(server);
  }
  const any = http.createServer((_req, res) => res.end('host\n'));
  await new Promise<void>((resolve) => any.listen(0, '0.0.0.0', resolve));
  servers.push(any);
  hostPort = (any.address() as { port: number }).port;
  tp = await startTestPlatform({
    microvm: {},
    network: { hosts: { 'allowed.test': ALLOWED, 'other.test': OTHER }, nameservers: [], allowedPrivateRanges: [`${ALLOWED}/32`, `${OTHER}/32`] },
  });
  tp.platform.edge.onEvent((ev) => events.push(ev));
  client = new DsecClient({ apiUrl: tp.url, apiKey: tp.adminKey, requestTimeoutMs: 180_000 });
});
after(async () => {
  for (const sb of made) await sb.kill().catch(() => undefined);
  await client?.close();
  await tp?.close();
  for (const server of servers) await new Promise((resolve) => server.close(resolve));
});

describe('microvm backend', () => {
  test('the node reports its accelerator and boot time from a real boot probe', () => {
    const cap = tp.platform.edge.capacity();
    assert.ok(cap.backends.includes('microvm'));
    assert.ok(cap.microvm && (cap.microvm.accel === 'kvm' || cap.microvm.accel === 'tcg'), JSON.stringify(cap.microvm));
    assert.ok(cap.microvm.bootMs > 0);
  });

  test('a spec that does not fit a microVM is refused naming the field', async () => {
    const r = await apiCall(tp.url, tp.adminKey, 'POST', '/v1/sandboxes', {
      backend: 'microvm',
      image: { base: 'busybox' },
      resources: { memoryMiB: 64 },
    });
    assert.equal(r.status, 400, JSON.stringify(r.body));
    assert.match(JSON.stringify(r.body), /resources\.memoryMiB/);
  });

  test('one microVM: exec, files, attach, pause/resume, confinement, crash -> lost, nothing left', async () => {
    const allocatedBefore = (await client.nodes.list())[0]!.allocated;
    const sb = await Sandbox.create({ backend: 'microvm', image: { base: 'busybox' }, resources: { cpu: 1, memoryMiB: 192, diskMiB: 64 } }, { client });
    made.push(sb);

    // A kernel of its own, chronus as PID 1, the image's files under an overlay.
    const release = (await sh(sb, 'uname -r')).trim();
    assert.notEqual(release, os.release(), 'the guest runs its own kernel');
    assert.match(await sh(sb, 'cat /proc/1/cmdline | tr "\\0" " "'), /^\/\.dsec\/chronus --stream-path/);
    assert.match(await sh(sb, 'cat /proc/mounts'), /^overlay \/ overlay/m);
    assert.equal((await sb.exec('echo out; echo err >&2; exit 3')).exitCode, 3);

    // Files through the agent; the writable disk is bounded by diskMiB.
    await sb.files.write('/tmp/hello.txt', 'from the host');
    assert.equal(await sb.files.read('/tmp/hello.txt'), 'from the host');
    assert.equal(await sh(sb, 'cat /tmp/hello.txt'), 'from the host');
    assert.ok((await sb.files.list('/tmp')).some((f) => f.name === 'hello.txt'));
    const full = await sb.exec('dd if=/dev/zero of=/big bs=1M count=200 2>&1; echo rc=$?');
    assert.match(full.stdout, /No space left on device/);
    await sh(sb, 'rm -f /big');

    // A running command, reattached from an offset on a connection of its own (an extra port).
    const h = await sb.spawn('i=0; while [ $i -lt 5 ]; do echo line-$i; i=$((i+1)); done; sleep 600');
    await until('five lines', async () => ((await sb.processes()).find((p) => p.pid === h.pid)?.stdoutBytes ?? 0) >= 35);
    const again = await sb.attach(h.pid, { fromStdout: 7 });
    let seen = '';
    for await (const ev of again) {
      seen += ev.data.toString();
      if (seen.includes('line-4')) break;
    }
    again.disconnect();
    assert.equal(seen, 'line-1\nline-2\nline-3\nline-4\n');

    // A disk snapshot, read out by the guest (its disk frozen meanwhile), and a fork from it: a
    // new file, a changed one, a deleted one (a whiteout) and a directory made again (opaque).
    await sh(sb, 'mkdir -p /data && head -c 1048576 /dev/urandom > /data/blob && echo changed > /etc/hosts && rm /bin/vi');
    await sh(sb, 'rm -rf /root && mkdir /root && echo only > /root/only && mkdir /opq && rm -rf /etc && mkdir /etc && echo x > /etc/passwd');
    const sum = (await sh(sb, 'md5sum /data/blob')).split(' ')[0];
    const writer = await sb.spawn('i=0; while true; do echo $i >> /data/counter; i=$((i+1)); sleep 0.05; done');
    const fork = await sb.fork(1);
    const child = fork.sandboxes[0]!;
    made.push(child);
    assert.equal(child.lastInfo?.backend, 'microvm');
    assert.equal((await sh(child, 'md5sum /data/blob')).split(' ')[0], sum, 'the new file, byte for byte');
    assert.equal(await sh(child, 'ls /etc'), 'passwd\n', 'a directory made again hides what the image had (opaque)');
    assert.equal(await sh(child, 'cat /etc/passwd'), 'x\n');
    assert.equal(await sh(child, '[ -e /bin/vi ] || [ -L /bin/vi ] || echo gone'), 'gone\n', 'a deleted image file stays deleted (whiteout)');
    assert.equal(await sh(child, 'ls /bin/sh >/dev/null && echo kept'), 'kept\n');
    assert.ok(Number((await sh(child, 'wc -l < /data/counter')).trim()) > 0, 'what the source wrote before the snapshot');
    // The source ran on: its writes went on after the freeze, nothing of the read is left in it.
    const counted = Number((await sh(sb, 'wc -l < /data/counter')).trim());
    await until('the source writes on', async () => Number((await sh(sb, 'wc -l < /data/counter')).trim()) > counted + 2);
    assert.doesNotMatch(await sh(sb, 'cat /proc/mounts'), /dsec-snapshot/);
    await writer.kill();
    await writer.wait().catch(() => undefined);
    await child.kill();
    made.splice(made.indexOf(child), 1);

    // Pause stops the vCPUs; resume goes on where it was.
    await sb.pause();
    assert.equal((await sb.info()).state, 'paused');
    // A paused microVM is not snapshotted: its guest reads its own disk.
    const paused = await apiCall(tp.url, tp.adminKey, 'POST', `/v1/sandboxes/${sb.id}/snapshot`, {});
    assert.equal(paused.status, 409, JSON.stringify(paused.body));
    await sb.resume();
    assert.equal((await sh(sb, 'echo back')).trim(), 'back');
    const stats = await sb.stats();
    assert.ok(stats.memoryBytes > 0 && stats.diskLimitBytes === 64 * 1024 * 1024, JSON.stringify(stats));

    // QEMU is confined: an unprivileged uid, seccomp filter mode, a mount namespace of its own,
    // in the sandbox's cgroup.
    const [pid] = await qemuPids(sb.id);
    assert.ok(pid, 'the QEMU process is found');
    const status = await readFile(`/proc/${pid}/status`, 'utf8');
    const uids = /^Uid:\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)/m.exec(status)!.slice(1).map(Number);
    assert.ok(
      uids.every((u) => u >= 0x4000_0000),
      `uids ${uids.join(' ')}`,
    );
    assert.match(status, /^Seccomp:\s+2$/m);
    assert.match(status, /^CapEff:\s+0+$/m);
    assert.match(status, /^NoNewPrivs:\s+1$/m);
    assert.notEqual(await readlink(`/proc/${pid}/ns/mnt`), await readlink('/proc/self/ns/mnt'));
    assert.match(await readFile(`/proc/${pid}/cgroup`, 'utf8'), new RegExp(`/${sb.id}$`, 'm'));
    const cmdline = (await readFile(`/proc/${pid}/cmdline`, 'utf8')).split('\0');
    assert.ok(cmdline.includes('on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny'));

    // A crashed QEMU: the sandbox is lost (an event says so) and nothing of it is left.
    process.kill(pid, 'SIGKILL');
    await until('sandbox.lost', () => events.some((e) => e.kind === 'sandbox.lost' && e.sandboxId === sb.id));
    await until('the API says lost', async () => (await sb.info()).state === 'lost');
    await until('no QEMU, cgroup or folder left', async () => {
      return (await qemuPids(sb.id)).length === 0 && (await tp.platform.edge.cgroups.existing(sb.id)).length === 0;
    });
    assert.ok(!(await tp.platform.edge.list()).some((s) => s.id === sb.id), 'the edge forgot it');
    await sb.kill();
    made.length = 0;
    // Its charge was given back once (when lost), not again by the delete.
    assert.deepEqual((await client.nodes.list())[0]!.allocated, allocatedBefore);
  });

  test('a networked microVM: a tap in its namespace; the node policy, DNS stub and proxy apply', async () => {
    const sb = await Sandbox.create(
      {
        backend: 'microvm',
        image: { base: 'busybox' },
        resources: { cpu: 1, memoryMiB: 192, diskMiB: 64 },
        network: { mode: 'allowlist', allow: [{ host: 'allowed.test' }] },
      },
      { client },
    );
    made.push(sb);
    assert.match(await sh(sb, 'cat /etc/resolv.conf'), /^nameserver /m);
    const ok = await sb.exec(get('allowed.test'));
    assert.match(ok.stdout, new RegExp(`^HTTP/1\\.[01] 200[^]*hello from ${ALLOWED.replace(/\./g, '\\.')}\n$`), `${ok.exitCode} ${ok.stdout} ${ok.stderr}`);
    assert.equal(ok.exitCode, 0);
    const other = await sb.exec(get('other.test'));
    assert.doesNotMatch(other.stdout, /hello/, 'a name the policy does not allow fails');
    const direct = await sb.exec(get(OTHER));
    assert.doesNotMatch(direct.stdout, /hello/, 'an address nobody allowed fails');
    // A host service on every address (the gateway's included) is out of reach.
    const gw = /^default via (\d+\.\d+\.\d+\.\d+)/m.exec(await sh(sb, 'ip route'))?.[1];
    assert.ok(gw, 'the guest has a default route');
    const host = await sb.exec(get(gw, hostPort));
    assert.doesNotMatch(host.stdout, /host/, 'host services are unreachable');

    // A fork with memory: a process started before it runs on in the fork from where it was (its
    // shell variable is in the copied memory); the two diverge; the fork has its own address and MAC.
    const count = async (s: Sandbox): Promise<number> => Number((await sh(s, 'cat /tmp/count 2>/dev/null || echo 0')).trim());
    const counter = await sb.spawn('i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done');
    await until('the counter counts', async () => (await count(sb)) > 2);
    await sh(sb, 'echo source > /tmp/marker');
    const identity = async (s: Sandbox): Promise<string> => sh(s, "ip -4 -o addr show eth0 | awk '{print $4}'; cat /sys/class/net/eth0/address");
    const sourceIdentity = await identity(sb);
    const before = await count(sb);
    // A fork of another shape (more memory) is refused before anything of the source is stopped or copied.
    const sourceDir = path.join(tp.home, 'node', 'microvm', sb.id);
    const copies: string[] = [];
    const watcher = watch(sourceDir, (_ev, name) => {
      if (name?.startsWith('fork-')) copies.push(name);
    });
    try {
      const record = JSON.parse(await readFile(path.join(sourceDir, 'sandbox.json'), 'utf8')) as { spec: SandboxSpec };
      const resources = { ...record.spec.resources, memoryMiB: (record.spec.resources?.memoryMiB ?? 0) + 64 };
      await assert.rejects(
        tp.platform.edge.create({ ...record.spec, resources, memoryOf: sb.id }),
        (err: unknown) => err instanceof DsecError && err.code === 'CONFLICT' && /a fork with memory needs its source's layers, memory/.test(err.message),
      );
      await new Promise((r) => setTimeout(r, 200));
    } finally {
      watcher.close();
    }
    assert.deepEqual(copies, [], "no copy of the source's memory or disk was started");
    // A fork with memory goes through the admission queue as any create: behind a request of its
    // project that waits there (for capacity), it is refused, not let past it.
    const project = (await sb.info()).project;
    const leave = new AbortController();
    const waiter = tp.platform.services.admission.admit(
      project,
      () => Promise.reject(new DsecError('CAPACITY_EXHAUSTED', 'no room for the earlier request', { retryAfterMs: 1000 })),
      { wait: true, timeoutMs: 30_000, signal: leave.signal },
    );
    waiter.catch(() => undefined);
    try {
      const queued = await apiCall(tp.url, tp.adminKey, 'POST', `/v1/sandboxes/${sb.id}/fork`, { count: 1, memory: true });
      assert.equal(queued.status, 503, JSON.stringify(queued.body));
      assert.match(queued.body.error.message, /1 earlier request\(s\) of this project are waiting/);
    } finally {
      leave.abort();
    }
    const forked = await sb.fork(1, { memory: true });
    assert.equal(forked.snapshot, undefined, 'a fork with memory makes no snapshot');
    const twin = forked.sandboxes[0]!;
    made.push(twin);
    assert.equal(twin.lastInfo?.backend, 'microvm');
    assert.ok(
      (await twin.processes()).some((p) => p.pid === counter.pid),
      "the source's process is the fork's",
    );
    const at = await count(twin);
    assert.ok(at >= before, `the counter came with the memory (${at} >= ${before})`);
    await until('the counter runs on in the fork', async () => (await count(twin)) > at + 2);
    assert.equal(await sh(twin, 'cat /tmp/marker'), 'source\n');
    await sh(twin, 'echo fork > /tmp/marker');
    assert.equal(await sh(sb, 'cat /tmp/marker'), 'source\n', 'the two diverge');
    const sourceAt = await count(sb);
    await until('the source runs on', async () => (await count(sb)) > sourceAt + 2);
    const twinIdentity = await identity(twin);
    const [sourceAddress, sourceMac] = sourceIdentity.trim().split('\n');
    const [twinAddress, twinMac] = twinIdentity.trim().split('\n');
    assert.ok(twinAddress && twinAddress !== sourceAddress, `an address of its own (${twinIdentity} vs ${sourceIdentity})`);
    assert.ok(twinMac && twinMac !== sourceMac, `a MAC of its own (${twinIdentity} vs ${sourceIdentity})`);
    const fromTwin = await twin.exec(get('allowed.test'));
    assert.match(fromTwin.stdout, /hello from/, `the fork's network works under the same policy: ${fromTwin.stdout} ${fromTwin.stderr}`);
    assert.match(await sh(sb, 'echo still'), /still/);
    await twin.kill();
    // A source paused in memory: saved once for all its forks, it stays paused and runs on when resumed.
    await sb.pause();
    const fromPaused = await sb.fork(2, { memory: true });
    made.push(...fromPaused.sandboxes);
    assert.equal((await sb.info()).state, 'paused');
    for (const f of fromPaused.sandboxes) {
      const c = await count(f);
      await until('a fork of the paused source counts on', async () => (await count(f)) > c);
      await f.kill();
    }
    await sb.resume();
    const resumedAt = await count(sb);
    await until('the source counts on after its resume', async () => (await count(sb)) > resumedAt);
    await counter.kill();

    await sb.kill();
    made.length = 0;
    for (const gone of [sb.id, twin.id]) {
      await until('its namespace is gone', async () => !(await readdir('/run/netns').catch(() => [] as string[])).includes(`dsec-${gone}`));
    }
  });
});
