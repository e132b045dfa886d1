// End-to-end tests of the edge core: real crun sandboxes on EROFS layers with chronus as PID 1.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdir, mkdtemp, readFile, rm, stat, symlink, writeFile, readdir } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import { collectOutput, runDirFor, runGuestStep } from '@dsec/edge';
import { isDsecError } from '@dsec/protocol';
import type { LayerInfo } from '@dsec/protocol';
import { parsed, startNode } from './helpers/node.js';
import type { TestNode } from './helpers/node.js';
import { tarOf } from './helpers/assert.js';

let node: TestNode;
let workspace: LayerInfo;
let scratch: string;

before(async () => {
  node = await startNode();
  scratch = await mkdtemp(path.join(os.tmpdir(), 'dsec-scratch-'));
  await node.edge.layers.build({ type: 'busybox' }, { kind: 'base', name: 'busybox' });
  const ws = path.join(scratch, 'ws');
  await mkdir(path.join(ws, 'project/tests'), { recursive: true });
  await writeFile(path.join(ws, 'project/README'), 'workspace readme\n');
  await writeFile(path.join(ws, 'project/tests/test.sh'), '#!/bin/sh\necho tests-pass\n', { mode: 0o755 });
  await writeFile(path.join(ws, 'project/shadowed'), 'from workspace\n');
  workspace = await node.edge.layers.build({ type: 'dir', path: ws }, { kind: 'workspace', name: 'ws-test' });
  await node.edge.layers.build(
    {
      type: 'tar',
      stream: Readable.from([await tarOf({ 'opt/tool/bin/hello': '#!/bin/sh\necho hello from toolkit\n', 'project/shadowed': 'from toolkit\n' }, 0o755)]),
    },
    { kind: 'toolkit', name: 'tool-test' },
  );
});

after(async () => {
  await node?.cleanup();
  await rm(scratch, { recursive: true, force: true });
});

const image = () => ({ base: 'busybox', workspace: 'ws-test', toolkits: ['tool-test'] });

describe('container sandboxes', () => {
  test('layers stack with the right precedence; writes stay in the sandbox, out of the layers and the host mount table', async () => {
    const sb = await node.edge.create({ image: image() });
    try {
      const r = await node.edge.exec(sb.id, { cmd: 'cat /project/README /project/shadowed && /opt/tool/bin/hello && /project/tests/test.sh' });
      assert.equal(r.exitCode, 0, r.stderr);
      assert.equal(r.stdout, 'workspace readme\nfrom toolkit\nhello from toolkit\ntests-pass\n');
      const w = await node.edge.exec(sb.id, { cmd: 'echo changed > /project/README && rm /bin/ls && echo new > /root/new' });
      assert.equal(w.exitCode, 0, w.stderr);
      const changed = await node.edge.exec(sb.id, { cmd: 'cat /project/README /root/new; ls /bin/ls 2>&1' });
      assert.equal(changed.stdout, 'changed\nnew\nls: /bin/ls: No such file or directory\n');
      // The overlay root lives in the sandbox's own mount namespace; the host's table holds only
      // its writable tmpfs, whose upper directory edge reads (deletions are whiteouts: 0/0 char devices).
      const hostMounts = (await readFile('/proc/self/mountinfo', 'utf8')).split('\n').filter((l) => l.includes(sb.id));
      assert.equal(hostMounts.length, 1, hostMounts.join('\n'));
      assert.match(hostMounts[0]!, / - tmpfs /);
      const upper = node.edge.upperDir(sb.id);
      assert.equal(await readFile(path.join(upper, 'project/README'), 'utf8'), 'changed\n');
      const whiteout = await stat(path.join(upper, 'bin/ls'));
      assert.ok(whiteout.isCharacterDevice() && whiteout.rdev === 0, 'a deleted file is a whiteout in the upper directory');
      const layerDir = path.join(node.home, 'layers/mnt', workspace.digest.replace('sha256:', ''));
      assert.equal(await readFile(path.join(layerDir, 'project/README'), 'utf8'), 'workspace readme\n', 'the layer itself is unchanged');
      // The shared layer mount is untouched.
      const other = await node.edge.create({ image: image() });
      try {
        const o = await node.edge.exec(other.id, { cmd: 'cat /project/README; ls /bin/ls' });
        assert.equal(o.stdout, 'workspace readme\n/bin/ls\n');
      } finally {
        await node.edge.destroy(other.id);
      }
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('exec: exit codes, stdin, env, cwd, signals and timeouts', async () => {
    const sb = await node.edge.create({ image: { base: 'busybox' }, env: { FROM_SANDBOX: 'yes' } });
    try {
      assert.equal((await node.edge.exec(sb.id, { argv: ['sh', '-c', 'exit 7'] })).exitCode, 7);
      const cat = await node.edge.exec(sb.id, { argv: ['cat'], stdin: 'piped input' });
      assert.equal(cat.stdout, 'piped input');
      const env = await node.edge.exec(sb.id, { cmd: 'echo $FROM_SANDBOX $MINE; pwd', env: { MINE: 'ok' }, cwd: '/tmp' });
      assert.equal(env.stdout, 'yes ok\n/tmp\n');
      const user = await node.edge.exec(sb.id, { argv: ['id', '-u'], uid: 65534, gid: 65534 });
      assert.equal(user.stdout.trim(), '65534');
      const err = await node.edge.exec(sb.id, { cmd: 'echo oops >&2; exit 3' });
      assert.deepEqual([err.exitCode, err.stderr], [3, 'oops\n']);
      const slow = await node.edge.exec(sb.id, { argv: ['sleep', '30'], timeoutMs: 300 });
      assert.equal(slow.timedOut, true);
      assert.equal(slow.signal, 'SIGKILL');
      assert.equal(slow.exitCode, null);
      const handle = await node.edge.spawn(sb.id, { argv: ['sleep', '30'] });
      await handle.kill('SIGTERM');
      const exit = await handle.exited;
      assert.equal(exit.signal, 'SIGTERM');
      await assert.rejects(node.edge.exec(sb.id, { argv: ['/no/such/binary'] }), (e: unknown) => isDsecError(e, 'FILE_NOT_FOUND'));
      await assert.rejects(
        async () => node.edge.exec(sb.id, parsed.exec({ cwd: 'relative', cmd: 'true' })),
        (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT'),
      );
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('100 MB of output through one command arrives complete', async () => {
    const sb = await node.edge.create({ image: { base: 'busybox' } });
    try {
      const handle = await node.edge.spawn(sb.id, { cmd: 'i=0; while [ $i -lt 100 ]; do head -c 1000000 /dev/urandom; i=$((i+1)); done | tee /tmp/out' });
      const hash = createHash('md5');
      let bytes = 0;
      let expectOffset = 0;
      for await (const ev of handle) {
        assert.equal(ev.kind, 'data');
        if (ev.kind !== 'data' || ev.stream !== 'stdout') continue;
        assert.equal(ev.offset, expectOffset);
        expectOffset += ev.data.length;
        bytes += ev.data.length;
        hash.update(ev.data);
      }
      const exit = await handle.exited;
      assert.equal(exit.exitCode, 0);
      assert.equal(bytes, 100_000_000);
      assert.equal(exit.stdoutBytes, 100_000_000);
      const inside = await node.edge.exec(sb.id, { cmd: 'md5sum < /tmp/out' });
      assert.equal(inside.stdout.split(' ')[0], hash.digest('hex'));
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('20 concurrent commands in one sandbox', async () => {
    const sb = await node.edge.create({ image: { base: 'busybox' } });
    try {
      const results = await Promise.all(Array.from({ length: 20 }, (_, i) => node.edge.exec(sb.id, { cmd: `sleep 0.2; echo ${i}; exit ${i}` })));
      results.forEach((r, i) => {
        assert.equal(r.exitCode, i);
        assert.equal(r.stdout, `${i}\n`);
      });
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('50 sandboxes at once', async () => {
    const ids: string[] = [];
    try {
      const created = await Promise.all(
        Array.from({ length: 50 }, () => node.edge.create({ image: { base: 'busybox' }, resources: { memoryMiB: 64, diskMiB: 16 } })),
      );
      ids.push(...created.map((s) => s.id));
      const outs = await Promise.all(ids.map((id) => node.edge.exec(id, { cmd: 'hostname; echo $$' })));
      for (const o of outs) assert.equal(o.stdout, `sandbox\n${o.stdout.split('\n')[1]}\n`);
      assert.equal(new Set(ids).size, 50);
    } finally {
      await Promise.all(ids.map((id) => node.edge.destroy(id)));
    }
  });

  test('an edge restart does not disturb a running command; output is read on from an offset', async () => {
    const sb = await node.edge.create({ image: { base: 'busybox' } });
    try {
      const handle = await node.edge.spawn(sb.id, { cmd: 'for i in 1 2 3 4 5 6 7 8; do echo line$i; sleep 0.15; done' });
      let seen = '';
      for await (const ev of handle) {
        if (ev.kind === 'data') seen += ev.data.toString();
        if (seen.includes('line2')) break;
      }
      const offset = Buffer.byteLength(seen);
      const edge = await node.restart();
      assert.deepEqual(
        (await edge.list()).map((s) => s.id),
        [sb.id],
      );
      const procs = await edge.processes(sb.id);
      const proc = procs.find((p) => p.state === 'running');
      assert.ok(proc, 'the command is still running after the restart');
      const again = await edge.attach(sb.id, proc.pid, { stdout: offset });
      let rest = '';
      for await (const ev of again) if (ev.kind === 'data') rest += ev.data.toString();
      const exit = await again.exited;
      assert.equal(exit.exitCode, 0);
      assert.equal(seen + rest, [1, 2, 3, 4, 5, 6, 7, 8].map((i) => `line${i}\n`).join(''));
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('limits: memory gives an OOM kill, pids stops fork, disk gives ENOSPC', async () => {
    const sb = await node.edge.create({ image: { base: 'busybox' }, resources: { memoryMiB: 32, pids: 16, diskMiB: 8 } });
    try {
      const oom = await node.edge.exec(sb.id, { argv: ['tail', '-c', '100m', '/dev/zero'] });
      assert.equal(oom.signal, 'SIGKILL', JSON.stringify(oom));
      assert.equal(oom.oomKilled, true);
      const inPipe = await node.edge.exec(sb.id, { cmd: 'head -c 200m /dev/zero | tail -c 100m > /dev/null' });
      // The kernel picks the victim: tail (the shell then exits 137) or, under memory pressure
      // from elsewhere, the shell itself (killed by the signal).
      assert.ok(inPipe.exitCode === 137 || inPipe.signal === 'SIGKILL', JSON.stringify(inPipe));
      assert.equal(inPipe.oomKilled, true);
      const fork = await node.edge.exec(sb.id, { cmd: 'for i in $(seq 1 40); do sleep 5 & done; wait; echo done' });
      assert.match(fork.stderr, /can't fork|Resource temporarily unavailable|fork/i);
      await node.edge.exec(sb.id, { cmd: 'pkill sleep; true' });
      const disk = await node.edge.exec(sb.id, { cmd: 'dd if=/dev/zero of=/root/big bs=1M count=20' });
      assert.notEqual(disk.exitCode, 0);
      assert.match(disk.stderr, /No space left on device/);
      const stats = await node.edge.stats(sb.id);
      assert.ok(stats.diskUsedBytes > 0 && stats.diskUsedBytes <= 8 * 1024 * 1024);
      assert.equal(stats.memoryLimitBytes, 32 * 1024 * 1024);
      assert.equal(stats.pidsLimit, 16);
      assert.ok(stats.oomKills >= 1);
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('a sandbox has six superblocks of its own: /dev and /dev/shm are folders of its writable tmpfs (inside its disk limit), masked directories bind an empty directory of that tmpfs', async () => {
    const sb = await node.edge.create({ image: { base: 'busybox' }, resources: { diskMiB: 16 } });
    try {
      const run = (cmd: string) => node.edge.exec(sb.id, { cmd });
      const devices = await run('echo x > /dev/null && head -c 3 /dev/zero | wc -c && stat -c %a /dev/shm /dev && ls /dev/pts/ptmx');
      assert.equal(devices.stdout, '3\n1777\n755\n/dev/pts/ptmx\n', devices.stderr);
      const masked = await run(
        'for d in /proc/acpi /sys/firmware /sys/fs/cgroup; do ls -A $d | wc -l; done; touch /sys/firmware/x 2>/dev/null || echo refused',
      );
      assert.equal(masked.stdout, '0\n0\n0\nrefused\n', 'masked directories are empty and read-only');
      const before = (await node.edge.stats(sb.id)).diskUsedBytes;
      assert.equal((await run('dd if=/dev/zero of=/dev/shm/kept bs=1M count=4 2>/dev/null')).exitCode, 0);
      const used = (await node.edge.stats(sb.id)).diskUsedBytes;
      assert.ok(used - before >= 4 * 1024 * 1024, `disk use went from ${before} to ${used} bytes with 4 MiB in /dev/shm`);
      // Beside the upper directory, not in it: snapshots and diffs do not see /dev.
      const upper = node.edge.upperDir(sb.id);
      assert.equal(await stat(path.join(upper, 'dev/shm/kept')).catch(() => 'absent'), 'absent');
      assert.equal((await stat(path.join(upper, '../dev/shm/kept'))).size, 4 * 1024 * 1024);
      const flood = await run('dd if=/dev/zero of=/dev/flood bs=1M count=32');
      assert.notEqual(flood.exitCode, 0);
      assert.match(flood.stderr, /No space left/);
      // Its own file systems: those of its PID 1's mountinfo that the host's lacks (the agent's
      // tmpfs, the layers and devtmpfs are shared), plus the writable tmpfs on the host.
      const pid = (await readFile(`/sys/fs/cgroup/memory/${node.cgroupParent}/${sb.id}/cgroup.procs`, 'utf8')).split('\n')[0];
      const fields = (line: string) => [line.split(' ')[2], line.split(' - ')[1]?.split(' ')[0]];
      const host = new Set((await readFile('/proc/self/mountinfo', 'utf8')).split('\n').map((l) => fields(l)[0]));
      const mountinfo = (await readFile(`/proc/${pid}/mountinfo`, 'utf8')).split('\n');
      const own = new Map(mountinfo.filter((l) => l && !host.has(fields(l)[0])).map(fields) as Array<[string, string]>);
      assert.deepEqual([...own.values()].sort(), ['devpts', 'mqueue', 'overlay', 'proc', 'sysfs']);
      // The masked directory binds the sandbox's own empty folder (no other sandbox's opens or locks
      // show there): the superblock of its /dev, at /mask.
      const at = (point: string) => mountinfo.find((l) => l.split(' ')[4] === point)?.split(' ');
      assert.deepEqual(at('/sys/firmware')?.slice(2, 4), [at('/dev')?.[2], '/mask']);
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('hardening: masked /proc, no cgroupfs, seccomp, no capabilities beyond the default set, agent not dumpable', async () => {
    const sb = await node.edge.create({ image: { base: 'busybox' } });
    try {
      const run = (cmd: string) => node.edge.exec(sb.id, { cmd });
      assert.equal((await run('cat /proc/kpagecgroup | head -c 1 | wc -c')).stdout.trim(), '0');
      assert.equal((await run('ls /sys/fs/cgroup | wc -l')).stdout.trim(), '0');
      assert.notEqual((await run('unshare -U true')).exitCode, 0);
      assert.notEqual((await run('mount -t tmpfs none /mnt')).exitCode, 0);
      assert.notEqual((await run('cat /proc/1/environ')).exitCode, 0);
      assert.equal((await run('readlink /proc/1/fd/3 || echo denied')).stdout, 'denied\n');
      assert.notEqual((await run('cat /proc/1/maps')).exitCode, 0);
      assert.notEqual((await run('echo x > /.dsec/chronus')).exitCode, 0);
      assert.notEqual((await run('mknod /tmp/sda b 8 0')).exitCode, 0);
      assert.equal((await run('ip link 2>/dev/null | grep -c mtu || cat /proc/net/dev | tail -n +3 | wc -l')).stdout.trim(), '1');
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('seccomp compiled once per profile: a later create hands crun the program crun made, and its filter is on', async () => {
    const first = await node.edge.create({ image: { base: 'busybox' } });
    const second = await node.edge.create({ image: { base: 'busybox' } });
    try {
      const crunRoot = path.join(runDirFor(node.home), 'crun');
      const compiled = await readFile(path.join(crunRoot, first.id, 'seccomp.bpf'));
      assert.ok(compiled.length > 0 && compiled.length % 8 === 0);
      const config = JSON.parse(await readFile(path.join(node.home, 'sandboxes', second.id, 'config.json'), 'utf8')) as {
        annotations?: Record<string, string>;
        linux: { seccomp: { flags: string[] } };
      };
      assert.equal(config.annotations?.['run.oci.seccomp_bpf_data'], compiled.toString('base64'));
      // crun still takes the flags (LOG: refusals become audit records) from the section.
      assert.deepEqual(config.linux.seccomp.flags, ['SECCOMP_FILTER_FLAG_LOG']);
      assert.deepEqual(await readFile(path.join(crunRoot, second.id, 'seccomp.bpf')), compiled);
      const status = (await node.edge.exec(second.id, { cmd: 'grep -E "^(Seccomp|Seccomp_filters):" /proc/self/status' })).stdout;
      assert.match(status, /^Seccomp:\t2$/m);
      assert.match(status, /^Seccomp_filters:\t1$/m);
    } finally {
      await node.edge.destroy(first.id);
      await node.edge.destroy(second.id);
    }
  });

  test('agent: a pty, no inherited fds, rlimits, CPU quota, orphans reaped', async () => {
    const sb = await node.edge.create({ image: { base: 'busybox' }, resources: { cpu: 0.5, openFiles: 1024 } });
    try {
      const pty = await node.edge.exec(sb.id, { cmd: 'tty; stty size; echo $TERM', pty: { rows: 33, cols: 99 } });
      assert.equal(pty.stdout.replace(/\r/g, ''), '/dev/pts/0\n33 99\nxterm\n');
      const fds = await node.edge.exec(sb.id, { cmd: 'ls /proc/self/fd' });
      assert.deepEqual(fds.stdout.trim().split(/\s+/).map(Number).sort(), [0, 1, 2, 3], 'only stdio (and ls own dir fd)');
      assert.equal((await node.edge.exec(sb.id, { cmd: 'ulimit -n' })).stdout.trim(), '1024');
      const quota = await readFile(`/sys/fs/cgroup/cpu/${node.cgroupParent}/${sb.id}/cpu.cfs_quota_us`, 'utf8').catch(() => '');
      if (node.edge.cgroups.mode !== 'v2') assert.equal(quota.trim(), '50000');
      await node.edge.exec(sb.id, { cmd: 'for i in 1 2 3 4 5; do (sleep 0.05 &) ; done; true' });
      await new Promise((r) => setTimeout(r, 300));
      const zombies = await node.edge.exec(sb.id, { cmd: "ps -o stat | grep -c '^Z' || true" });
      assert.equal(zombies.stdout.trim(), '0', 'PID 1 reaps orphans');
      const oom = (await node.edge.exec(sb.id, { cmd: 'cat /proc/1/oom_score_adj /proc/self/oom_score_adj' })).stdout.split('\n').map(Number);
      assert.equal(oom[1], 500);
      assert.ok(oom[0]! < oom[1], 'the agent is the OOM killer last choice in its sandbox');
      const kill1 = await node.edge.exec(sb.id, { cmd: 'kill -TERM 1; kill -INT 1; kill -HUP 1; sleep 0.2; echo alive' });
      assert.equal(kill1.stdout, 'alive\n');
      assert.equal((await node.edge.exec(sb.id, { argv: ['true'] })).exitCode, 0, 'kill 1 from inside does not stop the sandbox');
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('best-effort sandboxes run under SCHED_IDLE with a low CPU weight', async () => {
    const be = await node.edge.create({ image: { base: 'busybox' }, resources: { cpuClass: 'best-effort' } });
    const ls = await node.edge.create({ image: { base: 'busybox' } });
    try {
      const policy = async (id: string) => (await node.edge.exec(id, { cmd: "grep '^policy' /proc/self/sched | tr -dc 0-9" })).stdout;
      assert.equal(await policy(be.id), '5', 'SCHED_IDLE');
      assert.equal(await policy(ls.id), '0', 'SCHED_OTHER');
      if (node.edge.cgroups.mode !== 'v2') {
        assert.equal((await readFile(`/sys/fs/cgroup/cpu/${node.cgroupParent}/${be.id}/cpu.shares`, 'utf8')).trim(), '2');
      }
    } finally {
      await node.edge.destroy(be.id);
      await node.edge.destroy(ls.id);
    }
  });

  test("a snapshot's step in a guest (the runner microVMs and VMs share) that does not end is killed, TIMEOUT naming it; a stream lives while it writes its product, up to a total bound", async () => {
    const sb = await node.edge.create({ image: image() });
    try {
      const agent = await node.edge.agent(sb.id);
      const step = { id: sb.id, shell: ['/bin/sh'], consume: collectOutput };
      // A step that never ends: what a guest whose root stopped `sync` or `fsfreeze` gives.
      const t0 = Date.now();
      await assert.rejects(
        runGuestStep(agent, { ...step, step: 'freeze', script: 'echo $$ > /tmp/step.pid; exec sleep 600', timeoutMs: 1000 }),
        (err) => isDsecError(err) && err.code === 'TIMEOUT' && /the snapshot's freeze step did not end in the guest within 1000 ms/.test(err.message),
      );
      assert.ok(Date.now() - t0 < 15_000, 'an answer, not a hang');
      const pid = (await node.edge.exec(sb.id, { cmd: 'cat /tmp/step.pid' })).stdout.trim();
      assert.match(pid, /^\d+$/);
      const until = Date.now() + 10_000;
      while ((await node.edge.exec(sb.id, { cmd: `kill -0 ${pid}` })).exitCode === 0) {
        assert.ok(Date.now() < until, `the step's process ${pid} was killed`);
        await new Promise((r) => setTimeout(r, 100));
      }
      // A stream (the tar of a layer) is bounded by its silence, not its length; any other step by its length.
      const ticking = 'for i in 1 2 3 4 5 6; do echo $i; sleep 0.5; done';
      const out = await runGuestStep(agent, { ...step, step: 'tar', script: ticking, bound: 'idle', timeoutMs: 2000 });
      assert.equal(out.toString(), '1\n2\n3\n4\n5\n6\n');
      await assert.rejects(
        runGuestStep(agent, { ...step, step: 'thaw', script: ticking, timeoutMs: 2000 }),
        (err) => isDsecError(err) && err.code === 'TIMEOUT',
      );
      // The guest's stderr does not keep a stream alive, and a stream that never stops writing
      // ends at its total bound.
      const trickle = 'while :; do echo . >&2; sleep 0.2; done';
      await assert.rejects(
        runGuestStep(agent, { ...step, step: 'tar', script: trickle, bound: 'idle', timeoutMs: 1000 }),
        (err) => isDsecError(err) && err.code === 'TIMEOUT' && /wrote nothing/.test(err.message),
      );
      const endless = 'while :; do echo .; sleep 0.2; done';
      await assert.rejects(
        runGuestStep(agent, { ...step, step: 'tar', script: endless, bound: 'idle', timeoutMs: 1000, totalMs: 2000 }),
        (err) => isDsecError(err) && err.code === 'TIMEOUT' && /did not end in the guest within 2000 ms/.test(err.message),
      );
      await assert.rejects(
        runGuestStep(agent, { ...step, step: 'freeze', script: 'echo "no writable disk" >&2; exit 3' }),
        (err) => isDsecError(err) && err.code === 'BACKEND_FAILED' && /freeze step failed in the guest \(exit 3\): no writable disk/.test(err.message),
      );
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('output beyond the kept buffer is reported as a gap, never dropped silently', async () => {
    const small = await startNode({ outputCapBytes: 65536 });
    try {
      await small.edge.layers.build({ type: 'busybox' }, { kind: 'base', name: 'busybox' });
      const sb = await small.edge.create({ image: { base: 'busybox' } });
      const handle = await small.edge.spawn(sb.id, { cmd: 'head -c 1000000 /dev/zero; echo end' });
      await handle.detach();
      const exit = await (await small.edge.agent(sb.id)).wait(handle.pid);
      assert.equal(exit.stdoutBytes, 1_000_004);
      const again = await small.edge.attach(sb.id, handle.pid, { stdout: 0 });
      const events = [];
      for await (const ev of again) events.push(ev);
      const gap = events.find((e) => e.kind === 'gap');
      assert.ok(gap && gap.kind === 'gap' && gap.offset === 0 && gap.bytes > 0, 'the lost bytes are reported');
      const held = events.filter((e) => e.kind === 'data').reduce((n, e) => n + (e.kind === 'data' ? e.data.length : 0), 0);
      assert.equal(gap.bytes + held, 1_000_004, 'lost + held = everything the command wrote');
      assert.ok(held <= 65536);
    } finally {
      await small.cleanup();
    }
  });

  test('files: write, read ranges, list, stat, mkdir, rename, remove', async () => {
    const sb = await node.edge.create({ image: { base: 'busybox' } });
    try {
      const big = Buffer.alloc(3 * 1024 * 1024 + 17, 7);
      await node.edge.mkdir(sb.id, '/work/a/b');
      await node.edge.writeFile(sb.id, '/work/a/b/big.bin', big);
      assert.deepEqual(await node.edge.readFile(sb.id, '/work/a/b/big.bin'), big);
      assert.deepEqual(await node.edge.readFile(sb.id, '/work/a/b/big.bin', { offset: 1024 * 1024 - 2, length: 5 }), big.subarray(0, 5));
      const st = await node.edge.stat(sb.id, '/work/a/b/big.bin');
      assert.equal(st.type, 'file');
      assert.equal(st.size, big.length);
      await node.edge.symlink(sb.id, '/work/link', 'a/b/big.bin');
      const link = await node.edge.stat(sb.id, '/work/link');
      assert.deepEqual([link.type, link.linkTarget], ['symlink', 'a/b/big.bin']);
      await node.edge.remove(sb.id, '/work/link');
      await node.edge.rename(sb.id, '/work/a/b/big.bin', '/work/a/moved');
      assert.deepEqual((await node.edge.listDir(sb.id, '/work/a')).map((e) => [e.name, e.type]).sort(), [
        ['b', 'dir'],
        ['moved', 'file'],
      ]);
      await node.edge.remove(sb.id, '/work', { recursive: true });
      await assert.rejects(node.edge.stat(sb.id, '/work'), (e: unknown) => isDsecError(e, 'FILE_NOT_FOUND'));
      const seen = await node.edge.exec(sb.id, { cmd: 'ls /work 2>&1 || echo gone' });
      assert.match(seen.stdout, /gone/);
    } finally {
      await node.edge.destroy(sb.id);
    }
  });

  test('destroy leaves no mount, cgroup or process; bad specs create nothing', async () => {
    const sb = await node.edge.create({ image: { base: 'busybox' } });
    const r = await node.edge.exec(sb.id, { cmd: 'sleep 1000 & echo $!' });
    assert.equal(r.exitCode, 0);
    await node.edge.destroy(sb.id);
    const mounts = await readFile('/proc/self/mountinfo', 'utf8');
    assert.ok(!mounts.includes(sb.id), 'no mount of the sandbox is left');
    assert.deepEqual(await node.edge.cgroups.existing(sb.id), []);
    assert.deepEqual(await readdir(path.join(node.home, 'sandboxes')), []);
    const ps = await readdir('/proc');
    for (const pid of ps.filter((p) => /^\d+$/.test(p))) {
      const cmdline = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '');
      // Exactly `sleep 1000`: other processes on the host (a `sleep 1000000`) are not the sandbox's.
      assert.ok(cmdline !== 'sleep\u00001000\u0000', 'no process of the sandbox is left');
    }
    await assert.rejects(node.edge.create({ image: { base: 'no-such-layer' } }), (e: unknown) => isDsecError(e, 'LAYER_NOT_FOUND'));
    await assert.rejects(
      async () => node.edge.create(parsed.sandbox({ image: { base: 'busybox' }, resources: { memoryMiB: -1 } })),
      (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT') && e.details.field === 'resources.memoryMiB',
    );
    await assert.rejects(
      async () => node.edge.create(parsed.sandbox({ image: {} })),
      (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT') && e.details.field === 'image.base',
    );
    // An image whose /dev is a symbolic link cannot be a root: the caller's error, naming image.
    const devLink = path.join(scratch, 'dev-link');
    await mkdir(devLink);
    await symlink('tmp', path.join(devLink, 'dev'));
    await node.edge.layers.build({ type: 'dir', path: devLink }, { kind: 'toolkit', name: 'dev-link' });
    await assert.rejects(
      node.edge.create({ image: { base: 'busybox', toolkits: ['dev-link'] } }),
      (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT') && e.details.field === 'image' && /\/dev is a symbolic link/.test(e.message),
    );
    assert.deepEqual(await readdir(path.join(node.home, 'sandboxes')), []);
    assert.deepEqual(await node.edge.list(), []);
  });

  test('an image without /dev gets one owned by the sandbox root', async () => {
    const bare = path.join(scratch, 'bare');
    await mkdir(path.join(bare, 'etc'), { recursive: true });
    await node.edge.layers.build({ type: 'dir', path: bare }, { kind: 'base', name: 'bare' });
    const sb = await node.edge.create({ image: { base: 'bare' } });
    try {
      const dev = await stat(path.join(node.edge.upperDir(sb.id), 'dev'));
      const range = node.edge.idRange(sb.id);
      assert.ok(range, 'the test node runs sandboxes in user namespaces');
      assert.deepEqual([dev.uid, dev.gid], [range.uid, range.gid]);
    } finally {
      await node.edge.destroy(sb.id);
    }
  });
});
