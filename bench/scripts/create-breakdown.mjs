// Where a create's time goes through the API: REPO=<checkout, built> node
// bench/scripts/create-breakdown.mjs N CONCURRENCY. Starts the bench's in-process platform, runs
// N creates of a busybox sandbox through the SDK (create + exec `true`, then kill), CONCURRENCY at
// a time, and prints the p50 of each stage: the launch (dsec-launch + crun run), the container
// backend's create, the edge's create, the SDK's create and exec; then, per create cycle, the
// wall time of every better-sqlite3 statement on the event loop (a commit holds it for its fsync).
// Run it under the node's e2e lock (it creates sandboxes).
import { createRequire } from 'node:module';
import path from 'node:path';
import { performance } from 'node:perf_hooks';

const repo = path.resolve(process.env.REPO ?? '.');
const load = (p) => import(path.join(repo, p));
const n = Number(process.argv[2] ?? 30);
const conc = Number(process.argv[3] ?? 1);

const stages = new Map();
const add = (k, v) => stages.set(k, [...(stages.get(k) ?? []), v]);
const timed = (obj, name, label) => {
  const o = obj[name];
  obj[name] = async function (...a) {
    const t = performance.now();
    try {
      return await o.apply(this, a);
    } finally {
      add(label, performance.now() - t);
    }
  };
};

// Statements by SQL text (before the store opens its database).
const sql = new Map();
const Database = createRequire(path.join(repo, 'packages/apiserver/package.json'))('better-sqlite3');
const prepare = Database.prototype.prepare;
Database.prototype.prepare = function (text, ...a) {
  const st = prepare.call(this, text, ...a);
  const key = text.replace(/\s+/g, ' ').slice(0, 80);
  for (const m of ['run', 'all', 'get']) {
    const o = st[m];
    st[m] = function (...args) {
      const t = performance.now();
      try {
        return o.apply(this, args);
      } finally {
        const e = sql.get(key) ?? { n: 0, ms: 0 };
        e.n++;
        e.ms += performance.now() - t;
        sql.set(key, e);
      }
    };
  }
  return st;
};

const { startBenchPlatform, benchTempDir } = await load('bench/dist/lib/platform.js');
const { cleanupAll } = await load('bench/dist/lib/cleanup.js');
const { ContainerBackend } = await load('packages/edge/dist/backends/container/backend.js');
const { LaunchServer } = await load('packages/edge/dist/backends/container/launcher.js');
const { Sandbox } = await load('node_modules/@dsec/sdk/dist/index.js');
timed(ContainerBackend.prototype, 'create', 'backend create');
timed(LaunchServer.prototype, 'run', 'launch (dsec-launch + crun run)');
try {
  const dir = await benchTempDir();
  const bench = await startBenchPlatform(path.join(dir, 'home'));
  const client = await bench.newClient();
  timed(Object.getPrototypeOf(bench.platform.edge), 'create', 'edge create');
  const one = async () => {
    const t0 = performance.now();
    const sb = await Sandbox.create({ image: { base: 'busybox' } }, { client });
    const t1 = performance.now();
    await sb.exec(['true']);
    const t2 = performance.now();
    add('API create', t1 - t0);
    add('API exec true', t2 - t1);
    add('API create to first exec', t2 - t0);
    return sb;
  };
  for (let i = 0; i < 3; i++) await (await one()).kill();
  stages.clear();
  sql.clear();
  for (let i = 0; i < n; i += conc) {
    const sbs = await Promise.all(Array.from({ length: Math.min(conc, n - i) }, one));
    for (const sb of sbs) await sb.kill();
  }
  for (const [k, v] of stages) {
    v.sort((a, b) => a - b);
    console.log(`${v[v.length >> 1].toFixed(2).padStart(8)} ms p50  ${k}`);
  }
  console.log('SQLite on the event loop, per create cycle (create, exec, kill):');
  for (const [k, v] of [...sql].sort((a, b) => b[1].ms - a[1].ms).slice(0, 12)) {
    console.log(`${(v.ms / n).toFixed(2).padStart(8)} ms ${(v.n / n).toFixed(1).padStart(5)}x  ${k}`);
  }
} finally {
  await cleanupAll();
}
