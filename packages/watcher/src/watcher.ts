// The watcher: polls nodes for health, destroys sandboxes whose lifetime has elapsed, enforces
// leases (idle timeouts, lost owners), and reconciles the control plane's records with what the nodes actually run (orphans on a node
// are destroyed; records whose sandbox vanished are marked lost).

/** Default interval between two passes. */
export const DEFAULT_WATCH_INTERVAL_MS = 1000;

/** A sandbox as the control plane records it. */
export interface WatchedSandbox {
  id: string;
  node: string;
  state: string;
  expiresAt: string;
}

/** What the watcher needs of a node. */
export interface WatchedNode {
  name: string;
  /** Ids of the sandboxes the node runs; rejects when the node is unreachable. */
  sandboxIds(): Promise<string[]>;
  /** Destroys a sandbox the control plane does not know. */
  destroyOrphan(id: string): Promise<void>;
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
}

/** Options of {@link Watcher}. */
export interface WatcherOptions {
  intervalMs?: number;
  log?: (line: string) => void;
  /** A sandbox must be missing this long before it is marked lost (creation races). */
  lostAfterMs?: number;
}

/** Periodic health, expiry and garbage collection. */
export class Watcher {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private readonly missingSince = new Map<string, number>();

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

  /** One pass; errors are logged, never thrown. */
  async pass(): Promise<void> {
    const log = this.o.log ?? (() => undefined);
    try {
      const now = Date.now();
      for (const s of await this.target.sandboxes()) {
        if (s.state !== 'creating' && Date.parse(s.expiresAt) <= now) {
          await this.target.expire(s.id).catch((err: unknown) => log(`watcher: expiring ${s.id} failed: ${(err as Error).message}`));
        }
      }
      await this.target.leases?.().catch((err: unknown) => log(`watcher: lease pass failed: ${(err as Error).message}`));
      for (const node of this.target.nodes()) await this.reconcile(node, log);
    } catch (err) {
      log(`watcher: pass failed: ${(err as Error).message}`);
    }
  }

  /**
   * Compares a node with the records. The node is asked first and the records read after: a
   * record is written before its sandbox is created, so everything the node reported is known
   * by then, and a sandbox created meanwhile is never taken for an orphan.
   */
  private async reconcile(node: WatchedNode, log: (line: string) => void): Promise<void> {
    let running: Set<string>;
    try {
      running = new Set(await node.sandboxIds());
      this.target.setNodeHealthy(node.name, true);
    } catch (err) {
      this.target.setNodeHealthy(node.name, false);
      log(`watcher: node ${node.name} unreachable: ${(err as Error).message}`);
      return;
    }
    const records = (await this.target.sandboxes()).filter((s) => s.node === node.name);
    const known = new Set(records.map((s) => s.id));
    for (const id of running) {
      if (!known.has(id)) await node.destroyOrphan(id).catch((err: unknown) => log(`watcher: orphan ${id}: ${(err as Error).message}`));
    }
    const now = Date.now();
    for (const s of records) {
      // Paused sandboxes are on their node too (frozen); one that vanished is lost as well.
      if ((s.state !== 'running' && s.state !== 'paused') || running.has(s.id)) {
        this.missingSince.delete(s.id);
        continue;
      }
      const since = this.missingSince.get(s.id) ?? now;
      this.missingSince.set(s.id, since);
      if (now - since >= (this.o.lostAfterMs ?? 5000)) {
        this.missingSince.delete(s.id);
        await this.target.markLost(s.id).catch(() => undefined);
      }
    }
  }
}
