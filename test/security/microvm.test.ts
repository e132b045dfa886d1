// The adversarial kit inside a microVM (issue 17): one QEMU microvm (TCG on this machine), made
// through the API, runs what the kit tries from a sandbox (the host's services, loopback and a
// metadata address over the network, root's escape attempts on its own kernel, a fork bomb, a
// disk filled beyond diskMiB, memory beyond the spec) and nothing of it reaches the host: host
// files and settings are unchanged, no connection arrives, the QEMU process stays within its
// cgroup's bounds, and the platform answers throughout. The same boot measures that memory the
// guest touched and freed goes back to the host (free page reporting, microvm/qemu.ts).
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { readFile, rm, stat, writeFile } from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { DsecClient, DsecError, Sandbox } from '@dsec/sdk';
import { startTestPlatform } from '../helpers/platform.js';
import type { TestPlatform } from '../helpers/platform.js';
import { apiCall, sh } from '../helpers/assert.js';
import { qemuPids } from '../helpers/qemu.js';
import { KIT, KIT_LAYER, hex, kitLayerDir, newCanary, probe, probes } from './fixture.js';

const MEMORY_MIB = 256;
const DISK_MIB = 32;
/** Memory the guest touches and frees to see it given back (below /dev/shm's half of RAM). */
const TOUCH_MIB = 80;

/** The kit's system-call probes run in the guest (every one but `ptrace-attach-1`, tried last). */
const GUEST_SYSCALL_PROBES = [
  'bpf',
  'bpf-map',
  'io_uring',
  'userfaultfd',
  'perf_event_open',
  'unshare-user',
  'unshare-mount',
  'unshare-net',
  'unshare-pid',
  'clone-newuser',
  'clone-newns',
  'clone3-newuser',
  'mount-tmpfs',
  'mount-proc',
  'mount-cgroup',
  'fsopen',
  'open_tree',
  'keyctl',
  'add_key',
  'ptrace-child',
  'process_vm_readv-1',
  'pidfd_getfd-1',
  'name_to_handle_at',
  'open_by_handle_at',
  'setns',
  'init_module',
  'kexec_load',
  'syslog',
  'socket-raw',
  'socket-packet',
  'mknod-block',
  'iopl',
  'reboot',
  'swapon',
  'ioctl-tiocsti',
  'xfs-swapext',
];

let tp: TestPlatform | undefined;
let client: DsecClient;
let layerDir = '';
const made: Sandbox[] = [];
/** A host service on every address: no connection may reach it from the guest. */
let server: http.Server | undefined;
let hostPort = 0;
let connections = 0;
const hostCanary = newCanary();
let canaryFile = '';

async function until(what: string, fn: () => Promise<boolean> | boolean, ms = 30_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await fn())) {
    if (Date.now() > end) assert.fail(`${what}: not within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** Host settings and files no attack may change. */
async function hostState(): Promise<Record<string, unknown>> {
  const canary = await readFile(canaryFile);
  return {
    hostname: os.hostname(),
    corePattern: await readFile('/proc/sys/kernel/core_pattern', 'utf8'),
    canarySha: createHash('sha256').update(canary).digest('hex'),
    canaryMtimeMs: (await stat(canaryFile)).mtimeMs,
  };
}

/** Anonymous resident memory of a host process, MiB (guest RAM QEMU has touched lies there). */
async function rssAnonMiB(pid: number): Promise<number> {
  const m = /^RssAnon:\s+(\d+) kB$/m.exec(await readFile(`/proc/${pid}/status`, 'utf8'));
  assert.ok(m, `no RssAnon for ${pid}`);
  return Number(m[1]) / 1024;
}

/** A number from the sandbox's cgroup: the first of `files` found in any of its directories (v1 or v2). */
async function cgroupNumber(dirs: readonly string[], files: readonly string[]): Promise<number> {
  for (const dir of dirs) {
    for (const f of files) {
      const text = await readFile(path.join(dir, f), 'utf8').catch(() => undefined);
      if (text !== undefined) return Number(text.trim());
    }
  }
  assert.fail(`none of ${files.join(', ')} in ${dirs.join(', ')}`);
}

/** Addresses of this host on its interfaces (loopback excluded). */
function hostAddresses(): string[] {
  return Object.values(os.networkInterfaces())
    .flat()
    .filter((a) => a && a.family === 'IPv4' && !a.internal)
    .map((a) => a!.address);
}

before(async () => {
  server = http.createServer((_req, res) => res.end('host\n'));
  server.on('connection', () => connections++);
  await new Promise<void>((resolve) => server!.listen(0, '0.0.0.0', resolve));
  hostPort = (server.address() as { port: number }).port;
  tp = await startTestPlatform({ microvm: {} });
  client = new DsecClient({ apiUrl: tp.url, apiKey: tp.adminKey, requestTimeoutMs: 180_000 });
  layerDir = await kitLayerDir();
  await client.layers.uploadDir(layerDir, { kind: 'toolkit', name: KIT_LAYER });
  canaryFile = path.join(tp.home, 'node', 'layers', 'answers.txt');
  await writeFile(canaryFile, `expected output: ${hostCanary}\n`);
});

after(async () => {
  try {
    for (const sb of made) await sb.kill().catch(() => undefined);
    await client?.close();
    await tp?.close();
    if (server) await new Promise((resolve) => server!.close(resolve));
  } finally {
    if (layerDir) await rm(layerDir, { recursive: true, force: true });
  }
});

describe('the adversarial kit in a microVM', () => {
  test('network, escape, fork bomb, disk and memory attacks from a guest reach nothing of the host; freed guest memory goes back to the host', async (t) => {
    const before = await hostState();
    const sb = await Sandbox.create(
      {
        backend: 'microvm',
        image: { base: 'busybox', toolkits: [KIT_LAYER] },
        resources: { cpu: 1, memoryMiB: MEMORY_MIB, diskMiB: DISK_MIB },
        // A network device (a tap in the sandbox's namespace) with a policy that allows nothing.
        network: { mode: 'allowlist' },
      },
      { client },
    );
    made.push(sb);
    const kit = (args: string, timeoutMs = 60_000) => sb.exec(`${KIT} ${args}`, { timeoutMs });
    const [pid] = await qemuPids(sb.id);
    assert.ok(pid, 'the QEMU process is found');
    const cgroups = await tp!.platform.edge.cgroups.existing(sb.id);
    assert.ok(cgroups.length > 0);
    const memoryMax = await cgroupNumber(cgroups, ['memory.max', 'memory.limit_in_bytes']);
    const pidsMax = await cgroupNumber(cgroups, ['pids.max']);
    assert.ok(memoryMax > 0 && pidsMax > 0, `bounds: memory ${memoryMax}, pids ${pidsMax}`);

    // Freed memory goes back: the guest fills TOUCH_MIB of tmpfs (held while the file exists),
    // removes it; its balloon driver reports the free blocks and QEMU discards them.
    const idle = await rssAnonMiB(pid);
    await sh(sb, `dd if=/dev/zero of=/dev/shm/touch bs=1M count=${TOUCH_MIB} 2>/dev/null`);
    const held = await rssAnonMiB(pid);
    assert.ok(held - idle >= TOUCH_MIB / 2, `the guest's memory shows on the host: idle ${idle.toFixed(1)} MiB, holding ${held.toFixed(1)} MiB`);
    await sh(sb, 'rm /dev/shm/touch');
    let freed = held;
    await until('freed guest memory given back to the host', async () => (freed = await rssAnonMiB(pid)) <= held - TOUCH_MIB / 2);
    t.diagnostic(`QEMU RssAnon: idle ${idle.toFixed(1)} MiB, guest holding ${TOUCH_MIB} MiB ${held.toFixed(1)} MiB, freed ${freed.toFixed(1)} MiB`);
    // The kit's own touch, within the spec, runs to its end.
    assert.equal(probe(await kit(`balloon ${TOUCH_MIB}`), 'balloon').result, 'OK');

    // Network: the host's own addresses (its service on every address), the gateway, QEMU's
    // user-mode gateway address. The guest is root on its own kernel; the node's rules stand
    // outside it.
    const gw = /^default via (\d+\.\d+\.\d+\.\d+)/m.exec(await sh(sb, 'ip route'))?.[1];
    assert.ok(gw, 'the guest has a default route');
    for (const host of [gw, ...hostAddresses(), '10.0.2.2']) {
      const r = await kit(`ports ${host} ${hostPort} ${hostPort} 2000`);
      assert.deepEqual(
        probes(r).filter((p) => p.probe === 'open-port'),
        [],
        `${host}:${hostPort} reached from the guest: ${r.stdout}`,
      );
    }
    // A metadata address: port 80 leads to the node's egress proxy, which refuses the literal.
    const metadata = await sb.exec(
      "(printf 'GET /latest/meta-data/ HTTP/1.0\\r\\nHost: 169.254.169.254\\r\\n\\r\\n'; sleep 3) | timeout 8 nc 169.254.169.254 80",
    );
    assert.match(metadata.stdout, /^HTTP\/1\.[01] 40[03]/, `the metadata address answered: ${metadata.stdout}`);
    const udp = probe(await kit(`udp ${gw} ${hostPort}`), 'udp');
    assert.ok(udp.result, JSON.stringify(udp));
    assert.equal(connections, 0, 'no connection reached the host service');

    // Escapes: root in the guest may do what root does on its kernel (the probes say what), and
    // none of it lands on the host: its hostname, core_pattern and files stay as they were.
    // All but ptrace-attach-1, tried last (below): guest root attaching the guest's PID 1 stops
    // chronus, and with it the agent.
    const syscalls = await kit(`syscall ${GUEST_SYSCALL_PROBES.join(' ')}`);
    assert.equal(syscalls.exitCode, 0, syscalls.stderr);
    t.diagnostic(`inside the guest: ${JSON.stringify(Object.fromEntries(probes(syscalls).map((p) => [p.probe, p.result])))}`);
    await sh(sb, "hostname kit-owned; echo '|/tmp/evil %p' > /proc/sys/kernel/core_pattern; echo 1 > /proc/sys/kernel/sysrq");
    assert.equal((await sh(sb, 'hostname')).trim(), 'kit-owned', "the guest's own hostname changed");
    // No disk the host gives the guest, nor any file it sees, holds the host's canary.
    const scan = probe(await kit(`scan ${hex(hostCanary)} /etc /opt /root /tmp /run /sys/firmware`), 'scan');
    assert.equal(scan.hits, 0, JSON.stringify(scan));
    const disks = await sb.exec(`for d in /dev/vd*; do grep -c -F '${hostCanary}' $d; done; true`);
    assert.doesNotMatch(disks.stdout, /^[1-9]/m, `a guest disk holds the host canary: ${disks.stdout}`);

    // A fork bomb: the guest's kernel runs out, the host's QEMU stays within its pids bound.
    // The kit reports how many it forked, unless the guest's OOM killer ended it first.
    const bombRun = await kit('forkbomb 500', 120_000);
    const bomb = probes(bombRun).find((p) => p.probe === 'forkbomb');
    assert.ok(bomb ? Number(bomb.forked) > 0 : bombRun.exitCode !== 0, `${bombRun.exitCode} ${bombRun.stdout}`);
    assert.ok((await cgroupNumber(cgroups, ['pids.current'])) <= pidsMax, "QEMU's threads within its pids bound");

    // A disk filled beyond diskMiB: the guest's filesystem is full, the host file keeps its size.
    // (TCG writes slowly on a loaded node: a generous bound, and the run's status in a failure.)
    const fillRun = await kit(`fill /fill ${DISK_MIB * 2}`, 180_000);
    assert.equal(probes(fillRun).filter((p) => p.probe === 'fill').length, 1, `fill: exit ${fillRun.exitCode} ${fillRun.stderr.slice(-500)}`);
    const fill = probe(fillRun, 'fill');
    assert.equal(fill.result, 'ENOSPC', JSON.stringify(fill));
    assert.ok(Number(fill.bytes) <= DISK_MIB * 1024 * 1024, JSON.stringify(fill));
    const stats = await sb.stats();
    assert.equal(stats.diskLimitBytes, DISK_MIB * 1024 * 1024);
    assert.ok(stats.diskUsedBytes <= DISK_MIB * 1024 * 1024, JSON.stringify(stats));
    await sh(sb, 'rm -f /fill');

    // Memory beyond the spec: the guest's OOM killer ends the kit; QEMU stays inside its cgroup.
    const hog = await kit(`balloon ${MEMORY_MIB * 2}`, 120_000);
    assert.notEqual(probes(hog).find((p) => p.probe === 'balloon')?.result, 'OK', `${MEMORY_MIB * 2} MiB in a ${MEMORY_MIB} MiB guest: ${hog.stdout}`);
    assert.ok((await rssAnonMiB(pid)) * 1024 * 1024 <= memoryMax, 'QEMU within its memory bound');

    // The platform answers and the guest still works; nothing changed on the host.
    assert.equal((await sb.info()).state, 'running');
    assert.equal((await sh(sb, 'echo alive')).trim(), 'alive');
    const nodes = await apiCall(tp!.url, tp!.adminKey, 'GET', '/v1/nodes');
    assert.equal(nodes.status, 200);
    assert.deepEqual(await hostState(), before, 'host files and settings are unchanged');
    assert.equal(connections, 0, 'no connection reached the host service');

    // Last, as it leaves the agent stopped: guest root ptrace-attaches the guest's PID 1
    // (chronus). The node bounds the wait on it: a command with timeoutMs is answered with
    // TIMEOUT in bounded time (not at the client's own timeout) and the event is raised.
    const attach = await kit('syscall ptrace-attach-1', 5_000).then(
      (r) => r.stdout,
      (err: unknown) => String(err),
    );
    t.diagnostic(`ptrace-attach-1: ${attach}`);
    const t0 = Date.now();
    const stopped = await sb.exec('echo answered', { timeoutMs: 2_000 }).then(
      (r) => r,
      (err: unknown) => err,
    );
    const waited = Date.now() - t0;
    assert.ok(
      stopped instanceof DsecError && stopped.code === 'TIMEOUT',
      `an exec to the stopped agent: ${String((stopped as Error).message ?? JSON.stringify(stopped))}`,
    );
    assert.ok(waited < 30_000, `answered after ${waited} ms`);
    assert.match(stopped.message, /agent does not answer/, "the node answered, not the client's own timeout");
    await until('sandbox.agent-unresponsive raised', async () => {
      const ev = await apiCall(tp!.url, tp!.adminKey, 'GET', `/v1/events?kind=sandbox.agent-unresponsive&sandbox=${sb.id}`);
      return ev.status === 200 && ev.body.items.length > 0;
    });

    // Destroyed: no QEMU, cgroup or namespace of it is left.
    await sb.kill();
    made.length = 0;
    await until('no QEMU or cgroup left', async () => (await qemuPids(sb.id)).length === 0 && (await tp!.platform.edge.cgroups.existing(sb.id)).length === 0);
  });
});
