// A/B probe of container creates at the edge, in-process (no HTTP): REPO=<checkout, built>
// node bench/scripts/create-ab.mjs N CONCURRENCY. Creates N busybox sandboxes, CONCURRENCY at a
// time, each followed by an exec of `true` (create to first exec), then destroys them as many at
// a time; prints the p50 of create to first exec, creates per second and destroys per second.
// Run it under the node's e2e lock, alternating checkouts (see docs/benchmarks.md, fastcreate).
import path from 'node:path';
import { performance } from 'node:perf_hooks';

const repo = path.resolve(process.env.REPO ?? '.');
const { startNode } = await import(path.join(repo, 'test/dist/helpers/node.js'));
const n = Number(process.argv[2] ?? 20);
const conc = Number(process.argv[3] ?? 1);
const node = await startNode();
try {
  await node.edge.layers.build({ type: 'busybox' }, { kind: 'base', name: 'busybox' });
  const lat = [];
  const one = async () => {
    const t0 = performance.now();
    const sb = await node.edge.create({ image: { base: 'busybox' } });
    await node.edge.exec(sb.id, { argv: ['true'] });
    lat.push(performance.now() - t0);
    return sb.id;
  };
  for (let i = 0; i < 3; i++) await node.edge.destroy(await one());
  lat.length = 0;
  const ids = [];
  const t0 = performance.now();
  for (let i = 0; i < n; i += conc) ids.push(...(await Promise.all(Array.from({ length: Math.min(conc, n - i) }, one))));
  const secs = (performance.now() - t0) / 1000;
  const t1 = performance.now();
  for (let i = 0; i < ids.length; i += conc) await Promise.all(ids.slice(i, i + conc).map((id) => node.edge.destroy(id)));
  const dsecs = (performance.now() - t1) / 1000;
  lat.sort((a, b) => a - b);
  const p50 = lat[lat.length >> 1];
  console.log(JSON.stringify({ repo: path.basename(repo), conc, p50: +p50.toFixed(2), rate: +(n / secs).toFixed(1), destroyRate: +(n / dsecs).toFixed(1) }));
} finally {
  await node.cleanup();
}
