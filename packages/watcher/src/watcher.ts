// The watcher: polls nodes for health, destroys sandboxes whose lifetime has elapsed, enforces
// leases (idle timeouts, lost owners: the control plane's pass, run from here), and reconciles
// the control plane's records with what the nodes actually run (orphans on a node are
// destroyed once seen again after a grace; records whose sandbox vanished are marked lost). It raises lease.exceeded for an
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
/**
 * Default number of records a pass compares with their nodes: a cell with more sandboxes is
 * reconciled a share of its nodes per pass, in turn (every node within a few passes).
 */
export const DEFAULT_RECONCILE_ROWS_PER_PASS = 2000;
/** Default time a sandbox must be missing from its node before it is marked lost (creation races). */
export const DEFAULT_LOST_AFTER_MS = 5000;
/**
 * Default time a sandbox a node runs without a record must stay so before it is destroyed (a few
 * passes): a sandbox made at the node beside the control plane (a benchmark's, an operator's)
 * is not destroyed at first sight.
 */
export const DEFAULT_ORPHAN_GRACE_MS = 5000;

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
  /** Destroys a sandbox the control plane has not known for the orphan grace. */
  destroyOrphan(id: string): Promise<void>;
  /** Removes what no live sandbox owns on the node (containers, cgroups, mounts); returns how many things went. */
  collectGarbage?(): Promise<number>;
}

/** What the watcher needs of the control plane. */
export interface WatcherTarget {
  nodes(): WatchedNode[];
  /** The records of the sandboxes on these nodes, in every state. */
  sandboxes(nodes: readonly string[]): Promise<WatchedSandbox[]>;
  /** The records whose lifetime ended by `at` (ISO time): `expiresAt <= at`. */
  expired(at: string): Promise<WatchedSandbox[]>;
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
  /** A sandbox must be missing this long before it is marked lost (creation races). Default {@link DEFAULT_LOST_AFTER_MS}. */
  lostAfterMs?: number;
  /** A sandbox a node runs without a record is destroyed when seen so again this long after it was first. Default {@link DEFAULT_ORPHAN_GRACE_MS}. */
  orphanGraceMs?: number;
  /** Interval of garbage collection on the nodes. Default {@link DEFAULT_GC_INTERVAL_MS}. */
  gcIntervalMs?: number;
  /** Interval of {@link WatcherTarget.maintain}. Default {@link DEFAULT_MAINTENANCE_INTERVAL_MS}. */
  maintenanceIntervalMs?: number;
  /** Records compared with their nodes per pass (whole nodes, at least one). Default {@link DEFAULT_RECONCILE_ROWS_PER_PASS}. */
  reconcileRowsPerPass?: number;
}

/** Periodic health, expiry and garbage collection. */
export class Watcher {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  /** Sandboxes missing from their node, by id: the node and since when. */
  private readonly missingSince = new Map<string, { node: string; since: number }>();
  /** Sandboxes a node runs without a record, by id: the node and since when. */
  private readonly orphanSince = new Map<string, { node: string; since: number }>();
  /** Records each node held at its last reconcile (what a pass's share is measured by). */
  private readonly recordsOn = new Map<string, number>();
  /** Where the next pass's share of the nodes starts. */
  private nextNode = 0;
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
   * One pass; errors are logged, never thrown. The pass's share of the nodes (all of them while
   * they hold at most `reconcileRowsPerPass` records, else the next ones in turn up to that many)
   * is asked first (all at once) and their records are read once after: a record is written
   * before its sandbox is created, so everything a node reported is known by then, and a
   * sandbox created meanwhile is never taken for an orphan. Expiry reads only the records whose
   * lifetime ended. A pass so costs about the same whatever the number of sandboxes.
   */
  async pass(): Promise<void> {
    const log = this.o.log ?? (() => undefined);
    try {
      const all = this.target.nodes();
      const nodes = this.share(all);
      const answers = await Promise.all(nodes.map((node) => this.ask(node, log)));
      const now = Date.now();
      const byNode = new Map<string, WatchedSandbox[]>(nodes.map((n) => [n.name, []]));
      for (const s of nodes.length ? await this.target.sandboxes(nodes.map((n) => n.name)) : []) byNode.get(s.node)?.push(s);
      for (const [i, node] of nodes.entries()) {
        const records = byNode.get(node.name) ?? [];
        this.recordsOn.set(node.name, records.length);
        const running = answers[i];
        if (running) await this.reconcile(node, running, records, log);
      }
      await this.expire(await this.target.expired(new Date(now).toISOString()), now, log);
      await this.target.leases?.().catch((err: unknown) => log(`watcher: lease pass failed: ${(err as Error).message}`));
      if (now - this.lastGc >= (this.o.gcIntervalMs ?? DEFAULT_GC_INTERVAL_MS)) {
        this.lastGc = now;
        // Every node, not this pass's share: a share that comes round in step with the interval
        // would leave the other nodes' leftovers for ever.
        for (const node of all) {
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

  /**
   * The nodes this pass reconciles: from where the last share ended, whole nodes until their
   * records (as counted at their last reconcile; a node not seen yet counts none) would pass
   * the bound; at least one, at most all.
   */
  private share(all: WatchedNode[]): WatchedNode[] {
    const names = new Set(all.map((n) => n.name));
    for (const name of this.recordsOn.keys()) if (!names.has(name)) this.recordsOn.delete(name);
    for (const seen of [this.missingSince, this.orphanSince]) for (const [id, m] of seen) if (!names.has(m.node)) seen.delete(id);
    const bound = this.o.reconcileRowsPerPass ?? DEFAULT_RECONCILE_ROWS_PER_PASS;
    const out: WatchedNode[] = [];
    let rows = 0;
    for (let i = 0; i < all.length; i++) {
      const node = all[(this.nextNode + i) % all.length]!;
      const n = this.recordsOn.get(node.name) ?? 0;
      if (out.length > 0 && rows + n > bound) break;
      out.push(node);
      rows += n;
    }
    this.nextNode = all.length ? (this.nextNode + out.length) % all.length : 0;
    return out;
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
   * Ends the sandboxes past their lifetime, `expired` (lease.exceeded once per lifetime: a
   * lifetime renewed at a resume raises it again, as the sandbox leaves the expired records);
   * forgets rows that are gone. A sandbox already kept paused is not asked about again on every pass.
   */
  private async expire(expired: readonly WatchedSandbox[], now: number, log: (line: string) => void): Promise<void> {
    const ids = new Set(expired.map((s) => s.id));
    for (const id of this.leaseReported) if (!ids.has(id)) this.leaseReported.delete(id);
    for (const s of expired) {
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

  /**
   * Compares what a node runs with its records: orphans (run, no record) destroyed when seen
   * again after the orphan grace, sandboxes missing too long lost. The records were read after
   * the node answered, so a sandbox whose record came during the grace is known by now and kept.
   */
  private async reconcile(node: WatchedNode, running: Set<string>, records: readonly WatchedSandbox[], log: (line: string) => void): Promise<void> {
    const known = new Set(records.map((s) => s.id));
    for (const [id, m] of this.missingSince) if (m.node === node.name && !known.has(id)) this.missingSince.delete(id);
    for (const [id, m] of this.orphanSince) if (m.node === node.name && (known.has(id) || !running.has(id))) this.orphanSince.delete(id);
    const now = Date.now();
    for (const id of running) {
      if (known.has(id)) continue;
      const since = this.orphanSince.get(id)?.since ?? now;
      this.orphanSince.set(id, { node: node.name, since });
      if (now - since < (this.o.orphanGraceMs ?? DEFAULT_ORPHAN_GRACE_MS)) continue;
      log(`watcher: destroying ${id} on ${node.name}: it has run without a record for ${now - since} ms`);
      await node.destroyOrphan(id).then(
        () => this.orphanSince.delete(id),
        (err: unknown) => log(`watcher: orphan ${id}: ${(err as Error).message}`),
      );
    }
    for (const s of records) {
      if ((s.state !== 'running' && s.state !== 'paused') || running.has(s.id)) {
        this.missingSince.delete(s.id);
        continue;
      }
      const since = this.missingSince.get(s.id)?.since ?? now;
      this.missingSince.set(s.id, { node: node.name, since });
      if (now - since >= (this.o.lostAfterMs ?? DEFAULT_LOST_AFTER_MS)) {
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
