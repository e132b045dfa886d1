// The simulated cell (`npm run cell`): the real `dsec apiserver` on a PostgreSQL of its own
// (Debian's server, started by the test helper test/helpers/postgres.ts) and N simulated nodes
// that join its node port with single-use tokens and hold real sessions (HTTP/2 in mutual TLS,
// the edge wire protocol), several per process (edge-host.ts). The nodes' sandboxes are records
// with the delays of the real container backend (SimEdge, `@dsec/apiserver/testing`): what is
// measured is the control plane, the store and the node protocol. The cell fills in ten
// stages; each stage creates its share through batch creates, then times single creates
// through the HTTP API and list/filter queries, and samples the apiserver's RSS.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { mkdir, mkdtemp, readFile, readdir, rename, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import type { SimEdgeOptions } from '@dsec/apiserver/testing';
import { DsecClient } from '@dsec/sdk';
import type { EdgeHostOrders } from './edge-host.js';
import { nowMs, percentile } from '../lib/stats.js';

const HERE = path.dirname(fileURLToPath(import.meta.url));
/** The checkout (this file runs from bench/dist/cell/). */
export const REPO = path.resolve(HERE, '../../..');
const CLI = path.join(REPO, 'packages/cli/dist/main.js');
/** Bound of a process start and of a node's join. */
const START_TIMEOUT_MS = 120_000;

/** The size and shape of a cell run. */
export interface CellOptions {
  /** Simulated nodes. */
  nodes: number;
  /** Sandboxes the cell holds at the end. */
  sandboxes: number;
  /** Processes the nodes are spread over. */
  edgeProcesses: number;
  /** Items per batch create. */
  batchSize: number;
  /** Batch creates in flight at once. */
  batchConcurrency: number;
  /** Single creates timed per stage (of the ten). */
  singlesPerStage: number;
  /**
   * Single creates in flight at once. Each worker has its own API key: the keys are the root
   * project's, each with its own rate bucket (`limits.requestsPerSecondPerTenant`, 100/s, burst
   * 1,000), so the per-key limit binds only above 100 creates/s a worker.
   */
  singleConcurrency: number;
  /** List/filter queries timed per stage. */
  listsPerStage: number;
  /** Capacity and delays of each simulated node. */
  sim: SimEdgeOptions;
  /** Where progress goes. */
  log: (line: string) => void;
  /** Stops the run (everything started is stopped). */
  signal?: AbortSignal;
  /**
   * A folder for a profile of the run: the apiserver's CPU profile (`--cpu-prof`, written when
   * it stops) and PostgreSQL's statements by total time (pg_stat_statements) in
   * `pg-statements.txt`. None: no profile.
   */
  profileDir?: string;
  /**
   * With `profileDir`: also a heap snapshot of the apiserver once the cell is full
   * (`apiserver.heapsnapshot`, V8's format; `node bench/dist/cell/heap-summary.js <file>` sums it by
   * constructor). Large: about twice the apiserver's heap.
   */
  heapSnapshot?: boolean;
  /**
   * Once the cell is full, stop the apiserver (SIGTERM) and start it again on the same store,
   * home and ports: how long it takes to serve again and to have every node back, and its
   * memory meanwhile (a replica restarted in a full cell).
   */
  restart?: boolean;
}

/** A restart of the apiserver in the full cell ({@link CellOptions.restart}). */
export interface CellRestart {
  /** Seconds from the new process's start to its API listening. */
  listeningS: number;
  /** Seconds from its start to every node `ready` again (their sessions reopened). */
  nodesReadyS: number;
  /** Seconds from its start to a single create answered 201. */
  firstCreateS: number;
  /** Largest RSS of the new process until then (MiB, sampled every 100 ms). */
  rssPeakMiB: number;
}

/**
 * CPU used during a phase, in cores (CPU seconds per second of the phase): what bounds a figure
 * on a machine the whole cell shares.
 */
export interface CellBusy {
  apiserver: number;
  postgres: number;
  /** The edge processes (simulated nodes). */
  nodes: number;
  /** This process: the load generator. */
  load: number;
}

/** Figures of one of the ten stages. */
export interface CellStage {
  /** Sandboxes in the cell when the stage ended. */
  filled: number;
  batchCreated: number;
  batchPerSecond: number;
  singleCreated: number;
  singlePerSecond: number;
  singleP50: number;
  singleP99: number;
  listP50: number;
  listP99: number;
  rssMiB: number;
  /**
   * The apiserver's V8 heap at the stage's end (its /metrics): in use (live objects and garbage
   * not yet collected) and reserved. RSS beyond the reserved heap is code, buffers and native.
   */
  heapUsedMiB: number;
  heapTotalMiB: number;
  failures: number;
  /** CPU of each part during the stage's batch creates and during its single creates. */
  busy: { batch: CellBusy; singles: CellBusy };
}

/** What a cell run measured. */
export interface CellReport {
  options: Omit<CellOptions, 'log'>;
  stages: CellStage[];
  /** Placements per second through batch creates, over the whole fill. */
  batchPerSecond: number;
  /** Single creates per second, and their latency, over every stage. */
  singlePerSecond: number;
  singleP50: number;
  singleP99: number;
  listP99: number;
  /** Largest apiserver RSS sampled (MiB). */
  rssMiB: number;
  /** PostgreSQL database size at the end (MiB) and sandbox rows. */
  storeMiB: number;
  sandboxRows: number;
  /** Nodes holding at least one sandbox, and the most and fewest any node holds. */
  nodesUsed: number;
  perNodeMax: number;
  perNodeMin: number;
  /** CPU of each part over all the batch creates and over all the single creates. */
  busy: { batch: CellBusy; singles: CellBusy };
  /** Last tenth's single-create p50 over the first's. */
  fillCostRatio: number;
  failures: number;
  /** Seconds to start the cell (PostgreSQL, apiserver, nodes joined). */
  startS: number;
  /** The apiserver's restart in the full cell, when asked for. */
  restart?: CellRestart;
  durationS: number;
}

/** The PostgreSQL fixture of the tests (test/dist/helpers/postgres.js), loaded at run time. */
interface PostgresHelper {
  postgresSkipReason(): string | undefined;
  startTestPostgres(opts?: { settings?: Record<string, string> }): Promise<{
    createDatabase(name: string): Promise<string>;
    query(sql: string, database?: string): Promise<{ rows: Array<Record<string, unknown>> }>;
    close(): Promise<void>;
  }>;
}

interface Proc {
  child: ChildProcess;
  out: () => string;
  err: () => string;
}

function start(args: string[], env: Record<string, string> = {}): Proc {
  const child = spawn(process.execPath, args, { env: { PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin', ...env }, stdio: ['pipe', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (err = (err + d.toString()).slice(-20_000)));
  return { child, out: () => out, err: () => err };
}

async function waitFor(p: Proc, re: RegExp, name: string): Promise<RegExpExecArray> {
  const deadline = Date.now() + START_TIMEOUT_MS;
  for (;;) {
    const m = re.exec(p.out());
    if (m) return m;
    if (p.child.exitCode !== null || p.child.signalCode !== null)
      throw new Error(`${name} exited (${p.child.exitCode ?? p.child.signalCode}): ${p.err().slice(-4000)}`);
    if (Date.now() > deadline) throw new Error(`${name}: no ${re} within ${START_TIMEOUT_MS} ms: ${p.err().slice(-4000)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function stop(p: Proc | undefined): Promise<void> {
  if (!p || p.child.exitCode !== null || p.child.signalCode !== null) return;
  const exited = new Promise<void>((r) => p.child.once('exit', () => r()));
  p.child.kill('SIGTERM');
  const t = setTimeout(() => p.child.kill('SIGKILL'), 15_000);
  await exited;
  clearTimeout(t);
}

/**
 * Has the apiserver write a heap snapshot (SIGUSR2, `--heapsnapshot-signal`) and waits for it:
 * V8 writes it on the main thread, so the process answers `/healthz` again once it is written.
 */
async function heapSnapshot(api: Proc, apiUrl: string, dir: string, log: (line: string) => void): Promise<void> {
  const before = new Set(await readdir(dir));
  log('cell: writing the apiserver heap snapshot');
  api.child.kill('SIGUSR2');
  const until = nowMs() + 600_000;
  for (;;) {
    if (nowMs() > until) throw new Error('the apiserver heap snapshot was not written within 10 minutes');
    await new Promise((r) => setTimeout(r, 500));
    const made = (await readdir(dir)).find((f) => f.endsWith('.heapsnapshot') && !before.has(f));
    if (!made) continue;
    const ok = await fetch(`${apiUrl}/healthz`, { signal: AbortSignal.timeout(2_000) }).then(
      (r) => r.ok,
      () => false,
    );
    if (!ok) continue;
    await rename(path.join(dir, made), path.join(dir, 'apiserver.heapsnapshot'));
    log(`cell: heap snapshot in ${path.join(dir, 'apiserver.heapsnapshot')}`);
    return;
  }
}

/** The apiserver's V8 heap in use and reserved, MiB, from its /metrics (NaN when not there). */
async function heapMiB(apiUrl: string): Promise<{ used: number; total: number }> {
  const text = await fetch(`${apiUrl}/metrics`, { signal: AbortSignal.timeout(30_000) }).then(
    (r) => r.text(),
    () => '',
  );
  const gauge = (name: string): number => Number(new RegExp(`^${name} (\\d+)$`, 'm').exec(text)?.[1] ?? NaN) / 1048576;
  return { used: gauge('nodejs_heap_used_bytes'), total: gauge('nodejs_heap_total_bytes') };
}

/** Resident memory of a process, MiB. */
async function rssMiB(pid: number): Promise<number> {
  const status = await readFile(`/proc/${pid}/status`, 'utf8').catch(() => '');
  const m = /VmRSS:\s+(\d+) kB/.exec(status);
  return m ? Number(m[1]) / 1024 : NaN;
}

/** Clock ticks a second of /proc/<pid>/stat's times (USER_HZ, 100 on Linux). */
const CLK_TCK = 100;

/** A process's fields of /proc/<pid>/stat after its command (the first is the state), or undefined when it is gone. */
async function statFields(pid: number): Promise<string[] | undefined> {
  const stat = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '');
  return stat ? stat.slice(stat.lastIndexOf(')') + 2).split(' ') : undefined;
}

/** CPU seconds (user and system) of a process and of its children it has waited for. */
async function cpuSeconds(pid: number): Promise<number> {
  const f = await statFields(pid);
  return f ? (Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14])) / CLK_TCK : 0;
}

/**
 * CPU seconds of PostgreSQL: the postmaster (with the backends it reaped) and its live backends
 * (its children, from /proc/<pid>/task/<pid>/children: a scan of /proc would read every
 * process of a busy machine at each sample).
 */
async function postgresCpuSeconds(postmaster: number): Promise<number> {
  let total = await cpuSeconds(postmaster);
  const children = await readFile(`/proc/${postmaster}/task/${postmaster}/children`, 'utf8').catch(() => '');
  for (const pid of children.split(' ').filter(Boolean)) {
    const f = await statFields(Number(pid));
    if (f) total += (Number(f[11]) + Number(f[12])) / CLK_TCK;
  }
  return total;
}

/**
 * Writes PostgreSQL's statements of the cell's database: the 40 costliest by total time, then
 * the 40 most frequent (each statement is a round trip, and on a loaded machine the round trips
 * cost the apiserver more than the statements cost PostgreSQL).
 */
async function writeStatements(pg: { query(sql: string, database?: string): Promise<{ rows: Array<Record<string, unknown>> }> }, file: string): Promise<void> {
  const top = (order: string): Promise<{ rows: Array<Record<string, unknown>> }> =>
    pg.query(
      `SELECT calls, round(total_exec_time::numeric, 1) AS total_ms, round(mean_exec_time::numeric, 3) AS mean_ms, rows, left(regexp_replace(query, '\\s+', ' ', 'g'), 300) AS query
         FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'dsec_cell')
         ORDER BY ${order} DESC LIMIT 40`,
      'dsec_cell',
    );
  const all = await pg.query(
    `SELECT sum(calls) AS calls, round(sum(total_exec_time)::numeric, 1) AS total_ms FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'dsec_cell')`,
    'dsec_cell',
  );
  const lines = [`all statements: ${String(all.rows[0]?.calls)} calls, ${String(all.rows[0]?.total_ms)} ms`];
  for (const [title, order] of [
    ['by total time', 'total_exec_time'],
    ['by calls', 'calls'],
  ] as const) {
    lines.push('', `-- ${title}`);
    lines.push(
      ...(await top(order)).rows.map(
        (row) =>
          `${String(row.calls).padStart(8)} calls ${String(row.total_ms).padStart(10)} ms total ${String(row.mean_ms).padStart(9)} ms mean ${String(row.rows).padStart(8)} rows  ${String(row.query)}`,
      ),
    );
  }
  await writeFile(file, `${lines.join('\n')}\n`);
}

function noBusy(): CellBusy {
  return { apiserver: 0, postgres: 0, nodes: 0, load: 0 };
}

/** CPU seconds over a phase's milliseconds, as cores. */
function perSecond(t: { ms: number; cpu: CellBusy }): CellBusy {
  const out = noBusy();
  for (const k of Object.keys(out) as Array<keyof CellBusy>) out[k] = t.cpu[k] / (t.ms / 1000);
  return out;
}

/** `api 0.93 pg 0.21 nodes 0.30 load 0.25` (cores). */
export function busyText(b: CellBusy): string {
  return `api ${b.apiserver.toFixed(2)} pg ${b.postgres.toFixed(2)} nodes ${b.nodes.toFixed(2)} load ${b.load.toFixed(2)}`;
}

/** An empty tar archive (two zero blocks): the cell's base layer. */
const EMPTY_TAR = new Uint8Array(1024);

/** Why the cell cannot run here, or undefined. */
export async function cellSkipReason(): Promise<string | undefined> {
  return (await postgresHelper()).postgresSkipReason();
}

async function postgresHelper(): Promise<PostgresHelper> {
  return (await import(pathToFileURL(path.join(REPO, 'test/dist/helpers/postgres.js')).href)) as PostgresHelper;
}

/** Runs a cell and reports what it measured; everything it started is stopped, even on failure. */
export async function runCell(o: CellOptions): Promise<CellReport> {
  const { log } = o;
  const t0 = nowMs();
  const pgHelper = await postgresHelper();
  const dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-cell-'));
  const cleanups: Array<() => Promise<void>> = [() => rm(dir, { recursive: true, force: true })];
  try {
    log('cell: starting PostgreSQL');
    const pg = await pgHelper.startTestPostgres(
      o.profileDir ? { settings: { shared_preload_libraries: 'pg_stat_statements', 'pg_stat_statements.track': 'all' } } : {},
    );
    cleanups.unshift(() => pg.close());
    const db = await pg.createDatabase('dsec_cell');
    if (o.profileDir) {
      await mkdir(o.profileDir, { recursive: true });
      await pg.query('CREATE EXTENSION IF NOT EXISTS pg_stat_statements', 'dsec_cell');
    }
    const home = path.join(dir, 'home');
    log('cell: starting dsec apiserver');
    const profile = o.profileDir ? ['--cpu-prof', '--cpu-prof-dir', path.resolve(o.profileDir)] : [];
    if (o.profileDir && o.heapSnapshot) profile.push('--heapsnapshot-signal=SIGUSR2', '--diagnostic-dir', path.resolve(o.profileDir));
    const apiArgs = (addr: string, nodeAddr: string): string[] => [
      CLI,
      'apiserver',
      '--db',
      db,
      '--home',
      home,
      '--addr',
      addr,
      '--node-addr',
      nodeAddr,
      '--quiet',
    ];
    let api = start([...profile, ...apiArgs('127.0.0.1:0', '127.0.0.1:0')]);
    cleanups.unshift(() => stop(api));
    const apiUrl = (await waitFor(api, /listening on (http:\/\/\S+)/, 'dsec apiserver'))[1]!;
    const nodeUrl = (await waitFor(api, /nodes join on (https:\/\/\S+)/, 'dsec apiserver'))[1]!;
    const adminKey = (await readFile(path.join(home, 'admin.key'), 'utf8')).trim();
    const admin = new DsecClient({ apiUrl, apiKey: adminKey, requestTimeoutMs: 300_000 });

    // Nodes: a token each, then the edge processes, each joining its share.
    log(`cell: joining ${o.nodes} simulated nodes over ${o.edgeProcesses} processes`);
    const names = Array.from({ length: o.nodes }, (_, i) => `sim-${String(i).padStart(3, '0')}`);
    const tokens: Array<{ name: string; token: string }> = [];
    for (const name of names) tokens.push({ name, token: (await admin.nodes.joinToken({ ttlMs: 600_000 })).token });
    const hosts: Proc[] = [];
    for (let p = 0; p < o.edgeProcesses; p++) {
      const orders: EdgeHostOrders = { url: nodeUrl, home: path.join(dir, 'nodes'), nodes: tokens.filter((_, i) => i % o.edgeProcesses === p), sim: o.sim };
      if (orders.nodes.length === 0) continue;
      const h = start([path.join(HERE, 'edge-host.js'), JSON.stringify(orders)]);
      cleanups.unshift(() => stop(h));
      hosts.push(h);
    }
    for (const [i, h] of hosts.entries()) await waitFor(h, /ready \d+/, `edge host ${i}`);
    const deadline = Date.now() + START_TIMEOUT_MS;
    while ((await admin.nodes.list()).filter((n) => n.state === 'ready').length < o.nodes) {
      if (Date.now() > deadline) throw new Error('the nodes did not all become ready');
      await new Promise((r) => setTimeout(r, 200));
    }
    await admin.layers.upload(EMPTY_TAR, { kind: 'base', name: 'cellbase' });
    const keys: string[] = [];
    for (let i = 0; i < o.singleConcurrency + o.batchConcurrency; i++) keys.push((await admin.keys.create({ name: `cell-${i}`, role: 'member' })).key);
    const startS = (nowMs() - t0) / 1000;
    log(`cell: ready in ${startS.toFixed(1)} s`);

    // CPU of each part, sampled around each phase.
    // The checkpointer lives as long as the server: its parent is the postmaster.
    const checkpointer = Number((await pg.query(`SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'`)).rows[0]!.pid);
    const postmaster = Number((await statFields(checkpointer))?.[1]);
    const sample = async (): Promise<{ at: number; cpu: CellBusy }> => {
      const own = process.cpuUsage();
      return {
        at: nowMs(),
        cpu: {
          apiserver: await cpuSeconds(api.child.pid!),
          postgres: await postgresCpuSeconds(postmaster),
          nodes: (await Promise.all(hosts.map((h) => cpuSeconds(h.child.pid!)))).reduce((a, b) => a + b, 0),
          load: (own.user + own.system) / 1e6,
        },
      };
    };
    const busyTotals = { batch: { ms: 0, cpu: noBusy() }, singles: { ms: 0, cpu: noBusy() } };
    const busyOf = (a: { at: number; cpu: CellBusy }, b: { at: number; cpu: CellBusy }, phase: 'batch' | 'singles'): CellBusy => {
      const ms = b.at - a.at;
      const t = busyTotals[phase];
      t.ms += ms;
      const out = noBusy();
      for (const k of Object.keys(out) as Array<keyof CellBusy>) {
        t.cpu[k] += b.cpu[k] - a.cpu[k];
        out[k] = (b.cpu[k] - a.cpu[k]) / (ms / 1000);
      }
      return out;
    };

    const headers = (key: string): Record<string, string> => ({ authorization: `Bearer ${key}`, 'content-type': 'application/json' });
    const spec = (job: number): object => ({ image: { base: 'cellbase' }, labels: { job: `j${job}` } });
    let failures = 0;
    let created = 0;
    let job = 0;
    const stages: CellStage[] = [];
    const allSingles: number[] = [];
    const allLists: number[] = [];
    let singleTime = 0;
    let batchTime = 0;
    let batchTotal = 0;
    let peakRss = 0;
    const perStage = Math.floor(o.sandboxes / 10);
    for (let stage = 0; stage < 10; stage++) {
      const singles = Math.min(o.singlesPerStage, perStage);
      // Batches: the stage's share less its singles, split over the batch workers.
      let toBatch = perStage - singles;
      const sb = await sample();
      const tb = nowMs();
      let batched = 0;
      await Promise.all(
        Array.from({ length: o.batchConcurrency }, async (_, w) => {
          for (;;) {
            o.signal?.throwIfAborted();
            const count = Math.min(o.batchSize, toBatch);
            if (count <= 0) return;
            toBatch -= count;
            const res = await fetch(`${apiUrl}/v1/sandboxes:batch`, {
              method: 'POST',
              headers: headers(keys[o.singleConcurrency + w]!),
              body: JSON.stringify({ spec: spec(job++), count }),
            });
            const body = (await res.json()) as { items?: Array<{ sandbox?: unknown; error?: { code: string; message: string } }>; error?: { message: string } };
            if (!res.ok || !body.items) throw new Error(`batch create: ${res.status} ${body.error?.message ?? ''}`);
            for (const it of body.items) {
              if (it.sandbox) batched++;
              else {
                failures++;
                if (failures <= 5) log(`cell: batch item failed: ${it.error?.code} ${it.error?.message}`);
              }
            }
          }
        }),
      );
      const batchMs = nowMs() - tb;
      const batchBusy = busyOf(sb, await sample(), 'batch');
      batchTime += batchMs;
      batchTotal += batched;
      created += batched;

      // Single creates through the HTTP API, each worker with its own key.
      const lat: number[] = [];
      let next = 0;
      const ss = await sample();
      const ts = nowMs();
      await Promise.all(
        Array.from({ length: o.singleConcurrency }, async (_, w) => {
          while (next < singles) {
            o.signal?.throwIfAborted();
            next++;
            const t = nowMs();
            const res = await fetch(`${apiUrl}/v1/sandboxes`, { method: 'POST', headers: headers(keys[w]!), body: JSON.stringify(spec(job)) });
            await res.arrayBuffer();
            if (res.status === 201 || res.status === 200) {
              lat.push(nowMs() - t);
              created++;
            } else {
              failures++;
              if (failures <= 5) log(`cell: single create answered ${res.status}`);
            }
          }
        }),
      );
      const singleMs = nowMs() - ts;
      const singlesBusy = busyOf(ss, await sample(), 'singles');
      singleTime += singleMs;
      job++;
      allSingles.push(...lat);

      // List/filter: one job's sandboxes by label, first page.
      const lists: number[] = [];
      for (let i = 0; i < o.listsPerStage; i++) {
        o.signal?.throwIfAborted();
        const t = nowMs();
        const res = await fetch(`${apiUrl}/v1/sandboxes?label=job%3Dj${i % Math.max(1, job)}&limit=100`, { headers: headers(keys[0]!) });
        await res.arrayBuffer();
        if (res.ok) lists.push(nowMs() - t);
        else failures++;
      }
      allLists.push(...lists);
      const rss = await rssMiB(api.child.pid!);
      peakRss = Math.max(peakRss, rss);
      const heap = await heapMiB(apiUrl);
      const s: CellStage = {
        filled: created,
        batchCreated: batched,
        batchPerSecond: batched / (batchMs / 1000),
        singleCreated: lat.length,
        singlePerSecond: lat.length / (singleMs / 1000),
        singleP50: percentile(lat, 50),
        singleP99: percentile(lat, 99),
        listP50: percentile(lists, 50),
        listP99: percentile(lists, 99),
        rssMiB: rss,
        heapUsedMiB: heap.used,
        heapTotalMiB: heap.total,
        failures,
        busy: { batch: batchBusy, singles: singlesBusy },
      };
      stages.push(s);
      log(
        `cell: stage ${stage + 1}/10: ${created} sandboxes; batch ${s.batchPerSecond.toFixed(0)}/s; single ${s.singlePerSecond.toFixed(0)}/s p50 ${s.singleP50.toFixed(1)} p99 ${s.singleP99.toFixed(1)} ms; list p99 ${s.listP99.toFixed(1)} ms; rss ${rss.toFixed(0)} MiB (heap ${heap.used.toFixed(0)} of ${heap.total.toFixed(0)}); cores batch ${busyText(batchBusy)}, singles ${busyText(singlesBusy)}`,
      );
    }
    log(`cell: measured in ${((nowMs() - t0) / 1000).toFixed(1)} s`);
    const size = await pg.query(`SELECT pg_database_size('dsec_cell') AS bytes`);
    const rows = await pg.query(`SELECT count(*) AS n FROM sandboxes`, 'dsec_cell');
    const spread = await pg.query(`SELECT count(*) AS n FROM sandboxes GROUP BY node`, 'dsec_cell');
    const perNode = spread.rows.map((row) => Number(row.n));
    if (o.profileDir) await writeStatements(pg, path.join(o.profileDir, 'pg-statements.txt'));
    if (o.profileDir && o.heapSnapshot) await heapSnapshot(api, apiUrl, o.profileDir, log);
    let restart: CellRestart | undefined;
    if (o.restart) {
      log('cell: restarting the apiserver');
      await stop(api);
      const began = nowMs();
      api = start(apiArgs(new URL(apiUrl).host, new URL(nodeUrl).host));
      const pid = api.child.pid!;
      let rssPeak = 0;
      const sampler = setInterval(() => void rssMiB(pid).then((m) => (rssPeak = Math.max(rssPeak, Number.isFinite(m) ? m : 0))), 100);
      try {
        await waitFor(api, /listening on (http:\/\/\S+)/, 'dsec apiserver (restarted)');
        const listeningS = (nowMs() - began) / 1000;
        const until = Date.now() + START_TIMEOUT_MS;
        while ((await admin.nodes.list()).filter((n) => n.state === 'ready').length < o.nodes) {
          if (Date.now() > until) throw new Error('the nodes did not all come back after the apiserver restarted');
          await new Promise((r) => setTimeout(r, 200));
        }
        const nodesReadyS = (nowMs() - began) / 1000;
        const res = await fetch(`${apiUrl}/v1/sandboxes`, { method: 'POST', headers: headers(keys[0]!), body: JSON.stringify(spec(0)) });
        await res.arrayBuffer();
        if (res.status !== 201) throw new Error(`a create after the restart answered ${res.status}`);
        restart = { listeningS, nodesReadyS, firstCreateS: (nowMs() - began) / 1000, rssPeakMiB: Math.max(rssPeak, await rssMiB(pid)) };
      } finally {
        clearInterval(sampler);
      }
      log(
        `cell: restarted: listening in ${restart.listeningS.toFixed(1)} s, every node ready in ${restart.nodesReadyS.toFixed(1)} s, a create answered in ${restart.firstCreateS.toFixed(1)} s; RSS peak ${restart.rssPeakMiB.toFixed(0)} MiB`,
      );
    }
    const first = stages[0]!.singleP50;
    const last = stages[stages.length - 1]!.singleP50;
    return {
      options: {
        nodes: o.nodes,
        sandboxes: o.sandboxes,
        edgeProcesses: o.edgeProcesses,
        batchSize: o.batchSize,
        batchConcurrency: o.batchConcurrency,
        singlesPerStage: o.singlesPerStage,
        singleConcurrency: o.singleConcurrency,
        listsPerStage: o.listsPerStage,
        sim: o.sim,
      },
      stages,
      batchPerSecond: batchTotal / (batchTime / 1000),
      singlePerSecond: allSingles.length / (singleTime / 1000),
      singleP50: percentile(allSingles, 50),
      singleP99: percentile(allSingles, 99),
      listP99: percentile(allLists, 99),
      rssMiB: peakRss,
      busy: { batch: perSecond(busyTotals.batch), singles: perSecond(busyTotals.singles) },
      storeMiB: Number(size.rows[0]!.bytes) / 1048576,
      sandboxRows: Number(rows.rows[0]!.n),
      nodesUsed: perNode.length,
      perNodeMax: Math.max(...perNode),
      perNodeMin: perNode.length < o.nodes ? 0 : Math.min(...perNode),
      fillCostRatio: last / first,
      failures,
      startS,
      ...(restart ? { restart } : {}),
      durationS: (nowMs() - t0) / 1000,
    };
  } finally {
    const tc = nowMs();
    for (const c of cleanups) await c().catch((err: unknown) => log(`cell: cleanup: ${(err as Error).message}`));
    log(`cell: stopped everything in ${((nowMs() - tc) / 1000).toFixed(1)} s`);
  }
}
