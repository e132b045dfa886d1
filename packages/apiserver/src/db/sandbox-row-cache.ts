// The sandbox rows that requests route by (every exec and file call reads its sandbox's row),
// kept in memory by the embedded store. Correctness rests on one rule: every statement that may
// change a sandbox row, or undo such a change, drops the whole cache before its result is seen.
// The SQLite driver runs every statement of the process (sqlite-group-commit.ts) and reports each
// write ({@link SandboxRowCache.written}); a write naming the `sandboxes` table, any rollback and
// any failed group drop every row. A read that a drop overtook (begun before it, answered after)
// does not fill the cache. A deleted, moved, paused or stopping sandbox is therefore seen as the
// store holds it by the next request after the write.
//
// Not used on a shared store (PostgreSQL replicas): another replica's write is not seen here
// until a notification arrives, and a notification sent after a statement may arrive before its
// transaction commits, so a replica could cache the row as it was; see docs/benchmarks.md.
import type { SandboxTable } from './schema.js';

/** Most rows kept (the oldest is dropped first). */
export const MAX_CACHED_SANDBOX_ROWS = 50_000;

/** What a statement's SQL says about the cached rows: true when it may change or undo a change of one. */
export function mayChangeSandboxRows(sql: string): boolean {
  return /\bsandboxes\b/i.test(sql) || /^\s*rollback\b/i.test(sql);
}

/** Sandbox rows by id, dropped on every write that may touch one. */
export class SandboxRowCache {
  /** Hits, reads and drops, for tests and reports. */
  readonly counts = { hits: 0, reads: 0, dropped: 0 };
  private readonly rows = new Map<string, SandboxTable>();
  /** Bumped on every drop: a read that began before it does not fill the cache. */
  private generation = 0;

  /** The row of `id`: a copy of the cached one, or `read()`'s (kept when nothing was written meanwhile). */
  async get(id: string, read: () => Promise<SandboxTable | undefined>): Promise<SandboxTable | undefined> {
    const hit = this.rows.get(id);
    if (hit) {
      this.counts.hits++;
      return { ...hit };
    }
    this.counts.reads++;
    const generation = this.generation;
    const row = await read();
    if (row && generation === this.generation) {
      if (this.rows.size >= MAX_CACHED_SANDBOX_ROWS) this.rows.delete(this.rows.keys().next().value!);
      this.rows.set(id, { ...row });
    }
    return row;
  }

  /** A statement ran (its SQL): drops every row when it may have changed one. */
  written(sql: string): void {
    if (mayChangeSandboxRows(sql)) this.forget();
  }

  /** Drops every row. */
  forget(): void {
    this.generation++;
    this.counts.dropped++;
    this.rows.clear();
  }
}
