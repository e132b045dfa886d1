// The watcher's tables: events, the audit trail and run-time rules, on the state store's Kysely
// database (same portable subset: text ids, ISO timestamps, JSON as text).
import type { Kysely } from 'kysely';
import type { CreateRuleRequest, EventKind, EventSeverity, RuleKind } from '@dsec/protocol';
import type { AuditQuery, AuditRecord, AuditStore, EventQuery, EventStore, RuleRecord, StoredEvent } from '@dsec/watcher';
import type { AuditTable, Database, EventTable, RuleTable } from './schema.js';

/** Default retention: events kept at most (newest first) and for at most this long. */
export const DEFAULT_EVENT_RETENTION = { maxRows: 200_000, maxAgeMs: 30 * 86_400_000 };
/** Default retention of audit entries. */
export const DEFAULT_AUDIT_RETENTION = { maxRows: 1_000_000, maxAgeMs: 90 * 86_400_000 };

/** Rows deleted per statement when pruning (keeps each write transaction short). */
const PRUNE_BATCH = 5000;

function toEvent(r: EventTable): StoredEvent {
  let data: Record<string, unknown> = {};
  try {
    data = JSON.parse(r.data) as Record<string, unknown>;
  } catch {
    // a row written by something else; serve it without data
  }
  return {
    id: r.id,
    at: r.at,
    kind: r.kind as EventKind,
    severity: r.severity as EventSeverity,
    projectId: r.project_id,
    sandboxId: r.sandbox_id,
    node: r.node,
    message: r.message,
    data,
  };
}

function toAudit(r: AuditTable): AuditRecord {
  return {
    id: r.id,
    at: r.at,
    keyId: r.key_id,
    projectId: r.project_id,
    method: r.method,
    route: r.route,
    sandboxId: r.sandbox_id,
    status: r.status,
    durationMs: r.duration_ms,
    command: r.command,
    exitCode: r.exit_code,
    ...(r.count > 1 ? { count: r.count } : {}),
  };
}

/** Events, audit entries and rules. */
export class WatchStore implements EventStore, AuditStore {
  /** Called with the ids of each batch of events once stored (replicas announce them to each other). */
  onEventsStored: ((ids: string[]) => Promise<void>) | undefined;

  constructor(private readonly db: Kysely<Database>) {}

  // ---- events ----

  async insertEvents(rows: StoredEvent[]): Promise<void> {
    if (rows.length === 0) return;
    await this.db
      .insertInto('events')
      .values(
        rows.map((e) => ({
          id: e.id,
          at: e.at,
          kind: e.kind,
          severity: e.severity,
          project_id: e.projectId,
          sandbox_id: e.sandboxId,
          node: e.node,
          message: e.message,
          data: JSON.stringify(e.data),
        })),
      )
      .execute();
    await this.onEventsStored?.(rows.map((e) => e.id));
  }

  /** Stored events by id, in id order. */
  async eventsByIds(ids: string[]): Promise<StoredEvent[]> {
    if (ids.length === 0) return [];
    const rows = await this.db.selectFrom('events').selectAll().where('id', 'in', ids).orderBy('id').execute();
    return rows.map(toEvent);
  }

  async queryEvents(q: EventQuery): Promise<StoredEvent[]> {
    if (q.projectIds !== 'all' && q.projectIds.length === 0 && !q.includeUnscoped) return [];
    let query = this.db.selectFrom('events').selectAll();
    if (q.projectIds !== 'all') {
      const ids = q.projectIds;
      query = query.where((eb) => {
        const any = [];
        if (ids.length > 0) any.push(eb('project_id', 'in', ids));
        if (q.includeUnscoped) any.push(eb('project_id', 'is', null));
        return eb.or(any);
      });
    }
    if (q.kinds?.length) query = query.where('kind', 'in', q.kinds);
    if (q.severities?.length) query = query.where('severity', 'in', q.severities);
    if (q.sandboxId !== undefined) query = query.where('sandbox_id', '=', q.sandboxId);
    if (q.since !== undefined) query = query.where('at', '>=', q.since);
    if (q.cursor !== undefined) query = query.where('id', q.order === 'asc' ? '>' : '<', q.cursor);
    const rows = await query.orderBy('id', q.order).limit(q.limit).execute();
    return rows.map(toEvent);
  }

  async pruneEvents(maxRows: number, before: string): Promise<number> {
    return this.prune('events', maxRows, before);
  }

  // ---- audit ----

  async insertAudit(rows: AuditRecord[]): Promise<void> {
    if (rows.length === 0) return;
    await this.db
      .insertInto('audit')
      .values(
        rows.map((a) => ({
          id: a.id,
          at: a.at,
          key_id: a.keyId,
          project_id: a.projectId,
          method: a.method,
          route: a.route,
          sandbox_id: a.sandboxId,
          status: a.status,
          duration_ms: a.durationMs,
          command: a.command,
          exit_code: a.exitCode,
          count: a.count ?? 1,
        })),
      )
      .execute();
  }

  async queryAudit(q: AuditQuery): Promise<AuditRecord[]> {
    if (q.projectIds !== 'all' && q.projectIds.length === 0) return [];
    let query = this.db.selectFrom('audit').selectAll();
    if (q.projectIds !== 'all') query = query.where('project_id', 'in', q.projectIds);
    if (q.sandboxId !== undefined) query = query.where('sandbox_id', '=', q.sandboxId);
    if (q.keyId !== undefined) query = query.where('key_id', '=', q.keyId);
    if (q.since !== undefined) query = query.where('at', '>=', q.since);
    if (q.cursor !== undefined) query = query.where('id', q.order === 'asc' ? '>' : '<', q.cursor);
    const rows = await query.orderBy('id', q.order).limit(q.limit).execute();
    return rows.map(toAudit);
  }

  async pruneAudit(maxRows: number, before: string): Promise<number> {
    return this.prune('audit', maxRows, before);
  }

  /**
   * Deletes each project's audit entries beyond its newest `maxRowsPerProject` (calls without a
   * key count as one more project), so that a flood in one project never erases another's.
   */
  async pruneAuditPerProject(maxRowsPerProject: number): Promise<number> {
    const over = await this.db
      .selectFrom('audit')
      .select((eb) => ['project_id', eb.fn.countAll<number>().as('n')])
      .groupBy('project_id')
      .having((eb) => eb.fn.countAll(), '>', maxRowsPerProject)
      .execute();
    let deleted = 0;
    for (const { project_id: projectId } of over) {
      const edge = await this.db
        .selectFrom('audit')
        .select('id')
        .where((eb) => (projectId === null ? eb('project_id', 'is', null) : eb('project_id', '=', projectId)))
        .orderBy('id', 'desc')
        .offset(maxRowsPerProject)
        .limit(1)
        .executeTakeFirst();
      if (!edge) continue;
      for (;;) {
        const batch = await this.db
          .selectFrom('audit')
          .select('id')
          .where((eb) => (projectId === null ? eb('project_id', 'is', null) : eb('project_id', '=', projectId)))
          .where('id', '<=', edge.id)
          .orderBy('id')
          .limit(PRUNE_BATCH)
          .execute();
        if (batch.length === 0) break;
        const res = await this.db
          .deleteFrom('audit')
          .where(
            'id',
            'in',
            batch.map((r) => r.id),
          )
          .executeTakeFirst();
        deleted += Number(res.numDeletedRows);
        if (batch.length < PRUNE_BATCH) break;
      }
    }
    return deleted;
  }

  /** Deletes rows older than `before` and beyond the newest `maxRows`, in short batches. */
  private async prune(table: 'events' | 'audit', maxRows: number, before: string): Promise<number> {
    let deleted = 0;
    // Ids sort by time, so "beyond the newest maxRows" is "id at or below the (maxRows+1)th newest".
    const edge = await this.db.selectFrom(table).select('id').orderBy('id', 'desc').offset(maxRows).limit(1).executeTakeFirst();
    for (;;) {
      const batch = await this.db
        .selectFrom(table)
        .select('id')
        .where((eb) => (edge ? eb.or([eb('at', '<', before), eb('id', '<=', edge.id)]) : eb('at', '<', before)))
        .orderBy('id')
        .limit(PRUNE_BATCH)
        .execute();
      if (batch.length === 0) return deleted;
      const res = await this.db
        .deleteFrom(table)
        .where(
          'id',
          'in',
          batch.map((r) => r.id),
        )
        .executeTakeFirst();
      deleted += Number(res.numDeletedRows);
      if (batch.length < PRUNE_BATCH) return deleted;
    }
  }

  // ---- rules ----

  async rules(): Promise<RuleRecord[]> {
    const rows = await this.db.selectFrom('rules').selectAll().orderBy('id').execute();
    return rows.map((r) => this.toRule(r));
  }

  async insertRule(r: RuleRecord): Promise<void> {
    await this.db
      .insertInto('rules')
      .values({ id: r.id, project_id: r.projectId, kind: r.kind, spec: JSON.stringify(r.spec), created_by: r.createdBy, created_at: r.createdAt })
      .execute();
  }

  async rule(id: string): Promise<RuleRecord | undefined> {
    const row = await this.db.selectFrom('rules').selectAll().where('id', '=', id).executeTakeFirst();
    return row ? this.toRule(row) : undefined;
  }

  async deleteRule(id: string): Promise<void> {
    await this.db.deleteFrom('rules').where('id', '=', id).execute();
  }

  async ruleCount(): Promise<number> {
    const row = await this.db
      .selectFrom('rules')
      .select((eb) => eb.fn.countAll<number>().as('n'))
      .executeTakeFirstOrThrow();
    return Number(row.n);
  }

  private toRule(r: RuleTable): RuleRecord {
    return {
      id: r.id,
      projectId: r.project_id,
      kind: r.kind as RuleKind,
      spec: JSON.parse(r.spec) as CreateRuleRequest,
      createdBy: r.created_by,
      createdAt: r.created_at,
    };
  }

  // ---- metrics ----

  /** Sandboxes per lifecycle state. */
  async sandboxesByState(): Promise<Map<string, number>> {
    const rows = await this.db
      .selectFrom('sandboxes')
      .select(['state', (eb) => eb.fn.countAll<number>().as('n')])
      .groupBy('state')
      .execute();
    return new Map(rows.map((r) => [r.state, Number(r.n)]));
  }
}
