// The charts of a run, drawn from its rows: latency distributions side by side with the peers,
// throughput side by side, creates per second as the node fills, memory per sandbox.
import type { Row, RunReport } from './report.js';
import { barChart, lineChart } from './svg.js';
import type { BarGroup } from './svg.js';

/** One chart: its file name (beside docs/benchmarks.md, under benchmarks/), title and SVG text. */
export interface Chart {
  file: string;
  title: string;
  svg: string;
}

/** Latency figures drawn side by side (scenario, metric). */
const LATENCIES: Array<[string, string | RegExp]> = [
  ['create', 'create to first exec, concurrency 1'],
  ['create', 'create to first exec, concurrency 8'],
  ['create', 'destroy'],
  ['exec', 'exec round trip (true)'],
  ['fncall', 'trivial call, paced'],
  ['fncall', "python3 -c 'print(1)', paced"],
];
/** Rates drawn side by side. */
const RATES: Array<[string, string | RegExp]> = [
  ['stream', /^stdout of /],
  ['fncall', /^trivial calls per second/],
  ['exec', /^exec throughput/],
];

const matches = (r: Row, scenario: string, metric: string | RegExp): boolean =>
  r.scenario === scenario && (typeof metric === 'string' ? r.metric === metric : metric.test(r.metric));

function groups(rows: readonly Row[], figures: Array<[string, string | RegExp]>): BarGroup[] {
  const out: BarGroup[] = [];
  for (const [scenario, metric] of figures) {
    const of = rows.filter((r) => matches(r, scenario, metric) && (r.p50 ?? r.value) !== undefined);
    if (of.length === 0) continue;
    out.push({
      label: `${scenario}: ${of[0]!.metric}${of[0]!.p50 === undefined ? ` (${of[0]!.unit})` : ''}`,
      bars: of.map((r) => ({ label: r.system, value: (r.p50 ?? r.value)!, p90: r.p90, p99: r.p99 })),
    });
  }
  return out;
}

/** The charts this run's rows allow (a scenario not run draws nothing). */
export function chartsOf(report: RunReport): Chart[] {
  const charts: Chart[] = [];
  const latency = groups(report.rows, LATENCIES);
  if (latency.length)
    charts.push({
      file: 'latency.svg',
      title: 'Latency, dsec and its peers',
      svg: barChart({ title: 'Latency, dsec and its peers', unit: 'ms', groups: latency }),
    });
  const rates = groups(report.rows, RATES);
  if (rates.length)
    charts.push({
      file: 'throughput.svg',
      title: 'Throughput, dsec and its peers',
      svg: barChart({ title: 'Throughput, dsec and its peers', unit: 'per s', groups: rates, higherIsBetter: true }),
    });
  for (const [suffix, file, unit, title] of [
    ['create to first command end', 'lazy-start.svg', 'ms', "Cold start to the first command's end: eager pull, lazy, lazy + profile, podman pull + run"],
    ['blob requests to the registry', 'lazy-requests.svg', 'requests', 'Registry requests of a cold start: eager pull, lazy, lazy + profile'],
    ['bytes fetched', 'lazy-bytes.svg', 'MiB', 'Bytes fetched before the first command ends: eager pull, lazy, lazy + profile, podman pull + run'],
  ] as const) {
    const of = report.rows.filter((r) => r.scenario === 'lazy' && r.metric.endsWith(`: ${suffix}`) && r.value !== undefined);
    const images = [...new Set(of.map((r) => r.metric))];
    if (images.length > 0)
      charts.push({
        file,
        title,
        svg: barChart({
          title,
          unit,
          groups: images.map((m) => ({ label: m, bars: of.filter((r) => r.metric === m).map((r) => ({ label: r.system, value: r.value! })) })),
        }),
      });
  }
  // Bytes received over the link during a cold start, per image: every mode, then the first seconds.
  const overTime = report.rows.filter((r) => r.scenario === 'lazy' && r.metric.endsWith(': bytes received over the link over time') && r.series);
  for (const [k, metric] of [...new Set(overTime.map((r) => r.metric))].entries()) {
    const image = metric.slice(0, -': bytes received over the link over time'.length);
    const of = overTime.filter((r) => r.metric === metric);
    const lazyEnd = Math.max(...of.filter((r) => r.system.startsWith('dsec lazy')).map((r) => r.series!.points[r.series!.points.length - 1]?.[0] ?? 0));
    const longest = Math.max(...of.map((r) => r.series!.points[r.series!.points.length - 1]?.[0] ?? 0));
    for (const [suffix, until] of [
      ['', Infinity],
      // The first seconds again, when the eager pull (and podman) run on past the lazy starts.
      ...(longest > lazyEnd * 1.5 ? ([[`, first ${(lazyEnd / 1000).toFixed(1)} s`, lazyEnd]] as const) : []),
    ] as const) {
      const title = `Bytes received from the registry over time, ${image}${suffix}`;
      charts.push({
        file: `lazy-bytes-over-time-${k + 1}${until === Infinity ? '' : '-start'}.svg`,
        title,
        svg: lineChart({
          title,
          xLabel: 'ms since create (to the first command end)',
          yLabel: 'MiB',
          series: of.map((r) => ({ label: r.system, points: r.series!.points.filter(([x]) => x <= until) })),
        }),
      });
    }
  }
  const fill = report.rows.find((r) => r.scenario === 'sustained' && r.series);
  const probes = report.rows.filter((r) => r.scenario === 'density' && /^create at \d+% fill$/.test(r.metric) && r.p50 !== undefined);
  if (fill?.series) {
    charts.push({
      file: 'creates-as-the-node-fills.svg',
      title: 'Creates per second as the node fills',
      svg: lineChart({
        title: `Creates per second as the node fills (${fill.metric})`,
        xLabel: fill.series.x,
        yLabel: fill.series.y,
        series: [{ label: 'dsec', points: fill.series.points }],
      }),
    });
  }
  if (probes.length) {
    const systems = [...new Set(probes.map((r) => r.system))];
    charts.push({
      file: 'create-latency-as-the-node-fills.svg',
      title: 'Create latency as the node fills',
      svg: lineChart({
        title: 'Create latency (p50) as the node fills',
        xLabel: 'fill (% of the density target)',
        yLabel: 'ms',
        series: systems.map((s) => ({
          label: s,
          points: probes.filter((r) => r.system === s).map((r) => [Number(/(\d+)%/.exec(r.metric)![1]), r.p50!] as [number, number]),
        })),
      }),
    });
  }
  const memory = groups(report.rows, [
    ['density', 'host memory per sandbox (MemAvailable delta)'],
    ['density', 'host memory per sandbox beyond its cgroups'],
  ]);
  if (memory.length)
    charts.push({
      file: 'memory-per-sandbox.svg',
      title: 'Memory per idle sandbox',
      svg: barChart({ title: 'Memory per idle sandbox', unit: 'MiB', groups: memory }),
    });
  return charts;
}
