// Warm against cold python3 calls at the edge, in-process (no HTTP), alternating in one run:
// `python3 -c 'print(1)'` as a plain call (a warm interpreter, docs/fncall.md "Warm python3"),
// the same call with an environment of its own (a new python3 process, the path every python3
// call took before), and Debian's /usr/bin/python3 on the host. Paced 20 ms apart; p50 in ms.
// usage (as root, under the e2e lock): node bench/scripts/fncall-python-probe.mjs [REPO] [N]
import { execFile } from 'node:child_process';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';

const repo = path.resolve(process.argv[2] ?? '.');
const n = Number(process.argv[3] ?? 40);
const { startNode } = await import(path.join(repo, 'test/dist/helpers/node.js'));
const { fncallRunner } = await import(path.join(repo, 'packages/edge/dist/index.js'));
const node = await startNode({ edge: { calls: fncallRunner({ runtimeCache: '/var/tmp/dsec-bench-cache/runtimes', prebuild: ['python'] }) } });
const run = promisify(execFile);
const systems = {
  warm: () => node.edge.calls.run({ runtime: 'python3', code: 'print(1)' }),
  cold: () => node.edge.calls.run({ runtime: 'python3', code: 'print(1)', env: { COLD: '1' } }),
  host: () => run('/usr/bin/python3', ['-c', 'print(1)']),
};
try {
  for (const until = Date.now() + 900_000; ;) {
    const r = await systems.warm().catch((err) => err);
    if (!(r instanceof Error) || Date.now() > until) break;
    await sleep(2000);
  }
  const samples = Object.fromEntries(Object.keys(systems).map((k) => [k, []]));
  for (let i = 0; i < n + 5; i++) {
    for (const [name, fn] of Object.entries(systems)) {
      const t0 = performance.now();
      const r = await fn();
      if (name !== 'host' && r.stdout !== '1\n') throw new Error(`${name}: ${JSON.stringify(r)}`);
      if (i >= 5) samples[name].push(performance.now() - t0);
      await sleep(20);
    }
  }
  const p50 = (xs) => Number(xs.sort((a, b) => a - b)[xs.length >> 1].toFixed(2));
  const out = Object.fromEntries(Object.entries(samples).map(([k, xs]) => [k, p50(xs)]));
  console.log(
    JSON.stringify({ repo, n, p50Ms: out, warmOverHost: Number((out.warm / out.host).toFixed(2)), coldOverHost: Number((out.cold / out.host).toFixed(2)) }),
  );
} finally {
  await node.cleanup();
}
