// Timing and summary statistics.

/** Milliseconds from a monotonic clock. */
export function nowMs(): number {
  return Number(process.hrtime.bigint()) / 1e6;
}

/** Runs `fn` and returns its duration in ms along with its value. */
export async function timed<T>(fn: () => Promise<T>): Promise<{ ms: number; value: T }> {
  const t0 = nowMs();
  const value = await fn();
  return { ms: nowMs() - t0, value };
}

/** Nearest-rank percentile of `xs` (p in 0..100); NaN for an empty sample. */
export function percentile(xs: readonly number[], p: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  const rank = Math.ceil((p / 100) * s.length);
  return s[Math.min(s.length - 1, Math.max(0, rank - 1))]!;
}

/** Percentiles of a sample. */
export interface Summary {
  n: number;
  p50: number;
  p90: number;
  p99: number;
  mean: number;
}

/** p50/p90/p99 and mean of a sample. */
export function summarize(xs: readonly number[]): Summary {
  const mean = xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : NaN;
  return { n: xs.length, p50: percentile(xs, 50), p90: percentile(xs, 90), p99: percentile(xs, 99), mean };
}

/** Runs `count` tasks with at most `concurrency` in flight; resolves with their results in order. */
export async function pool<T>(count: number, concurrency: number, task: (i: number, worker: number) => Promise<T>): Promise<T[]> {
  const out: T[] = new Array<T>(count);
  let next = 0;
  const worker = async (w: number): Promise<void> => {
    while (next < count) {
      const i = next++;
      out[i] = await task(i, w);
    }
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, count) }, (_, w) => worker(w)));
  return out;
}

/** A number with a sensible count of digits for a table. */
export function fmt(x: number | undefined): string {
  if (x === undefined || !Number.isFinite(x)) return '-';
  const a = Math.abs(x);
  if (a >= 1000) return x.toFixed(0);
  if (a >= 100) return x.toFixed(1);
  if (a >= 10) return x.toFixed(2);
  return x.toFixed(2);
}

/** Progress line on stderr (the table goes to stdout). */
export function progress(line: string): void {
  process.stderr.write(`bench: ${line}\n`);
}

/** Resolves after `ms`. */
export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Operations per second of `fn` run back to back by `concurrency` workers for `durationMs`. */
export async function rateInFlight(concurrency: number, durationMs: number, fn: () => Promise<unknown>): Promise<number> {
  let done = 0;
  const t0 = nowMs();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (nowMs() - t0 < durationMs) {
        await fn();
        done++;
      }
    }),
  );
  return done / ((nowMs() - t0) / 1000);
}
