// Batch creation and warm pools: one `POST /v1/sandboxes:batch` of many idle sandboxes end to
// end, and the latency of a create that claims a sandbox from a warm pool.
import { Sandbox } from '@dsec/sdk';
import type { DsecClient } from '@dsec/sdk';
import { IDLE_RESOURCES, retryRateLimited } from '../lib/platform.js';
import { latencyRow } from '../lib/report.js';
import type { Scenario, ScenarioContext } from '../lib/scenario.js';
import { nowMs, pool, progress, sleep, summarize } from '../lib/stats.js';

const SPEC = { image: { base: 'busybox' }, resources: IDLE_RESOURCES };
const POOL = 'bench-claims';

async function destroyAll(sandboxes: Sandbox[], concurrency = 8): Promise<void> {
  await pool(sandboxes.length, concurrency, (i) => retryRateLimited(() => sandboxes[i]!.kill()));
}

/** Waits until the pool holds `size` ready sandboxes and creates none. */
async function poolFull(client: DsecClient, size: number): Promise<void> {
  const deadline = nowMs() + 300_000;
  for (;;) {
    const p = await client.pools.get(POOL);
    if (p.ready >= size && p.creating === 0) return;
    if (nowMs() > deadline) throw new Error(`pool ${POOL} did not fill: ${p.ready}/${size} ready, last error ${p.lastError ?? 'none'}`);
    await sleep(100);
  }
}

export const batchScenario: Scenario = {
  name: 'batch',
  title: '8. Batch creation and warm pools',
  method: [
    'Batch: one `Sandbox.createBatch({spec, count})` of idle busybox sandboxes (cpu 0.1, 16 MiB, 16 MiB disk)',
    'through the SDK, timed from the call to the last item of the streamed reply (every sandbox running, its agent',
    'answering); the server creates 16 at a time. Then all are destroyed. Pool claim: a pool of the same spec is',
    'filled, then creates of that spec (each with its own env and labels) are timed one after another through the',
    'SDK, half the pool per round so that claims never wait on the background refill; the claimed sandboxes are',
    'destroyed and the pool refills between rounds. For reference, creates of a spec no pool matches are timed too.',
  ].join(' '),
  async run(ctx: ScenarioContext) {
    const client = await ctx.bench.newClient();
    const cp = ctx.bench.platform.services;

    // ---- batch ----
    for (const count of ctx.quick ? [50] : [100, 1000]) {
      let first: number | undefined;
      const t0 = nowMs();
      const result = await Sandbox.createBatch(
        { spec: { ...SPEC, labels: { bench: 'batch' } }, count },
        { onItem: () => (first ??= nowMs() - t0) },
        { client },
      );
      const ms = nowMs() - t0;
      if (result.failed > 0) throw new Error(`batch of ${count}: ${result.failed} items failed, first: ${result.items.find((i) => i.error)?.error?.message}`);
      progress(`batch: ${count} created in ${ms.toFixed(0)} ms`);
      ctx.record({ scenario: 'batch', metric: `batch of ${count} creates, end to end`, system: 'dsec', unit: 'ms', value: ms });
      ctx.record({
        scenario: 'batch',
        metric: `batch of ${count} creates, rate`,
        system: 'dsec',
        unit: 'creates/s',
        value: count / (ms / 1000),
        higherIsBetter: true,
      });
      ctx.record({ scenario: 'batch', metric: `batch of ${count}: first item streamed`, system: 'dsec', unit: 'ms', value: first ?? ms });
      await destroyAll(result.sandboxes);
    }

    // ---- pool claims ----
    const size = ctx.quick ? 16 : 64;
    const rounds = ctx.quick ? 2 : 5;
    await client.pools.put(POOL, { spec: SPEC, size });
    await poolFull(client, size);
    const claimsBefore = cp.counters.poolClaims;
    const claim: number[] = [];
    const claimExec: number[] = [];
    for (let round = 0; round < rounds; round++) {
      const claimed: Sandbox[] = [];
      for (let i = 0; i < size / 2; i++) {
        const t0 = nowMs();
        const sb = await retryRateLimited(() => Sandbox.create({ ...SPEC, env: { EPISODE: `${round}-${i}` }, labels: { bench: 'claim' } }, { client }));
        const t1 = nowMs();
        await sb.exec(['true']);
        claim.push(t1 - t0);
        claimExec.push(nowMs() - t0);
        claimed.push(sb);
      }
      await destroyAll(claimed);
      await poolFull(client, size);
      progress(`batch: pool claims, round ${round + 1}/${rounds}`);
    }
    const fromPool = cp.counters.poolClaims - claimsBefore;
    if (fromPool !== claim.length) throw new Error(`only ${fromPool} of ${claim.length} creates were claims from the pool`);
    const s = summarize(claim);
    ctx.record(latencyRow('batch', 'create that claims from a warm pool', 'dsec', s, { targets: [{ text: 'p50 <= 2 ms', met: s.p50 <= 2 }] }));
    ctx.record(latencyRow('batch', 'claim from a warm pool to first exec', 'dsec', summarize(claimExec)));
    await client.pools.delete(POOL);

    // Reference: the same create when no pool matches (layers cached).
    const fresh: number[] = [];
    const freshSandboxes: Sandbox[] = [];
    for (let i = 0; i < (ctx.quick ? 8 : 32); i++) {
      const t0 = nowMs();
      freshSandboxes.push(await retryRateLimited(() => Sandbox.create({ ...SPEC, env: { EPISODE: `fresh-${i}` } }, { client })));
      fresh.push(nowMs() - t0);
    }
    ctx.record(latencyRow('batch', 'create with no pool (same spec)', 'dsec', summarize(fresh)));
    await destroyAll(freshSandboxes);
    ctx.note(`${fromPool} creates were answered from the pool (${size} sandboxes, ${rounds} rounds of ${size / 2} claims).`);
  },
};
