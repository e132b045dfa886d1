// Results: rows of measurements, printed as a table, written as JSON, and rendered into
// docs/benchmarks.md.
import { readFile, mkdir, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { Chart } from './charts.js';
import { fmt } from './stats.js';
import { checkTargets } from './targets.js';
import type { Summary } from './stats.js';

/** A DESIGN.md target next to a figure, and whether this run met it. */
export interface TargetCheck {
  text: string;
  met: boolean;
}

/** One measured figure: a latency sample (p50/p90/p99) or a single value. */
export interface Row {
  scenario: string;
  /** What was measured; rows with the same metric are compared side by side. */
  metric: string;
  /** `dsec`, `dsec edge` (breakdown), `podman`, `crun`, `bwrap`. */
  system: string;
  unit: string;
  n?: number;
  p50?: number;
  p90?: number;
  p99?: number;
  value?: number;
  /** True for rates (bigger is better); latencies and memory are smaller-is-better. */
  higherIsBetter?: boolean;
  targets?: TargetCheck[];
  note?: string;
  /** False when the peers' figure is not comparable (e.g. a capped count). */
  compare?: boolean;
  /** How the figure moved along the run (creates/s per window as the node fills), for the charts. */
  series?: { x: string; y: string; points: Array<[number, number]> };
}

/** Builds a latency row from a summary. */
export function latencyRow(scenario: string, metric: string, system: string, s: Summary, extra: Partial<Row> = {}): Row {
  return { scenario, metric, system, unit: 'ms', n: s.n, p50: s.p50, p90: s.p90, p99: s.p99, ...extra };
}

/** The figure rows are compared on: p50 for latencies, the value otherwise. */
export function headline(r: Row): number | undefined {
  return r.p50 ?? r.value;
}

/** How many times better dsec's row is than a peer's (> 1: dsec is better). */
export function ratio(dsec: Row, peer: Row): number | undefined {
  const a = headline(dsec);
  const b = headline(peer);
  if (a === undefined || b === undefined || a === 0 || b === 0) return undefined;
  return dsec.higherIsBetter ? a / b : b / a;
}

const isDsec = (r: Row): boolean => r.system === 'dsec';

/** The peers of a dsec row: rows of the same scenario and metric from other systems. */
function peersOf(rows: readonly Row[], r: Row): Row[] {
  return rows.filter((p) => p.scenario === r.scenario && p.metric === r.metric && !p.system.startsWith('dsec'));
}

function versus(rows: readonly Row[], r: Row): string {
  if (!isDsec(r) || r.compare === false) return '';
  return peersOf(rows, r)
    .map((p) => {
      const x = ratio(r, p);
      return x === undefined ? '' : `${x.toFixed(x < 10 ? 2 : 1)}x vs ${p.system}`;
    })
    .filter(Boolean)
    .join('; ');
}

function targetText(r: Row): string {
  return (r.targets ?? []).map((t) => `${t.met ? 'met' : 'MISSED'}: ${t.text}`).join('; ');
}

/** Machine facts for the report. */
export interface MachineInfo {
  cores: number;
  cpuModel: string;
  memoryGiB: number;
  kernel: string;
  distro: string;
  node: string;
  versions: Record<string, string>;
}

/** Reads the machine facts. */
export async function machineInfo(versions: Record<string, string>): Promise<MachineInfo> {
  const osRelease = await readFile('/etc/os-release', 'utf8').catch(() => '');
  return {
    cores: os.cpus().length,
    cpuModel: os.cpus()[0]?.model.trim() ?? 'unknown',
    memoryGiB: Math.round((os.totalmem() / 2 ** 30) * 10) / 10,
    kernel: os.release(),
    distro: /^PRETTY_NAME="?([^"\n]*)/m.exec(osRelease)?.[1] ?? 'unknown',
    node: process.version,
    versions,
  };
}

/** Everything one run produced. */
export interface RunReport {
  date: string;
  command: string;
  quick: boolean;
  durationS: number;
  machine: MachineInfo;
  /** Scenario name -> title, method and notes of this run. */
  scenarios: Array<{ name: string; title: string; method: string; notes: string[]; error?: string }>;
  rows: Row[];
  /** Run-wide notes (settings that shape the figures). */
  notes: string[];
}

function cells(r: Row): string[] {
  const lat = r.p50 !== undefined;
  return [r.metric, r.system, r.n !== undefined ? String(r.n) : '', lat ? fmt(r.p50) : fmt(r.value), lat ? fmt(r.p90) : '', lat ? fmt(r.p99) : '', r.unit];
}

/** The table printed on stdout. */
export function textTable(rows: readonly Row[]): string {
  const head = ['scenario', 'metric', 'system', 'n', 'p50/value', 'p90', 'p99', 'unit', 'vs peers', 'target'];
  const body = rows.map((r) => [r.scenario, ...cells(r), versus(rows, r), targetText(r)]);
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((b) => b[i]!.length)));
  const line = (c: string[]): string =>
    c
      .map((x, i) => x.padEnd(widths[i]!))
      .join('  ')
      .trimEnd();
  return [line(head), line(widths.map((w) => '-'.repeat(w))), ...body.map(line)].join('\n');
}

/** Writes the JSON result file; returns its path. */
export async function writeJson(dir: string, report: RunReport): Promise<string> {
  await mkdir(dir, { recursive: true });
  const file = path.join(dir, `${report.date.replace(/[:.]/g, '-')}.json`);
  await writeFile(file, JSON.stringify(report, null, 2) + '\n');
  return file;
}

const esc = (s: string): string => s.replace(/\|/g, '\\|');

/** docs/benchmarks.md from a run; `extra` (markdown) is appended (the hand-written analysis). */
export function markdown(report: RunReport, extra: string, charts: readonly Chart[] = []): string {
  const m = report.machine;
  const out: string[] = [];
  out.push('# Benchmarks');
  out.push('');
  out.push('Generated by `npm run bench` (code in `bench/`); do not edit by hand, except the analysis at the end, which');
  out.push('comes from `bench/notes/where-the-time-goes.md`. dsec and its peers (podman, crun, bubblewrap) run side by');
  out.push('side in one run on the same busybox rootfs, alternating per iteration after a warm-up.');
  out.push('');
  out.push('| | |');
  out.push('|---|---|');
  out.push(`| date | ${report.date} |`);
  out.push(`| command | \`${report.command}\` (${report.durationS.toFixed(0)} s) |`);
  out.push(`| machine | ${m.cores} cores (${esc(m.cpuModel)}), ${m.memoryGiB} GiB, kernel ${m.kernel}, ${m.distro} |`);
  out.push(`| software | node ${m.node}; ${Object.values(m.versions).join('; ')} |`);
  out.push('');
  out.push('Latencies are in ms (nearest-rank percentiles). "vs" gives how many times better dsec is than the peer on');
  out.push('the p50 (latency) or the rate (throughput): above 1 dsec is faster.');
  out.push('');
  for (const n of report.notes) out.push(`- ${n}`);
  if (report.notes.length) out.push('');
  out.push('## Targets of issue 15 (faster than crun)');
  out.push('');
  out.push('Each a ratio to a peer measured in this run, except the bounds marked "quiet run" (absolute figures,');
  out.push('judged only on an idle machine). "not measured": the scenario did not run at that size in this run.');
  out.push('');
  out.push('| figure | target | this run | verdict |');
  out.push('|---|---|---|---|');
  for (const t of checkTargets(report.rows)) {
    out.push(
      `| ${esc(t.figure)} | ${esc(t.target)} | ${esc(t.measured)} | ${t.verdict === 'MET' ? 'MET' : t.verdict === 'MISSED' ? '**MISSED**' : 'not measured'} |`,
    );
  }
  out.push('');
  if (charts.length) {
    out.push('## Charts');
    out.push('');
    for (const c of charts) {
      out.push(`![${c.title}](benchmarks/${c.file})`);
      out.push('');
    }
  }
  out.push('## Targets (DESIGN.md)');
  out.push('');
  out.push('| scenario | figure | this run | target | met |');
  out.push('|---|---|---|---|---|');
  for (const r of report.rows) {
    for (const t of r.targets ?? []) {
      const fig = r.p50 !== undefined ? `p50 ${fmt(r.p50)} ${r.unit}` : `${fmt(r.value)} ${r.unit}`;
      const vs = versus(report.rows, r);
      out.push(`| ${r.scenario} | ${esc(r.metric)} | ${fig}${vs ? ` (${vs})` : ''} | ${esc(t.text)} | ${t.met ? 'yes' : '**no**'} |`);
    }
  }
  out.push('');
  for (const s of report.scenarios) {
    out.push(`## ${s.title}`);
    out.push('');
    out.push(s.method);
    out.push('');
    if (s.error) {
      out.push(`**This scenario failed in this run:** ${s.error}`);
      out.push('');
    }
    const rows = report.rows.filter((r) => r.scenario === s.name);
    if (rows.length) {
      out.push('| metric | system | n | p50 / value | p90 | p99 | unit | vs peers | target |');
      out.push('|---|---|---|---|---|---|---|---|---|');
      for (const r of rows) out.push(`| ${[...cells(r), versus(report.rows, r), targetText(r)].map(esc).join(' | ')} |`);
      out.push('');
    }
    const notes = [...s.notes, ...rows.filter((r) => r.note).map((r) => `${r.metric} (${r.system}): ${r.note}`)];
    for (const n of notes) out.push(`- ${n}`);
    if (notes.length) out.push('');
  }
  out.push(extra.trim());
  out.push('');
  return out.join('\n');
}
