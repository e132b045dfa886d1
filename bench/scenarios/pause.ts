// Pause and resume: latency of each through the API and in-process, and the host memory a pause
// gives back (MemAvailable and the sandboxes' cgroups), without swap and with the node's zram
// swap, for sandboxes that each hold anonymous memory and tmpfs files.
import { readFile } from 'node:fs/promises';
import { ZramSwap } from '@dsec/edge';
import { Sandbox } from '@dsec/sdk';
import { onCleanup } from '../lib/cleanup.js';
import { IDLE_RESOURCES, retryRateLimited } from '../lib/platform.js';
import { latencyRow } from '../lib/report.js';
import type { Scenario, ScenarioContext } from '../lib/scenario.js';
import { nowMs, pool, progress, sleep, summarize } from '../lib/stats.js';

const MiB = 1048576;
/** Memory each sandbox of the reclaim measurement holds: half anonymous, half a tmpfs file. */
const HELD_MIB = 32;
/** zram swap set up for the measurement (the node setting `zramSwapMiB`). */
const ZRAM_MIB = 2048;

/** MemAvailable in bytes: the median of a few samples (other processes move it a little). */
async function memAvailable(): Promise<number> {
  const samples: number[] = [];
  for (let i = 0; i < 5; i++) {
    const m = /MemAvailable:\s+(\d+)/.exec(await readFile('/proc/meminfo', 'utf8'));
    samples.push(Number(m?.[1] ?? 0) * 1024);
    await sleep(100);
  }
  return samples.sort((a, b) => a - b)[2]!;
}

/**
 * The holder: 16 MiB of busybox's binary as hex text in a shell variable (anonymous memory),
 * 16 MiB of the binary in a tmpfs file; checksums of both, and a loop that checks them again
 * when asked (after a resume).
 */
const HOLDER = [
  `x=$(for i in $(seq 1 12); do cat /bin/busybox; done | od -An -tx1 | head -c ${(HELD_MIB / 2) * MiB})`,
  `for i in $(seq 1 12); do cat /bin/busybox; done | head -c ${(HELD_MIB / 2) * MiB} > /tmp/fill`,
  'printf %s "$x" | md5sum > /tmp/anon.md5; md5sum /tmp/fill > /tmp/fill.md5; touch /tmp/ready',
  'while true; do if [ -e /tmp/check ]; then printf %s "$x" | md5sum > /tmp/anon.again; rm /tmp/check; fi; sleep 0.1; done',
].join('; ');

export const pauseScenario: Scenario = {
  name: 'pause',
  title: '8. Pause and resume',
  method: [
    'Latency: idle sandboxes (one sleeping process each) are paused and resumed one after another through the SDK',
    '(`sb.pause()`, `sb.resume()`: apiserver -> edge -> cgroup freezer, reclaim, thaw) and in-process (`edge.pause/resume`),',
    "alternating. Memory: sandboxes that each hold 16 MiB of anonymous memory (busybox's binary as hex text in a shell",
    "variable) and a 16 MiB tmpfs file are paused; the host's MemAvailable (median of 5 samples) and the sum of the",
    "sandboxes' cgroup memory are read before and after, first without swap (a pause can only drop page cache), then",
    `with a ${ZRAM_MIB} MiB zram swap device (lz4) set up as the node setting \`zramSwapMiB\` would. The resume from zram`,
    'prefetches swapped-out process memory; both checksums are verified after it.',
  ].join(' '),
  async run(ctx: ScenarioContext) {
    await latency(ctx);
    await reclaim(ctx);
  },
};

async function latency(ctx: ScenarioContext): Promise<void> {
  const { bench } = ctx;
  const edge = bench.platform.edge;
  const client = await bench.newClient();
  const count = ctx.quick ? 5 : 50;
  const rounds = ctx.quick ? 2 : 4;
  const sandboxes = await pool(count, 4, () => retryRateLimited(() => Sandbox.create({ image: { base: 'busybox' }, resources: IDLE_RESOURCES }, { client })));
  try {
    for (const sb of sandboxes) (await sb.spawn('sleep 86400')).disconnect();
    const ms = {
      apiPause: [] as number[],
      apiResume: [] as number[],
      edgePause: [] as number[],
      edgeResume: [] as number[],
      nodePause: [] as number[],
      nodeResume: [] as number[],
    };
    for (let r = 0; r < rounds; r++) {
      for (const sb of sandboxes) {
        let t0 = nowMs();
        const p = await retryRateLimited(() => sb.pause());
        ms.apiPause.push(nowMs() - t0);
        ms.nodePause.push(p.durationMs);
        t0 = nowMs();
        const q = await retryRateLimited(() => sb.resume());
        ms.apiResume.push(nowMs() - t0);
        ms.nodeResume.push(q.durationMs);
        t0 = nowMs();
        await edge.pause(sb.id);
        ms.edgePause.push(nowMs() - t0);
        t0 = nowMs();
        await edge.resume(sb.id);
        ms.edgeResume.push(nowMs() - t0);
      }
      progress(`pause: latency round ${r + 1}/${rounds}`);
    }
    ctx.record(latencyRow('pause', 'pause (freeze + reclaim), idle sandbox', 'dsec', summarize(ms.apiPause)));
    ctx.record(latencyRow('pause', 'pause (freeze + reclaim), idle sandbox', 'dsec edge', summarize(ms.edgePause)));
    ctx.record(latencyRow('pause', 'resume (thaw), idle sandbox', 'dsec', summarize(ms.apiResume)));
    ctx.record(latencyRow('pause', 'resume (thaw), idle sandbox', 'dsec edge', summarize(ms.edgeResume)));
    ctx.note(
      `Time on the node as the API reports it (durationMs): pause p50 ${summarize(ms.nodePause).p50.toFixed(2)} ms, resume p50 ${summarize(ms.nodeResume).p50.toFixed(2)} ms; the rest of the API figure is HTTP, the state store and the CPU accounting.`,
    );
  } finally {
    await pool(sandboxes.length, 4, (i) => sandboxes[i]!.kill().catch(() => undefined));
  }
}

async function reclaim(ctx: ScenarioContext): Promise<void> {
  const { bench } = ctx;
  const client = await bench.newClient();
  const count = ctx.quick ? 4 : 16;
  progress(`pause: filling ${count} sandboxes with ${HELD_MIB} MiB each`);
  const sandboxes = await pool(count, 2, () =>
    retryRateLimited(() => Sandbox.create({ image: { base: 'busybox' }, resources: { cpu: 0.5, memoryMiB: 256, diskMiB: 64 } }, { client })),
  );
  let swapOff: (() => Promise<void>) | undefined;
  try {
    for (const sb of sandboxes) (await sb.spawn(HOLDER)).disconnect();
    for (const sb of sandboxes) {
      const deadline = Date.now() + 120_000;
      while ((await sb.exec('test -e /tmp/ready')).exitCode !== 0) {
        if (Date.now() > deadline) throw new Error(`sandbox ${sb.id} did not fill its memory in 2 minutes`);
        await sleep(200);
      }
    }
    const cgroupBytes = async (): Promise<number> => {
      let sum = 0;
      for (const sb of sandboxes) sum += (await sb.stats()).memoryBytes;
      return sum;
    };

    const measure = async (config: string, zram: ZramSwap | undefined): Promise<void> => {
      await sleep(500);
      const availBefore = await memAvailable();
      const cgBefore = await cgroupBytes();
      const zramBefore = zram ? (await zram.usage()).memoryUsedBytes : 0;
      const pauses: number[] = [];
      for (const sb of sandboxes) pauses.push((await retryRateLimited(() => sb.pause())).durationMs);
      await sleep(500);
      const availAfter = await memAvailable();
      const cgAfter = await cgroupBytes();
      const z = zram ? await zram.usage() : undefined;
      const perSandbox = (bytes: number): number => bytes / count / MiB;
      ctx.record(latencyRow('pause', `pause, ${HELD_MIB} MiB resident, ${config}`, 'dsec', summarize(pauses), { note: 'time on the node (durationMs)' }));
      ctx.record({
        scenario: 'pause',
        metric: `host memory freed per paused sandbox (MemAvailable), ${config}`,
        system: 'dsec',
        unit: 'MiB',
        value: perSandbox(availAfter - availBefore),
        higherIsBetter: true,
      });
      ctx.record({
        scenario: 'pause',
        metric: `sandbox cgroup memory before -> after pause, ${config}`,
        system: 'dsec',
        unit: 'MiB',
        value: perSandbox(cgAfter),
        note: `from ${perSandbox(cgBefore).toFixed(1)} MiB per sandbox`,
      });
      if (z) {
        // The same figure from the kernel's own accounting, free of other processes' noise:
        // what left the sandboxes' cgroups, less the RAM zram took to hold it.
        const freed = cgBefore - cgAfter - (z.memoryUsedBytes - zramBefore);
        ctx.record({
          scenario: 'pause',
          metric: `host memory freed per paused sandbox (cgroups less zram RAM), ${config}`,
          system: 'dsec',
          unit: 'MiB',
          value: perSandbox(freed),
          higherIsBetter: true,
        });
        ctx.note(
          `${config}: zram holds ${(z.storedBytes / MiB).toFixed(1)} MiB of swapped pages in ${((z.memoryUsedBytes - zramBefore) / MiB).toFixed(1)} MiB of RAM (compression ${(z.storedBytes / Math.max(1, z.compressedBytes)).toFixed(2)}x).`,
        );
      }
      const resumes: number[] = [];
      for (const sb of sandboxes) resumes.push((await retryRateLimited(() => sb.resume())).durationMs);
      ctx.record(
        latencyRow('pause', `resume, ${HELD_MIB} MiB resident, ${config}`, 'dsec', summarize(resumes), {
          note: zram ? 'thaw and prefetch from zram; time on the node' : 'time on the node',
        }),
      );
      // Everything is as it was: the variable's and the file's checksums.
      for (const sb of sandboxes) {
        await sb.exec('touch /tmp/check');
        const deadline = Date.now() + 60_000;
        while ((await sb.exec('test -e /tmp/check')).exitCode === 0) {
          if (Date.now() > deadline) throw new Error(`sandbox ${sb.id}: the holder did not answer after the resume`);
          await sleep(100);
        }
        const check = await sb.exec('cmp /tmp/anon.md5 /tmp/anon.again && md5sum -c -s /tmp/fill.md5');
        if (check.exitCode !== 0) throw new Error(`sandbox ${sb.id}: memory changed across pause/resume (${config}): ${check.stdout}${check.stderr}`);
      }
    };

    await measure('no swap', undefined);
    let zram: ZramSwap | undefined;
    try {
      zram = await ZramSwap.enable({ sizeMiB: ZRAM_MIB });
    } catch (err) {
      ctx.note(`zram: not measured (${(err as Error).message}).`);
      return;
    }
    swapOff = onCleanup('zram swap', () => zram.disable());
    await measure('zram swap', zram);
  } finally {
    await pool(sandboxes.length, 4, (i) => sandboxes[i]!.kill().catch(() => undefined));
    // After the sandboxes: nothing of theirs is left in swap to read back in.
    await swapOff?.();
  }
}
