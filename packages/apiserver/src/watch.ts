// The watcher's side of the API: events (a page, or a live text/event-stream), the audit trail
// (a page, or an NDJSON export) and run-time rules, scoped by project like everything else.
import { randomBytes } from 'node:crypto';
import { DEFAULT_TENANT_LIMITS, DEFAULT_WATCH_PAGE_SIZE, DsecError, KeyedSerialQueue, invalidArgument, limitExceeded, withDeniedNames } from '@dsec/protocol';
import type { TenantLimits } from '@dsec/protocol';
import type { AuditEntry, CreateRuleRequest, RecordedEvent, EventKind, ListAuditQuery, ListEventsQuery, Rule, SandboxSpec } from '@dsec/protocol';
import { AuditLog, EventHub, MAX_RULES, RULE_APPLIES_TO, RuleSet, isSortableId, severitiesFrom, sortableId } from '@dsec/watcher';
import type { AuditQuery, AuditRecord, EventHubOptions, EventOwner, EventQuery, EventSandbox, RuleRecord, StoredEvent, Tightening } from '@dsec/watcher';
import { requireRole, roleAtLeast } from './auth.js';
import type { Principal } from './auth.js';
import { ROOT_PROJECT_ID } from './db/store.js';
import type { StateStore } from './db/store.js';
import { DEFAULT_AUDIT_RETENTION, DEFAULT_EVENT_RETENTION, WatchStore } from './db/watch-store.js';

/** Default interval of SSE heartbeats (comment lines that keep proxies from closing the stream). */
export const DEFAULT_HEARTBEAT_MS = 15_000;
/** Events a live subscriber may fall behind before it is cut off. */
export const DEFAULT_SUBSCRIBER_QUEUE = 1000;
/** Ids a live stream remembers having sent (to drop duplicates). */
const SENT_IDS_KEPT = 10_000;
/** Stored events replayed per step of a resumed stream. */
const REPLAY_PAGE = 500;

/** Channel on which replicas announce the events they stored. */
export const EVENTS_CHANNEL = 'dsec_events';
/** Channel on which replicas announce a change of the rules. */
export const RULES_CHANNEL = 'dsec_rules';
/** How long a project's ancestry read for events is reused (ms). */
const ANCESTRY_CACHE_MS = 5000;
/** Ancestries kept at most (the map is emptied past it). */
const ANCESTRIES_KEPT = 10_000;
/** Event ids per announcement (a notification holds at most 8000 bytes). */
const NOTIFY_IDS = 100;

/** What joining the other replicas needs: a LISTEN connection (PostgresListener). */
export interface ReplicaListener {
  listen(channel: string, handler: (payload: string) => void): Promise<void>;
}

function parseAnnouncement(payload: string): { origin: string; ids: string[] } | undefined {
  try {
    const v = JSON.parse(payload) as { origin?: unknown; ids?: unknown };
    if (typeof v.origin !== 'string' || !Array.isArray(v.ids) || !v.ids.every((i) => typeof i === 'string')) return undefined;
    return { origin: v.origin, ids: v.ids };
  } catch {
    return undefined;
  }
}

/** Retention of a table: newest `maxRows` rows, none older than `maxAgeMs`. */
export interface Retention {
  maxRows: number;
  maxAgeMs: number;
}

/** Options of {@link WatchService}. */
export interface WatchServiceOptions {
  heartbeatMs?: number;
  subscriberQueue?: number;
  eventRetention?: Retention;
  auditRetention?: Retention;
  events?: EventHubOptions;
  log?: (line: string) => void;
  /** Rules per tenant, the root project's headroom, audit entries per project. Default protocol's defaults. */
  limits?: Pick<TenantLimits, 'rulesPerTenant' | 'rootRuleHeadroom' | 'auditRowsPerProject'>;
  /** The projects of a tenant (Authenticator.tenantProjects). Default: the tenant alone. */
  tenantProjects?: (tenantId: string) => Promise<Set<string>>;
}

/** Events, audit and rules for the HTTP API and the platform. */
export class WatchService {
  readonly store: WatchStore;
  /** This replica's name in announcements (set by joinReplicas). */
  private origin: string | undefined;
  readonly rules: RuleSet;
  readonly events: EventHub;
  readonly audit: AuditLog;
  /** Rule additions run one at a time: the counts they check cannot be passed by concurrent ones. */
  private readonly ruleAdds = new KeyedSerialQueue();
  /** Projects' ancestries lately read, for the events' scoping and rules. */
  private readonly ancestries = new Map<string, { chain: string[]; at: number }>();

  constructor(
    private readonly state: StateStore,
    private readonly o: WatchServiceOptions = {},
  ) {
    this.store = new WatchStore(state.db);
    this.rules = new RuleSet(ROOT_PROJECT_ID);
    this.events = new EventHub(this.store, (id, owner) => this.lookup(id, owner), this.rules, { ...(o.log ? { log: o.log } : {}), ...o.events });
    this.audit = new AuditLog(this.store, o.log ? { log: o.log } : {});
  }

  /** Loads the rules from the store. */
  async init(): Promise<void> {
    this.rules.replace(await this.store.rules());
  }

  /**
   * Joins the other replicas of a shared store: the ids of events stored here are announced on
   * {@link EVENTS_CHANNEL} and events the others stored are offered to this replica's live
   * streams; a rule created or deleted anywhere reloads the rules everywhere.
   */
  async joinReplicas(listener: ReplicaListener): Promise<void> {
    const origin = randomBytes(8).toString('hex');
    this.origin = origin;
    this.store.onEventsStored = async (ids) => {
      // A notification carries at most 8000 bytes: ids go in chunks.
      for (let i = 0; i < ids.length; i += NOTIFY_IDS) {
        await this.state.notify(EVENTS_CHANNEL, JSON.stringify({ origin, ids: ids.slice(i, i + NOTIFY_IDS) })).catch(() => undefined);
      }
    };
    await listener.listen(EVENTS_CHANNEL, (payload) => {
      const msg = parseAnnouncement(payload);
      if (!msg || msg.origin === origin) return;
      void this.store
        .eventsByIds(msg.ids)
        .then((events) => this.events.offerStored(events))
        .catch((err: unknown) => this.o.log?.(`dsec: reading events another replica stored: ${(err as Error).message}`));
    });
    await listener.listen(RULES_CHANNEL, (payload) => {
      if (payload === origin) return;
      void this.store
        .rules()
        .then((rules) => this.rules.replace(rules))
        .catch((err: unknown) => this.o.log?.(`dsec: reloading rules: ${(err as Error).message}`));
    });
  }

  /** Tells the other replicas that the rules changed. */
  private async rulesChanged(): Promise<void> {
    if (this.origin) await this.state.notify(RULES_CHANNEL, this.origin).catch(() => undefined);
  }

  /** Writes what is buffered and ends live streams. */
  async close(): Promise<void> {
    await this.events.close();
    await this.audit.close();
  }

  /** Housekeeping for the watcher's passes: rules from the store, retention. */
  async maintain(): Promise<void> {
    this.rules.replace(await this.store.rules());
    const now = Date.now();
    const ev = this.o.eventRetention ?? DEFAULT_EVENT_RETENTION;
    const au = this.o.auditRetention ?? DEFAULT_AUDIT_RETENTION;
    await this.events.flush();
    await this.store.pruneEvents(ev.maxRows, new Date(now - ev.maxAgeMs).toISOString());
    await this.audit.flush();
    await this.store.pruneAuditPerProject((this.o.limits ?? DEFAULT_TENANT_LIMITS).auditRowsPerProject);
    await this.store.pruneAudit(au.maxRows, new Date(now - au.maxAgeMs).toISOString());
  }

  private async lookup(id: string, owner?: EventOwner): Promise<EventSandbox | undefined> {
    // The control plane says whose a sandbox is when it raises about it (its row may be gone):
    // no read of the row then.
    let known = owner;
    if (!known) {
      const row = await this.state.sandbox(id);
      if (!row) return undefined;
      known = { projectId: row.project_id, labels: row.labels };
    }
    return { projectId: known.projectId, ancestry: await this.ancestry(known.projectId), labels: known.labels };
  }

  /** A project's ancestry (a project never changes its parent), kept a little while: events come in bursts. */
  private async ancestry(projectId: string): Promise<string[]> {
    const now = Date.now();
    const hit = this.ancestries.get(projectId);
    if (hit && now - hit.at < ANCESTRY_CACHE_MS) return hit.chain;
    const chain = await this.state.ancestry(projectId);
    if (this.ancestries.size >= ANCESTRIES_KEPT) this.ancestries.clear();
    this.ancestries.set(projectId, { chain, at: now });
    return chain;
  }

  // ---- tightening of new sandboxes ----

  /** The spec of a new sandbox of `projectId` with the run-time rules that apply merged in. */
  async tighten(projectId: string, spec: SandboxSpec): Promise<SandboxSpec> {
    if (this.rules.size === 0) return spec;
    const t: Tightening = this.rules.tightening(await this.state.ancestry(projectId));
    let out = spec;
    if (t.readOnlyPaths.length > 0 || t.denySyscalls.length > 0) {
      const protect = { ...spec.protect };
      if (t.readOnlyPaths.length > 0) protect.readOnly = union(spec.protect?.readOnly, t.readOnlyPaths);
      if (t.denySyscalls.length > 0) protect.denySyscalls = union(spec.protect?.denySyscalls, t.denySyscalls);
      out = { ...spec, protect };
    }
    if (t.denyDomains.length > 0 && out.network) out = { ...out, network: withDeniedNames(out.network, t.denyDomains) };
    return out;
  }

  /** Names that deny-domain rules refuse to sandboxes of `projectId` (kept through policy changes). */
  async deniedNames(projectId: string): Promise<string[]> {
    if (this.rules.size === 0) return [];
    return this.rules.tightening(await this.state.ancestry(projectId)).denyDomains;
  }

  // ---- events ----

  /** Who may see which events: the root project sees all (node-level ones too). */
  private eventScope(p: Principal): Pick<EventQuery, 'projectIds' | 'includeUnscoped'> {
    return p.projectId === ROOT_PROJECT_ID ? { projectIds: 'all', includeUnscoped: true } : { projectIds: [...p.visibleProjects], includeUnscoped: false };
  }

  private eventQuery(p: Principal, q: ListEventsQuery): EventQuery {
    const out: EventQuery = { ...this.eventScope(p), order: q.order ?? 'desc', limit: q.limit ?? DEFAULT_WATCH_PAGE_SIZE };
    if (q.kind) out.kinds = q.kind.split(',') as EventKind[];
    if (q.severity) out.severities = severitiesFrom(q.severity);
    if (q.sandbox) out.sandboxId = q.sandbox;
    if (q.since) out.since = new Date(q.since).toISOString();
    if (q.cursor) out.cursor = decodeCursor('ev', q.cursor, 'query.cursor');
    return out;
  }

  /** A page of events, newest first unless `order=asc`. */
  async listEvents(p: Principal, query: ListEventsQuery): Promise<{ items: RecordedEvent[]; nextCursor: string | null }> {
    requireRole(p, 'viewer');
    const q = this.eventQuery(p, query);
    const rows = await this.events.query({ ...q, limit: q.limit + 1 });
    const page = rows.slice(0, q.limit);
    const last = page[page.length - 1];
    return { items: page.map(toEventBody), nextCursor: rows.length > q.limit && last ? encodeCursor(last.id) : null };
  }

  /**
   * A live `text/event-stream` of the events the query selects. With `lastEventId` (the
   * `Last-Event-ID` header) or `since`, stored events are replayed first. A subscriber that
   * falls more than its queue behind gets a final `dropped` event and the stream ends; it can
   * reconnect with the last id it saw.
   */
  streamEvents(p: Principal, query: ListEventsQuery, lastEventId: string | undefined, signal?: AbortSignal): Response {
    requireRole(p, 'viewer');
    const q = this.eventQuery(p, query);
    let after: string | undefined;
    if (lastEventId !== undefined && lastEventId !== '') {
      if (!isSortableId('ev', lastEventId)) throw invalidArgument('Last-Event-ID', 'not an event id from this API');
      after = lastEventId;
    }
    const replay = after !== undefined || q.since !== undefined;
    const visible = eventFilter(q);
    const heartbeatMs = this.o.heartbeatMs ?? DEFAULT_HEARTBEAT_MS;
    const encoder = new TextEncoder();
    const hub = this.events;
    const maxQueued = this.o.subscriberQueue ?? DEFAULT_SUBSCRIBER_QUEUE;
    let sub: ReturnType<EventHub['subscribe']> | undefined;
    let lastSent = after;
    let replaying = replay;
    let ended = false;
    const end = (): void => {
      ended = true;
      sub?.close();
    };
    signal?.addEventListener('abort', end, { once: true });

    // Ids sent lately: the replay's tail and the live subscription overlap, and an event another
    // replica stored can arrive after a newer one of this replica (its id sorts before the last
    // sent), so duplicates are found by id, not by order.
    const sent = new Set<string>();
    const frame = (e: StoredEvent): Uint8Array => {
      sent.add(e.id);
      if (sent.size > SENT_IDS_KEPT) for (const id of [...sent].slice(0, SENT_IDS_KEPT / 2)) sent.delete(id);
      return encoder.encode(`id: ${e.id}\ndata: ${JSON.stringify(toEventBody(e))}\n\n`);
    };
    const stored = async (cursorId: string | undefined, limit: number): Promise<StoredEvent[]> => {
      const base: EventQuery = { ...q, order: 'asc', limit };
      if (cursorId !== undefined) return hub.query({ ...base, cursor: cursorId });
      return hub.query(base);
    };

    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        controller.enqueue(encoder.encode(`retry: 2000\n: dsec events\n\n`));
        if (!replay) sub = hub.subscribe(visible, maxQueued);
      },
      async pull(controller) {
        if (ended) {
          controller.close();
          return;
        }
        if (replaying) {
          // Stored events page by page, as the client reads them; the live subscription starts
          // when the replay has caught up, and stored events are read once more after it so
          // that nothing raised in between is missed.
          const rows = await stored(lastSent, REPLAY_PAGE);
          for (const e of rows) controller.enqueue(frame(e));
          if (rows.length > 0) lastSent = rows[rows.length - 1]!.id;
          if (rows.length < REPLAY_PAGE) {
            replaying = false;
            sub = hub.subscribe(visible, maxQueued);
            const tail = await stored(lastSent, maxQueued);
            for (const e of tail) controller.enqueue(frame(e));
            if (tail.length > 0) lastSent = tail[tail.length - 1]!.id;
          }
          return;
        }
        const s = sub!;
        for (;;) {
          const batch = s.take().filter((e) => !sent.has(e.id));
          if (batch.length > 0) {
            for (const e of batch) {
              controller.enqueue(frame(e));
              if (lastSent === undefined || e.id > lastSent) lastSent = e.id;
            }
            return;
          }
          if (s.overflowed) {
            const note = { reason: 'the client fell too far behind', resumeWith: lastSent ?? null };
            controller.enqueue(encoder.encode(`event: dropped\ndata: ${JSON.stringify(note)}\n\n`));
            controller.close();
            return;
          }
          if (ended || s.closed) {
            controller.close();
            return;
          }
          let timer: NodeJS.Timeout | undefined;
          const beat = await Promise.race([
            s.wait().then(() => false),
            new Promise<boolean>((r) => {
              timer = setTimeout(() => r(true), heartbeatMs);
            }),
          ]);
          clearTimeout(timer);
          if (beat) {
            controller.enqueue(encoder.encode(`: heartbeat ${new Date().toISOString()}\n\n`));
            return;
          }
        }
      },
      cancel() {
        end();
      },
    });
    return new Response(body, {
      status: 200,
      headers: { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'x-accel-buffering': 'no' },
    });
  }

  // ---- audit ----

  /** Admins see their projects' calls (the root's admins: every call); others their project's. */
  private auditScope(p: Principal): AuditQuery['projectIds'] {
    if (!roleAtLeast(p.role, 'admin')) return [p.projectId];
    return p.projectId === ROOT_PROJECT_ID ? 'all' : [...p.visibleProjects];
  }

  private auditQuery(p: Principal, q: ListAuditQuery): AuditQuery {
    const out: AuditQuery = { projectIds: this.auditScope(p), order: q.order ?? 'desc', limit: q.limit ?? DEFAULT_WATCH_PAGE_SIZE };
    if (q.since) out.since = new Date(q.since).toISOString();
    if (q.sandbox) out.sandboxId = q.sandbox;
    if (q.key) out.keyId = q.key;
    if (q.cursor) out.cursor = decodeCursor('au', q.cursor, 'query.cursor');
    return out;
  }

  /** A page of audit entries, newest first unless `order=asc`. */
  async listAudit(p: Principal, query: ListAuditQuery): Promise<{ items: AuditEntry[]; nextCursor: string | null }> {
    requireRole(p, 'viewer');
    const q = this.auditQuery(p, query);
    const rows = await this.audit.query({ ...q, limit: q.limit + 1 });
    const page = rows.slice(0, q.limit);
    const last = page[page.length - 1];
    return { items: page.map(toAuditBody), nextCursor: rows.length > q.limit && last ? encodeCursor(last.id) : null };
  }

  /** Every audit entry the query selects as NDJSON, oldest first, read from the store in pages as the client reads. */
  exportAudit(p: Principal, query: ListAuditQuery): Response {
    requireRole(p, 'viewer');
    const q = { ...this.auditQuery(p, query), order: 'asc' as const, limit: 1000 };
    const audit = this.audit;
    const encoder = new TextEncoder();
    let cursor = q.cursor;
    const body = new ReadableStream<Uint8Array>({
      async pull(controller) {
        const rows = await audit.query({ ...q, ...(cursor !== undefined ? { cursor } : {}) });
        if (rows.length > 0) {
          controller.enqueue(encoder.encode(rows.map((r) => JSON.stringify(toAuditBody(r)) + '\n').join('')));
          cursor = rows[rows.length - 1]!.id;
        }
        if (rows.length < q.limit) controller.close();
      },
    });
    return new Response(body, { status: 200, headers: { 'content-type': 'application/x-ndjson' } });
  }

  // ---- rules ----

  /** Adds a rule in the caller's project; it applies there and in the projects below. */
  async createRule(p: Principal, spec: CreateRuleRequest): Promise<Rule> {
    requireRole(p, 'admin');
    if (spec.kind === 'event' && spec.suppress && p.projectId !== ROOT_PROJECT_ID) {
      throw new DsecError('PERMISSION_DENIED', "suppress: only the root project's admins may drop events", { field: 'suppress' });
    }
    return this.ruleAdds.run('rules', async () => {
      if ((await this.store.ruleCount()) >= MAX_RULES) throw new DsecError('CONFLICT', `at most ${MAX_RULES} rules; delete one first`);
      if (p.tenantId !== ROOT_PROJECT_ID) await this.checkTenantRules(p.tenantId);
      const rule: RuleRecord = { id: sortableId('rl'), projectId: p.projectId, kind: spec.kind, spec, createdBy: p.keyId, createdAt: new Date().toISOString() };
      await this.store.insertRule(rule);
      this.rules.add(rule);
      await this.rulesChanged();
      return toRuleBody(rule);
    });
  }

  /**
   * A tenant's rules stay within its limit, and all tenants' together leave the root project's
   * headroom free (an operator can always add an emergency rule).
   */
  private async checkTenantRules(tenantId: string): Promise<void> {
    const limits = this.o.limits ?? DEFAULT_TENANT_LIMITS;
    const mine = (await this.o.tenantProjects?.(tenantId)) ?? new Set([tenantId]);
    const all = await this.store.rules();
    const max = limits.rulesPerTenant;
    if (all.filter((r) => mine.has(r.projectId)).length >= max)
      throw limitExceeded('rulesPerTenant', max, `tenant ${tenantId} has ${max} rules; delete one first`);
    const tenants = all.filter((r) => r.projectId !== ROOT_PROJECT_ID).length;
    const room = MAX_RULES - limits.rootRuleHeadroom;
    if (tenants >= room) {
      throw limitExceeded(
        'rootRuleHeadroom',
        limits.rootRuleHeadroom,
        `the tenants have ${tenants} rules; the last ${limits.rootRuleHeadroom} of ${MAX_RULES} are kept for the root project`,
      );
    }
  }

  /** Rules that apply to the caller's project (set above it) or that it set (in it or below). */
  async listRules(p: Principal): Promise<Rule[]> {
    requireRole(p, 'viewer');
    const above = new Set(await this.state.ancestry(p.projectId));
    return (await this.store.rules()).filter((r) => above.has(r.projectId) || p.visibleProjects.has(r.projectId)).map(toRuleBody);
  }

  /** Deletes a rule of the caller's project or one below it; new sandboxes no longer get it. */
  async deleteRule(p: Principal, id: string): Promise<void> {
    requireRole(p, 'admin');
    const rule = typeof id === 'string' && id.length <= 64 ? await this.store.rule(id) : undefined;
    if (!rule || !p.visibleProjects.has(rule.projectId)) throw new DsecError('NOT_FOUND', `rule ${id} not found`);
    await this.store.deleteRule(id);
    this.rules.remove(id);
    await this.rulesChanged();
  }
}

function union(a: string[] | undefined, b: string[]): string[] {
  return [...new Set([...(a ?? []), ...b])];
}

function encodeCursor(id: string): string {
  return Buffer.from(id).toString('base64url');
}

function decodeCursor(prefix: string, cursor: string, field: string): string {
  const id = Buffer.from(cursor, 'base64url').toString('utf8');
  if (!isSortableId(prefix, id)) throw invalidArgument(field, 'not a cursor from this API');
  return id;
}

/** The filter of a live stream: the same conditions as the stored query. */
function eventFilter(q: EventQuery): (e: StoredEvent) => boolean {
  const projects = q.projectIds === 'all' ? undefined : new Set(q.projectIds);
  const kinds = q.kinds ? new Set<string>(q.kinds) : undefined;
  const severities = q.severities ? new Set<string>(q.severities) : undefined;
  return (e) =>
    (projects === undefined || (e.projectId === null ? q.includeUnscoped : projects.has(e.projectId))) &&
    (kinds === undefined || kinds.has(e.kind)) &&
    (severities === undefined || severities.has(e.severity)) &&
    (q.sandboxId === undefined || e.sandboxId === q.sandboxId) &&
    (q.since === undefined || e.at >= q.since);
}

function toEventBody(e: StoredEvent): RecordedEvent {
  return { id: e.id, at: e.at, kind: e.kind, severity: e.severity, project: e.projectId, sandbox: e.sandboxId, node: e.node, message: e.message, data: e.data };
}

function toAuditBody(a: AuditRecord): AuditEntry {
  return {
    id: a.id,
    at: a.at,
    key: a.keyId,
    project: a.projectId,
    method: a.method,
    route: a.route,
    sandbox: a.sandboxId,
    status: a.status,
    durationMs: a.durationMs,
    command: a.command,
    exitCode: a.exitCode,
    ...(a.count !== undefined && a.count > 1 ? { count: a.count } : {}),
  };
}

function toRuleBody(r: RuleRecord): Rule {
  const { kind: _kind, ...spec } = r.spec;
  return { id: r.id, kind: r.kind, project: r.projectId, createdBy: r.createdBy, createdAt: r.createdAt, spec, appliesTo: RULE_APPLIES_TO[r.kind] };
}
