// A/B probe of function calls at the edge, in-process (no HTTP): paced p50 of `sh -c true`
// calls, their rate with 8 in flight, and the edge process's CPU per call in that phase.
// usage (as root, under the e2e lock): node bench/scripts/fncall-probe.mjs REPO [reuse|no-reuse]
// REPO: a built checkout (this one, or one of main to compare with).
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';

const repo = path.resolve(process.argv[2] ?? '.');
const reuse = process.argv[3] !== 'no-reuse';
const { startNode } = await import(path.join(repo, 'test/dist/helpers/node.js'));
const { fncallRunner } = await import(path.join(repo, 'packages/edge/dist/index.js'));
const node = await startNode({ edge: { calls: fncallRunner({ reuse }) } });
const call = () => node.edge.calls.run({ runtime: 'sh', code: 'true' });
try {
  for (let i = 0; i < 20; i++) await call();
  const latencies = [];
  for (let i = 0; i < 60; i++) {
    const t0 = performance.now();
    await call();
    latencies.push(performance.now() - t0);
    await sleep(20);
  }
  latencies.sort((a, b) => a - b);
  const cpu0 = process.cpuUsage();
  const end = Date.now() + 3000;
  let calls = 0;
  await Promise.all(
    Array.from({ length: 8 }, async () => {
      while (Date.now() < end) {
        await call();
        calls++;
      }
    }),
  );
  const cpu = process.cpuUsage(cpu0);
  const pacedP50Ms = Number(latencies[30].toFixed(2));
  const ratePerS = Number((calls / 3).toFixed(1));
  const edgeCpuMsPerCall = Number(((cpu.user + cpu.system) / 1000 / calls).toFixed(2));
  console.log(JSON.stringify({ repo, reuse, pacedP50Ms, ratePerS, edgeCpuMsPerCall }));
} finally {
  await node.cleanup();
}
