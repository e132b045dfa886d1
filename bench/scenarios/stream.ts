// Output streaming: MB/s of stdout through the SDK's streaming exec, vs reading crun exec's and
// podman exec's stdout pipe.
import { Sandbox } from '@dsec/sdk';
import type { Scenario, ScenarioContext } from '../lib/scenario.js';
import { nowMs, progress } from '../lib/stats.js';

export const streamScenario: Scenario = {
  name: 'stream',
  title: '5. Output streaming',
  method: [
    '`head -c <size> /dev/zero` in a running sandbox; dsec: `sb.spawn(...)` through the SDK, iterating the output',
    'events and counting bytes (ndjson over HTTP, base64 in JSON, from chronus through edge and apiserver); peers:',
    '`crun exec` and `podman exec`, counting the bytes of their stdout pipe. MB = 10^6 bytes; the systems',
    'alternate per repetition and the figure is total bytes over total time.',
  ].join(' '),
  async run(ctx: ScenarioContext) {
    const size = ctx.quick ? 64 * 2 ** 20 : 2 ** 30;
    const reps = ctx.quick ? 1 : 2;
    const { bench, peers } = ctx;
    const client = await bench.newClient();
    const sb = await Sandbox.create({ image: { base: 'busybox' } }, { client });
    const crunId = await peers.crunStartIdle();
    const podmanName = await peers.podmanStartIdle();
    const argv = ['head', '-c', String(size), '/dev/zero'];
    try {
      const systems: Array<[string, () => Promise<number>]> = [
        [
          'dsec',
          async () => {
            const h = await sb.spawn(argv);
            let bytes = 0;
            for await (const ev of h) if (ev.stream === 'stdout') bytes += ev.data.length;
            const exit = await h.wait();
            if (exit.exitCode !== 0) throw new Error(`head exited ${exit.exitCode}`);
            return bytes;
          },
        ],
        [
          'crun exec',
          async () => {
            let bytes = 0;
            await peers.crunExec(crunId, argv, { onStdout: (d) => (bytes += d.length) });
            return bytes;
          },
        ],
        [
          'podman exec',
          async () => {
            let bytes = 0;
            await peers.podmanExec(podmanName, argv, { onStdout: (d) => (bytes += d.length) });
            return bytes;
          },
        ],
      ];
      const totals = new Map<string, { bytes: number; ms: number }>(systems.map(([n]) => [n, { bytes: 0, ms: 0 }]));
      for (let r = 0; r < reps; r++) {
        for (const [name, fn] of systems) {
          const t0 = nowMs();
          const bytes = await fn();
          const ms = nowMs() - t0;
          if (bytes !== size) throw new Error(`${name}: received ${bytes} of ${size} bytes`);
          const t = totals.get(name)!;
          t.bytes += bytes;
          t.ms += ms;
          progress(`stream: ${name}: ${(bytes / 1e3 / ms).toFixed(0)} MB/s`);
        }
      }
      for (const [name, t] of totals) {
        ctx.record({
          scenario: 'stream',
          metric: `stdout of ${size / 2 ** 20} MiB`,
          system: name,
          unit: 'MB/s',
          value: t.bytes / 1e3 / t.ms,
          higherIsBetter: true,
          n: reps,
        });
      }
    } finally {
      await sb.kill();
      await peers.crunDelete(crunId);
      await peers.podmanRemove([podmanName]);
    }
  },
};
