// Adversarial suite: denial of service from inside a sandbox. Fork bombs, memory balloons, disk,
// inode and output floods, and processes that refuse to die with their command. Each must hit
// the sandbox's own limit, leave the sandbox usable (or at least destroyable) and leave the node,
// its other sandboxes and the host untouched.
import assert from 'node:assert/strict';
import { readFile, stat, statfs } from 'node:fs/promises';
import path from 'node:path';
import { after, afterEach, before, describe, test } from 'node:test';
import { KIT, SMALL, destroyAndCheck, expectEvent, hostProcessesNamed, probe, startSecurityNode, uniqueProcessName } from './fixture.js';
import type { SecurityNode } from './fixture.js';

/** Output the agent keeps per stream on this node (small, so that the cap is visible). */
const OUTPUT_CAP_BYTES = 1 << 20;
const MiB = 1 << 20;
/** statfs f_type of a tmpfs. */
const TMPFS_MAGIC = 0x01021994;

let sec: SecurityNode;

before(async () => {
  sec = await startSecurityNode({ outputCapBytes: OUTPUT_CAP_BYTES });
});

after(async () => {
  await sec?.cleanup();
});

afterEach(async () => {
  await sec.verifyContained();
});

/** Polls `fn` until it returns true (state that settles after a kill), failing after a deadline. */
async function eventually(what: string, fn: () => Promise<boolean>, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await fn())) {
    if (Date.now() > deadline) assert.fail(`${what} did not happen`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Host pid of a sandbox's agent (chronus), found through its pids cgroup. */
async function agentHostPid(id: string): Promise<number> {
  const dir = (await sec.edge.cgroups.existing(id)).find((d) => d.includes('/pids/')) ?? (await sec.edge.cgroups.existing(id))[0]!;
  for (const pid of (await readFile(path.join(dir, 'cgroup.procs'), 'utf8')).split('\n').filter(Boolean)) {
    if ((await readFile(`/proc/${pid}/comm`, 'utf8').catch(() => '')).trim() === 'chronus') return Number(pid);
  }
  assert.fail(`no chronus process in ${dir}`);
}

async function rssKiB(pid: number): Promise<number> {
  const m = /^VmRSS:\s+(\d+) kB$/m.exec(await readFile(`/proc/${pid}/status`, 'utf8'));
  return Number(m?.[1] ?? 0);
}

describe('processes', () => {
  test('a fork bomb stops at the pids limit (fork fails with EAGAIN), is killed by its timeout, and the sandbox works afterwards', async (t) => {
    const id = await sec.sandbox({ resources: SMALL });
    try {
      const counted = await sec.kit(id, ['forkbomb', '100000']);
      const bomb = probe(counted, 'forkbomb');
      assert.equal(bomb.result, 'EAGAIN');
      assert.ok(Number(bomb.forked) < SMALL.pids, `forked ${String(bomb.forked)} of at most ${SMALL.pids}`);
      // The classic one, recursive and in the background, until its command's timeout (the
      // shell then spins on a builtin: with the pids limit reached it could not fork a sleep).
      const classic = await sec.edge.exec(id, { argv: ['sh', '-c', 'b() { b | b & }; b; while :; do :; done'], timeoutMs: 2000 });
      assert.equal(classic.timedOut, true);
      await eventually('the bomb is gone', async () => (await sec.edge.stats(id)).pids <= 2);
      const after = await sec.sh(id, 'echo usable');
      assert.equal(after.stdout, 'usable\n');
      await expectEvent(t, sec.events, 'pids.limit-hit', id);
    } finally {
      await sec.edge.destroy(id);
    }
  });

  test('a process that ignores SIGTERM and double-forks outlives its command, inside the sandbox only: SIGTERM and SIGHUP do not stop it, process.survived-command reports it, and it dies with the sandbox', async (t) => {
    const name = uniqueProcessName('surv');
    const id = await sec.sandbox({ resources: SMALL });
    try {
      // Once through a command that exits, once through one killed by its timeout.
      const quick = await sec.kit(id, ['doublefork', name]);
      assert.equal(probe(quick, 'doublefork').result, 'OK');
      assert.equal(quick.exitCode, 0);
      const slow = await sec.edge.exec(id, { cmd: `${KIT} doublefork ${name} >/dev/null; sleep 100`, timeoutMs: 500 });
      assert.equal(slow.timedOut, true);
      const inside = await sec.sh(id, `kill -TERM $(pidof ${name}); kill -HUP $(pidof ${name}); sleep 0.2; pidof ${name} | wc -w`);
      assert.equal(inside.stdout.trim(), '2', 'both survivors ignore SIGTERM and SIGHUP and keep running');
      // What the platform reports: the command has exited, and its survivors are in the sandbox.
      const procs = await sec.edge.processes(id);
      assert.ok(procs.filter((p) => p.argv.includes('doublefork') || p.argv.some((a) => a.includes('doublefork'))).every((p) => p.state === 'exited'));
      assert.equal((await hostProcessesNamed(name)).length, 2, 'the survivors are visible on the host until the sandbox goes');
      await expectEvent(t, sec.events, 'process.survived-command', id);
    } finally {
      await destroyAndCheck(sec, id, [name]);
    }
  });
});

describe('memory', () => {
  test('a memory balloon is OOM-killed inside the sandbox (exec result oomKilled); the agent and the sandbox survive', async (t) => {
    const id = await sec.sandbox({ resources: SMALL });
    try {
      const r = await sec.kit(id, ['balloon', '1024']);
      assert.equal(r.oomKilled, true);
      assert.equal(r.signal, 'SIGKILL');
      assert.ok(!r.stdout.includes('"probe":"balloon"'), 'the balloon never finished');
      const stats = await sec.edge.stats(id);
      assert.ok(stats.oomKills >= 1);
      assert.ok(stats.memoryPeakBytes <= SMALL.memoryMiB * MiB);
      const after = await sec.sh(id, 'echo alive');
      assert.equal(after.stdout, 'alive\n', 'the agent was not the one killed');
      await expectEvent(t, sec.events, 'oom.kill', id);
    } finally {
      await sec.edge.destroy(id);
    }
  });
});

describe('disk', () => {
  test('a disk flood gets ENOSPC at diskMiB; the sandbox can free the space and write again', async () => {
    const id = await sec.sandbox({ resources: SMALL });
    try {
      const r = await sec.kit(id, ['fill', '/root/flood', '1024']);
      const fill = probe(r, 'fill');
      assert.equal(fill.result, 'ENOSPC');
      assert.ok(Number(fill.bytes) <= SMALL.diskMiB * MiB, `wrote ${String(fill.bytes)} bytes`);
      const stats = await sec.edge.stats(id);
      assert.ok(stats.diskUsedBytes <= SMALL.diskMiB * MiB && stats.diskLimitBytes === SMALL.diskMiB * MiB);
      // The flood landed in the sandbox's own tmpfs of diskMiB, never on the host's disk.
      const upper = sec.edge.upperDir(id);
      const fs = await statfs(upper);
      assert.equal(fs.type, TMPFS_MAGIC);
      assert.equal(fs.blocks * fs.bsize, SMALL.diskMiB * MiB);
      assert.equal((await stat(path.join(upper, 'root/flood'))).size, Number(fill.bytes));
      const again = await sec.sh(id, 'rm /root/flood && echo ok > /root/after && cat /root/after');
      assert.equal(again.stdout, 'ok\n');
    } finally {
      await sec.edge.destroy(id);
    }
  });

  test("an inode flood gets ENOSPC within the writable layer's inode budget", async () => {
    const id = await sec.sandbox({ resources: SMALL });
    try {
      const r = await sec.kit(id, ['flood-inodes', '/tmp/inodes', '1000000']);
      const flood = probe(r, 'flood-inodes');
      assert.equal(flood.result, 'ENOSPC');
      assert.ok(Number(flood.files) <= Math.max(1024, SMALL.diskMiB * 256), `created ${String(flood.files)} files`);
      const again = await sec.sh(id, 'rm -rf /tmp/inodes && touch /tmp/after && echo ok');
      assert.equal(again.stdout, 'ok\n');
    } finally {
      await sec.edge.destroy(id);
    }
  });

  test("/dev/shm is counted in the sandbox's memory: what a sandbox keeps there shows in its memory use, and goes when removed", async () => {
    // /dev/shm is inside diskMiB: room for the 40 MiB.
    const id = await sec.sandbox({ resources: { ...SMALL, memoryMiB: 128, diskMiB: 64 } });
    try {
      const before = (await sec.edge.stats(id)).memoryBytes;
      const r = await sec.kit(id, ['fill', '/dev/shm/kept', '40']);
      assert.equal(probe(r, 'fill').result, 'OK', r.stdout);
      const held = (await sec.edge.stats(id)).memoryBytes;
      // The writer has exited: only the tmpfs pages can hold this much in the sandbox's cgroup.
      assert.ok(held - before >= 32 * MiB, `memory use went from ${before} to ${held} bytes with 40 MiB in /dev/shm`);
      await sec.sh(id, 'rm -f /dev/shm/kept');
      const freed = (await sec.edge.stats(id)).memoryBytes;
      assert.ok(held - freed >= 32 * MiB, `memory use went from ${held} to ${freed} bytes after removing the file`);
    } finally {
      await sec.edge.destroy(id);
    }
  });

  test("/dev and /dev/shm are folders of the writable layer's tmpfs: a flood of either stops at diskMiB and shows in the sandbox's disk use", async () => {
    const id = await sec.sandbox({ resources: SMALL });
    try {
      for (const file of ['/dev/shm/flood', '/dev/flood']) {
        const r = await sec.kit(id, ['fill', file, '1024']);
        assert.equal(probe(r, 'fill').result, 'ENOSPC', `${file}: ${r.stdout} oomKilled=${r.oomKilled}`);
        const { diskUsedBytes, diskLimitBytes } = await sec.edge.stats(id);
        assert.ok(diskUsedBytes >= diskLimitBytes - 2 * MiB, `${file}: ${diskUsedBytes} of ${diskLimitBytes} bytes used when full`);
        await sec.sh(id, `rm -f ${file}`);
      }
      const after = await sec.sh(id, 'echo alive');
      assert.equal(after.stdout, 'alive\n');
    } finally {
      await sec.edge.destroy(id);
    }
  });
});

describe('output', () => {
  test('an output flood through exec is capped: the result holds maxOutputBytes, says truncated, counts every byte, and edge memory stays bounded', async () => {
    const id = await sec.sandbox({ resources: SMALL });
    const floodBytes = 256 * MiB;
    const cap = MiB;
    const rssBefore = process.memoryUsage().rss;
    let rssPeak = rssBefore;
    const sampler = setInterval(() => (rssPeak = Math.max(rssPeak, process.memoryUsage().rss)), 20);
    try {
      const r = await sec.edge.exec(id, { argv: [KIT, 'flood', String(floodBytes)] }, { maxOutputBytes: cap });
      assert.equal(r.exitCode, 0);
      assert.equal(r.truncated, true);
      assert.equal(r.stdout.length, cap);
      assert.equal(r.stdoutBytes, floodBytes, 'the agent counted every byte');
    } finally {
      clearInterval(sampler);
      await sec.edge.destroy(id);
    }
    const growthMiB = (rssPeak - rssBefore) / MiB;
    assert.ok(growthMiB < 96, `edge grew by ${growthMiB.toFixed(0)} MiB while ${floodBytes / MiB} MiB went through it`);
  });

  test('gigabytes of output nobody reads are capped in the agent: it keeps the last output-cap bytes, reports the loss as a gap, and its memory stays bounded', async () => {
    const id = await sec.sandbox({ resources: SMALL });
    const floodBytes = 4 * 1024 * MiB;
    try {
      const att = await sec.edge.spawn(id, { argv: [KIT, 'flood', String(floodBytes)] });
      await att.detach();
      const exit = await (await sec.edge.agent(id)).wait(att.pid);
      assert.equal(exit.exitCode, 0);
      assert.equal(exit.stdoutBytes, floodBytes);
      const agentRssMiB = (await rssKiB(await agentHostPid(id))) / 1024;
      assert.ok(agentRssMiB < OUTPUT_CAP_BYTES / MiB + 16, `the agent holds ${agentRssMiB.toFixed(1)} MiB after ${floodBytes / MiB} MiB of output`);
      const reread = await sec.edge.attach(id, att.pid);
      let gap = 0;
      let data = 0;
      for await (const ev of reread) {
        if (ev.kind === 'gap') gap += ev.bytes;
        else data += ev.data.length;
      }
      assert.equal(gap, floodBytes - OUTPUT_CAP_BYTES, 'the loss is reported');
      assert.equal(data, OUTPUT_CAP_BYTES, 'the last output-cap bytes are kept');
      assert.equal((await sec.edge.stats(id)).oomKills, 0);
    } finally {
      await sec.edge.destroy(id);
    }
  });
});
