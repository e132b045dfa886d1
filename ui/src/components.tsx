// Shared pieces of the pages: followed answers, reads, the signed-in key's role, tables, charts (uPlot), errors.
// Every value from the API is rendered as text (JSX children), never as markup.
import { createContext } from 'preact';
import type { ComponentChildren } from 'preact';
import { useContext, useEffect, useRef, useState } from 'preact/hooks';
import uPlot from 'uplot';
import { FOLLOW_MEDIA_TYPE, followNdjson } from './api.js';
import type { Me } from './api.js';

/** The signed-in key. */
export const MeContext = createContext<Me | null>(null);

const RANK = { viewer: 0, member: 1, admin: 2 } as const;

/** True when the signed-in key has at least `role` (buttons it cannot use are not shown). */
export function useCan(role: keyof typeof RANK): boolean {
  const me = useContext(MeContext);
  return me !== null && RANK[me.role] >= RANK[role];
}

/**
 * A GET's answer, followed: the API sends it now and again each time it changes (one request
 * held open, no polling); its last value, or the error that ended it (a revoked key's stream
 * ends with its reason). `live` says whether the stream is up.
 */
// eslint-disable-next-line @typescript-eslint/no-unnecessary-type-parameters -- the caller names the answer type it expects
export function useFollow<T>(path: string | undefined): { data: T | undefined; error: string | undefined; live: boolean } {
  const [data, setData] = useState<T | undefined>(undefined);
  const [error, setError] = useState<string | undefined>(undefined);
  const [live, setLive] = useState(false);
  useEffect(() => {
    setData(undefined);
    if (path === undefined) return;
    const ctl = new AbortController();
    followNdjson<{ at: string; value?: T; error?: { code: string; message: string } }>(
      path,
      (line) => {
        if (line.error) setError(`${line.error.code}: ${line.error.message}`);
        else {
          setData(line.value);
          setError(undefined);
        }
      },
      ctl.signal,
      setLive,
      FOLLOW_MEDIA_TYPE,
    ).catch((err: unknown) => {
      setLive(false);
      setError(errorText(err));
    });
    return () => ctl.abort();
  }, [path]);
  return { data, error, live };
}

/** Calls `load` now and every `ms` (0: once, and again on `reload` or a change of `deps`); its last value or error. */
export function usePoll<T>(load: () => Promise<T>, ms: number, deps: unknown[] = []): { data: T | undefined; error: string | undefined; reload: () => void } {
  const [data, setData] = useState<T | undefined>(undefined);
  const [error, setError] = useState<string | undefined>(undefined);
  const [tick, setTick] = useState(0);
  useEffect(() => {
    let alive = true;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const run = async (): Promise<void> => {
      try {
        const v = await load();
        if (alive) {
          setData(v);
          setError(undefined);
        }
      } catch (err) {
        if (alive) setError(errorText(err));
      }
      if (alive && ms > 0) timer = setTimeout(() => void run(), ms);
    };
    void run();
    return () => {
      alive = false;
      clearTimeout(timer);
    };
  }, [...deps, tick]);
  return { data, error, reload: () => setTick((t) => t + 1) };
}

/** The message of an error, for display. */
export function errorText(err: unknown): string {
  if (err instanceof Error) return ('code' in err ? `${String(err.code)}: ` : '') + err.message;
  return String(err);
}

/** An error line (nothing when there is none). */
export function ErrorLine({ error }: { error: string | undefined }) {
  return error ? (
    <p class="error" role="alert">
      {error}
    </p>
  ) : null;
}

/** A titled block of a page. */
export function Section({ title, children, actions }: { title: string; children: ComponentChildren; actions?: ComponentChildren }) {
  return (
    <section>
      <header class="section-head">
        <h2>{title}</h2>
        <div class="actions">{actions}</div>
      </header>
      {children}
    </section>
  );
}

/** A table of rows; cells are text or elements made by the page. */
export function Table({
  head,
  rows,
  empty = 'nothing yet',
  testid,
}: {
  head: string[];
  rows: ComponentChildren[][];
  empty?: string;
  testid?: string | undefined;
}) {
  return (
    <table data-testid={testid}>
      <thead>
        <tr>
          {head.map((h) => (
            <th key={h}>{h}</th>
          ))}
        </tr>
      </thead>
      <tbody>
        {rows.length === 0 ? (
          <tr>
            <td colSpan={head.length} class="muted">
              {empty}
            </td>
          </tr>
        ) : (
          rows.map((r, i) => (
            <tr key={i}>
              {r.map((c, j) => (
                <td key={j}>{c}</td>
              ))}
            </tr>
          ))
        )}
      </tbody>
    </table>
  );
}

/** A bar of `used` out of `total` with its figures. */
export function Meter({ used, total, label }: { used: number; total: number; label: string }) {
  const pct = total > 0 ? Math.min(100, (used / total) * 100) : 0;
  return (
    <div class="meter" title={label}>
      <div class="meter-fill" style={{ width: `${pct.toFixed(1)}%` }} />
      <span>{label}</span>
    </div>
  );
}

/** Bytes in a readable unit. */
export function bytes(n: number | null | undefined): string {
  if (n == null) return '-';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}

/** A time as the local clock shows it. */
export function time(iso: string | null | undefined): string {
  if (!iso) return '-';
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString();
}

/** A live line chart (uPlot) of named series over time; `points` is [times, ...series]. */
export function Chart({ title, series, points, unit }: { title: string; series: string[]; points: number[][]; unit: string }) {
  const el = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  useEffect(() => {
    if (!el.current) return;
    const colors = ['#2f7ed8', '#d8542f', '#3aa55d'];
    const opts: uPlot.Options = {
      title,
      width: 360,
      height: 160,
      series: [{}, ...series.map((label, i) => ({ label, stroke: colors[i % colors.length]!, width: 1.5 }))],
      axes: [{}, { values: (_u, ticks) => ticks.map((t) => formatUnit(t, unit)), size: 70 }],
      legend: { show: true },
    };
    plot.current = new uPlot(opts, points as uPlot.AlignedData, el.current);
    return () => {
      plot.current?.destroy();
      plot.current = null;
    };
  }, [title, series.join(','), unit]);
  useEffect(() => {
    plot.current?.setData(points as uPlot.AlignedData);
  }, [points]);
  return <div class="chart" ref={el} data-testid={`chart-${title}`} />;
}

function formatUnit(v: number, unit: string): string {
  if (unit === 'bytes') return bytes(v);
  if (unit === '%') return `${v.toFixed(0)}%`;
  return v.toFixed(2);
}

/** A button that runs an async action, shows that it runs, and reports its error. */
export function ActionButton({
  label,
  run,
  danger,
  testid,
  disabled,
}: {
  label: string;
  run: () => Promise<unknown>;
  danger?: boolean | undefined;
  testid?: string | undefined;
  disabled?: boolean | undefined;
}) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | undefined>(undefined);
  return (
    <span class="action">
      <button
        class={danger ? 'danger' : ''}
        data-testid={testid}
        disabled={busy || disabled}
        onClick={() => {
          setBusy(true);
          setError(undefined);
          run()
            .catch((err: unknown) => setError(errorText(err)))
            .finally(() => setBusy(false));
        }}
      >
        {busy ? `${label}…` : label}
      </button>
      {error ? <span class="error">{error}</span> : null}
    </span>
  );
}
