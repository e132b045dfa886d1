// The event pipeline: what edge, the egress proxy and the control plane raise comes in through
// `ingest` (an EventSink: never throws, never blocks), gets its sandbox's project, passes the
// rules (severity, suppression) and a per-sandbox-and-kind rate limit, is counted, written to
// the store in batches, and handed to live subscribers (the SSE stream of GET /v1/events).
import type { EventKind, EventSeverity, RaisedEvent } from '@dsec/protocol';
import { sortableId } from './ids.js';
import type { RuleSet } from './rules.js';

/** An event as stored and served. */
export interface StoredEvent {
  id: string;
  at: string;
  kind: EventKind;
  severity: EventSeverity;
  projectId: string | null;
  sandboxId: string | null;
  node: string | null;
  message: string;
  data: Record<string, unknown>;
}

/** A query of stored events; all conditions hold. */
export interface EventQuery {
  /** Projects whose sandboxes' events are visible; `all` for every project. */
  projectIds: string[] | 'all';
  /** Also events with no project (node-level). */
  includeUnscoped: boolean;
  kinds?: EventKind[];
  /** Severities to include. */
  severities?: EventSeverity[];
  sandboxId?: string;
  /** ISO time: only events at or after it. */
  since?: string;
  /** Only ids after (asc) or before (desc) this one. */
  cursor?: string;
  order: 'asc' | 'desc';
  limit: number;
}

/** What the pipeline needs of the state store. */
export interface EventStore {
  insertEvents(rows: StoredEvent[]): Promise<void>;
  queryEvents(q: EventQuery): Promise<StoredEvent[]>;
  /** Deletes events beyond the newest `maxRows` and those older than `before`; returns how many. */
  pruneEvents(maxRows: number, before: string): Promise<number>;
}

/** A sandbox as the pipeline sees it. */
export interface EventSandbox {
  projectId: string;
  /** The project and its ancestors, nearest first. */
  ancestry: string[];
  labels: Record<string, string>;
}

/**
 * Whose sandbox an event is about, as its trusted raiser (the control plane) knows it: the
 * project and labels of a row that may be gone by the time the event is stored (a deletion).
 */
export interface EventOwner {
  projectId: string;
  labels: Record<string, string>;
}

/**
 * Looks a sandbox up (undefined when unknown). `owner`, when the raiser gave one, stands for a
 * row already gone.
 */
export type SandboxLookup = (sandboxId: string, owner?: EventOwner) => Promise<EventSandbox | undefined>;

/** Options of {@link EventHub}. */
export interface EventHubOptions {
  /** Events of one sandbox (or node) and kind stored per window; the rest are counted. Default 10. */
  maxPerWindow?: number;
  /** The rate-limit window. Default 10 s. */
  windowMs?: number;
  /** Interval of batched writes. Default 200 ms. */
  flushIntervalMs?: number;
  log?: (line: string) => void;
}

/** Default rate limit: events of one sandbox and kind per window. */
export const DEFAULT_EVENTS_PER_WINDOW = 10;
/** Default rate-limit window. */
export const DEFAULT_EVENT_WINDOW_MS = 10_000;
/** Default interval of batched event writes. */
export const DEFAULT_EVENT_FLUSH_MS = 200;
/** Events waiting for their sandbox's lookup; more are dropped (and counted). */
export const MAX_PENDING_EVENTS = 10_000;
/** Events written in one insert. */
const WRITE_BATCH = 500;
/** Sandboxes whose project and labels are cached. */
const LOOKUP_CACHE = 10_000;
/** Longest message and serialized data kept per event. */
const MAX_MESSAGE_CHARS = 1024;
const MAX_DATA_CHARS = 8192;

const SEVERITIES: readonly EventSeverity[] = ['info', 'warning', 'critical'];

/** Kinds that are a refusal of something a sandbox tried (counted as denials in metrics). */
export const DENIAL_KINDS: ReadonlySet<EventKind> = new Set<EventKind>([
  'protected-path.write',
  'seccomp.denied',
  'pids.limit-hit',
  'egress.denied',
  'egress.port-scan',
  'control.forged-message',
]);

/** A live subscriber: a bounded queue the SSE stream drains. */
export interface EventSubscription {
  /** Takes the queued events. */
  take(): StoredEvent[];
  /** Resolves when events are queued or the subscription ends. */
  wait(): Promise<void>;
  /** True once the subscriber fell more than its queue behind (it gets no more events). */
  readonly overflowed: boolean;
  /** True once closed (by its reader, or by the hub shutting down). */
  readonly closed: boolean;
  close(): void;
}

interface Window {
  start: number;
  stored: number;
  suppressed: number;
  last?: StoredEvent;
}

class Subscriber implements EventSubscription {
  private queue: StoredEvent[] = [];
  private waiter: (() => void) | undefined;
  overflowed = false;
  closed = false;

  constructor(
    readonly filter: (e: StoredEvent) => boolean,
    private readonly maxQueued: number,
    private readonly onClose: (s: Subscriber) => void,
  ) {}

  offer(e: StoredEvent): void {
    if (this.closed || this.overflowed || !this.filter(e)) return;
    if (this.queue.length >= this.maxQueued) {
      // A consumer this far behind is cut off rather than buffered without bound.
      this.overflowed = true;
      this.queue = [];
      this.onClose(this);
    } else this.queue.push(e);
    this.wake();
  }

  take(): StoredEvent[] {
    const q = this.queue;
    this.queue = [];
    return q;
  }

  wait(): Promise<void> {
    if (this.queue.length > 0 || this.closed || this.overflowed) return Promise.resolve();
    return new Promise((r) => (this.waiter = r));
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.onClose(this);
    this.wake();
  }

  private wake(): void {
    const w = this.waiter;
    this.waiter = undefined;
    w?.();
  }
}

/** The event pipeline. */
export class EventHub {
  /** Events stored, by `kind|severity`. */
  readonly counts = new Map<string, number>();
  /** Events dropped by suppress rules, by kind. */
  readonly suppressedByRule = new Map<string, number>();
  /** Events folded into a rate-limit summary. */
  rateLimited = 0;
  /** Events lost to a full intake queue or a failed write. */
  dropped = 0;

  private readonly pending: Array<RaisedEvent & { owner?: EventOwner }> = [];
  private draining: Promise<void> | undefined;
  /** Events taken in and events processed so far (a flush waits for those taken in before it). */
  private taken = 0;
  private processed = 0;
  private readonly processedWaiters: Array<{ upTo: number; resolve: () => void }> = [];
  private writeBuffer: StoredEvent[] = [];
  private writing: Promise<void> | undefined;
  private readonly subscribers = new Set<Subscriber>();
  private readonly windows = new Map<string, Window>();
  private readonly cache = new Map<string, EventSandbox | null>();
  private readonly timer: NodeJS.Timeout;
  private closed = false;

  constructor(
    private readonly store: EventStore,
    private readonly lookup: SandboxLookup,
    private readonly rules: RuleSet,
    private readonly o: EventHubOptions = {},
  ) {
    this.timer = setInterval(() => this.tick(), o.flushIntervalMs ?? DEFAULT_EVENT_FLUSH_MS);
    this.timer.unref();
  }

  /**
   * Takes an event in (an EventSink: never throws, never waits). `owner`: the sandbox's project
   * and labels, from a trusted raiser only (the control plane), for a row that may be gone.
   */
  readonly ingest = (ev: RaisedEvent, owner?: EventOwner): void => {
    if (this.closed) return;
    if (this.pending.length >= MAX_PENDING_EVENTS) {
      this.dropped++;
      return;
    }
    // Times are stored as ISO-8601 UTC so that they compare as text.
    const at = ev.at !== undefined && !Number.isNaN(Date.parse(ev.at)) ? new Date(ev.at).toISOString() : new Date().toISOString();
    this.pending.push(owner ? { ...ev, at, owner } : { ...ev, at });
    this.taken++;
    this.draining ??= this.drain().finally(() => (this.draining = undefined));
  };

  /** Remembers a sandbox's project and labels (the control plane calls this as it creates one). */
  remember(sandboxId: string, sandbox: EventSandbox): void {
    this.cacheSet(sandboxId, sandbox);
  }

  /** Subscribes to events as they are stored. */
  subscribe(filter: (e: StoredEvent) => boolean, maxQueued = 1000): EventSubscription {
    const s = new Subscriber(filter, maxQueued, (x) => this.subscribers.delete(x));
    this.subscribers.add(s);
    return s;
  }

  /**
   * Offers events that another process stored (a replica on the same store) to the live
   * subscribers, as if raised here; they are not stored or counted again.
   */
  offerStored(events: readonly StoredEvent[]): void {
    if (this.closed) return;
    for (const e of events) for (const s of this.subscribers) s.offer(e);
  }

  /** Ends every live subscription (their streams end; done before the HTTP server closes). */
  endSubscriptions(): void {
    for (const s of [...this.subscribers]) s.close();
  }

  /** Live subscribers now. */
  get subscriberCount(): number {
    return this.subscribers.size;
  }

  /** Waits until every event taken in so far is stored (not those that arrive meanwhile). */
  async flush(): Promise<void> {
    const upTo = this.taken;
    if (this.processed < upTo) await new Promise<void>((resolve) => this.processedWaiters.push({ upTo, resolve }));
    await this.write();
  }

  /** Stored events (after a flush, so a reader sees what was raised before it asked). */
  async query(q: EventQuery): Promise<StoredEvent[]> {
    await this.flush();
    return this.store.queryEvents(q);
  }

  /** Stops the timers, writes what is buffered and ends every subscription. */
  async close(): Promise<void> {
    this.closed = true;
    clearInterval(this.timer);
    this.emitWindowSummaries(true);
    await this.flush();
    this.endSubscriptions();
  }

  private async drain(): Promise<void> {
    for (let ev = this.pending.shift(); ev; ev = this.pending.shift()) {
      try {
        await this.process(ev);
      } catch (err) {
        this.dropped++;
        this.o.log?.(`watcher: event ${ev.kind} dropped: ${(err as Error).message}`);
      }
      this.processed++;
      for (let i = this.processedWaiters.length - 1; i >= 0; i--) {
        const w = this.processedWaiters[i]!;
        if (w.upTo <= this.processed) {
          this.processedWaiters.splice(i, 1);
          w.resolve();
        }
      }
    }
  }

  private async process({ owner, ...ev }: RaisedEvent & { owner?: EventOwner }): Promise<void> {
    const sb = ev.sandboxId ? await this.sandbox(ev.sandboxId, owner) : undefined;
    const verdict = this.rules.judge({ kind: ev.kind, sandboxId: ev.sandboxId ?? null, ancestry: sb?.ancestry ?? [], labels: sb?.labels ?? {} }, ev.severity);
    if (verdict.suppress) {
      this.suppressedByRule.set(ev.kind, (this.suppressedByRule.get(ev.kind) ?? 0) + 1);
      return;
    }
    const data = boundedData(ev.data);
    if (verdict.ruleId) data.rule = verdict.ruleId;
    const stored: StoredEvent = {
      id: '',
      at: ev.at ?? new Date().toISOString(),
      kind: ev.kind,
      severity: verdict.severity,
      projectId: sb?.projectId ?? null,
      sandboxId: ev.sandboxId ?? null,
      node: ev.node ?? null,
      message: ev.message.slice(0, MAX_MESSAGE_CHARS),
      data,
    };
    // Rate limit per sandbox (or node) and kind: a fork bomb or a port scan is a handful of
    // events and a count, not thousands of rows.
    const key = `${stored.sandboxId ?? `node:${stored.node ?? ''}`}|${stored.kind}`;
    const now = Date.now();
    let w = this.windows.get(key);
    if (!w || now - w.start >= (this.o.windowMs ?? DEFAULT_EVENT_WINDOW_MS)) {
      if (w) this.summarize(w);
      w = { start: now, stored: 0, suppressed: 0 };
      this.windows.set(key, w);
    }
    if (w.stored >= (this.o.maxPerWindow ?? DEFAULT_EVENTS_PER_WINDOW)) {
      w.suppressed++;
      w.last = stored;
      this.rateLimited++;
      return;
    }
    w.stored++;
    this.emit(stored);
  }

  /** Assigns the id, counts, buffers for the store and offers to subscribers. */
  private emit(e: StoredEvent): void {
    e.id = sortableId('ev');
    const key = `${e.kind}|${e.severity}`;
    this.counts.set(key, (this.counts.get(key) ?? 0) + 1);
    this.writeBuffer.push(e);
    if (this.writeBuffer.length >= WRITE_BATCH) void this.write();
    for (const s of this.subscribers) s.offer(e);
  }

  /** One event that stands for those the rate limit held back in a window. */
  private summarize(w: Window): void {
    if (w.suppressed === 0 || !w.last) return;
    const last = w.last;
    this.emit({
      ...last,
      at: new Date().toISOString(),
      message: `${w.suppressed} more ${last.kind} event${w.suppressed === 1 ? '' : 's'} like this were rate-limited; the last: ${last.message}`.slice(
        0,
        MAX_MESSAGE_CHARS,
      ),
      data: { ...last.data, rateLimited: w.suppressed },
    });
    w.suppressed = 0;
    delete w.last;
  }

  /** Summarizes and ends windows that are over (all of them when closing). */
  private emitWindowSummaries(all: boolean): void {
    const now = Date.now();
    const windowMs = this.o.windowMs ?? DEFAULT_EVENT_WINDOW_MS;
    for (const [key, w] of this.windows) {
      if (!all && now - w.start < windowMs) continue;
      this.summarize(w);
      this.windows.delete(key);
    }
  }

  private tick(): void {
    this.emitWindowSummaries(false);
    void this.write();
  }

  /** Writes the buffer in batches, one write at a time. */
  private async write(): Promise<void> {
    while (this.writing) await this.writing;
    if (this.writeBuffer.length === 0) return;
    const rows = this.writeBuffer;
    this.writeBuffer = [];
    this.writing = (async () => {
      for (let i = 0; i < rows.length; i += WRITE_BATCH) {
        const batch = rows.slice(i, i + WRITE_BATCH);
        try {
          await this.store.insertEvents(batch);
        } catch (err) {
          this.dropped += batch.length;
          this.o.log?.(`watcher: storing ${batch.length} events failed: ${(err as Error).message}`);
        }
      }
    })().finally(() => (this.writing = undefined));
    await this.writing;
  }

  private async sandbox(id: string, owner?: EventOwner): Promise<EventSandbox | undefined> {
    const cached = this.cache.get(id);
    if (cached || (this.cache.has(id) && !owner)) return cached ?? undefined;
    const sb = await this.lookup(id, owner).catch(() => undefined);
    // An unknown id is cached as such: ids are never reused, and a sandbox's record is written
    // before the sandbox exists, so an id unknown now stays unknown (an orphan's).
    this.cacheSet(id, sb ?? null);
    return sb;
  }

  private cacheSet(id: string, sb: EventSandbox | null): void {
    this.cache.delete(id);
    if (this.cache.size >= LOOKUP_CACHE) this.cache.delete(this.cache.keys().next().value as string);
    this.cache.set(id, sb);
  }
}

/** Severities at or above `min`. */
export function severitiesFrom(min: EventSeverity): EventSeverity[] {
  return SEVERITIES.slice(SEVERITIES.indexOf(min));
}

function boundedData(data: Record<string, unknown> | undefined): Record<string, unknown> {
  if (!data) return {};
  let text: string;
  try {
    text = JSON.stringify(data);
  } catch {
    return { unserializable: true };
  }
  if (text.length <= MAX_DATA_CHARS) return JSON.parse(text) as Record<string, unknown>;
  return { truncated: true, excerpt: text.slice(0, MAX_DATA_CHARS / 2) };
}
