// Density: fill the node with idle sandboxes, measure host memory per sandbox (MemAvailable and
// cgroup accounting), create latency as the node fills, and the time to destroy them all; the
// same for podman up to a cap.
import { readFile } from 'node:fs/promises';
import { Sandbox } from '@dsec/sdk';
import type { DsecClient } from '@dsec/sdk';
import { IDLE_RESOURCES, retryRateLimited } from '../lib/platform.js';
import { latencyRow } from '../lib/report.js';
import type { Row } from '../lib/report.js';
import type { Scenario, ScenarioContext } from '../lib/scenario.js';
import { nowMs, pool, progress, sleep, summarize } from '../lib/stats.js';

/** podman containers are capped: each costs ~0.25 s and a conmon process. */
const PODMAN_CAP = 300;
/** Fill levels at which create latency is probed. */
const MARKS = [0, 0.25, 0.5, 0.75, 1];

async function memAvailableKiB(): Promise<number> {
  const m = /MemAvailable:\s+(\d+)/.exec(await readFile('/proc/meminfo', 'utf8'));
  return Number(m?.[1] ?? 0);
}

/** How one system is filled. */
interface Filler<H> {
  system: string;
  /** Starts one idle sandbox/container. */
  create(worker: number): Promise<H>;
  /** Starts one and returns the time to a usable state. */
  probe(): Promise<{ ms: number; handle: H }>;
  destroyAll(handles: H[]): Promise<void>;
  /** Memory charged to the sandboxes' cgroups, when known. */
  cgroupBytes(handles: H[]): Promise<number | undefined>;
}

async function fill<H>(ctx: ScenarioContext, f: Filler<H>, target: number, concurrency: number, deadlineMs: number, probes: number): Promise<void> {
  const rows: Row[] = [];
  const handles: H[] = [];
  await sleep(1000);
  const before = await memAvailableKiB();
  const t0 = nowMs();
  const probeAt = async (mark: number): Promise<H[]> => {
    const ms: number[] = [];
    const got: H[] = [];
    for (let i = 0; i < probes; i++) {
      const p = await f.probe();
      ms.push(p.ms);
      got.push(p.handle);
    }
    rows.push(latencyRow('density', `create at ${Math.round(mark * 100)}% fill`, f.system, summarize(ms)));
    return got;
  };
  let timedOut = false;
  for (const mark of MARKS.slice(0, -1)) {
    handles.push(...(await probeAt(mark)));
    const next = Math.floor(MARKS[MARKS.indexOf(mark) + 1]! * target);
    const need = next - handles.length;
    if (need > 0 && !timedOut) {
      const made = await pool(need, concurrency, async (_i, w) => {
        if (nowMs() - t0 > deadlineMs) {
          timedOut = true;
          return undefined;
        }
        return f.create(w);
      });
      handles.push(...made.filter((h): h is Awaited<H> => h !== undefined));
    }
    progress(`density: ${f.system}: ${handles.length}/${target} running`);
  }
  const fillS = (nowMs() - t0) / 1000;
  await sleep(2000);
  const after = await memAvailableKiB();
  const n = handles.length;
  const hostMiB = (before - after) / 1024 / n;
  const cg = await f.cgroupBytes(handles);
  const cgMiB = cg === undefined ? undefined : cg / 1048576 / n;
  // At 100%: a few more on the full node, removed right after.
  const extra = await probeAt(1);
  await f.destroyAll(extra);

  const isDsec = f.system === 'dsec';
  rows.push({
    scenario: 'density',
    metric: 'idle sandboxes running',
    system: f.system,
    unit: 'sandboxes',
    value: n,
    higherIsBetter: true,
    compare: false,
    ...(isDsec && target >= 3200 ? { targets: [{ text: '>= 3,200 running on 24 GiB', met: n >= 3200 }] } : {}),
    note: `filled in ${fillS.toFixed(1)} s${timedOut ? ' (stopped at the time bound)' : ''}`,
  });
  rows.push({ scenario: 'density', metric: 'host memory per sandbox (MemAvailable delta)', system: f.system, unit: 'MiB', value: hostMiB });
  if (cgMiB !== undefined) {
    rows.push({ scenario: 'density', metric: 'memory per sandbox charged to its cgroups', system: f.system, unit: 'MiB', value: cgMiB });
    rows.push({
      scenario: 'density',
      metric: 'host memory per sandbox beyond its cgroups',
      system: f.system,
      unit: 'MiB',
      value: hostMiB - cgMiB,
      ...(isDsec ? { targets: [{ text: "<= 1 MiB each beyond the agent's own processes", met: hostMiB - cgMiB <= 1 }] } : {}),
    });
  }
  const t1 = nowMs();
  await f.destroyAll(handles);
  const destroyS = (nowMs() - t1) / 1000;
  rows.push({ scenario: 'density', metric: 'destroy all', system: f.system, unit: 's', value: destroyS, compare: false, note: `${n} sandboxes` });
  rows.push({ scenario: 'density', metric: 'destroy all, per sandbox', system: f.system, unit: 'ms', value: (destroyS * 1000) / n });
  for (const r of rows) ctx.record(r);
}

export const densityScenario: Scenario = {
  name: 'density',
  title: '4. Density',
  method: [
    'The node is filled with idle busybox sandboxes (cpu 0.1, 16 MiB memory limit, 16 MiB disk) through the SDK at',
    'concurrency 8. Host memory per sandbox is the drop of MemAvailable in /proc/meminfo from before the fill to',
    '2 s after it (no caches dropped), divided by the count; it includes everything the node spends: chronus, the',
    'tmpfs and overlay mounts, crun state, kernel objects and the growth of the platform process. "Charged to its',
    "cgroups\" sums the sandboxes' memory.usage_in_bytes; the difference is the host's cost beyond the agent's",
    'own processes. Create latency (create + first exec of `true`) is probed with a few sequential creates at',
    '0/25/50/75/100% fill. podman is filled with `podman run -d ... sleep` (its probe is `podman run -d`, no exec)',
    `at concurrency 4 up to ${PODMAN_CAP} containers (a cap, for time: each costs ~0.25 s), within a time bound.`,
    "dsec's destroy sends every DELETE with `Prefer: respond-async` (8 at a time) and stops the clock when the last",
    'teardown behind them has finished.',
  ].join(' '),
  async run(ctx: ScenarioContext) {
    const target = ctx.density;
    const probes = ctx.quick ? 2 : 5;
    const clients: DsecClient[] = await Promise.all(Array.from({ length: 9 }, () => ctx.bench.newClient()));
    const probeClient = clients[8]!;
    const edge = ctx.bench.platform.edge;
    const create = (client: DsecClient): Promise<Sandbox> =>
      retryRateLimited(() => Sandbox.create({ image: { base: 'busybox' }, resources: IDLE_RESOURCES }, { client }));
    await fill<Sandbox>(
      ctx,
      {
        system: 'dsec',
        create: (w) => create(clients[w]!),
        async probe() {
          const t0 = nowMs();
          const sb = await create(probeClient);
          await retryRateLimited(() => sb.exec(['true']));
          return { ms: nowMs() - t0, handle: sb };
        },
        async destroyAll(sbs) {
          // Each DELETE answers once the delete is durable; gone means gone from the node.
          await pool(sbs.length, 8, (i) => retryRateLimited(() => sbs[i]!.kill({ wait: false })));
          await ctx.bench.platform.services.lifecycle.teardownsIdle();
        },
        async cgroupBytes(sbs) {
          let sum = 0;
          for (const sb of sbs) sum += (await edge.stats(sb.id)).memoryBytes;
          return sum;
        },
      },
      target,
      8,
      ctx.quick ? 60_000 : 600_000,
      probes,
    );

    const peers = ctx.peers;
    const podmanTarget = Math.min(target, ctx.quick ? 10 : PODMAN_CAP);
    await fill<string>(
      ctx,
      {
        system: 'podman',
        create: () => peers.podmanStartIdle(),
        async probe() {
          const t0 = nowMs();
          const handle = await peers.podmanStartIdle();
          return { ms: nowMs() - t0, handle };
        },
        async destroyAll(names) {
          for (let i = 0; i < names.length; i += 50) await peers.podmanRemove(names.slice(i, i + 50));
        },
        async cgroupBytes() {
          const text = await readFile('/sys/fs/cgroup/memory/libpod_parent/memory.usage_in_bytes', 'utf8').catch(() => undefined);
          return text === undefined ? undefined : Number(text.trim());
        },
      },
      podmanTarget,
      4,
      ctx.quick ? 30_000 : 150_000,
      probes,
    );
    if (podmanTarget < target) ctx.note(`podman was capped at ${podmanTarget} containers (dsec: ${target}); its per-container figures are at that count.`);
  },
};
