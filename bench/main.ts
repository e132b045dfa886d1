// dsec's benchmark: scenarios that measure dsec and its peers (podman, crun, bubblewrap) side by
// side in one run; prints a table, writes JSON to bench/results/, regenerates docs/benchmarks.md.
// Usage: node bench/dist/main.js [--quick] [--only create,exec,...] [--density N] [--no-docs]
//        node bench/dist/main.js --render bench/results/<file>.json   (docs from a saved run)
import os from 'node:os';
import { cp, mkdir, readdir, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { cleanupAll, cleanupOnSignals } from './lib/cleanup.js';
import { Peers, peerVersions } from './lib/peers.js';
import {
  BENCH_ORPHAN_GRACE_MS,
  BENCH_PLACEMENT,
  benchMaxSandboxes,
  benchTempDir,
  IDLE_RESOURCES,
  rateLimitedHits,
  startBenchPlatform,
} from './lib/platform.js';
import type { PreloadedLayer } from './lib/platform.js';
import { chartsOf } from './lib/charts.js';
import { machineInfo, markdown, textTable, writeJson } from './lib/report.js';
import type { Row, RunReport } from './lib/report.js';
import type { Scenario } from './lib/scenario.js';
import { nowMs, progress } from './lib/stats.js';
import { checkTargets, targetLines } from './lib/targets.js';
import { batchScenario } from './scenarios/batch.js';
import { createScenario } from './scenarios/create.js';
import { densityScenario } from './scenarios/density.js';
import { episodeScenario } from './scenarios/episode.js';
import { execScenario } from './scenarios/exec.js';
import { fncallScenario } from './scenarios/fncall.js';
import { networkScenario } from './scenarios/network.js';
import { pauseScenario } from './scenarios/pause.js';
import { installScenario } from './scenarios/install.js';
import { microvmScenario } from './scenarios/microvm.js';
import { vmScreenScenario } from './scenarios/vm-screen.js';
import { vmScenario } from './scenarios/vm.js';
import { proxyScenario } from './scenarios/proxy.js';
import { remoteEdgeScenario } from './scenarios/remote-edge.js';
import { snapshotScenario } from './scenarios/snapshot.js';
import { streamScenario } from './scenarios/stream.js';
import { sustainedScenario } from './scenarios/sustained.js';
import { sandboxFusionScenario } from './scenarios/sandboxfusion.js';
import { e2bScenario } from './scenarios/e2b.js';
import { lazyScenario } from './scenarios/lazy.js';

const SCENARIOS: Scenario[] = [
  createScenario,
  sustainedScenario,
  execScenario,
  densityScenario,
  streamScenario,
  episodeScenario,
  fncallScenario,
  pauseScenario,
  batchScenario,
  snapshotScenario,
  networkScenario,
  proxyScenario,
  installScenario,
  remoteEdgeScenario,
  sandboxFusionScenario,
  microvmScenario,
  e2bScenario,
  lazyScenario,
  vmScreenScenario,
  vmScenario,
];
/** Idle sandboxes of the density scenario (issue 15's per-node figure on the 24 GiB node). */
const DEFAULT_DENSITY = 10_000;
const QUICK_DENSITY = 20;
/** Persistent cache across runs: the Debian base layer, downloaded packages. */
const CACHE_DIR = '/var/tmp/dsec-bench-cache';
const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

function usage(msg: string): never {
  process.stderr.write(`${msg}\nusage: node bench/dist/main.js [--quick] [--only ${SCENARIOS.map((s) => s.name).join(',')}] [--density N] [--no-docs]\n`);
  process.exit(2);
}

async function main(): Promise<number> {
  const argv = process.argv.slice(2);
  const { values } = parseArgs({
    args: argv,
    options: {
      quick: { type: 'boolean', default: false },
      only: { type: 'string' },
      density: { type: 'string' },
      'no-docs': { type: 'boolean', default: false },
      render: { type: 'string' },
    },
  });
  if (values.render) {
    // Regenerates docs/benchmarks.md from a saved run (after editing the analysis notes).
    const report = JSON.parse(await readFile(values.render, 'utf8')) as RunReport;
    await writeDocs(report);
    return 0;
  }
  const quick = values.quick ?? false;
  const density = values.density !== undefined ? Number(values.density) : quick ? QUICK_DENSITY : DEFAULT_DENSITY;
  if (!Number.isInteger(density) || density < 1) usage(`--density: not a positive integer: ${values.density}`);
  const only = values.only
    ?.split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  for (const name of only ?? []) if (!SCENARIOS.some((s) => s.name === name)) usage(`--only: no scenario ${name}`);
  const selected = SCENARIOS.filter((s) => (only ? only.includes(s.name) : !s.onlyWhenNamed));
  if (process.getuid?.() !== 0) usage('the benchmark creates containers, mounts and cgroups: run it as root');

  cleanupOnSignals();
  const started = nowMs();
  const date = new Date().toISOString();
  const dir = await benchTempDir();
  await mkdir(CACHE_DIR, { recursive: true });

  const preload: PreloadedLayer[] = [];
  for (const s of selected) if (s.prepare) preload.push(...(await s.prepare({ cacheDir: CACHE_DIR, quick })));
  progress('starting the platform');
  const maxSandboxes = benchMaxSandboxes(density);
  const bench = await startBenchPlatform(path.join(dir, 'home'), preload, maxSandboxes);

  // The peers run on the very rootfs of dsec's busybox base layer.
  const edge = bench.platform.edge;
  const busybox = await edge.layers.resolve('busybox');
  const rootfs = path.join(dir, 'rootfs');
  const mounted = await edge.layers.acquire(busybox.digest);
  try {
    await cp(mounted, rootfs, { recursive: true, verbatimSymlinks: true });
  } finally {
    await edge.layers.release(busybox.digest);
  }
  progress('preparing the peers (podman image, crun bundle)');
  const peers = await Peers.open(path.join(dir, 'peers'), rootfs);

  const rows: Row[] = [];
  const report: RunReport = {
    date,
    command:
      process.env.npm_lifecycle_event === 'bench'
        ? `npm run bench${argv.length ? ' -- ' + argv.join(' ') : ''}`
        : `node bench/dist/main.js${argv.length ? ' ' + argv.join(' ') : ''}`,
    quick,
    durationS: 0,
    machine: await machineInfo(await peerVersions()),
    scenarios: [],
    rows,
    notes: [
      `The platform runs in-process (apiserver + edge + watcher, SQLite state) on a temp home, reached over loopback HTTP. Placement over-commit is raised to CPU x${BENCH_PLACEMENT.cpuOvercommit} and memory x${BENCH_PLACEMENT.memoryOvercommit} so that the edge's own admission limit (${maxSandboxes.toLocaleString('en-US')} sandboxes: the density and room for the probes, never below the node's default) binds, not the scheduler's request bounds (room is judged on measured use either way). Idle sandboxes request cpu ${IDLE_RESOURCES.cpu}, ${IDLE_RESOURCES.memoryMiB} MiB memory, ${IDLE_RESOURCES.diskMiB} MiB disk; the others use the API defaults (1 cpu, 512 MiB, 1 GiB disk) unless noted. The watcher's orphan grace is ${BENCH_ORPHAN_GRACE_MS / 60_000} minutes: the \`dsec edge\` rows create sandboxes at the edge in-process, without a record.`,
      'The API limits each key to 100 requests/s on average (bursts of 1,000). The bench gives each concurrent worker its own key, as a trainer with many workers would.',
    ],
  };
  let failed = 0;
  for (const s of selected) {
    const notes: string[] = [];
    const entry: RunReport['scenarios'][number] = { name: s.name, title: s.title, method: s.method, notes };
    report.scenarios.push(entry);
    progress(`scenario ${s.name}`);
    const t0 = nowMs();
    const loadBefore = await loadAverage();
    try {
      await s.run({ quick, density, bench, peers, dir, cacheDir: CACHE_DIR, record: (r) => rows.push(r), note: (n) => notes.push(n) });
    } catch (err) {
      failed++;
      entry.error = (err as Error).stack ?? String(err);
      progress(`scenario ${s.name} FAILED: ${entry.error}`);
    }
    // Other work on a shared machine moves absolute figures: say how busy it was.
    notes.push(
      `Load average (1 min) of the machine: ${loadBefore} when this scenario began, ${await loadAverage()} when it ended (${os.cpus().length} cores).`,
    );
    progress(`scenario ${s.name} took ${((nowMs() - t0) / 1000).toFixed(1)} s`);
  }
  report.notes.push(`RATE_LIMITED answers during the run (retried after Retry-After): ${rateLimitedHits}.`);
  report.durationS = (nowMs() - started) / 1000;

  process.stdout.write(textTable(rows) + '\n');
  process.stdout.write(`\nTargets of issue 15 (ratios to peers in this run; "quiet run" bounds are absolute):\n${targetLines(checkTargets(rows))}\n`);
  const json = await writeJson(path.join(REPO, 'bench', 'results'), report);
  progress(`wrote ${path.relative(REPO, json)}`);
  if (!values['no-docs']) await writeDocs(report);
  return failed ? 1 : 0;
}

async function writeDocs(report: RunReport): Promise<void> {
  // Every note in bench/notes/ is kept, the analysis of where the time goes first, the rest by name.
  const FIRST = 'where-the-time-goes.md';
  const names = (await readdir(path.join(REPO, 'bench', 'notes'))).filter((n) => n.endsWith('.md') && n !== FIRST).sort();
  const notes = [FIRST, ...names];
  const extra = (await Promise.all(notes.map((n) => readFile(path.join(REPO, 'bench', 'notes', n), 'utf8').catch(() => '')))).join('\n');
  // The charts go beside docs/benchmarks.md, in docs/benchmarks/, and the page links them.
  const charts = chartsOf(report);
  const chartDir = path.join(REPO, 'docs', 'benchmarks');
  await mkdir(chartDir, { recursive: true });
  for (const c of charts) await writeFile(path.join(chartDir, c.file), c.svg);
  // The section `npm run cell` wrote (between its markers) stays.
  const page = path.join(REPO, 'docs', 'benchmarks.md');
  const cell = /<!-- cell:begin[\s\S]*?<!-- cell:end -->/.exec(await readFile(page, 'utf8').catch(() => ''))?.[0];
  await writeFile(page, markdown(report, extra, charts) + (cell ? `\n${cell}\n` : ''));
  progress(`wrote docs/benchmarks.md and ${charts.length} charts in docs/benchmarks/`);
}

/** The 1-minute load average, as /proc/loadavg gives it. */
async function loadAverage(): Promise<string> {
  return (await readFile('/proc/loadavg', 'utf8')).split(' ')[0] ?? '?';
}

let code = 1;
try {
  code = await main();
} catch (err) {
  progress(`failed: ${(err as Error).stack ?? String(err)}`);
} finally {
  progress('cleaning up');
  await cleanupAll();
}
process.exit(code);
