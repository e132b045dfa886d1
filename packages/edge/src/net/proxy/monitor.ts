// What the egress proxy records: a bounded log of every connection attempt (sandbox, destination,
// address, rule, verdict, bytes), per-sandbox counters, and watcher events for denials and for
// port-scan-like bursts of them.
import type { EventSink } from '@dsec/protocol';

/** Entries kept in the in-memory connection log. */
export const DEFAULT_LOG_ENTRIES = 10_000;
/** Window in which denied destinations are counted for port-scan detection. */
export const DEFAULT_SCAN_WINDOW_MS = 10_000;
/** Distinct denied destinations (host:port) within the window that make a port scan. */
export const DEFAULT_SCAN_THRESHOLD = 10;
/** After a port-scan event, the same sandbox raises the next one no sooner than this. */
export const DEFAULT_SCAN_COOLDOWN_MS = 60_000;
/** `egress.denied` events per sandbox per window; the rest are counted into the next one. */
export const DEFAULT_DENIED_EVENTS_PER_WINDOW = 10;

/** Distinct denied destinations remembered per sandbox (bounds memory under a scan). */
const MAX_TRACKED_DENIALS = 1_000;

/** How a connection reached the proxy. */
export type EgressVia = 'forward' | 'connect' | 'transparent-http' | 'transparent-tls' | 'mirror';

/** Why a connection was refused or closed (stable strings). */
export type EgressReason =
  | 'unknown-source'
  | 'policy'
  | 'ip-literal'
  | 'restricted-address'
  | 'unresolvable'
  | 'connection-limit'
  | 'no-sni'
  | 'bad-request'
  | 'mirror-requires-http'
  | 'mirror-not-configured'
  | 'mirror-hidden'
  | 'policy-changed';

/** One connection attempt (a CONNECT, a TLS connection, or one forwarded HTTP request). */
export interface EgressRecord {
  /** Sequence number, unique per proxy. */
  seq: number;
  /** ISO time of the decision. */
  at: string;
  sandboxId?: string;
  /** The client's source address. */
  source: string;
  via: EgressVia;
  host: string;
  port: number;
  /** The address dialled (after resolution and checks). */
  address?: string;
  /** The policy rule that matched. */
  rule?: string;
  verdict: 'allow' | 'deny';
  reason?: EgressReason;
  /** Detail for humans (upstream error, parse error). */
  detail?: string;
  /** Bytes received by the sandbox / sent by it, updated until the connection closes. */
  bytesIn: number;
  bytesOut: number;
  /** ISO time the connection ended (allowed ones). */
  closedAt?: string;
}

/** Counters of one sandbox. */
export interface EgressStats {
  /** Bytes delivered to the sandbox. */
  bytesIn: number;
  /** Bytes the sandbox sent out. */
  bytesOut: number;
  /** Connections open now. */
  connections: number;
  /** Connection attempts allowed since the proxy started. */
  allowed: number;
  /** Connection attempts denied. */
  denied: number;
}

/** Options of {@link EgressMonitor}. */
export interface EgressMonitorOptions {
  events?: EventSink;
  logEntries?: number;
  scanWindowMs?: number;
  scanThreshold?: number;
  scanCooldownMs?: number;
  deniedEventsPerWindow?: number;
  now?: () => number;
}

interface SandboxWatch {
  stats: EgressStats;
  /** Denied destinations with the time last seen, within the scan window. */
  recentDenied: Map<string, number>;
  lastScanEventAt: number;
  deniedWindowStart: number;
  deniedEventsInWindow: number;
  suppressed: number;
}

/** The connection log, the counters and the events of one proxy. */
export class EgressMonitor {
  private readonly log: EgressRecord[] = [];
  private seq = 0;
  private readonly sandboxes = new Map<string, SandboxWatch>();
  private readonly listeners = new Set<(r: EgressRecord) => void>();
  private readonly opts: Required<Omit<EgressMonitorOptions, 'events'>> & { events?: EventSink };

  constructor(opts: EgressMonitorOptions = {}) {
    this.opts = {
      logEntries: opts.logEntries ?? DEFAULT_LOG_ENTRIES,
      scanWindowMs: opts.scanWindowMs ?? DEFAULT_SCAN_WINDOW_MS,
      scanThreshold: opts.scanThreshold ?? DEFAULT_SCAN_THRESHOLD,
      scanCooldownMs: opts.scanCooldownMs ?? DEFAULT_SCAN_COOLDOWN_MS,
      deniedEventsPerWindow: opts.deniedEventsPerWindow ?? DEFAULT_DENIED_EVENTS_PER_WINDOW,
      now: opts.now ?? Date.now,
      ...(opts.events ? { events: opts.events } : {}),
    };
  }

  /** Subscribes to every decision as it is made; returns the unsubscribe function. */
  onDecision(listener: (r: EgressRecord) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  private watch(sandboxId: string): SandboxWatch {
    let w = this.sandboxes.get(sandboxId);
    if (!w) {
      w = {
        stats: { bytesIn: 0, bytesOut: 0, connections: 0, allowed: 0, denied: 0 },
        recentDenied: new Map(),
        lastScanEventAt: -Infinity,
        deniedWindowStart: -Infinity,
        deniedEventsInWindow: 0,
        suppressed: 0,
      };
      this.sandboxes.set(sandboxId, w);
    }
    return w;
  }

  /** The counters of a sandbox (zeros when it never connected). */
  stats(sandboxId: string): EgressStats {
    return { ...(this.sandboxes.get(sandboxId)?.stats ?? { bytesIn: 0, bytesOut: 0, connections: 0, allowed: 0, denied: 0 }) };
  }

  /** Drops a sandbox's counters (it is gone); returns their last values. */
  forget(sandboxId: string): EgressStats {
    const s = this.stats(sandboxId);
    this.sandboxes.delete(sandboxId);
    return s;
  }

  /** The most recent log entries, oldest first; optionally of one sandbox only. */
  entries(filter: { sandboxId?: string; limit?: number } = {}): EgressRecord[] {
    const out = filter.sandboxId === undefined ? this.log : this.log.filter((r) => r.sandboxId === filter.sandboxId);
    return out.slice(-(filter.limit ?? this.opts.logEntries)).map((r) => ({ ...r }));
  }

  /** Records a decision; the returned record is updated with bytes and close time as they come. */
  decide(entry: Omit<EgressRecord, 'seq' | 'at' | 'bytesIn' | 'bytesOut'>): EgressRecord {
    const record: EgressRecord = { seq: ++this.seq, at: new Date(this.opts.now()).toISOString(), ...entry, bytesIn: 0, bytesOut: 0 };
    this.log.push(record);
    if (this.log.length > this.opts.logEntries) this.log.splice(0, this.log.length - this.opts.logEntries);
    if (record.sandboxId !== undefined) {
      const w = this.watch(record.sandboxId);
      if (record.verdict === 'allow') w.stats.allowed++;
      else w.stats.denied++;
    }
    if (record.verdict === 'deny') this.denied(record);
    for (const l of this.listeners) {
      try {
        l(record);
      } catch {
        // a listener's failure is its own
      }
    }
    return record;
  }

  /** Counts bytes for a record and its sandbox. */
  addBytes(record: EgressRecord, direction: 'in' | 'out', n: number): void {
    if (direction === 'in') record.bytesIn += n;
    else record.bytesOut += n;
    if (record.sandboxId === undefined) return;
    const s = this.watch(record.sandboxId).stats;
    if (direction === 'in') s.bytesIn += n;
    else s.bytesOut += n;
  }

  /** A client connection of `sandboxId` opened (+1) or closed (-1). */
  connectionDelta(sandboxId: string, delta: 1 | -1): void {
    this.watch(sandboxId).stats.connections += delta;
  }

  /** Marks an allowed connection closed. */
  closed(record: EgressRecord): void {
    record.closedAt ??= new Date(this.opts.now()).toISOString();
  }

  private raise(ev: Parameters<EventSink>[0]): void {
    try {
      this.opts.events?.(ev);
    } catch {
      // sinks must not throw; if one does, the proxy carries on
    }
  }

  private denied(r: EgressRecord): void {
    const now = this.opts.now();
    const key = r.sandboxId ?? `source:${r.source}`;
    const w = this.watch(key);
    if (r.sandboxId === undefined) w.stats.denied++;
    const dest = `${r.host}:${r.port}`;
    const data = { source: r.source, via: r.via, host: r.host, port: r.port, reason: r.reason, ...(r.address ? { address: r.address } : {}), ...(r.detail ? { detail: r.detail } : {}) };
    const base = r.sandboxId !== undefined ? { sandboxId: r.sandboxId } : {};
    if (now - w.deniedWindowStart >= this.opts.scanWindowMs) {
      w.deniedWindowStart = now;
      w.deniedEventsInWindow = 0;
    }
    if (w.deniedEventsInWindow < this.opts.deniedEventsPerWindow) {
      w.deniedEventsInWindow++;
      const suppressed = w.suppressed;
      w.suppressed = 0;
      this.raise({
        kind: 'egress.denied',
        severity: 'info',
        ...base,
        message: `egress to ${dest} denied (${r.reason ?? 'policy'})`,
        data: { ...data, ...(suppressed ? { suppressedBefore: suppressed } : {}) },
      });
    } else w.suppressed++;

    // Port-scan-like: many distinct denied destinations in a short time.
    w.recentDenied.delete(dest);
    w.recentDenied.set(dest, now);
    for (const [d, t] of w.recentDenied) {
      if (now - t < this.opts.scanWindowMs && w.recentDenied.size <= MAX_TRACKED_DENIALS) break; // insertion order = time order
      w.recentDenied.delete(d);
    }
    if (w.recentDenied.size >= this.opts.scanThreshold && now - w.lastScanEventAt >= this.opts.scanCooldownMs) {
      w.lastScanEventAt = now;
      const sample = [...w.recentDenied.keys()].slice(-20);
      const ports = new Set(sample.map((d) => d.slice(d.lastIndexOf(':') + 1)));
      this.raise({
        kind: 'egress.port-scan',
        severity: 'warning',
        ...base,
        message: `${w.recentDenied.size} distinct destinations denied within ${this.opts.scanWindowMs / 1000} s`,
        data: { source: r.source, distinctDestinations: w.recentDenied.size, windowMs: this.opts.scanWindowMs, destinations: sample, ports: [...ports] },
      });
    }
  }
}
