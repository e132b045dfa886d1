// Function calls (the fncall backend): latency and rate of a trivial call and of `python3 -c`,
// against a bubblewrap one-shot and `podman run --rm` of the same busybox rootfs.
import { existsSync } from 'node:fs';
import { mustRun } from '../lib/peers.js';
import { retryRateLimited, waitForRuntime } from '../lib/platform.js';
import { latencyRow } from '../lib/report.js';
import type { Scenario, ScenarioContext } from '../lib/scenario.js';
import { nowMs, progress, rateInFlight, summarize } from '../lib/stats.js';

const WARMUP = 10;
/** Pause between sequential calls, so a pool that refills in the background keeps up. */
const PACE_MS = 20;
const RATE_CONCURRENCY = 8;
/**
 * The host's python3: Debian's own (the runtime layer's version), never the first `python3` on
 * PATH, which can be a wrapper (a pyenv shim is a shell script that costs ~200 ms per call).
 */
const HOST_PYTHON = existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';

function rate(durationMs: number, fn: () => Promise<unknown>): Promise<number> {
  return rateInFlight(RATE_CONCURRENCY, durationMs, fn);
}

export const fncallScenario: Scenario = {
  name: 'fncall',
  title: '7. Function calls',
  method: [
    'A trivial call (`true` in the `sh` runtime) through `client.calls.run`: each call claims a pre-created sandbox',
    "from the runtime's pool and runs one process in it; the sandbox is then reset (every process but its agent",
    'killed, fresh tmpfs mounts, IPC emptied: docs/fncall.md) and reused. Latency is measured paced (a call every',
    `${PACE_MS} ms, what an online-judge agent does) and back to back (the pool cannot refill between calls);`,
    `the rate with ${RATE_CONCURRENCY} calls in flight. Peers: a bubblewrap one-shot (\`bwrap --unshare-all\`, no cgroups:`,
    "the floor) and `podman run --rm` of the same busybox rootfs, alternating per iteration. `python3 -c 'print(1)'`",
    'runs in the Debian python3 runtime (from the machine-wide cache, built there on first use), in the interpreter',
    'its sandbox started after its last reset (docs/fncall.md, "Warm python3"), alternating with a host `python3 -c \'print(1)\'`',
    "(Debian's /usr/bin/python3, the runtime's version; a fresh process per call on both sides).",
  ].join(' '),
  async run(ctx: ScenarioContext) {
    const { bench, peers } = ctx;
    const client = await bench.newClient();
    const trivial = (): Promise<unknown> => retryRateLimited(() => client.calls.run({ runtime: 'sh', code: 'true' }));
    const systems: Array<[string, () => Promise<unknown>]> = [
      ['dsec', trivial],
      ['bwrap', () => peers.bwrapRun()],
      ['podman run --rm', () => peers.podmanRun()],
    ];
    for (let i = 0; i < WARMUP; i++) for (const [, fn] of systems) await fn();
    const iterations = ctx.quick ? 10 : 100;
    const paced = new Map<string, number[]>(systems.map(([n]) => [n, []]));
    for (let i = 0; i < iterations; i++) {
      for (const [name, fn] of systems) {
        const t0 = nowMs();
        await fn();
        paced.get(name)!.push(nowMs() - t0);
        await new Promise((r) => setTimeout(r, PACE_MS));
      }
      if ((i + 1) % 25 === 0) progress(`fncall: ${i + 1}/${iterations}`);
    }
    for (const [name] of systems) {
      const s = summarize(paced.get(name)!);
      const targets = name === 'dsec' ? [{ text: 'p50 <= 5 ms', met: s.p50 <= 5 }] : undefined;
      ctx.record(latencyRow('fncall', 'trivial call, paced', name, s, targets ? { targets } : {}));
    }
    const backToBack: number[] = [];
    for (let i = 0; i < iterations; i++) {
      const t0 = nowMs();
      await trivial();
      backToBack.push(nowMs() - t0);
    }
    ctx.record(latencyRow('fncall', 'trivial call, back to back', 'dsec', summarize(backToBack)));

    const seconds = ctx.quick ? 2 : 10;
    progress(`fncall: rate for ${seconds} s per system`);
    const dsecRate = await rate(seconds * 1000, trivial);
    ctx.record({
      scenario: 'fncall',
      metric: `trivial calls per second, ${RATE_CONCURRENCY} in flight`,
      system: 'dsec',
      unit: 'calls/s',
      value: dsecRate,
      higherIsBetter: true,
      targets: [{ text: '>= 300 calls/s', met: dsecRate >= 300 }],
    });
    ctx.record({
      scenario: 'fncall',
      metric: `trivial calls per second, ${RATE_CONCURRENCY} in flight`,
      system: 'bwrap',
      unit: 'calls/s',
      value: await rate(seconds * 1000, () => peers.bwrapRun()),
      higherIsBetter: true,
    });
    ctx.record({
      scenario: 'fncall',
      metric: `trivial calls per second, ${RATE_CONCURRENCY} in flight`,
      system: 'podman run --rm',
      unit: 'calls/s',
      value: await rate(seconds * 1000, () => peers.podmanRun()),
      higherIsBetter: true,
    });

    progress('fncall: python3 runtime (its Debian layer built in the background on first use, or from the cache)');
    await waitForRuntime(client, 'python3', 'pass');
    const py = (): Promise<unknown> => retryRateLimited(() => client.calls.run({ runtime: 'python3', code: 'print(1)' }));
    for (let i = 0; i < WARMUP; i++) await py();
    const pySamples: number[] = [];
    const hostPySamples: number[] = [];
    for (let i = 0; i < (ctx.quick ? 20 : 50); i++) {
      const t0 = nowMs();
      await py();
      pySamples.push(nowMs() - t0);
      await new Promise((r) => setTimeout(r, PACE_MS));
      // The peer: a fresh host python3 process, alternating with the calls.
      const t1 = nowMs();
      await mustRun([HOST_PYTHON, '-c', 'print(1)']);
      hostPySamples.push(nowMs() - t1);
      await new Promise((r) => setTimeout(r, PACE_MS));
    }
    const pyStats = summarize(pySamples);
    const hostPyStats = summarize(hostPySamples);
    const pyTarget = { text: "p50 <= 0.5x a host python3's", met: pyStats.p50 <= 0.5 * hostPyStats.p50 };
    ctx.record(latencyRow('fncall', "python3 -c 'print(1)', paced", 'dsec', pyStats, { targets: [pyTarget] }));
    ctx.record(latencyRow('fncall', "python3 -c 'print(1)', paced", 'host python3', hostPyStats));
    ctx.record({
      scenario: 'fncall',
      metric: `python3 calls per second, ${RATE_CONCURRENCY} in flight`,
      system: 'dsec',
      unit: 'calls/s',
      value: await rate(seconds * 1000, py),
      higherIsBetter: true,
    });
  },
};
