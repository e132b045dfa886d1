// Exec through the SDK against the apiserver over a fake node (no root, no sandbox): SDK -> HTTP ->
// apiserver -> FakeEdge, for one checkout's builds; alternate two checkouts. Usage:
// node bench/scripts/exec-fake-ab.mjs <checkout> [iterations, <= 800: the key's rate limit bursts to 1000]
import path from 'node:path';
import { createServer } from 'node:http';
import { performance } from 'node:perf_hooks';
const [checkout, nArg] = process.argv.slice(2);
const d = (p) => path.join(checkout, p);
const { harness } = await import(d('packages/apiserver/dist/testing/harness.js'));
const { createApp } = await import(d('packages/apiserver/dist/http/app.js'));
const { Metrics } = await import(d('packages/apiserver/dist/metrics.js'));
const { WatchService } = await import(d('packages/apiserver/dist/watch.js'));
const { getRequestListener } = await import(d('node_modules/@hono/node-server/dist/index.mjs'));
const { DsecClient, Sandbox } = await import(d('packages/sdk/dist/index.js'));
let fast;
try {
  fast = await import(d('packages/apiserver/dist/http/exec-fast-path.js'));
} catch {
  // a checkout without the raw exec handler: the app serves every request
}
const h = await harness();
const watch = new WatchService(h.store);
const raw = [];
const app = createApp(h.services, new Metrics(h.services, watch), () => {}, watch, { onRequest: (fn) => raw.push(fn) });
const listener = getRequestListener(app.fetch);
const server = createServer(fast ? fast.withRawHandlers(raw, listener) : listener);
await new Promise((r) => server.listen(0, '127.0.0.1', r));
const client = new DsecClient({ apiUrl: `http://127.0.0.1:${server.address().port}`, apiKey: h.adminKey });
const sb = await Sandbox.create({ image: { base: 'busybox' } }, { client });
const n = Number(nArg ?? 2000);
for (let i = 0; i < 100; i++) await sb.exec(['true']);
const lat = [];
const c0 = process.cpuUsage();
for (let i = 0; i < n; i++) {
  const t = performance.now();
  await sb.exec(['true']);
  lat.push(performance.now() - t);
}
const c = process.cpuUsage(c0);
lat.sort((a, b) => a - b);
console.log(
  `FAKE ${checkout} cpu/exec ${((c.user + c.system) / n).toFixed(0)} us  p10 ${lat[Math.floor(n * 0.1)].toFixed(3)} p50 ${lat[Math.floor(n * 0.5)].toFixed(3)}`,
);
server.closeAllConnections();
server.close();
await watch.close();
await h.close();
process.exit(0);
