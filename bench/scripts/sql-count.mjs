// SQLite statements (and commits: COMMITs and writes outside a transaction) per exec or per create +
// exec + kill through the SDK, for one checkout's builds. Root, under the e2e lock:
// flock /tmp/dsec-e2e.lock node bench/scripts/sql-count.mjs <checkout> exec|create|create8
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { createRequire } from 'node:module';
const checkout = process.argv[2];
const require = createRequire(path.join(checkout, 'packages/apiserver/package.json'));
const Database = require('better-sqlite3');
const counts = new Map();
// Commits: COMMIT statements and writes outside a transaction (SQLite commits each alone).
let commits = 0;
const origPrepare = Database.prototype.prepare;
let on = false;
Database.prototype.prepare = function (src) {
  const st = origPrepare.call(this, src);
  const inTransaction = () => this.inTransaction;
  for (const m of ['run', 'get', 'all', 'iterate']) {
    const o = st[m];
    st[m] = function (...a) {
      if (on && (/^commit/i.test(src) || (!st.readonly && !inTransaction()))) commits++;
      const t = performance.now();
      try {
        return o.apply(this, a);
      } finally {
        if (on) {
          const k = m + ' ' + src.slice(0, 110);
          const c = counts.get(k) ?? [0, 0];
          c[0]++;
          c[1] += performance.now() - t;
          counts.set(k, c);
        }
      }
    };
  }
  return st;
};
const { startBenchPlatform, benchTempDir } = await import(path.join(checkout, 'bench/dist/lib/platform.js'));
const { cleanupAll } = await import(path.join(checkout, 'bench/dist/lib/cleanup.js'));
const { Sandbox } = await import(path.join(checkout, 'packages/sdk/dist/index.js'));
try {
  const dir = await benchTempDir();
  const bench = await startBenchPlatform(path.join(dir, 'home'));
  const client = await bench.newClient();
  const mode = process.argv[3] ?? 'exec';
  const n = 200;
  if (mode === 'exec') {
    const sb = await Sandbox.create({ image: { base: 'busybox' } }, { client });
    for (let i = 0; i < 20; i++) await sb.exec(['true']);
    await sleep(1500);
    on = true;
    for (let i = 0; i < n; i++) await sb.exec(['true']);
    on = false;
    await sb.kill();
  } else {
    // create: 20 create + exec + kill one at a time; create8: 40, eight at a time.
    const conc = mode === 'create8' ? 8 : 1;
    const total = conc === 8 ? 40 : 20;
    const one = async () => {
      const sb = await Sandbox.create({ image: { base: 'busybox' } }, { client });
      await sb.exec(['true']);
      await sb.kill();
    };
    on = true;
    for (let i = 0; i < total; i += conc) await Promise.all(Array.from({ length: conc }, one));
    on = false;
  }
  const div = mode === 'exec' ? n : mode === 'create8' ? 40 : 20;
  console.log(`COMMITS ${checkout} ${mode}: ${(commits / div).toFixed(2)} per ${mode === 'exec' ? 'exec' : 'create + exec + kill'}`);
  for (const [k, [c, t]] of [...counts].sort((a, b) => b[1][1] - a[1][1]))
    console.log(`${(c / div).toFixed(2).padStart(6)}/op ${(t / div).toFixed(3).padStart(7)}ms/op  ${k}`);
} finally {
  await cleanupAll();
}
process.exit(0);
