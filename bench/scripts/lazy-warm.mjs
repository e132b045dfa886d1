// Warm starts of a lazily loaded layer against the same layer stored locally, in-process at the
// edge (no HTTP): REPO=<checkout, built> node bench/scripts/lazy-warm.mjs [--image NAME] [--runs N]
// [--unmount] [--idle-ms MS]. Pushes the image (a base layer from the bench's persistent cache,
// default the 1.66 GiB one of `--only lazy`) to a docker-registry on loopback, opens two nodes on
// it (eager: layers pulled whole; lazy), starts one sandbox on each (the cold start, not counted),
// then N times on each, alternating which goes first: create, `python3 -c 'import json'`,
// destroy; prints the runs and the medians of create + command, create, command. `--unmount`:
// the layer is unmounted after each destroy (no linger), so each start mounts it again (what a
// warm start meets once the linger has passed); `--idle-ms` sets the lazy node's
// `lazyServerIdleMs` (0: the server stops with the unmount). Run it under the e2e lock.
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';

const repo = path.resolve(process.env.REPO ?? '.');
const { values } = parseArgs({
  options: {
    image: { type: 'string', default: 'bench-lazy-10pkgs-80' },
    runs: { type: 'string', default: '10' },
    unmount: { type: 'boolean', default: false },
    'idle-ms': { type: 'string' },
  },
});
const { LayerRegistry, LayerStore, startOciRegistry } = await import(path.join(repo, 'packages/edge/dist/index.js'));
const { startNode } = await import(path.join(repo, 'test/dist/helpers/node.js'));
const cacheRoot = '/var/tmp/dsec-bench-cache/layers';
const source = new LayerStore({ root: cacheRoot });
const info = await source.resolve(values.image);
await source.close();
const registry = await startOciRegistry({ bcryptCost: 4 });
const nodes = {};
try {
  const endpoint = { url: registry.url, username: registry.username, password: registry.password };
  const dir = path.join(cacheRoot, 'blobs', info.digest.slice(7));
  await new LayerRegistry(endpoint).push({ meta: path.join(dir, 'meta.erofs'), blob: path.join(dir, 'data.blob') }, info);
  const idle = values['idle-ms'] === undefined ? {} : { lazyServerIdleMs: Number(values['idle-ms']) };
  nodes.eager = await startNode({ edge: { registry: endpoint } });
  nodes.lazy = await startNode({ edge: { registry: { ...endpoint, lazy: true, ...idle } } });
  // The store's unmount linger (10 s) is not an edge option: set on the store for `--unmount`.
  if (values.unmount) for (const n of Object.values(nodes)) n.edge.layers.lingerMs = 0;
  const spec = { image: { base: info.digest } };
  const cmd = "python3 -c 'import json'";
  const one = async (edge) => {
    const t0 = performance.now();
    const sb = await edge.create(spec);
    const t1 = performance.now();
    const r = await edge.exec(sb.id, { cmd });
    const t2 = performance.now();
    if (r.exitCode !== 0) throw new Error(r.stderr);
    await edge.destroy(sb.id);
    return [t2 - t0, t1 - t0, t2 - t1];
  };
  for (const n of Object.values(nodes)) await one(n.edge);
  const times = { eager: [], lazy: [] };
  for (let i = 0; i < Number(values.runs); i++) for (const m of i % 2 ? ['lazy', 'eager'] : ['eager', 'lazy']) times[m].push(await one(nodes[m].edge));
  const med = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)].toFixed(1);
  for (const [m, t] of Object.entries(times)) {
    console.log(`${m}: runs ${t.map((x) => x[0].toFixed(0)).join(' ')}`);
    console.log(`${m}: median create+command ${med(t.map((x) => x[0]))} ms, create ${med(t.map((x) => x[1]))} ms, command ${med(t.map((x) => x[2]))} ms`);
  }
} finally {
  for (const n of Object.values(nodes)) await n.cleanup().catch(() => undefined);
  await registry.close();
}
