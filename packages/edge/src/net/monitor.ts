// Every egress attempt of every sandbox, from the proxy, the DNS stub and the kernel, ends here:
// kept per sandbox (the latest ones), counted, and turned into events: `egress.denied` for
// denials (at most one per destination per interval, and a bounded number per minute) and
// `egress.port-scan` when a sandbox is denied many distinct destinations or ports quickly.
import type { EventSink } from '@dsec/protocol';
import type { EgressLogEntry } from './types.js';

/** Attempts kept per sandbox. */
export const EGRESS_LOG_ENTRIES = 1000;
/** Window of the port-scan rule. */
export const SCAN_WINDOW_MS = 10_000;
/** Distinct denied destination:port pairs within the window that make a scan. */
export const SCAN_DISTINCT_DESTINATIONS = 12;
/** A destination denied again within this time raises no new event. */
const DENIED_EVENT_REPEAT_MS = 30_000;
/** Most `egress.denied` events per sandbox per minute (the rest are counted in the next one). */
const DENIED_EVENTS_PER_MINUTE = 20;
/** A port scan is reported at most this often per sandbox. */
const SCAN_EVENT_REPEAT_MS = 60_000;
/** The kernel logs each retransmitted SYN: the same attempt within this time is one attempt. */
const KERNEL_DUPLICATE_MS = 5_000;

/** Counters of one sandbox's attempts. */
export interface EgressCounts {
  allowed: number;
  denied: number;
}

interface SandboxLog {
  entries: EgressLogEntry[];
  /** Index of the oldest entry once the ring is full. */
  start: number;
  counts: EgressCounts;
  /** Denied destination -> last time, within the scan window. */
  recentDenied: Map<string, number>;
  /** Destination -> last time an event was raised for it. */
  raisedFor: Map<string, number>;
  eventsThisMinute: number;
  minuteStart: number;
  suppressed: number;
  lastScanEvent: number;
  /** Kernel attempts seen lately (for dropping duplicates). */
  kernelSeen: Map<string, number>;
}

/** The node's egress log. */
export class EgressMonitor {
  private readonly logs = new Map<string, SandboxLog>();

  constructor(private readonly raise: EventSink) {}

  private logOf(id: string): SandboxLog {
    let l = this.logs.get(id);
    if (!l) {
      l = {
        entries: [],
        start: 0,
        counts: { allowed: 0, denied: 0 },
        recentDenied: new Map(),
        raisedFor: new Map(),
        eventsThisMinute: 0,
        minuteStart: 0,
        suppressed: 0,
        lastScanEvent: 0,
        kernelSeen: new Map(),
      };
      this.logs.set(id, l);
    }
    return l;
  }

  /** Records one attempt. */
  record(input: EgressLogEntry): void {
    const now = Date.now();
    const entry: EgressLogEntry = { ...input, at: input.at ?? new Date(now).toISOString() };
    const l = this.logOf(entry.sandboxId);
    const dest = `${entry.protocol ?? 'tcp'} ${entry.host} ${entry.port}`;
    if (entry.via === 'kernel') {
      const seen = l.kernelSeen.get(dest);
      if (seen !== undefined && now - seen < KERNEL_DUPLICATE_MS) return;
      l.kernelSeen.set(dest, now);
      if (l.kernelSeen.size > 4096) prune(l.kernelSeen, now - KERNEL_DUPLICATE_MS);
    }
    if (l.entries.length < EGRESS_LOG_ENTRIES) l.entries.push(entry);
    else {
      l.entries[l.start] = entry;
      l.start = (l.start + 1) % EGRESS_LOG_ENTRIES;
    }
    if (entry.verdict === 'allowed') {
      l.counts.allowed++;
      return;
    }
    l.counts.denied++;
    this.deniedEvent(l, entry, dest, now);
    this.scanCheck(l, entry, dest, now);
  }

  private deniedEvent(l: SandboxLog, e: EgressLogEntry, dest: string, now: number): void {
    const last = l.raisedFor.get(dest);
    if (last !== undefined && now - last < DENIED_EVENT_REPEAT_MS) return;
    if (now - l.minuteStart >= 60_000) {
      l.minuteStart = now;
      l.eventsThisMinute = 0;
    }
    if (l.eventsThisMinute >= DENIED_EVENTS_PER_MINUTE) {
      l.suppressed++;
      return;
    }
    l.eventsThisMinute++;
    l.raisedFor.set(dest, now);
    if (l.raisedFor.size > 4096) prune(l.raisedFor, now - DENIED_EVENT_REPEAT_MS);
    const data: Record<string, unknown> = { via: e.via, host: e.host, port: e.port, protocol: e.protocol ?? 'tcp', reason: e.reason };
    if (e.rule) data.rule = e.rule;
    if (e.address) data.address = e.address;
    if (l.suppressed) {
      data.suppressed = l.suppressed;
      l.suppressed = 0;
    }
    this.raise({
      kind: 'egress.denied',
      severity: 'warning',
      sandboxId: e.sandboxId,
      message: `egress to ${e.host}:${e.port} (${data.protocol}, ${e.via}) denied: ${e.reason ?? 'not allowed'}`,
      data,
    });
  }

  private scanCheck(l: SandboxLog, e: EgressLogEntry, dest: string, now: number): void {
    l.recentDenied.set(dest, now);
    prune(l.recentDenied, now - SCAN_WINDOW_MS);
    if (l.recentDenied.size < SCAN_DISTINCT_DESTINATIONS || now - l.lastScanEvent < SCAN_EVENT_REPEAT_MS) return;
    l.lastScanEvent = now;
    const sample = [...l.recentDenied.keys()].slice(-20);
    const hosts = new Set(sample.map((d) => d.split(' ')[1]));
    const ports = new Set(sample.map((d) => d.split(' ')[2]));
    this.raise({
      kind: 'egress.port-scan',
      severity: 'critical',
      sandboxId: e.sandboxId,
      message: `${l.recentDenied.size} distinct destinations denied within ${SCAN_WINDOW_MS / 1000} s (${hosts.size} hosts, ${ports.size} ports)`,
      data: { distinct: l.recentDenied.size, windowMs: SCAN_WINDOW_MS, sample },
    });
  }

  /** The latest attempts of a sandbox, oldest first. */
  recent(id: string, limit = EGRESS_LOG_ENTRIES): EgressLogEntry[] {
    const l = this.logs.get(id);
    if (!l) return [];
    const ordered = [...l.entries.slice(l.start), ...l.entries.slice(0, l.start)];
    return ordered.slice(-limit);
  }

  /** Attempt counters of a sandbox. */
  counts(id: string): EgressCounts {
    return { ...(this.logs.get(id)?.counts ?? { allowed: 0, denied: 0 }) };
  }

  /** Drops a sandbox's log (destroyed). */
  forget(id: string): void {
    this.logs.delete(id);
  }
}

function prune(m: Map<string, number>, before: number): void {
  for (const [k, t] of m) if (t < before) m.delete(k);
}
