// Connection accounting of the egress proxy, in one place: every client connection is counted
// from accept to close, per sandbox and for the whole node. A connection over a limit waits in a
// first-come queue for a slot before it is refused, so a package manager's burst of parallel
// connections is slowed, not failed. The gate only counts: the proxy decides what a refusal says
// and releases each pass when the client socket closes (one 'close' ends every path: keep-alive,
// half-close, resets, aborts, upstream errors).

/** Default concurrent client connections per sandbox (npm, pip, cargo, apt open many at once). */
export const DEFAULT_MAX_CONNECTIONS_PER_SANDBOX = 512;
/** Default concurrent client connections for the whole node's proxy. */
export const DEFAULT_MAX_CONNECTIONS = 16_384;
/** Default time a connection over a limit waits for a slot before it is refused. */
export const DEFAULT_CONNECTION_QUEUE_MS = 15_000;
/** Connections waiting at once, node-wide; more are refused at once (each holds a socket). */
export const DEFAULT_MAX_QUEUED = 16_384;

/** Which limit held a connection back. */
export type GateLimit = 'sandbox' | 'node';

/** Options of {@link ConnectionGate}. */
export interface ConnectionGateOptions {
  /** Open connections per sandbox. Default {@link DEFAULT_MAX_CONNECTIONS_PER_SANDBOX}. */
  maxPerSandbox?: number;
  /** Open connections node-wide (sandboxes and unknown sources). Default {@link DEFAULT_MAX_CONNECTIONS}. */
  maxTotal?: number;
  /** Longest wait in the queue, ms; 0 refuses at once. Default {@link DEFAULT_CONNECTION_QUEUE_MS}. */
  queueTimeoutMs?: number;
  /** Most connections waiting at once. Default {@link DEFAULT_MAX_QUEUED}. */
  maxQueued?: number;
  /** A connection had to wait (called once per queued connection, before it waits). */
  onQueued?: (key: string | undefined, limit: GateLimit) => void;
}

/** A counted connection; `release` is idempotent. */
export interface GatePass {
  /** Time spent in the queue, ms (0: admitted at once). */
  waitedMs: number;
  release(): void;
}

/** A connection the gate would not count: over a limit after its wait, or the queue full, or the gate closed. */
export interface GateRefusal {
  refused: GateLimit | 'closed';
  /** For humans and the egress log: `sandbox limit of 512 connections (waited 15 s)`. */
  detail: string;
}

interface Waiter {
  key: string | undefined;
  since: number;
  timer: NodeJS.Timeout;
  settle(r: GatePass | GateRefusal): void;
}

/** Counts open connections per key (sandbox id; undefined for unknown sources) and in total. */
export class ConnectionGate {
  readonly maxPerSandbox: number;
  readonly maxTotal: number;
  readonly queueTimeoutMs: number;
  private readonly maxQueued: number;
  private total = 0;
  private readonly open = new Map<string, number>();
  private readonly waitingByKey = new Map<string, number>();
  private queue: Waiter[] = [];
  private closed = false;

  constructor(private readonly opts: ConnectionGateOptions = {}) {
    this.maxPerSandbox = opts.maxPerSandbox ?? DEFAULT_MAX_CONNECTIONS_PER_SANDBOX;
    this.maxTotal = opts.maxTotal ?? DEFAULT_MAX_CONNECTIONS;
    this.queueTimeoutMs = opts.queueTimeoutMs ?? DEFAULT_CONNECTION_QUEUE_MS;
    this.maxQueued = opts.maxQueued ?? DEFAULT_MAX_QUEUED;
  }

  /** Open connections of a key (all keys: {@link totalOpen}). */
  openOf(key: string): number {
    return this.open.get(key) ?? 0;
  }

  /** Open connections node-wide. */
  get totalOpen(): number {
    return this.total;
  }

  /** Connections waiting now. */
  get waiting(): number {
    return this.queue.length;
  }

  /** Connections of a key waiting now. */
  waitingOf(key: string): number {
    return this.waitingByKey.get(key) ?? 0;
  }

  /**
   * Counts a new connection: at once when both limits have room and nobody of the same key is
   * waiting (first come, first served), else after a wait in the queue, else refused. `gone`
   * ends a wait early (the client left): it resolves to a refusal that nobody needs to answer.
   */
  admit(key: string | undefined, gone?: (abandon: () => void) => void): Promise<GatePass | GateRefusal> {
    if (this.closed) return Promise.resolve({ refused: 'closed', detail: 'the proxy is closing' });
    const blocked = this.blockedBy(key);
    if (!blocked && (key === undefined || !this.waitingByKey.get(key))) return Promise.resolve(this.count(key, 0));
    const limit: GateLimit = blocked ?? 'sandbox';
    if (this.queueTimeoutMs <= 0 || this.queue.length >= this.maxQueued)
      return Promise.resolve({ refused: limit, detail: this.limitText(limit, this.queue.length >= this.maxQueued ? 'the wait queue is full' : undefined) });
    this.opts.onQueued?.(key, limit);
    return new Promise((resolve) => {
      const w: Waiter = {
        key,
        since: performance.now(),
        timer: setTimeout(() => {
          if (!this.dequeue(w)) return;
          const still = this.blockedBy(key) ?? 'sandbox';
          resolve({ refused: still, detail: this.limitText(still, `waited ${Math.round(this.queueTimeoutMs / 1000)} s`) });
        }, this.queueTimeoutMs),
        settle: resolve,
      };
      this.queue.push(w);
      if (key !== undefined) this.waitingByKey.set(key, (this.waitingByKey.get(key) ?? 0) + 1);
      gone?.(() => {
        if (!this.dequeue(w)) return;
        clearTimeout(w.timer);
        resolve({ refused: limit, detail: 'the client left while it waited' });
      });
    });
  }

  /** Refuses everyone waiting and everything after. */
  close(): void {
    this.closed = true;
    const queue = this.queue;
    this.queue = [];
    this.waitingByKey.clear();
    for (const w of queue) {
      clearTimeout(w.timer);
      w.settle({ refused: 'closed', detail: 'the proxy is closing' });
    }
  }

  private limitText(limit: GateLimit, why?: string): string {
    const base = limit === 'sandbox' ? `sandbox limit of ${this.maxPerSandbox} connections` : `node limit of ${this.maxTotal} connections`;
    return why ? `${base} (${why})` : base;
  }

  /** The limit that keeps `key` from one more connection now, if any. */
  private blockedBy(key: string | undefined): GateLimit | undefined {
    if (key !== undefined && (this.open.get(key) ?? 0) >= this.maxPerSandbox) return 'sandbox';
    if (this.total >= this.maxTotal) return 'node';
    return undefined;
  }

  private count(key: string | undefined, waitedMs: number): GatePass {
    this.total++;
    if (key !== undefined) this.open.set(key, (this.open.get(key) ?? 0) + 1);
    let released = false;
    return {
      waitedMs,
      release: () => {
        if (released) return;
        released = true;
        this.total--;
        if (key !== undefined) {
          const n = (this.open.get(key) ?? 1) - 1;
          if (n > 0) this.open.set(key, n);
          else this.open.delete(key);
        }
        this.drain();
      },
    };
  }

  /** Removes a waiter from the queue; false when it was no longer there. */
  private dequeue(w: Waiter): boolean {
    const i = this.queue.indexOf(w);
    if (i < 0) return false;
    this.queue.splice(i, 1);
    this.unwait(w.key);
    return true;
  }

  private unwait(key: string | undefined): void {
    if (key === undefined) return;
    const n = (this.waitingByKey.get(key) ?? 1) - 1;
    if (n > 0) this.waitingByKey.set(key, n);
    else this.waitingByKey.delete(key);
  }

  /** Admits waiters in arrival order while there is room (a waiter held by its own sandbox's limit does not hold up others). */
  private drain(): void {
    if (this.queue.length === 0 || this.total >= this.maxTotal) return;
    const kept: Waiter[] = [];
    const now = performance.now();
    for (const w of this.queue) {
      if (this.total < this.maxTotal && !this.blockedBy(w.key)) {
        clearTimeout(w.timer);
        this.unwait(w.key);
        w.settle(this.count(w.key, now - w.since));
      } else kept.push(w);
    }
    this.queue = kept;
  }
}
