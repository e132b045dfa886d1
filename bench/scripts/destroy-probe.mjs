// Where an edge destroy's time goes, in-process (no HTTP): REPO=<checkout, built>
// node bench/scripts/destroy-probe.mjs N CONCURRENCY. Creates N busybox sandboxes (8 at a time),
// then destroys them CONCURRENCY at a time with the container backend's steps timed (each
// wrapped where it is called); prints the destroys' p50 and ms per sandbox, then per step its
// count, p50 and sum (ms). Run it under the node's e2e lock, alternating checkouts.
import path from 'node:path';
import { performance } from 'node:perf_hooks';

const repo = path.resolve(process.env.REPO ?? '.');
const { startNode } = await import(path.join(repo, 'test/dist/helpers/node.js'));
const n = Number(process.argv[2] ?? 100);
const conc = Number(process.argv[3] ?? 8);
const node = await startNode();
const times = {};
const wrap = (obj, name, label) => {
  const f = obj?.[name];
  if (typeof f !== 'function') return;
  obj[name] = async function (...a) {
    const t0 = performance.now();
    try {
      return await f.apply(this, a);
    } finally {
      (times[label] ??= []).push(performance.now() - t0);
    }
  };
};
const p50 = (a) => [...a].sort((x, y) => x - y)[a.length >> 1];
try {
  await node.edge.layers.build({ type: 'busybox' }, { kind: 'base', name: 'busybox' });
  const ids = [];
  for (let i = 0; i < n; i += 8)
    ids.push(...(await Promise.all(Array.from({ length: Math.min(8, n - i) }, async () => (await node.edge.create({ image: { base: 'busybox' } })).id))));
  const b = node.edge.backends.get('container');
  wrap(b, 'destroy', 'backend.destroy');
  wrap(b.crun, 'end', 'crun.end');
  wrap(b.crun, 'initProcess', 'crun.initProcess');
  wrap(b.o.cgroups, 'thaw', 'cgroups.thaw');
  wrap(b.o.cgroups, 'waitEmpty', 'cgroups.waitEmpty');
  wrap(b.o.cgroups, 'remove', 'cgroups.remove');
  wrap(b.o.cgroups, 'existing', 'cgroups.existing');
  wrap(b, 'unmountWritable', 'unmountWritable');
  wrap(b.o.layers, 'release', 'layers.release');
  wrap(b.o.idRanges, 'release', 'idRanges.release');
  wrap(node.edge.network, 'remove', 'network.remove');
  const lat = [];
  let next = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: conc }, async () => {
      while (next < ids.length) {
        const id = ids[next++];
        const t = performance.now();
        await node.edge.destroy(id);
        lat.push(performance.now() - t);
      }
    }),
  );
  const ms = performance.now() - t0;
  console.log(`RESULT ${path.basename(repo)} destroy n ${n} conc ${conc}: ${(ms / n).toFixed(2)} ms per sandbox, p50 ${p50(lat).toFixed(1)} ms`);
  for (const [k, v] of Object.entries(times))
    console.log(
      `  ${k.padEnd(20)} n ${String(v.length).padStart(5)}  p50 ${p50(v).toFixed(2).padStart(7)}  sum ${v
        .reduce((x, y) => x + y, 0)
        .toFixed(0)
        .padStart(7)}`,
    );
} finally {
  await node.cleanup();
}
