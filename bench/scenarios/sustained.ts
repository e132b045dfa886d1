// Sustained creation: many idle sandboxes at the best concurrency, the rate per window of 100
// (so a slowdown as the node fills shows), then destroy them all.
import { Sandbox } from '@dsec/sdk';
import type { DsecClient } from '@dsec/sdk';
import { IDLE_RESOURCES, retryRateLimited } from '../lib/platform.js';
import type { Scenario, ScenarioContext } from '../lib/scenario.js';
import { nowMs, pool, progress } from '../lib/stats.js';

const CONCURRENCIES = [4, 8, 16];

async function createMany(clients: DsecClient[], count: number, concurrency: number, done?: (i: number) => void): Promise<Sandbox[]> {
  return pool(count, concurrency, async (i, w) => {
    const sb = await retryRateLimited(() => Sandbox.create({ image: { base: 'busybox' }, resources: IDLE_RESOURCES }, { client: clients[w]! }));
    done?.(i);
    return sb;
  });
}

async function destroyMany(sandboxes: Sandbox[], concurrency: number): Promise<void> {
  await pool(sandboxes.length, concurrency, (i) => retryRateLimited(() => sandboxes[i]!.kill()));
}

export const sustainedScenario: Scenario = {
  name: 'sustained',
  title: '2. Sustained creation',
  method: [
    'Idle busybox sandboxes (cpu 0.1, 16 MiB, 16 MiB disk) created through the SDK as fast as the node takes them,',
    'each worker with its own API key. A short trial at concurrency 4, 8 and 16 picks the concurrency; then the',
    'full count is created at it, and the rate is reported per window of 100 creations (10 with --quick) so that a',
    'slowdown as the node fills shows. "create" means the API answered 201: the sandbox runs and its agent answered',
    'a ping. Then all are destroyed at the same concurrency.',
  ].join(' '),
  async run(ctx: ScenarioContext) {
    const total = ctx.quick ? 50 : 1000;
    const window = ctx.quick ? 10 : 100;
    const trial = ctx.quick ? 8 : 48;
    const clients = await Promise.all(Array.from({ length: Math.max(...CONCURRENCIES) }, () => ctx.bench.newClient()));

    let best = { concurrency: 0, rate: 0 };
    for (const c of CONCURRENCIES) {
      const t0 = nowMs();
      const sbs = await createMany(clients, trial, c);
      const rate = trial / ((nowMs() - t0) / 1000);
      await destroyMany(sbs, c);
      progress(`sustained: trial at concurrency ${c}: ${rate.toFixed(1)} creates/s`);
      ctx.record({
        scenario: 'sustained',
        metric: `trial: ${trial} creates at concurrency ${c}`,
        system: 'dsec',
        unit: 'creates/s',
        value: rate,
        higherIsBetter: true,
      });
      if (rate > best.rate) best = { concurrency: c, rate };
    }

    const finished: number[] = new Array<number>(total);
    let count = 0;
    const t0 = nowMs();
    const sandboxes = await createMany(clients, total, best.concurrency, () => {
      finished[count++] = nowMs();
      if (count % window === 0) progress(`sustained: ${count}/${total} created`);
    });
    const elapsedS = (nowMs() - t0) / 1000;
    const windows: number[] = [];
    for (let end = window; end <= total; end += window) {
      const start = end === window ? t0 : finished[end - window - 1]!;
      windows.push(window / ((finished[end - 1]! - start) / 1000));
    }
    const overall = total / elapsedS;
    const first = windows[0] ?? 0;
    const last = windows[windows.length - 1] ?? 0;
    const flat = last >= 0.8 * first;
    ctx.record({
      scenario: 'sustained',
      metric: `${total} creates at concurrency ${best.concurrency}`,
      system: 'dsec',
      unit: 'creates/s',
      value: overall,
      higherIsBetter: true,
      series: { x: 'sandboxes created', y: 'creates/s', points: windows.map((w, i) => [(i + 1) * window, w]) },
      targets: [
        { text: '>= 100/s on the node', met: overall >= 100 },
        { text: 'flat as the node fills (last window >= 80% of the first)', met: flat },
      ],
    });
    ctx.record({
      scenario: 'sustained',
      metric: `slowest window of ${window}`,
      system: 'dsec',
      unit: 'creates/s',
      value: Math.min(...windows),
      higherIsBetter: true,
    });
    ctx.record({
      scenario: 'sustained',
      metric: `fastest window of ${window}`,
      system: 'dsec',
      unit: 'creates/s',
      value: Math.max(...windows),
      higherIsBetter: true,
    });
    ctx.note(`Rate per window of ${window} creations, in order: ${windows.map((w) => w.toFixed(0)).join(', ')} creates/s.`);

    const t1 = nowMs();
    await destroyMany(sandboxes, best.concurrency);
    const destroyRate = total / ((nowMs() - t1) / 1000);
    ctx.record({
      scenario: 'sustained',
      metric: `destroy ${total} at concurrency ${best.concurrency}`,
      system: 'dsec',
      unit: 'destroys/s',
      value: destroyRate,
      higherIsBetter: true,
    });
  },
};
