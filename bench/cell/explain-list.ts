// The plans PostgreSQL picks for the list's statements in a cell: the test PostgreSQL
// (test/helpers/postgres.ts, as `npm run cell` starts it), the schema `dsec apiserver --db`
// migrates, N sandboxes of the root project with a `job` label each (500 a job), then
// EXPLAIN (ANALYZE, BUFFERS) of the label list's page read and its labels' read (as an
// `IN (...)` of the page's ids, as they were, and by lateral lookups of an array, as the store
// reads them now) and the pools' pass, before and after ANALYZE. Needs root (PostgreSQL runs
// as its own user); run it under the test lock.
//   node bench/dist/cell/explain-list.js [--sandboxes 6000]
import { spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { REPO } from './cell.js';

interface PostgresHelper {
  startTestPostgres(): Promise<{
    createDatabase(name: string): Promise<string>;
    query(sql: string, database?: string): Promise<{ rows: Array<Record<string, unknown>> }>;
    close(): Promise<void>;
  }>;
}

const i = process.argv.indexOf('--sandboxes');
const sandboxes = i >= 0 ? Number(process.argv[i + 1]) : 6000;
if (!Number.isInteger(sandboxes) || sandboxes < 1) throw new Error('--sandboxes: not a positive integer');

const helper = (await import(pathToFileURL(path.join(REPO, 'test/dist/helpers/postgres.js')).href)) as PostgresHelper;
const pg = await helper.startTestPostgres();
const home = await mkdtemp(path.join(os.tmpdir(), 'dsec-explain-list-'));
try {
  const db = await pg.createDatabase('dsec_explain');
  // The apiserver migrates the empty database; it is stopped once it listens.
  const api = spawn(
    process.execPath,
    [path.join(REPO, 'packages/cli/dist/main.js'), 'apiserver', '--db', db, '--home', home, '--addr', '127.0.0.1:0', '--node-addr', '127.0.0.1:0', '--quiet'],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const exited = new Promise((r) => api.once('exit', r));
  await new Promise<void>((resolve, reject) => {
    let out = '';
    api.stdout.on('data', (d: Buffer) => (out += d.toString()).includes('listening') && resolve());
    api.once('exit', (code) => reject(new Error(`dsec apiserver exited (${code}) before it listened`)));
  });
  api.kill('SIGTERM');
  await exited;
  const q = (s: string): Promise<{ rows: Array<Record<string, unknown>> }> => pg.query(s, 'dsec_explain');
  const project = String((await q('SELECT id FROM projects LIMIT 1')).rows[0]!.id);
  const node = `'sim-' || lpad((g % 160)::text, 3, '0')`;
  await q(`INSERT INTO sandboxes (id, project_id, node, backend, state, spec, layers, cpu, memory_mib, created_at, expires_at, last_active_at)
    SELECT ${node} || '-' || md5(g::text), '${project}', ${node}, 'container', 'running', '{"image":{"base":"cellbase"},"labels":{"job":"j' || (g / 500) || '"}}',
           '[]', 1, 512, now()::text, now()::text, now()::text
      FROM generate_series(1, ${sandboxes}) g`);
  await q(`INSERT INTO sandbox_labels (sandbox_id, key, value) SELECT id, 'job', 'j' || substring(spec from '"job":"j([0-9]+)"') FROM sandboxes`);
  const page = (await q(`SELECT sandbox_id FROM sandbox_labels WHERE key = 'job' AND value = 'j3' ORDER BY sandbox_id LIMIT 101`)).rows.map((r) =>
    String(r.sandbox_id),
  );
  const ids = page.map((id) => `'${id}'`).join(', ');
  const array = `'{${page.join(',')}}'::text[]`;
  const statements = {
    'page read, id in (...) (before)': `select * from sandboxes where project_id in ('${project}') and id in (${ids}) and state != 'stopping' and pool_id is null`,
    'page read, ids by lateral lookup (StateStore.sandboxesByIds)': `select sandboxes.* from unnest(${array}) as page inner join lateral (select * from sandboxes where sandboxes.id = page.page offset 0) as sandboxes on true where project_id in ('${project}') and state != 'stopping' and pool_id is null order by id limit 100`,
    "the page's labels, sandbox_id in (...) (before)": `select * from sandbox_labels where sandbox_id in (${ids})`,
    "the page's labels by lateral lookup (StateStore.labelsByIds)": `select labels.* from unnest(${array}) as page inner join lateral (select * from sandbox_labels where sandbox_labels.sandbox_id = page.page offset 0) as labels on true`,
    "the pools' pass": `select pool_id, state, count(*) as n from sandboxes where pool_id is not null group by pool_id, state`,
  };
  for (const analyzed of [false, true]) {
    if (analyzed) await q('ANALYZE');
    for (const [name, s] of Object.entries(statements)) {
      for (let n = 0; n < 3; n++) await q(s);
      const plan = (await q(`EXPLAIN (ANALYZE, BUFFERS) ${s}`)).rows.map((r) => String(r['QUERY PLAN']));
      process.stdout.write(`== ${name} (${sandboxes} sandboxes, ${analyzed ? 'after' : 'before'} ANALYZE)\n${plan.join('\n')}\n\n`);
    }
  }
} finally {
  await pg.close();
  await rm(home, { recursive: true, force: true });
}
