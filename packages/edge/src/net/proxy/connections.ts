// The proxy's own view of its traffic: per-sandbox counters and a bounded list of recent
// connections with their bytes (open ones included). Attempts and their verdicts go to the node's
// egress log through the `log` sink; this is what the proxy alone knows: bytes and lifetimes.
import type { EgressLogEntry, EgressStats, EgressVia } from '../types.js';

/** Connections kept in the recent-connections list. */
export const DEFAULT_RECENT_CONNECTIONS = 10_000;

/** Why the proxy refused or closed a connection (stable codes; the log's `reason` starts with one). */
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
  | 'mirror-path'
  | 'policy-changed'
  | 'sandbox-gone';

/** One decision of the proxy (a CONNECT, a TLS connection, one forwarded HTTP request). */
export interface ConnectionRecord {
  /** Sequence number, unique per proxy. */
  seq: number;
  /** ISO time of the decision. */
  at: string;
  /** Undefined when the source address belongs to no sandbox. */
  sandboxId?: string;
  /** The client's source address. */
  source: string;
  via: EgressVia;
  host: string;
  port: number;
  /** The address dialled. */
  address?: string;
  rule?: string;
  verdict: 'allowed' | 'denied';
  reason?: EgressReason;
  /** Details for humans: the policy's reason, an upstream error, how a mirror served it. */
  detail?: string;
  /** Bytes delivered to the sandbox and sent by it, counted until the connection closes. */
  bytesIn: number;
  bytesOut: number;
  /** ISO time the connection closed (allowed ones). */
  closedAt?: string;
}

const zeroStats = (): EgressStats => ({ bytesIn: 0, bytesOut: 0, connections: 0, totalConnections: 0, denied: 0 });

/** Counters and recent connections of one proxy; every decision is also passed to `sink`. */
export class ConnectionLog {
  private readonly recentList: ConnectionRecord[] = [];
  private seq = 0;
  private readonly counters = new Map<string, EgressStats>();

  constructor(
    private readonly sink: (entry: EgressLogEntry) => void,
    private readonly capacity = DEFAULT_RECENT_CONNECTIONS,
  ) {}

  private statsOf(sandboxId: string): EgressStats {
    let s = this.counters.get(sandboxId);
    if (!s) this.counters.set(sandboxId, (s = zeroStats()));
    return s;
  }

  /** Records a decision and reports it to the sink; the record's bytes grow as traffic flows. */
  decide(entry: Omit<ConnectionRecord, 'seq' | 'at' | 'bytesIn' | 'bytesOut'>): ConnectionRecord {
    const record: ConnectionRecord = { seq: ++this.seq, at: new Date().toISOString(), ...entry, bytesIn: 0, bytesOut: 0 };
    this.recentList.push(record);
    if (this.recentList.length > this.capacity) this.recentList.splice(0, this.recentList.length - this.capacity);
    if (record.sandboxId !== undefined) {
      const s = this.statsOf(record.sandboxId);
      if (record.verdict === 'denied') s.denied++;
      else s.totalConnections++;
      try {
        this.sink({
          at: record.at,
          sandboxId: record.sandboxId,
          via: record.via,
          host: record.host,
          port: record.port,
          ...(record.address ? { address: record.address } : {}),
          verdict: record.verdict,
          ...(record.rule ? { rule: record.rule } : {}),
          ...(record.reason ? { reason: record.detail ? `${record.reason}: ${record.detail}` : record.reason } : {}),
        });
      } catch {
        // the sink must not throw; if it does, the proxy carries on
      }
    }
    return record;
  }

  /** Counts bytes for a connection and its sandbox. */
  addBytes(record: ConnectionRecord, direction: 'in' | 'out', n: number): void {
    if (direction === 'in') record.bytesIn += n;
    else record.bytesOut += n;
    if (record.sandboxId === undefined) return;
    const s = this.counters.get(record.sandboxId); // none: forgotten, its last bytes are not counted
    if (!s) return;
    if (direction === 'in') s.bytesIn += n;
    else s.bytesOut += n;
  }

  /** A client connection of the sandbox opened (+1) or closed (-1). */
  connectionDelta(sandboxId: string, delta: 1 | -1): void {
    const s = delta > 0 ? this.statsOf(sandboxId) : this.counters.get(sandboxId);
    if (s) s.connections = Math.max(0, s.connections + delta);
  }

  /** Open client connections of the sandbox. */
  openConnections(sandboxId: string): number {
    return this.counters.get(sandboxId)?.connections ?? 0;
  }

  /** Marks a connection closed. */
  closed(record: ConnectionRecord): void {
    record.closedAt ??= new Date().toISOString();
  }

  /** The counters of a sandbox (zeros when it never connected). */
  stats(sandboxId: string): EgressStats {
    return { ...(this.counters.get(sandboxId) ?? zeroStats()) };
  }

  /** Drops a sandbox's counters. */
  forget(sandboxId: string): void {
    this.counters.delete(sandboxId);
  }

  /** Recent connections, oldest first (copies). */
  recent(filter: { sandboxId?: string; limit?: number } = {}): ConnectionRecord[] {
    const list = filter.sandboxId === undefined ? this.recentList : this.recentList.filter((r) => r.sandboxId === filter.sandboxId);
    return list.slice(-(filter.limit ?? this.capacity)).map((r) => ({ ...r }));
  }
}
