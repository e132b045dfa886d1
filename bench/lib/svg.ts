// Small SVG charts without dependencies: grouped horizontal bars (a p50 bar, p90 and p99
// whiskers) and line charts. Output is plain SVG 1.1 text, readable on GitHub and in browsers.

/** One bar: a system's figure (p50 or value), with optional p90/p99 whiskers. */
export interface Bar {
  label: string;
  value: number;
  p90?: number | undefined;
  p99?: number | undefined;
}

/** Bars of one figure, side by side. */
export interface BarGroup {
  label: string;
  bars: Bar[];
}

/** One line of a line chart. */
export interface LineSeries {
  label: string;
  points: Array<[number, number]>;
}

const FONT = 'font-family="sans-serif" font-size="12"';
const PALETTE: Record<string, string> = {
  dsec: '#1f5fbf',
  'dsec edge': '#7fa7e0',
  'crun run': '#e07b00',
  'crun exec': '#e07b00',
  bwrap: '#2e9e44',
  'host python3': '#2e9e44',
  'podman run --rm': '#c23b3b',
  'podman exec': '#c23b3b',
  podman: '#c23b3b',
};
const FALLBACK = ['#6b6b6b', '#8e44ad', '#16a085', '#b7950b'];

/** A stable colour per system name. */
export function colourOf(name: string): string {
  const known = PALETTE[name];
  if (known) return known;
  let h = 0;
  for (const ch of name) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
  return FALLBACK[h % FALLBACK.length]!;
}

const esc = (s: string): string => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
const num = (x: number): string => (x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2));

/** Round axis maximum: 1, 2 or 5 times a power of ten at or above `x`. */
function niceMax(x: number): number {
  if (!(x > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(x));
  for (const m of [1, 2, 5, 10]) if (m * p >= x) return m * p;
  return 10 * p;
}

/**
 * Grouped horizontal bars: each group a figure, each bar a system's p50 (or value), a thin line
 * from p50 to p99 with a tick at p90. One scale per group, since the figures differ by orders.
 */
export function barChart(opts: { title: string; unit: string; groups: BarGroup[]; higherIsBetter?: boolean }): string {
  const width = 760;
  const labelW = 170;
  const plotW = width - labelW - 90;
  const barH = 16;
  const gap = 6;
  const out: string[] = [];
  let y = 40;
  for (const g of opts.groups) {
    // One far slower peer (podman) would squash the rest: the scale stops at 3x the largest of the
    // others' p50s, and what lies beyond is drawn to the edge and labelled.
    const heads = g.bars.map((b) => b.value).sort((a, b) => a - b);
    const second = heads.length > 1 ? heads[heads.length - 2]! : heads[0]!;
    const max = niceMax(Math.min(Math.max(...g.bars.map((b) => b.p99 ?? b.value)), 3 * second));
    const x = (v: number): number => labelW + (Math.min(v, max) / max) * plotW;
    out.push(`<text x="10" y="${y + 2}" ${FONT} font-weight="bold">${esc(g.label)}</text>`);
    out.push(`<text x="${labelW + plotW}" y="${y + 2}" ${FONT} text-anchor="end" fill="#666">0 to ${num(max)} ${esc(opts.unit)}</text>`);
    y += 10;
    for (const b of g.bars) {
      const c = colourOf(b.label);
      out.push(`<text x="${labelW - 6}" y="${y + barH - 4}" ${FONT} text-anchor="end">${esc(b.label)}</text>`);
      out.push(`<rect x="${labelW}" y="${y}" width="${Math.max(1, x(b.value) - labelW).toFixed(1)}" height="${barH}" fill="${c}"/>`);
      if (b.p99 !== undefined && b.p99 > b.value) {
        const mid = y + barH / 2;
        out.push(`<line x1="${x(b.value).toFixed(1)}" y1="${mid}" x2="${x(b.p99).toFixed(1)}" y2="${mid}" stroke="${c}" stroke-width="1.5"/>`);
        out.push(`<line x1="${x(b.p99).toFixed(1)}" y1="${y + 3}" x2="${x(b.p99).toFixed(1)}" y2="${y + barH - 3}" stroke="${c}" stroke-width="1.5"/>`);
        if (b.p90 !== undefined) out.push(`<circle cx="${x(b.p90).toFixed(1)}" cy="${mid}" r="2.5" fill="${c}"/>`);
      }
      const tail = (b.p99 !== undefined ? `p50 ${num(b.value)}, p99 ${num(b.p99)}` : num(b.value)) + (b.value > max ? ' (off scale)' : '');
      const at = Math.min(Math.max(x(b.value), b.p99 !== undefined ? x(b.p99) : 0) + 6, labelW + plotW - 150);
      out.push(`<text x="${at.toFixed(1)}" y="${y + barH - 4}" ${FONT} fill="${b.value > max ? '#fff' : '#333'}">${esc(tail)}</text>`);
      y += barH + gap;
    }
    y += 22;
  }
  const height = y;
  const note = opts.groups.some((g) => g.bars.some((b) => b.p99 !== undefined))
    ? `bar: p50; dot: p90; whisker: p99 (${opts.unit}). ${opts.higherIsBetter ? 'Longer is better.' : 'Shorter is better.'}`
    : `${opts.unit}. ${opts.higherIsBetter ? 'Longer is better.' : 'Shorter is better.'}`;
  return svgDoc(width, height, opts.title, note, out);
}

/** A line chart of one or more series against a shared x axis. */
export function lineChart(opts: { title: string; xLabel: string; yLabel: string; series: LineSeries[] }): string {
  const width = 760;
  const height = 360;
  const left = 60;
  const right = 20;
  const top = 40;
  const bottom = 50;
  const pts = opts.series.flatMap((s) => s.points);
  const xMax = niceMax(Math.max(...pts.map((p) => p[0])));
  const yMax = niceMax(Math.max(...pts.map((p) => p[1])));
  const X = (v: number): number => left + (v / xMax) * (width - left - right);
  const Y = (v: number): number => height - bottom - (v / yMax) * (height - top - bottom);
  const out: string[] = [];
  for (let i = 0; i <= 4; i++) {
    const v = (yMax * i) / 4;
    out.push(`<line x1="${left}" y1="${Y(v).toFixed(1)}" x2="${width - right}" y2="${Y(v).toFixed(1)}" stroke="#ddd"/>`);
    out.push(`<text x="${left - 6}" y="${(Y(v) + 4).toFixed(1)}" ${FONT} text-anchor="end">${num(v)}</text>`);
    const xv = (xMax * i) / 4;
    out.push(`<text x="${X(xv).toFixed(1)}" y="${height - bottom + 16}" ${FONT} text-anchor="middle">${num(xv)}</text>`);
  }
  out.push(`<text x="${(left + width - right) / 2}" y="${height - 12}" ${FONT} text-anchor="middle">${esc(opts.xLabel)}</text>`);
  out.push(
    `<text x="14" y="${(top + height - bottom) / 2}" ${FONT} text-anchor="middle" transform="rotate(-90 14 ${(top + height - bottom) / 2})">${esc(opts.yLabel)}</text>`,
  );
  opts.series.forEach((s, i) => {
    const c = colourOf(s.label);
    const d = s.points.map((p, j) => `${j ? 'L' : 'M'}${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(' ');
    out.push(`<path d="${d}" fill="none" stroke="${c}" stroke-width="2"/>`);
    for (const p of s.points) out.push(`<circle cx="${X(p[0]).toFixed(1)}" cy="${Y(p[1]).toFixed(1)}" r="2.5" fill="${c}"/>`);
    out.push(`<text x="${width - right}" y="${top + 14 * i}" ${FONT} text-anchor="end" fill="${c}">${esc(s.label)}</text>`);
  });
  return svgDoc(width, height, opts.title, '', out);
}

function svgDoc(width: number, height: number, title: string, note: string, body: string[]): string {
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}">`,
    `<title>${esc(title)}</title>`,
    `<rect width="${width}" height="${height}" fill="#fff"/>`,
    `<text x="10" y="20" font-family="sans-serif" font-size="15" font-weight="bold">${esc(title)}</text>`,
    note ? `<text x="${width - 10}" y="20" ${FONT} text-anchor="end" fill="#666">${esc(note)}</text>` : '',
    ...body,
    '</svg>',
    '',
  ]
    .filter(Boolean)
    .join('\n');
}
