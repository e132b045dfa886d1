// Exec round trip of `true` through the SDK vs crun exec and podman exec, and exec throughput
// across many sandboxes.
import { Sandbox } from '@dsec/sdk';
import { retryRateLimited } from '../lib/platform.js';
import { latencyRow } from '../lib/report.js';
import type { Scenario, ScenarioContext } from '../lib/scenario.js';
import { nowMs, pool, progress, summarize } from '../lib/stats.js';

const WARMUP = 10;

export const execScenario: Scenario = {
  name: 'exec',
  title: '3. Exec round trip and throughput',
  method: [
    "Round trip of `true` in a running sandbox: dsec `sb.exec(['true'])` through the SDK -> apiserver -> edge ->",
    'chronus and back with the exit status; `dsec edge` is `edge.exec` in-process (no HTTP). Peers: `crun exec` and',
    '`podman exec` into an idle container of the same rootfs. The systems alternate every iteration.',
    'Throughput: one worker per sandbox (each with its own API key) runs `true` back to back for a fixed time.',
  ].join(' '),
  async run(ctx: ScenarioContext) {
    const { bench, peers } = ctx;
    const client = await bench.newClient();
    const sb = await Sandbox.create({ image: { base: 'busybox' } }, { client });
    const crunId = await peers.crunStartIdle();
    const podmanName = await peers.podmanStartIdle();
    try {
      const edge = bench.platform.edge;
      const systems: Array<[string, () => Promise<unknown>]> = [
        ['dsec', () => retryRateLimited(() => sb.exec(['true']))],
        ['dsec edge', () => edge.exec(sb.id, { argv: ['true'] })],
        ['crun exec', () => peers.crunExec(crunId, ['true'])],
        ['podman exec', () => peers.podmanExec(podmanName, ['true'])],
      ];
      for (let i = 0; i < WARMUP; i++) for (const [, fn] of systems) await fn();
      const iterations = ctx.quick ? 20 : 200;
      const samples = new Map<string, number[]>(systems.map(([n]) => [n, []]));
      for (let i = 0; i < iterations; i++) {
        for (const [name, fn] of systems) {
          const t0 = nowMs();
          await fn();
          samples.get(name)!.push(nowMs() - t0);
        }
        if ((i + 1) % 50 === 0) progress(`exec: ${i + 1}/${iterations}`);
      }
      const crun = summarize(samples.get('crun exec')!);
      for (const [name] of systems) {
        const s = summarize(samples.get(name)!);
        const targets =
          name === 'dsec'
            ? [
                { text: 'p50 <= 2 ms', met: s.p50 <= 2 },
                { text: '>= 4x faster than crun exec', met: crun.p50 / s.p50 >= 4 },
              ]
            : undefined;
        ctx.record(latencyRow('exec', 'exec round trip (true)', name, s, targets ? { targets } : {}));
      }
    } finally {
      await sb.kill();
      await peers.crunDelete(crunId);
      await peers.podmanRemove([podmanName]);
    }

    // Throughput across many sandboxes.
    const count = ctx.quick ? 5 : 50;
    const durationMs = ctx.quick ? 2000 : 10_000;
    const clients = await Promise.all(Array.from({ length: count }, () => bench.newClient()));
    const sandboxes = await pool(count, 8, (i) =>
      retryRateLimited(() => Sandbox.create({ image: { base: 'busybox' }, resources: { cpu: 0.5, memoryMiB: 64 } }, { client: clients[i]! })),
    );
    try {
      progress(`exec: throughput across ${count} sandboxes for ${durationMs / 1000} s`);
      let execs = 0;
      const t0 = nowMs();
      await Promise.all(
        sandboxes.map(async (s) => {
          while (nowMs() - t0 < durationMs) {
            await retryRateLimited(() => s.exec(['true']));
            execs++;
          }
        }),
      );
      const rate = execs / ((nowMs() - t0) / 1000);
      ctx.record({ scenario: 'exec', metric: `exec throughput across ${count} sandboxes`, system: 'dsec', unit: 'execs/s', value: rate, higherIsBetter: true });
    } finally {
      await pool(sandboxes.length, 8, (i) => sandboxes[i]!.kill());
    }
  },
};
