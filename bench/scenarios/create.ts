// Create to first exec (`true`), layers cached, no pool: dsec through the SDK (and in-process at
// the edge, as a breakdown) vs podman run --rm, crun run and bubblewrap, at concurrency 1 and 8.
import { Sandbox } from '@dsec/sdk';
import type { DsecClient } from '@dsec/sdk';
import { retryRateLimited } from '../lib/platform.js';
import { latencyRow } from '../lib/report.js';
import type { Scenario, ScenarioContext } from '../lib/scenario.js';
import { nowMs, progress, summarize } from '../lib/stats.js';

const WARMUP = 5;

/** Times of the removals that follow the timed creates (the destroy target). */
interface DestroyTimes {
  /** Through the API, answered once the sandbox is gone (204). */
  api: number[];
  /** Through the API with `Prefer: respond-async`, answered once the row is durably `stopping` (202). */
  apiAsync: number[];
  edge: number[];
}

/**
 * Creates a sandbox, runs `true`, and returns the time to its exit; the sandbox is then removed
 * (timed apart, into `destroys`): every other removal answered at once (202), the teardown behind it.
 */
async function dsecCreate(client: DsecClient, destroys: DestroyTimes): Promise<number> {
  const t0 = nowMs();
  const sb = await retryRateLimited(() => Sandbox.create({ image: { base: 'busybox' } }, { client }));
  const r = await sb.exec(['true']);
  const ms = nowMs() - t0;
  const async = destroys.api.length > destroys.apiAsync.length;
  const t1 = nowMs();
  await sb.kill(async ? { wait: false } : {});
  (async ? destroys.apiAsync : destroys.api).push(nowMs() - t1);
  if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}`);
  return ms;
}

export const createScenario: Scenario = {
  name: 'create',
  title: '1. Create to first exec',
  method: [
    'Time from the create call to the exit of `true` run in the new sandbox, busybox base layer cached, no pool.',
    "dsec: `Sandbox.create` + `sb.exec(['true'])` through the SDK (HTTP API, apiserver, edge, crun, chronus);",
    'its removal is timed apart (the `destroy` rows: `sb.kill()` through the API, answered once the sandbox is gone,',
    'and, every other removal, `sb.kill({ wait: false })`, answered 202 once the row is durably `stopping` with the',
    'teardown behind it; `edge.destroy` in-process).',
    '`dsec edge` is the same at the edge in-process (no HTTP, no scheduler, no state store).',
    'Peers: `podman run --rm` (includes its removal, which it does before returning), `crun run` of a prepared',
    'bundle (crun removes the container when `true` exits), and `bwrap --unshare-all` (no cgroups, no image',
    'store: the cost floor). At concurrency 8, eight creates of one system run at once and each is timed.',
  ].join(' '),
  async run(ctx: ScenarioContext) {
    const { peers, bench } = ctx;
    const edge = bench.platform.edge;
    const clients = await Promise.all(Array.from({ length: 8 }, () => bench.newClient()));
    const destroys: DestroyTimes = { api: [], apiAsync: [], edge: [] };
    const edgeCreate = async (): Promise<number> => {
      const t0 = nowMs();
      const sb = await edge.create({ image: { base: 'busybox' } });
      await edge.exec(sb.id, { argv: ['true'] });
      const ms = nowMs() - t0;
      const t1 = nowMs();
      await edge.destroy(sb.id);
      destroys.edge.push(nowMs() - t1);
      return ms;
    };
    const timeIt = async (fn: () => Promise<void>): Promise<number> => {
      const t0 = nowMs();
      await fn();
      return nowMs() - t0;
    };
    const systems: Array<[string, (w: number) => Promise<number>]> = [
      ['dsec', (w) => dsecCreate(clients[w]!, destroys)],
      ['dsec edge', () => edgeCreate()],
      ['podman run --rm', () => timeIt(() => peers.podmanRun())],
      ['crun run', () => timeIt(() => peers.crunRun())],
      ['bwrap', () => timeIt(() => peers.bwrapRun())],
    ];
    progress('create: warm-up');
    for (let i = 0; i < WARMUP; i++) for (const [, fn] of systems) await fn(0);
    destroys.api.length = 0;
    destroys.apiAsync.length = 0;
    destroys.edge.length = 0;

    for (const concurrency of [1, 8]) {
      const rounds = concurrency === 1 ? (ctx.quick ? 10 : 100) : ctx.quick ? 2 : 20;
      const samples = new Map<string, number[]>(systems.map(([name]) => [name, []]));
      for (let round = 0; round < rounds; round++) {
        // Alternate the systems every round so that drift affects them all alike.
        for (const [name, fn] of systems) {
          const ms = await Promise.all(Array.from({ length: concurrency }, (_, w) => fn(w)));
          samples.get(name)!.push(...ms);
        }
        if ((round + 1) % 10 === 0) progress(`create: concurrency ${concurrency}, round ${round + 1}/${rounds}`);
      }
      const metric = `create to first exec, concurrency ${concurrency}`;
      const podman = summarize(samples.get('podman run --rm')!);
      for (const [name] of systems) {
        const s = summarize(samples.get(name)!);
        const targets =
          name === 'dsec' && concurrency === 1
            ? [
                { text: 'p50 <= 15 ms', met: s.p50 <= 15 },
                { text: '>= 10x faster than podman run', met: podman.p50 / s.p50 >= 10 },
              ]
            : undefined;
        ctx.record(latencyRow('create', metric, name, s, targets ? { targets } : {}));
      }
    }
    // Every removal of the rounds above (concurrency 1 and 8), timed from the call to its answer.
    ctx.record(latencyRow('create', 'destroy', 'dsec', summarize(destroys.api)));
    ctx.record(latencyRow('create', 'destroy, answered at once (202)', 'dsec', summarize(destroys.apiAsync)));
    ctx.record(latencyRow('create', 'destroy', 'dsec edge', summarize(destroys.edge)));
  },
};
