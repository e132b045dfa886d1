// The full-VM backend end to end: one q35 + OVMF machine (TCG on this machine) booting the disk
// image `dsec image build --vm` makes (cached machine-wide, so only the first run builds it)
// carries every check of a chronus guest, and a snapshot of its disk; a second boot checks that
// snapshot exported raw with `dsec image export` and imported back with `dsec image import`, run
// through the QEMU guest agent alone (test/vm-fork.test.ts, under test:long, boots forks).
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { execFile, spawn } from 'node:child_process';
import { createReadStream } from 'node:fs';
import { mkdtemp, open, readdir, readFile, readlink, rm, stat, truncate } from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import http from 'node:http';
import os from 'node:os';
import { after, before, describe, test } from 'node:test';
import { DsecClient, Sandbox } from '@dsec/sdk';
import type { Layer, RaisedEvent } from '@dsec/protocol';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';
import { apiCall, sh } from './helpers/assert.js';
import { qemuPids } from './helpers/qemu.js';
import { REPO_ROOT } from './helpers/node.js';

const run = promisify(execFile);

/** A loopback /24 of this run's own: an allowed upstream and one the policy does not name. */
const NET = `127.${1 + ((randomBytes(1)[0] ?? 0) % 250)}.${randomBytes(1)[0] ?? 0}`;
const ALLOWED = `${NET}.2`;
const OTHER = `${NET}.3`;
const servers: http.Server[] = [];
let hostPort = 0;

let tp: TestPlatform;
let client: DsecClient;
let image: Layer;
const events: RaisedEvent[] = [];
const made: Sandbox[] = [];
/** The snapshot of the first VM's disk (the second test boots it, exported and imported). */
let snapshot: Layer | undefined;
const CLI = path.join(REPO_ROOT, 'packages/cli/dist/main.js');

/** Runs `dsec args...` against the platform; its stdout once it exited 0. */
async function dsec(args: string[]): Promise<string> {
  const child = spawn(process.execPath, [CLI, ...args], {
    env: { PATH: process.env.PATH ?? '', DSEC_API_URL: tp.url, DSEC_API_KEY: tp.adminKey, DSEC_HOME: path.join(os.tmpdir(), 'dsec-vm-test-no-home') },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const code = await new Promise<number | null>((resolve) => child.on('close', resolve));
  assert.equal(code, 0, `dsec ${args.join(' ')}: ${stderr}`);
  return stdout;
}

/** An HTTP GET with bash's /dev/tcp (the image has no HTTP client). */
function get(host: string, port = 80): string {
  return `timeout 8 bash -c 'exec 3<>/dev/tcp/${host}/${port} && printf "GET / HTTP/1.0\\r\\nHost: ${host}\\r\\n\\r\\n" >&3 && cat <&3'`;
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
    vm: {},
    network: { hosts: { 'allowed.test': ALLOWED, 'other.test': OTHER }, nameservers: [], allowedPrivateRanges: [`${ALLOWED}/32`, `${OTHER}/32`] },
  });
  tp.platform.edge.onEvent((ev) => events.push(ev));
  client = new DsecClient({ apiUrl: tp.url, apiKey: tp.adminKey, requestTimeoutMs: 600_000 });
  // Built once per input machine-wide (minutes from an empty cache, with progress), then linked.
  image = await client.layers.buildVm({ name: 'vm-test' }, { onProgress: (line) => process.stderr.write(`vm image: ${line}\n`) });
});
after(async () => {
  for (const sb of made) await sb.kill().catch(() => undefined);
  await client?.close();
  await tp?.close();
  for (const server of servers) await new Promise((resolve) => server.close(resolve));
});

describe('vm backend', () => {
  test('the image is a disk layer; specs that do not fit a VM are refused naming the field', async () => {
    assert.equal(image.kind, 'disk');
    assert.ok(tp.platform.edge.capacity().backends.includes('vm'));
    const small = await apiCall(tp.url, tp.adminKey, 'POST', '/v1/sandboxes', { backend: 'vm', image: { base: 'vm-test' }, resources: { memoryMiB: 128 } });
    assert.equal(small.status, 400, JSON.stringify(small.body));
    assert.match(JSON.stringify(small.body), /resources\.memoryMiB/);
    const notDisk = await apiCall(tp.url, tp.adminKey, 'POST', '/v1/sandboxes', { backend: 'vm', image: { base: 'busybox' } });
    assert.equal(notDisk.status, 400, JSON.stringify(notDisk.body));
    assert.match(JSON.stringify(notDisk.body), /image\.base/);
  });

  test('one VM: exec, files, own kernel, network policy, pause/resume, confinement, crash -> lost, nothing left', async () => {
    const allocatedBefore = (await client.nodes.list())[0]!.allocated;
    const sb = await Sandbox.create(
      {
        backend: 'vm',
        image: { base: 'vm-test' },
        // Under 1 GiB: its snapshot exported raw stays within an upload's limit (test below).
        resources: { cpu: 1, memoryMiB: 512, diskMiB: 960 },
        network: { mode: 'allowlist', allow: [{ host: 'allowed.test' }] },
      },
      { client },
    );
    made.push(sb);

    // Its own kernel and OS: Debian under systemd, chronus a service, the guest agent beside it.
    const release = (await sh(sb, 'uname -r')).trim();
    assert.notEqual(release, os.release(), 'the guest runs its own kernel');
    assert.match(await sh(sb, 'cat /proc/1/comm'), /^systemd$/m);
    assert.match(await sh(sb, '. /etc/os-release; echo $ID $VERSION_CODENAME'), /^debian bookworm$/m);
    assert.match(await sh(sb, 'ls /dev/virtio-ports/'), /org\.qemu\.guest_agent\.0/);
    assert.equal((await sb.exec('echo out; echo err >&2; exit 3')).exitCode, 3);

    // Files up and down through chronus.
    await sb.files.write('/root/hello.txt', 'from the host');
    assert.equal(await sb.files.read('/root/hello.txt'), 'from the host');
    assert.equal(await sh(sb, 'cat /root/hello.txt'), 'from the host');
    assert.ok((await sb.files.list('/root')).some((f) => f.name === 'hello.txt'));

    // The network: the allowlisted name through the node's policy; nothing else.
    assert.match(await sh(sb, 'cat /etc/resolv.conf'), /^nameserver /m);
    const ok = await sb.exec(get('allowed.test'));
    assert.match(ok.stdout, new RegExp(`hello from ${ALLOWED.replace(/\./g, '\\.')}`), `${ok.exitCode} ${ok.stdout} ${ok.stderr}`);
    assert.doesNotMatch((await sb.exec(get('other.test'))).stdout, /hello/, 'a name the policy does not allow fails');
    assert.doesNotMatch((await sb.exec(get(OTHER))).stdout, /hello/, 'an address nobody allowed fails');
    const gw = /^default via (\d+\.\d+\.\d+\.\d+)/m.exec(await sh(sb, 'ip route'))?.[1];
    assert.ok(gw, 'the guest has a default route');
    assert.doesNotMatch((await sb.exec(get(gw, hostPort))).stdout, /host/, 'host services are unreachable');

    // Its image's root is on NVMe, which QEMU cannot save: a pause to a file is refused naming
    // `memory` and the VM runs on (the desktop image's virtio-blk root can: test/vm-x11.test.ts).
    await assert.rejects(sb.pause({ memory: 'file' }), (err: Error & { code?: string; details?: { field?: string } }) => {
      assert.equal(err.code, 'INVALID_ARGUMENT', err.message);
      assert.equal(err.details?.field, 'memory', err.message);
      return true;
    });
    assert.equal((await sb.info()).state, 'running');
    // Pause stops the vCPUs; resume goes on where it was.
    await sb.pause();
    assert.equal((await sb.info()).state, 'paused');
    await sb.resume();
    assert.equal((await sh(sb, 'cat /root/hello.txt')).trim(), 'from the host');
    // The root file system grew at boot to the disk the spec asked for.
    assert.ok(Number((await sh(sb, 'df -BM --output=size / | tail -1')).replace(/\D/g, '')) > 800, 'root grown to diskMiB (the image is 625 MiB)');
    const stats = await sb.stats();
    assert.ok(stats.memoryBytes > 0 && stats.diskLimitBytes >= 960 * 1024 * 1024, JSON.stringify(stats));

    // A snapshot of its disk: taken running (the guest frozen and stopped only while its overlay
    // is copied), a private snapshot layer over the image; the VM runs on and writes.
    await sb.files.write('/root/snap.txt', 'in the snapshot');
    await sh(sb, 'rm /etc/motd');
    const snapStart = Date.now();
    snapshot = await sb.snapshot();
    process.stderr.write(`vm snapshot (running, ${snapshot.contentBytes} bytes): ${Date.now() - snapStart} ms\n`);
    assert.equal(snapshot.kind, 'snapshot');
    assert.deepEqual(snapshot.snapshot?.parents, [image.digest]);
    assert.equal((await sb.info()).state, 'running');
    assert.equal(await sh(sb, 'echo after > /root/after.txt && sync && cat /root/after.txt'), 'after\n');

    // QEMU is confined: an unprivileged uid, seccomp filter mode, no capabilities, a mount
    // namespace of its own, in the sandbox's cgroup; its disks and firmware come as descriptors.
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
    assert.ok(!cmdline.some((a) => a.includes(tp.home)), 'no host path of the node on its command line');

    // A crashed QEMU: the sandbox is lost and nothing of it is left.
    process.kill(pid, 'SIGKILL');
    await until('sandbox.lost', () => events.some((e) => e.kind === 'sandbox.lost' && e.sandboxId === sb.id));
    await until('the API says lost', async () => (await sb.info()).state === 'lost');
    await until('no QEMU, cgroup, folder, socket folder or namespace left', async () => {
      const dirs = await readdir(`${tp.home}/node/vm`).catch(() => [] as string[]);
      const netns = await readdir('/run/netns').catch(() => [] as string[]);
      return (
        (await qemuPids(sb.id)).length === 0 &&
        (await tp.platform.edge.cgroups.existing(sb.id)).length === 0 &&
        !dirs.includes(sb.id) &&
        !netns.includes(`dsec-${sb.id}`)
      );
    });
    assert.ok(!(await tp.platform.edge.list()).some((s) => s.id === sb.id), 'the edge forgot it');
    await sb.kill();
    made.length = 0;
    assert.deepEqual((await client.nodes.list())[0]!.allocated, allocatedBefore);
  });

  test('a snapshot exported raw (dsec image export), imported back (dsec image import): boots, exec and files through the QEMU guest agent alone', async () => {
    assert.ok(snapshot, 'the first test took a snapshot');
    const dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-vm-export-'));
    try {
      const raw = path.join(dir, 'exported.img');
      await dsec(['image', 'export', snapshot.digest, '--raw', raw]);
      const head = Buffer.alloc(8);
      const fh = await open(raw, 'r');
      await fh.read(head, 0, 8, 512);
      await fh.close();
      assert.equal(head.toString('latin1'), 'EFI PART', 'a GPT disk');
      // One more MiB at the end: another image (its own digest; the same bytes would be the
      // snapshot's layer, labels and all), imported without dsec's labels: an image of any OS,
      // served by its QEMU guest agent.
      await truncate(raw, (await stat(raw)).size + 1024 * 1024);
      const imported = JSON.parse(await dsec(['image', 'import', raw, '--name', 'vm-imported', '--json'])) as Layer;
      assert.equal(imported.kind, 'disk');
      assert.ok(imported.names.includes('vm-imported:latest') || imported.names.includes('vm-imported'), JSON.stringify(imported.names));
      assert.notEqual(imported.digest, image.digest);
      assert.notEqual(imported.digest, snapshot.digest);

      // A qcow2 naming a backing file (a host path) is refused.
      const evil = path.join(dir, 'evil.qcow2');
      await run('qemu-img', ['create', '-q', '-f', 'qcow2', '-F', 'raw', '-b', '/etc/shadow', evil, '1M']);
      const refused = await client.layers.upload(createReadStream(evil), { format: 'disk', name: 'evil' }).then(
        () => undefined,
        (err: unknown) => err as Error,
      );
      assert.match(String(refused), /backing file/);

      const sb = await Sandbox.create({ backend: 'vm', image: { base: 'vm-imported' }, resources: { cpu: 1, memoryMiB: 512 } }, { client });
      made.push(sb);
      const r = await sb.exec('uname -s; echo err >&2; exit 4');
      assert.equal(r.exitCode, 4);
      assert.equal(r.stdout, 'Linux\n');
      assert.equal(r.stderr, 'err\n');
      // The snapshot's disk: the file written before it, the image's file deleted before it,
      // nothing written after it.
      assert.equal(await sb.files.read('/root/snap.txt'), 'in the snapshot');
      assert.equal((await sb.exec('test -e /etc/motd')).exitCode, 1);
      assert.equal((await sb.exec('test -e /root/after.txt')).exitCode, 1);
      await sb.files.write('/root/qga.txt', 'through qemu-ga');
      assert.equal(await sb.files.read('/root/qga.txt'), 'through qemu-ga');
      // What qemu-ga cannot do is refused with the reason.
      const listed = await sb.files.list('/root').then(
        () => undefined,
        (err: unknown) => err as Error,
      );
      assert.match(String(listed), /QEMU guest agent/);
      await sb.kill();
      made.length = 0;
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
