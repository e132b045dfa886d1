// The audit trail: one entry per API call (who, what, when, result) and, for exec, the command
// and its exit status. Recording is a push onto a bounded buffer (it sits on the exec path);
// the buffer is written in batches.
import { sortableId } from './ids.js';

/** One audit entry. */
export interface AuditRecord {
  id: string;
  at: string;
  /** The API key's id (never the key); null when the call had no valid key. */
  keyId: string | null;
  projectId: string | null;
  method: string;
  /** Route pattern, never the raw URL. */
  route: string;
  sandboxId: string | null;
  status: number;
  durationMs: number;
  command: string | null;
  exitCode: number | null;
  /** Calls this entry stands for when more than one (repeated failed authentications from one source). */
  count?: number;
}

/** A query of audit entries; all conditions hold. */
export interface AuditQuery {
  /** Projects whose keys' calls are visible; `all` for every project (and calls without a key). */
  projectIds: string[] | 'all';
  since?: string;
  sandboxId?: string;
  keyId?: string;
  cursor?: string;
  order: 'asc' | 'desc';
  limit: number;
}

/** What the audit trail needs of the state store. */
export interface AuditStore {
  insertAudit(rows: AuditRecord[]): Promise<void>;
  queryAudit(q: AuditQuery): Promise<AuditRecord[]>;
  /** Deletes entries beyond the newest `maxRows` and those older than `before`; returns how many. */
  pruneAudit(maxRows: number, before: string): Promise<number>;
}

/** Entries waiting to be written; more are dropped (and counted). */
export const MAX_AUDIT_BUFFER = 20_000;
/** Default interval of batched audit writes. */
export const DEFAULT_AUDIT_FLUSH_MS = 250;
/** Entries written in one insert. */
const WRITE_BATCH = 500;
/** Longest command summary kept. */
export const MAX_COMMAND_CHARS = 256;

/** A command as the audit trail shows it: argv joined by spaces, or the shell string, cut short. */
export function commandSummary(spec: { argv?: string[] | undefined; cmd?: string | undefined }): string {
  const text = spec.cmd ?? (spec.argv ?? []).join(' ');
  return text.length > MAX_COMMAND_CHARS ? `${text.slice(0, MAX_COMMAND_CHARS - 1)}…` : text;
}

/** Buffered, batched writer of audit entries. */
export class AuditLog {
  /** Entries lost to a full buffer or a failed write. */
  dropped = 0;
  /** Entries recorded. */
  recorded = 0;
  private buffer: AuditRecord[] = [];
  private writing: Promise<void> | undefined;
  private readonly timer: NodeJS.Timeout;

  constructor(
    private readonly store: AuditStore,
    private readonly o: { flushIntervalMs?: number; log?: (line: string) => void } = {},
  ) {
    this.timer = setInterval(() => void this.flush(), o.flushIntervalMs ?? DEFAULT_AUDIT_FLUSH_MS);
    this.timer.unref();
  }

  /** Records one entry (id and time filled in when absent). Never throws, never waits. */
  record(entry: Omit<AuditRecord, 'id' | 'at'> & { at?: string }): void {
    if (this.buffer.length >= MAX_AUDIT_BUFFER) {
      this.dropped++;
      return;
    }
    this.recorded++;
    this.buffer.push({ ...entry, id: sortableId('au'), at: entry.at ?? new Date().toISOString() });
    if (this.buffer.length >= WRITE_BATCH) void this.flush();
  }

  /** Writes everything recorded so far. */
  async flush(): Promise<void> {
    while (this.writing) await this.writing;
    if (this.buffer.length === 0) return;
    const rows = this.buffer;
    this.buffer = [];
    this.writing = (async () => {
      for (let i = 0; i < rows.length; i += WRITE_BATCH) {
        const batch = rows.slice(i, i + WRITE_BATCH);
        try {
          await this.store.insertAudit(batch);
        } catch (err) {
          this.dropped += batch.length;
          this.o.log?.(`watcher: writing ${batch.length} audit entries failed: ${(err as Error).message}`);
        }
      }
    })().finally(() => (this.writing = undefined));
    await this.writing;
  }

  /** Entries (after a flush, so a reader sees its own earlier calls). */
  async query(q: AuditQuery): Promise<AuditRecord[]> {
    await this.flush();
    return this.store.queryAudit(q);
  }

  /** Stops the timer and writes what is buffered. */
  async close(): Promise<void> {
    clearInterval(this.timer);
    await this.flush();
  }
}
