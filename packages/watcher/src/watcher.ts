// The watcher: polls nodes for health, destroys sandboxes whose lifetime has elapsed, enforces
// leases (idle timeouts, lost owners: the control plane's pass, run from here), and reconciles
// the control plane's records with what the nodes actually run (orphans on a node are
// destroyed; records whose sandbox vanished are marked lost). It raises lease.exceeded for an
// elapsed lifetime and sandbox.lost (idle and owner lease.exceeded come from the control
// plane's lease pass), collects what crashed edges left on their nodes, and runs the
// maintenance of the event and audit stores (retention, rules written by other replicas).
import type { RaisedEvent } from '@dsec/protocol';

/** Default interval between two passes. */
export const DEFAULT_WATCH_INTERVAL_MS = 1000;
/** Default interval of garbage collection on the nodes. */
export const DEFAULT_GC_INTERVAL_MS = 30_000;
/** Default interval of maintenance (retention pruning, rule reload). */
export const DEFAULT_MAINTENANCE_INTERVAL_MS = 10_000;

/** A sandbox as the control plane records it. */
export interface WatchedSandbox {
  id: string;
  node: string;
  state: string;
  expiresAt: string;
  /** A paused sandbox whose lease keeps it paused at the end of its lifetime (`onExpire: 'pause'`): expiry leaves it alone. */
  keptPaused?: boolean;
}

/** What the watcher needs of a node. */
export interface WatchedNode {
  name: string;
  /** Ids of the sandboxes the node runs; rejects when the node is unreachable. */
  sandboxIds(): Promise<string[]>;
  /** Destroys a sandbox the control plane does not know. */
  destroyOrphan(id: string): Promise<void>;
  /** Removes what no live sandbox owns on the node (containers, cgroups, mounts); returns how many things went. */
  collectGarbage?(): Promise<number>;
}

/** What the watcher needs of the control plane. */
export interface WatcherTarget {
  nodes(): WatchedNode[];
  sandboxes(): Promise<WatchedSandbox[]>;
  setNodeHealthy(name: string, healthy: boolean): void;
  expire(id: string): Promise<void>;
  markLost(id: string): Promise<void>;
  /** Enforces idle timeouts and owner leases (pauses or kills); called once per pass. */
  leases?(): Promise<void>;
  /** Where the watcher's own events go (lease.exceeded, sandbox.lost). */
  raise(ev: RaisedEvent): void;
  /** Periodic housekeeping: retention of events and audit entries, rules from the store. */
  maintain?(): Promise<void>;
}

/** Options of {@link Watcher}. */
export interface WatcherOptions {
  intervalMs?: number;
  log?: (line: string) => void;
  /** A sandbox must be missing this long before it is marked lost (creation races). */
  lostAfterMs?: number;
  /** Interval of garbage collection on the nodes. Default {@link DEFAULT_GC_INTERVAL_MS}. */
  gcIntervalMs?: number;
  /** Interval of {@link WatcherTarget.maintain}. Default {@link DEFAULT_MAINTENANCE_INTERVAL_MS}. */
  maintenanceIntervalMs?: number;
}

/** Periodic health, expiry and garbage collection. */
export class Watcher {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private readonly missingSince = new Map<string, number>();
  /** Sandboxes whose lease.exceeded was raised (once each, even when expiring them fails). */
  private readonly leaseReported = new Set<string>();
  private lastGc = Date.now();
  private lastMaintenance = 0;
  /** Things removed by garbage collection so far. */
  garbageCollected = 0;

  constructor(
    private readonly target: WatcherTarget,
    private readonly o: WatcherOptions = {},
  ) {}

  /** Starts the periodic passes. */
  start(): void {
    if (this.timer) return;
    this.timer = setInterval(() => {
      if (!this.running) this.running = this.pass().finally(() => (this.running = undefined));
    }, this.o.intervalMs ?? DEFAULT_WATCH_INTERVAL_MS);
    this.timer.unref();
  }

  /** Stops and waits for a pass in progress. */
  async stop(): Promise<void> {
    clearInterval(this.timer);
    this.timer = undefined;
    await this.running;
  }

  /**
   * One pass; errors are logged, never thrown. Every node is asked first (all at once) and the
   * records are read once after: a record is written before its sandbox is created, so everything
   * a node reported is known by then, and a sandbox created meanwhile is never taken for an
   * orphan. One read of the records per pass, whatever the number of nodes.
   */
  async pass(): Promise<void> {
    const log = this.o.log ?? (() => undefined);
    try {
      const nodes = this.target.nodes();
      const answers = await Promise.all(nodes.map((node) => this.ask(node, log)));
      const now = Date.now();
      const sandboxes = await this.target.sandboxes();
      const byNode = new Map<string, WatchedSandbox[]>();
      for (const s of sandboxes) {
        const list = byNode.get(s.node);
        if (list) list.push(s);
        else byNode.set(s.node, [s]);
      }
      for (const [i, node] of nodes.entries()) {
        const running = answers[i];
        if (running) await this.reconcile(node, running, byNode.get(node.name) ?? [], log);
      }
      await this.expire(sandboxes, now, log);
      await this.target.leases?.().catch((err: unknown) => log(`watcher: lease pass failed: ${(err as Error).message}`));
      if (now - this.lastGc >= (this.o.gcIntervalMs ?? DEFAULT_GC_INTERVAL_MS)) {
        this.lastGc = now;
        for (const node of nodes) {
          const n = await node.collectGarbage?.().catch((err: unknown) => {
            log(`watcher: garbage collection on ${node.name} failed: ${(err as Error).message}`);
            return 0;
          });
          if (n) {
            this.garbageCollected += n;
            log(`watcher: removed ${n} leftovers of unknown sandboxes on ${node.name}`);
          }
        }
      }
      if (this.target.maintain && now - this.lastMaintenance >= (this.o.maintenanceIntervalMs ?? DEFAULT_MAINTENANCE_INTERVAL_MS)) {
        this.lastMaintenance = now;
        await this.target.maintain().catch((err: unknown) => log(`watcher: maintenance failed: ${(err as Error).message}`));
      }
    } catch (err) {
      log(`watcher: pass failed: ${(err as Error).message}`);
    }
  }

  /** The ids a node runs (and the node marked healthy), or undefined when it did not answer. */
  private async ask(node: WatchedNode, log: (line: string) => void): Promise<Set<string> | undefined> {
    try {
      const running = new Set(await node.sandboxIds());
      this.target.setNodeHealthy(node.name, true);
      return running;
    } catch (err) {
      this.target.setNodeHealthy(node.name, false);
      log(`watcher: node ${node.name} unreachable: ${(err as Error).message}`);
      return undefined;
    }
  }

  /**
   * Ends the sandboxes past their lifetime (lease.exceeded once per lifetime: a lifetime renewed
   * at a resume raises it again); forgets rows that are gone. A sandbox already kept paused is
   * not asked about again on every pass.
   */
  private async expire(sandboxes: readonly WatchedSandbox[], now: number, log: (line: string) => void): Promise<void> {
    const ids = new Set(sandboxes.map((s) => s.id));
    for (const id of this.leaseReported) if (!ids.has(id)) this.leaseReported.delete(id);
    for (const id of this.missingSince.keys()) if (!ids.has(id)) this.missingSince.delete(id);
    for (const s of sandboxes) {
      if (Date.parse(s.expiresAt) > now) {
        this.leaseReported.delete(s.id);
        continue;
      }
      if (s.state === 'creating' || s.state === 'stopping') continue;
      if (!this.leaseReported.has(s.id)) {
        this.leaseReported.add(s.id);
        this.target.raise({
          kind: 'lease.exceeded',
          severity: 'warning',
          sandboxId: s.id,
          message: `sandbox ${s.id} exceeded its lifetime (it expired at ${s.expiresAt}); its lease's onExpire action (kill by default, or pause) follows`,
          data: { expiresAt: s.expiresAt, overdueMs: now - Date.parse(s.expiresAt) },
        });
      }
      if (s.keptPaused) continue;
      await this.target.expire(s.id).catch((err: unknown) => log(`watcher: expiring ${s.id} failed: ${(err as Error).message}`));
    }
  }

  /** Compares what a node runs with its records: orphans destroyed, sandboxes missing too long lost. */
  private async reconcile(node: WatchedNode, running: Set<string>, records: readonly WatchedSandbox[], log: (line: string) => void): Promise<void> {
    const known = new Set(records.map((s) => s.id));
    for (const id of running) {
      if (!known.has(id)) await node.destroyOrphan(id).catch((err: unknown) => log(`watcher: orphan ${id}: ${(err as Error).message}`));
    }
    const now = Date.now();
    for (const s of records) {
      if ((s.state !== 'running' && s.state !== 'paused') || running.has(s.id)) {
        this.missingSince.delete(s.id);
        continue;
      }
      const since = this.missingSince.get(s.id) ?? now;
      this.missingSince.set(s.id, since);
      if (now - since >= (this.o.lostAfterMs ?? 5000)) {
        this.missingSince.delete(s.id);
        const marked = await this.target.markLost(s.id).then(
          () => true,
          () => false,
        );
        if (marked) {
          this.target.raise({
            kind: 'sandbox.lost',
            severity: 'warning',
            sandboxId: s.id,
            message: `sandbox ${s.id} is no longer running on node ${node.name} (missing for ${now - since} ms); marked lost`,
            data: { node: node.name, missingMs: now - since },
          });
        }
      }
    }
  }
}
