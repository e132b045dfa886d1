// A/B of the apiserver's store on the request path, for one checkout's builds (run it for two
// checkouts in turn, alternating): exec `true` through the SDK vs the in-process edge, and create
// -> first exec through the SDK at concurrency 1 and 8 (each sandbox killed after).
// Root, under the e2e lock: flock /tmp/dsec-e2e.lock node bench/scripts/store-ab.mjs <checkout> [execs] [creates]
import path from 'node:path';
import { performance } from 'node:perf_hooks';
const [checkout, execArg, createArg] = process.argv.slice(2);
const d = (p) => path.join(checkout, p);
const { startBenchPlatform, benchTempDir } = await import(d('bench/dist/lib/platform.js'));
const { cleanupAll } = await import(d('bench/dist/lib/cleanup.js'));
const { Sandbox } = await import(d('packages/sdk/dist/index.js'));
const q = (a, p) => {
  const s = [...a].sort((x, y) => x - y);
  return s[Math.floor(p * (s.length - 1))];
};
const f = (a) => `p50 ${q(a, 0.5).toFixed(2)} p90 ${q(a, 0.9).toFixed(2)}`;
try {
  const dir = await benchTempDir();
  const bench = await startBenchPlatform(path.join(dir, 'home'));
  const client = await bench.newClient();
  const edge = bench.platform.edge;
  const sb = await Sandbox.create({ image: { base: 'busybox' } }, { client });
  const n = Number(execArg ?? 200);
  const sdk = [];
  const ed = [];
  for (let i = 0; i < 20; i++) await sb.exec(['true']);
  for (let i = 0; i < n; i++) {
    let t = performance.now();
    await sb.exec(['true']);
    sdk.push(performance.now() - t);
    t = performance.now();
    await edge.exec(sb.id, { argv: ['true'] });
    ed.push(performance.now() - t);
  }
  await sb.kill();
  const creates = Number(createArg ?? 24);
  const out = {};
  for (const conc of [1, 8]) {
    const lat = [];
    const one = async () => {
      const t0 = performance.now();
      const s = await Sandbox.create({ image: { base: 'busybox' } }, { client });
      await s.exec(['true']);
      lat.push(performance.now() - t0);
      return s;
    };
    for (let i = 0; i < 2; i++) await (await one()).kill();
    lat.length = 0;
    const t0 = performance.now();
    for (let i = 0; i < creates; i += conc) {
      const made = await Promise.all(Array.from({ length: Math.min(conc, creates - i) }, one));
      await Promise.all(made.map((s) => s.kill()));
    }
    out[conc] = { lat, rate: creates / ((performance.now() - t0) / 1000) };
  }
  console.log(
    `RESULT ${checkout} exec sdk ${f(sdk)} edge ${f(ed)} diff p50 ${(q(sdk, 0.5) - q(ed, 0.5)).toFixed(2)} | create->exec c=1 ${f(out[1].lat)} | c=8 ${f(out[8].lat)} (create+exec+kill ${out[8].rate.toFixed(1)}/s)`,
  );
} finally {
  await cleanupAll();
}
process.exit(0);
