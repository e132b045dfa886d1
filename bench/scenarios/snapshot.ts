// Snapshots and fork: how long packing a sandbox's writable layer takes (frozen meanwhile) with
// N small files in it, how long a fork into N sandboxes takes, and what creating from a
// snapshot costs next to creating from the image.
import { Sandbox } from '@dsec/sdk';
import { retryRateLimited } from '../lib/platform.js';
import { latencyRow } from '../lib/report.js';
import type { Scenario, ScenarioContext } from '../lib/scenario.js';
import { nowMs, progress, summarize } from '../lib/stats.js';

const RESOURCES = { cpu: 0.25, memoryMiB: 64, diskMiB: 256 };

export const snapshotScenario: Scenario = {
  name: 'snapshot',
  title: 'Snapshot and fork',
  method: [
    'A sandbox writes N small files (4 KiB each, in 10 directories); `sb.snapshot()` then packs its writable layer',
    '(frozen with the cgroup freezer meanwhile) into an EROFS layer; between snapshots one file changes, so each is a new',
    'layer. `dsec edge` is `edge.snapshot` in-process (freeze, mkfs.erofs, thaw, digest), without HTTP and bookkeeping;',
    'the frozen time runs from the freeze to the end of the thaw.',
    'Fork: `sb.fork(n)` (one snapshot, then n creates from it, four at a time) timed end to end. Create from a snapshot',
    'and create from the image alternate, one at a time.',
  ].join(' '),
  async run(ctx: ScenarioContext) {
    const { bench } = ctx;
    const client = await bench.newClient();
    const files = ctx.quick ? 200 : 5000;
    const iterations = ctx.quick ? 3 : 10;
    const forkCount = ctx.quick ? 4 : 32;
    const sb = await Sandbox.create({ image: { base: 'busybox' }, resources: RESOURCES }, { client });
    const made: Sandbox[] = [];
    try {
      const fill = await sb.exec(`i=0; while [ $i -lt ${files} ]; do d=/data/d$((i % 10)); mkdir -p $d; head -c 4096 /dev/urandom > $d/f$i; i=$((i+1)); done`, {
        timeoutMs: 600_000,
      });
      if (fill.exitCode !== 0) throw new Error(`filling the sandbox failed: ${fill.stderr}`);
      const samples = { api: [] as number[], edge: [] as number[], frozen: [] as number[] };
      // How long the sandbox's processes stand still: from the freeze to the end of the thaw.
      const cgroups = bench.platform.edge.cgroups;
      const { freeze, thaw } = { freeze: cgroups.freeze.bind(cgroups), thaw: cgroups.thaw.bind(cgroups) };
      let frozenAt = 0;
      cgroups.freeze = async (id, timeoutMs) => {
        frozenAt = nowMs();
        return freeze(id, timeoutMs);
      };
      cgroups.thaw = async (id) => {
        await thaw(id);
        if (frozenAt > 0) samples.frozen.push(nowMs() - frozenAt);
        frozenAt = 0;
      };
      let digest = '';
      for (let i = 0; i < iterations; i++) {
        await sb.exec(`echo ${i} > /data/changed`);
        let t0 = nowMs();
        digest = (await retryRateLimited(() => sb.snapshot())).digest;
        samples.api.push(nowMs() - t0);
        await sb.exec(`echo edge-${i} > /data/changed`);
        t0 = nowMs();
        await bench.platform.edge.snapshot(sb.id);
        samples.edge.push(nowMs() - t0);
      }
      const metric = `snapshot of a sandbox with ${files} small files`;
      ctx.record(latencyRow('snapshot', metric, 'dsec', summarize(samples.api)));
      ctx.record(latencyRow('snapshot', metric, 'dsec edge', summarize(samples.edge)));
      ctx.record(latencyRow('snapshot', `sandbox frozen during a snapshot (${files} small files)`, 'dsec', summarize(samples.frozen)));
      cgroups.freeze = freeze;
      cgroups.thaw = thaw;
      const layer = await client.layers.get(digest);
      ctx.note(`The snapshot layer holds ${layer.files} entries, ${(layer.contentBytes / 1048576).toFixed(1)} MiB of content.`);

      progress(`snapshot: fork into ${forkCount}`);
      const t0 = nowMs();
      const fork = await sb.fork(forkCount, { timeoutMs: 600_000 });
      const forkMs = nowMs() - t0;
      made.push(...fork.sandboxes);
      ctx.record({ scenario: 'snapshot', metric: `fork into ${forkCount} sandboxes (snapshot + creates)`, system: 'dsec', unit: 'ms', value: forkMs });
      ctx.record({ scenario: 'snapshot', metric: 'fork, per new sandbox', system: 'dsec', unit: 'ms', value: forkMs / forkCount });
      const check = await fork.sandboxes[forkCount - 1]!.exec('ls /data/d0 | wc -l');
      if (Number(check.stdout.trim()) !== Math.ceil(files / 10)) throw new Error(`a fork sees ${check.stdout.trim()} files in /data/d0`);
      await Promise.all(fork.sandboxes.map((s) => s.kill()));
      made.length = 0;

      const creates = ctx.quick ? 5 : 30;
      const fromSnapshot: number[] = [];
      const fromImage: number[] = [];
      for (let i = 0; i < creates; i++) {
        for (const [spec, out] of [
          [{ snapshot: digest }, fromSnapshot],
          [{ image: { base: 'busybox' } }, fromImage],
        ] as const) {
          const c0 = nowMs();
          const s = await retryRateLimited(() => Sandbox.create({ ...spec, resources: RESOURCES }, { client }));
          await s.exec(['true']);
          out.push(nowMs() - c0);
          await s.kill();
        }
      }
      ctx.record(latencyRow('snapshot', 'create + first exec', 'dsec (from a snapshot)', summarize(fromSnapshot), { compare: false }));
      ctx.record(latencyRow('snapshot', 'create + first exec', 'dsec (from the image)', summarize(fromImage), { compare: false }));
    } finally {
      for (const s of made) await s.kill().catch(() => undefined);
      await sb.kill();
    }
  },
};
