// Destroys through the API, for one checkout's builds (run it for two checkouts in turn):
//   flock /tmp/dsec-e2e.lock node bench/scripts/destroy-ab.mjs <checkout> N sync|async [CONCURRENCY]
// Fills a fresh bench platform with N idle busybox sandboxes (the density scenario's resources)
// through the SDK, then deletes them all through the SDK, CONCURRENCY at a time (default 8):
// `sync` waits for each DELETE to finish the teardown (204), `async` sends
// `Prefer: respond-async` (202 once the row is durably `stopping`, the teardown behind it).
// Prints the DELETE answers' p50/p99, the time until every DELETE was answered, and the time
// until every sandbox is gone from the node (no sandbox, cgroup, mount or folder of one left).
import path from 'node:path';
import { readdir } from 'node:fs/promises';
import { performance } from 'node:perf_hooks';

const [checkout, nArg, mode = 'sync', concArg] = process.argv.slice(2);
if (!checkout || !['sync', 'async'].includes(mode)) throw new Error('usage: destroy-ab.mjs <checkout> N sync|async [CONCURRENCY]');
const d = (p) => path.join(path.resolve(checkout), p);
const { startBenchPlatform, benchTempDir, retryRateLimited } = await import(d('bench/dist/lib/platform.js'));
const { cleanupAll } = await import(d('bench/dist/lib/cleanup.js'));
const { pool } = await import(d('bench/dist/lib/stats.js'));
const { Sandbox } = await import(d('packages/sdk/dist/index.js'));
const { mountsUnder } = await import(d('packages/edge/dist/index.js'));
const n = Number(nArg ?? 200);
const conc = Number(concArg ?? 8);
const IDLE = { cpu: 0.1, memoryMiB: 16, diskMiB: 16 };
const q = (a, p) => [...a].sort((x, y) => x - y)[Math.floor(p * (a.length - 1))];

try {
  const dir = await benchTempDir();
  const home = path.join(dir, 'home');
  const bench = await startBenchPlatform(home);
  const edge = bench.platform.edge;
  const clients = await Promise.all(Array.from({ length: 8 }, () => bench.newClient()));
  // What a container sandbox holds on the node: its folder, writable layer (a tmpfs mount), root
  // mount point, cgroups, processes (none can be left once its cgroups are gone).
  const o = edge.backends.get('container').o;
  const count = async (dir) => (await readdir(dir).catch(() => [])).length;
  const left = async () => ({
    sandboxes: (await edge.list()).length,
    cgroups: (await edge.cgroups.list()).length,
    mounts: (await mountsUnder(o.writableDir)).length + (await mountsUnder(o.rootsDir)).length,
    folders: (await count(o.sandboxesDir)) + (await count(o.writableDir)) + (await count(o.rootsDir)),
  });
  const before = await left();
  const sbs = await pool(n, 8, (_, w) => retryRateLimited(() => Sandbox.create({ image: { base: 'busybox' }, resources: IDLE }, { client: clients[w] })));
  const full = await left();
  const lat = [];
  const t0 = performance.now();
  await pool(n, conc, (i) =>
    retryRateLimited(async () => {
      const t = performance.now();
      await sbs[i].kill(mode === 'async' ? { wait: false } : {});
      lat.push(performance.now() - t);
    }),
  );
  const answeredS = (performance.now() - t0) / 1000;
  if (mode === 'async') await bench.platform.services.lifecycle.teardownsIdle();
  const goneS = (performance.now() - t0) / 1000;
  const after = await left();
  console.log(
    `RESULT ${path.basename(path.resolve(checkout))} destroy ${mode} n ${n} conc ${conc} answer p50 ${q(lat, 0.5).toFixed(2)} p99 ${q(lat, 0.99).toFixed(2)} ms; ` +
      `all answered ${answeredS.toFixed(2)} s; all gone ${goneS.toFixed(2)} s (${((goneS * 1000) / n).toFixed(2)} ms each); before ${JSON.stringify(before)} full ${JSON.stringify(full)} after ${JSON.stringify(after)}`,
  );
  for (const k of Object.keys(before)) if (after[k] !== before[k]) throw new Error(`${k} left: ${after[k]} (before the fill: ${before[k]})`);
} finally {
  await cleanupAll();
}
