// `npm run cell [-- flags]`: runs the simulated cell (cell.ts), prints what it measured against
// the targets of issue 16, writes bench/results/cell-<date>.json and its own section of
// docs/benchmarks.md (between the cell markers, which `npm run bench` keeps) with a chart in
// docs/benchmarks/cell.svg.
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { CONTAINER_DELAYS } from '@dsec/apiserver/testing';
import { lineChart } from '../lib/svg.js';
import { REPO, busyText, cellSkipReason, runCell } from './cell.js';
import type { CellReport } from './cell.js';

/** Markers of the cell's section in docs/benchmarks.md. */
export const CELL_BEGIN = '<!-- cell:begin (written by npm run cell) -->';
export const CELL_END = '<!-- cell:end -->';

const { values } = parseArgs({
  options: {
    nodes: { type: 'string', default: '160' },
    sandboxes: { type: 'string', default: '20000' },
    'edge-processes': { type: 'string', default: '4' },
    'batch-size': { type: 'string', default: '1000' },
    'batch-concurrency': { type: 'string', default: '4' },
    singles: { type: 'string', default: '1000' },
    concurrency: { type: 'string', default: '64' },
    lists: { type: 'string', default: '100' },
    'node-cpu': { type: 'string', default: '64' },
    'node-memory-gib': { type: 'string', default: '256' },
    'no-docs': { type: 'boolean', default: false },
    profile: { type: 'string' },
    'heap-snapshot': { type: 'boolean', default: false },
    restart: { type: 'boolean', default: false },
  },
});

function int(name: keyof typeof values): number {
  const v = Number(values[name]);
  if (!Number.isInteger(v) || v < 1) throw new Error(`--${name}: not a positive integer`);
  return v;
}

const fmt = (x: number, d = 1): string => (Number.isFinite(x) ? x.toFixed(d) : 'n/a');

/** The figures against the targets of issue 16 (scaled run: the targets are for 380,000 sandboxes). */
function targets(r: CellReport): Array<[string, string, string, boolean]> {
  return [
    ['placements/s through batch creates', fmt(r.batchPerSecond, 0), '>= 5,000', r.batchPerSecond >= 5000],
    ['single creates/s through HTTP', fmt(r.singlePerSecond, 0), '>= 1,000', r.singlePerSecond >= 1000],
    ['single create p99', `${fmt(r.singleP99)} ms`, '<= 50 ms', r.singleP99 <= 50],
    ['list/filter p99', `${fmt(r.listP99)} ms`, '<= 50 ms', r.listP99 <= 50],
    ['apiserver RSS (peak)', `${fmt(r.rssMiB, 0)} MiB`, '<= 1 GiB', r.rssMiB <= 1024],
    ['cost per create as the cell fills (last tenth p50 / first)', fmt(r.fillCostRatio, 2), '<= 1.2', r.fillCostRatio <= 1.2],
  ];
}

function section(r: CellReport, command: string, date: string): string {
  const o = r.options;
  const lines = [
    CELL_BEGIN,
    '## Simulated cell (`npm run cell`)',
    '',
    `The real \`dsec apiserver\` on PostgreSQL (Debian's server, its own cluster on loopback started by the test fixture: \`synchronous_commit=on\`, but \`fsync=off\`, so commits do not wait for a disk) and ${o.nodes} simulated nodes in ${o.edgeProcesses} processes, each node joined with its own single-use token and certificate and holding its own session on the node port (HTTP/2 in mutual TLS, the edge wire protocol). A simulated node keeps its sandboxes as records and answers with the delays measured on the container backend (create ${CONTAINER_DELAYS.create} ms, destroy ${CONTAINER_DELAYS.destroy} ms, exec ${CONTAINER_DELAYS.exec} ms: \`dsec edge\` rows above), each node ${o.sim.capacity?.cpu ?? 64} cores, ${((o.sim.capacity?.memoryMiB ?? 262_144) / 1024).toFixed(0)} GiB, with the default placement settings. Sandboxes are API defaults (1 core, 512 MiB). The cell fills to ${o.sandboxes.toLocaleString('en')} sandboxes in ten stages: each stage creates its share through batch creates (${o.batchSize} items, ${o.batchConcurrency} in flight), then ${o.singlesPerStage} single creates through the HTTP API (${o.singleConcurrency} in flight, each worker with its own API key of the root project, so each has its own rate bucket of 100 requests/s and the per-key limit does not bind), then ${o.listsPerStage} list/filter queries (one job's label, first page of 100). Everything (PostgreSQL, apiserver, nodes, load) runs on one machine; the load generator is the bench's own process, apart from the apiserver's and the nodes'. The "cores" rows are the CPU each part used during the phase (CPU seconds per second, from /proc): where their sum reaches the machine's cores, the machine bounds the figure, not a part.`,
    '',
    `**Scale.** The issue's targets are for 160 nodes and 380,000 live sandboxes on a control plane of its own; this run is ${o.nodes} nodes and ${o.sandboxes.toLocaleString('en')} sandboxes on the ${os.cpus().length}-core machine below, shared with the load generator, the nodes and PostgreSQL (and, when it ran, other work). Figures are what this machine gave, not what the design allows.`,
    '',
    `| | |`,
    `|---|---|`,
    `| date | ${date} |`,
    `| command | \`${command}\` (${fmt(r.durationS, 0)} s; start ${fmt(r.startS)} s) |`,
    `| machine | ${os.cpus().length} cores (${os.cpus()[0]?.model ?? '?'}), ${(os.totalmem() / 2 ** 30).toFixed(1)} GiB, node ${process.version} |`,
    `| sandboxes | ${r.sandboxRows.toLocaleString('en')} rows in the store; ${r.failures} failed creates or queries |`,
    `| store size | ${fmt(r.storeMiB)} MiB (pg_database_size) |`,
    `| spread | ${r.nodesUsed} of ${o.nodes} nodes hold sandboxes, ${r.perNodeMin} to ${r.perNodeMax} each |`,
    ...(r.restart
      ? [
          `| apiserver restarted in the full cell | listening in ${fmt(r.restart.listeningS)} s, every node ready in ${fmt(r.restart.nodesReadyS)} s, a create answered in ${fmt(r.restart.firstCreateS)} s; RSS peak ${fmt(r.restart.rssPeakMiB, 0)} MiB |`,
        ]
      : []),
    '',
    '| figure | this run | target (380,000 sandboxes) | met |',
    '|---|---|---|---|',
    ...targets(r).map(([f, v, t, ok]) => `| ${f} | ${v} | ${t} | ${ok ? 'yes' : '**no**'} |`),
    `| single create p50 | ${fmt(r.singleP50)} ms | | |`,
    '',
    '| cores used (CPU s/s) | apiserver | PostgreSQL | nodes | load generator |',
    '|---|---|---|---|---|',
    ...(['batch', 'singles'] as const).map(
      (ph) =>
        `| during ${ph === 'batch' ? 'batch' : 'single'} creates | ${fmt(r.busy[ph].apiserver, 2)} | ${fmt(r.busy[ph].postgres, 2)} | ${fmt(r.busy[ph].nodes, 2)} | ${fmt(r.busy[ph].load, 2)} |`,
    ),
    '',
    '| stage | sandboxes | batch placements/s | single creates/s | single p50 ms | single p99 ms | list p50 ms | list p99 ms | apiserver RSS MiB | its heap in use / reserved MiB |',
    '|---|---|---|---|---|---|---|---|---|---|',
    ...r.stages.map(
      (s, i) =>
        `| ${i + 1} | ${s.filled} | ${fmt(s.batchPerSecond, 0)} | ${fmt(s.singlePerSecond, 0)} | ${fmt(s.singleP50)} | ${fmt(s.singleP99)} | ${fmt(s.listP50)} | ${fmt(s.listP99)} | ${fmt(s.rssMiB, 0)} | ${fmt(s.heapUsedMiB, 0)} / ${fmt(s.heapTotalMiB, 0)} |`,
    ),
    '',
    '![Cost per create as the cell fills](benchmarks/cell.svg)',
    CELL_END,
  ];
  return lines.join('\n');
}

if (values['heap-snapshot'] && !values.profile) {
  process.stderr.write('npm run cell: --heap-snapshot needs --profile <dir> (the snapshot is written there)\n');
  process.exit(2);
}
const reason = await cellSkipReason();
if (reason) {
  process.stderr.write(`npm run cell: cannot run here: ${reason}\n`);
  process.exit(1);
}
const argv = process.argv.slice(2);
const command = `npm run cell${argv.length ? ' -- ' + argv.join(' ') : ''}`;
const date = new Date().toISOString();
// ^C stops the run: everything it started (PostgreSQL, apiserver, nodes) is stopped first.
const stopping = new AbortController();
process.once('SIGINT', () => stopping.abort(new Error('interrupted')));
process.once('SIGTERM', () => stopping.abort(new Error('terminated')));
const report = await runCell({
  signal: stopping.signal,
  nodes: int('nodes'),
  sandboxes: int('sandboxes'),
  edgeProcesses: int('edge-processes'),
  batchSize: int('batch-size'),
  batchConcurrency: int('batch-concurrency'),
  singlesPerStage: int('singles'),
  singleConcurrency: int('concurrency'),
  listsPerStage: int('lists'),
  sim: { capacity: { cpu: int('node-cpu'), memoryMiB: int('node-memory-gib') * 1024 } },
  log: (line) => process.stderr.write(`${line}\n`),
  ...(values.profile ? { profileDir: values.profile } : {}),
  heapSnapshot: values['heap-snapshot'],
  restart: values.restart,
});
process.stdout.write(`cores during batch creates: ${busyText(report.busy.batch)}\ncores during single creates: ${busyText(report.busy.singles)}\n`);
for (const [f, v, t, ok] of targets(report)) process.stdout.write(`${ok ? 'met ' : 'MISS'}  ${f}: ${v} (target ${t})\n`);
await mkdir(path.join(REPO, 'bench', 'results'), { recursive: true });
await writeFile(path.join(REPO, 'bench', 'results', `cell-${date.replace(/[:.]/g, '-')}.json`), JSON.stringify({ date, command, ...report }, null, 2));
if (!values['no-docs']) {
  const svg = lineChart({
    title: 'Cell: single create latency and list p99 as the cell fills',
    xLabel: 'sandboxes in the cell',
    yLabel: 'ms',
    series: [
      { label: 'create p50', points: report.stages.map((s) => [s.filled, s.singleP50]) },
      { label: 'create p99', points: report.stages.map((s) => [s.filled, s.singleP99]) },
      { label: 'list p99', points: report.stages.map((s) => [s.filled, s.listP99]) },
    ],
  });
  await mkdir(path.join(REPO, 'docs', 'benchmarks'), { recursive: true });
  await writeFile(path.join(REPO, 'docs', 'benchmarks', 'cell.svg'), svg);
  const file = path.join(REPO, 'docs', 'benchmarks.md');
  const doc = await readFile(file, 'utf8');
  const text = section(report, command, date);
  const b = doc.indexOf(CELL_BEGIN);
  const e = doc.indexOf(CELL_END);
  await writeFile(file, b >= 0 && e > b ? doc.slice(0, b) + text + doc.slice(e + CELL_END.length) : `${doc.trimEnd()}\n\n${text}\n`);
  process.stderr.write('cell: wrote its section of docs/benchmarks.md and docs/benchmarks/cell.svg\n');
}
