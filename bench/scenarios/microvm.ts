// MicroVMs beside containers: boot to first exec, exec round trip and idle host memory of a
// `backend: "microvm"` sandbox, next to the container backend and to the floor, a plain
// `qemu-system-x86_64 -M microvm` boot of the same kernel and initramfs to chronus's first
// answer (no disks, no API). Under TCG the figures say nothing about KVM (see
// docs/benchmarks.md). Run it by name (`--only microvm`): each boot is seconds of CPU under TCG.
import { readdir, readFile, stat } from 'node:fs/promises';
import path from 'node:path';
import { startPlatform } from '@dsec/apiserver';
import type { Platform } from '@dsec/apiserver';
import { bootOnce, DEFAULT_GUEST_CACHE, prepareGuest, probeAccel } from '@dsec/edge';
import { DsecClient, Sandbox } from '@dsec/sdk';
import { onCleanup } from '../lib/cleanup.js';
import { AGENT_BINARY } from '../lib/platform.js';
import { latencyRow } from '../lib/report.js';
import type { Scenario, ScenarioContext } from '../lib/scenario.js';
import { nowMs, progress, summarize } from '../lib/stats.js';

const RESOURCES = { cpu: 1, memoryMiB: 256, diskMiB: 256 } as const;

/** A field (`VmRSS`, `RssAnon`) of the QEMU process whose command line names the sandbox (KiB). */
async function qemuRssKiB(id: string, field = 'VmRSS'): Promise<number | undefined> {
  for (const e of await readdir('/proc')) {
    if (!/^\d+$/.test(e)) continue;
    const cmd = await readFile(`/proc/${e}/cmdline`, 'utf8').catch(() => '');
    if (!cmd.startsWith('qemu-system') || !cmd.includes(id)) continue;
    const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(await readFile(`/proc/${e}/status`, 'utf8'));
    return m ? Number(m[1]) : undefined;
  }
  return undefined;
}

/** Guest memory held and then freed in {@link measureGivenBack}, MiB (tmpfs: under half of RAM). */
const HOLD_MIB = 112;

/**
 * Idle memory given back (free page reporting): QEMU's anonymous resident memory of an idle
 * microVM, while its guest holds HOLD_MIB in tmpfs, and once the file is removed and the
 * guest's balloon driver has reported the free blocks (polled until it stops falling, 30 s at
 * most), with the time that took.
 */
async function measureGivenBack(ctx: ScenarioContext, client: DsecClient, rounds: number): Promise<void> {
  const system = 'dsec microvm';
  const idle: number[] = [];
  const holding: number[] = [];
  const freed: number[] = [];
  const backMs: number[] = [];
  const fileCache: number[] = [];
  const anon = async (id: string): Promise<number> => ((await qemuRssKiB(id, 'RssAnon')) ?? NaN) / 1024;
  for (let i = 0; i < rounds; i++) {
    const sb = await Sandbox.create({ backend: 'microvm', image: { base: 'busybox' }, resources: RESOURCES }, { client });
    try {
      await sb.exec('true');
      await new Promise((r) => setTimeout(r, 3000));
      idle.push(await anon(sb.id));
      // The guest's page cache of its disks (Cached less Shmem: the initramfs and tmpfs are
      // shmem): the copy of layer pages that virtio-pmem + DAX would share through the host's.
      const meminfo = (await sb.exec('cat /proc/meminfo', { check: true })).stdout;
      const kib = (f: string): number => Number(new RegExp(`^${f}:\\s+(\\d+) kB`, 'm').exec(meminfo)?.[1] ?? NaN);
      fileCache.push((kib('Cached') + kib('Buffers') - kib('Shmem')) / 1024);
      await sb.exec(`dd if=/dev/zero of=/dev/shm/hold bs=1M count=${HOLD_MIB} 2>/dev/null`, { check: true });
      const held = await anon(sb.id);
      holding.push(held);
      const t = nowMs();
      await sb.exec('rm /dev/shm/hold', { check: true });
      let last = held;
      let lastDrop = t;
      while (nowMs() - t < 30_000 && nowMs() - lastDrop < 3_000) {
        await new Promise((r) => setTimeout(r, 100));
        const now = await anon(sb.id);
        if (now < last - 1) lastDrop = nowMs();
        last = Math.min(last, now);
      }
      freed.push(last);
      backMs.push(lastDrop - t);
    } finally {
      await sb.kill().catch(() => undefined);
    }
  }
  const row = (metric: string, v: number[]) => ({ scenario: 'microvm', metric, system, unit: 'MiB', ...summarize(v) });
  ctx.record(row('QEMU anonymous memory, idle (free page reporting on)', idle));
  ctx.record(row(`QEMU anonymous memory, guest holding ${HOLD_MIB} MiB`, holding));
  ctx.record(row(`QEMU anonymous memory, ${HOLD_MIB} MiB freed in the guest`, freed));
  ctx.record(row('guest page cache of its disks, idle (what virtio-pmem + DAX would share)', fileCache));
  ctx.record(latencyRow('microvm', 'freed guest memory back on the host (rm to the last drop)', system, summarize(backMs)));
}

async function measure(ctx: ScenarioContext, client: DsecClient, backend: 'microvm' | 'container', boots: number, execs: number): Promise<void> {
  const system = backend === 'microvm' ? 'dsec microvm' : 'dsec container';
  const firstExec: number[] = [];
  const roundTrip: number[] = [];
  const idleMiB: number[] = [];
  const rssMiB: number[] = [];
  for (let i = 0; i < boots; i++) {
    const t0 = nowMs();
    const sb = await Sandbox.create({ backend, image: { base: 'busybox' }, resources: RESOURCES }, { client });
    try {
      await sb.exec('true');
      firstExec.push(nowMs() - t0);
      if (i === 0) {
        for (let j = 0; j < execs; j++) {
          const t = nowMs();
          await sb.exec('true');
          roundTrip.push(nowMs() - t);
        }
      }
      await new Promise((r) => setTimeout(r, 3000));
      idleMiB.push((await sb.stats()).memoryBytes / 1048576);
      if (backend === 'microvm') {
        const rss = await qemuRssKiB(sb.id);
        if (rss !== undefined) rssMiB.push(rss / 1024);
      }
    } finally {
      await sb.kill().catch(() => undefined);
    }
  }
  ctx.record(latencyRow('microvm', 'create to first exec (API)', system, summarize(firstExec)));
  ctx.record(latencyRow('microvm', 'exec round trip `true` (API)', system, summarize(roundTrip)));
  ctx.record({ scenario: 'microvm', metric: 'idle host memory per sandbox (cgroup)', system, unit: 'MiB', ...summarize(idleMiB) });
  if (rssMiB.length) ctx.record({ scenario: 'microvm', metric: 'idle QEMU resident set', system, unit: 'MiB', ...summarize(rssMiB) });
}

/**
 * Pause with memory to a file and resume from it, on an idle microVM: the API's wall times, the
 * node's own durations, the state file's size and the host memory before and after.
 */
async function measureStateFile(ctx: ScenarioContext, client: DsecClient, edgeHome: string, rounds: number): Promise<void> {
  const system = 'dsec microvm';
  const pauseMs: number[] = [];
  const resumeMs: number[] = [];
  const stateMiB: number[] = [];
  const pausedMiB: number[] = [];
  const sb = await Sandbox.create({ backend: 'microvm', image: { base: 'busybox' }, resources: RESOURCES }, { client });
  try {
    await sb.exec('true');
    await new Promise((r) => setTimeout(r, 3000));
    for (let i = 0; i < rounds; i++) {
      let t = nowMs();
      const paused = await sb.pause({ memory: 'file' });
      pauseMs.push(nowMs() - t);
      pausedMiB.push(paused.memoryAfterBytes / 1048576);
      stateMiB.push((await stat(path.join(edgeHome, 'microvm', sb.id, 'memory.state'))).size / 1048576);
      t = nowMs();
      await sb.resume();
      await sb.exec('true');
      resumeMs.push(nowMs() - t);
    }
  } finally {
    await sb.kill().catch(() => undefined);
  }
  ctx.record(
    latencyRow('microvm', 'pause with memory to a file (API)', system, summarize(pauseMs), {
      note: 'idle VM; QEMU migrates to the edge over a unix socket, then exits',
    }),
  );
  ctx.record(
    latencyRow('microvm', 'resume from the memory file to first exec (API)', system, summarize(resumeMs), { note: 'a new QEMU loads the state, then cont' }),
  );
  ctx.record({ scenario: 'microvm', metric: 'memory state file of an idle VM', system, unit: 'MiB', ...summarize(stateMiB) });
  ctx.record({ scenario: 'microvm', metric: 'host memory while paused to a file (cgroup)', system, unit: 'MiB', ...summarize(pausedMiB) });
}

export const microvmScenario: Scenario = {
  name: 'microvm',
  title: 'MicroVMs: boot, exec, idle memory (beside containers and a plain QEMU boot)',
  method:
    "A platform with `microvm: {}` (guest prepared and accelerator probed at start, both cached). Per backend: sandboxes of 1 cpu, 256 MiB, 256 MiB disk on the busybox base; create to the first `true` exec through the API, then `true` round trips on the first one, then the host memory charged to its cgroup after 3 s idle (for a microVM: the QEMU process, guest RAM it touched included) and QEMU's resident set. Then, on one idle microVM, pause with `memory: \"file\"` and resume (to the first exec after it), the state file's size and the cgroup's memory while paused. The floor: QEMU started by hand with the same kernel and initramfs, no disks, timed to chronus's first answer on virtio-serial.",
  onlyWhenNamed: true,
  async run(ctx: ScenarioContext): Promise<void> {
    const quick = ctx.quick;
    const home = path.join(ctx.dir, 'microvm-home');
    progress('microvm: starting a platform with the microVM backend (guest kernel and probe cached)');
    const platform: Platform = await startPlatform({ home, addr: '127.0.0.1:0', agentBinary: AGENT_BINARY, log: () => undefined, microvm: {} });
    onCleanup('microvm platform', () => platform.shutdown());
    const cap = platform.edge.capacity().microvm;
    if (!cap) throw new Error('the microVM backend did not open');
    ctx.note(
      `Accelerator: **${cap.accel}** (node probe: boot ${cap.bootMs} ms).${cap.accel === 'tcg' ? ' Under TCG every guest instruction is translated: these figures are not representative of KVM.' : ''}`,
    );
    const client = new DsecClient({ apiUrl: platform.url, apiKey: platform.adminKey!, requestTimeoutMs: 300_000 });
    try {
      const guest = await prepareGuest({ cacheDir: DEFAULT_GUEST_CACHE, agentBinary: AGENT_BINARY });
      const probe = await probeAccel({
        qemu: 'qemu-system-x86_64',
        guest,
        cacheDir: DEFAULT_GUEST_CACHE,
        tscHelper: path.join(path.dirname(AGENT_BINARY), 'dsec-tsckhz'),
        timeoutMs: 120_000,
      });
      const floor: number[] = [];
      for (let i = 0; i < (quick ? 1 : 3); i++)
        floor.push(await bootOnce({ qemu: 'qemu-system-x86_64', guest, timeoutMs: 120_000 }, probe.accel, probe.cmdline));
      ctx.record(
        latencyRow('microvm', 'create to first exec (API)', 'plain qemu -M microvm (floor)', summarize(floor), {
          note: 'QEMU start to chronus answering; no disks, no API',
        }),
      );
      await measure(ctx, client, 'microvm', quick ? 1 : 3, quick ? 10 : 30);
      await measureStateFile(ctx, client, platform.edge.home, quick ? 1 : 3);
      await measureGivenBack(ctx, client, quick ? 1 : 3);
      await measure(ctx, client, 'container', quick ? 1 : 3, quick ? 10 : 30);
    } finally {
      await client.close();
    }
  },
};
