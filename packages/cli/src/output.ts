// Human output: compact aligned tables, sizes and ages; JSON for scripts.

/** Prints rows as an aligned table with an upper-case header. */
export function printTable(header: string[], rows: string[][], out: NodeJS.WritableStream = process.stdout): void {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: string[]): string =>
    cells
      .map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i] ?? 0)))
      .join('  ')
      .trimEnd();
  out.write(`${line(header.map((h) => h.toUpperCase()))}\n`);
  for (const r of rows) out.write(`${line(r)}\n`);
}

/** Prints a value as indented JSON. */
export function printJson(value: unknown): void {
  process.stdout.write(`${JSON.stringify(value, null, 2)}\n`);
}

/** 1536 -> "1.5K"; binary units. */
export function formatBytes(bytes: number): string {
  const units = ['B', 'K', 'M', 'G', 'T'];
  let v = bytes;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return u === 0 ? `${v}B` : `${v < 10 ? v.toFixed(1) : Math.round(v)}${units[u]}`;
}

/** Time since an ISO date, compact ("5s", "3m", "2h", "4d"). */
export function formatAge(iso: string, nowMs = Date.now()): string {
  const s = Math.max(0, Math.round((nowMs - Date.parse(iso)) / 1000));
  if (!Number.isFinite(s)) return '-';
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86_400) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86_400)}d`;
}

/** A credential as `dsec keys ls` and `dsec endpoint-tokens ls` list it (an API key or an endpoint token). */
export interface CredentialRow {
  id: string;
  name: string;
  project: string;
  createdAt: string;
  revokedAt: string | null;
}

/**
 * The table of credentials: id, name, one column of their own (`kind`: a key's role, a token's
 * protocol), project, age and when revoked.
 */
export function printCredentials<T extends CredentialRow>(
  kind: { header: string; of: (item: T) => string },
  items: T[],
  out: NodeJS.WritableStream = process.stdout,
  nowMs = Date.now(),
): void {
  printTable(
    ['id', 'name', kind.header, 'project', 'age', 'revoked'],
    items.map((c) => [c.id, c.name, kind.of(c), c.project, formatAge(c.createdAt, nowMs), c.revokedAt ? formatAge(c.revokedAt, nowMs) + ' ago' : '-']),
    out,
  );
}
