// Warm pools, kept full in the background. A pool's members are sandbox rows that name the pool
// (state `pooled`) until a create with the same resolved spec claims one (ControlPlane, one
// transaction). This manager refills pools with bounded concurrency, drops the ready members of
// pools that stay unclaimed past their idle timeout, and removes members whose pool is gone.
import type { PoolTable, SandboxTable } from './db/schema.js';
import type { StateStore } from './db/store.js';
import { publicError } from './errors.js';

/** Interval of the reconciling passes (ms). */
export const POOL_PASS_INTERVAL_MS = 250;
/** Pool members created at once, over all pools (the node has few cores; claims come first). */
export const POOL_REFILL_CONCURRENCY = 2;
/** Wait after a refused refill (quota or capacity full) before the pool tries again (ms). */
export const POOL_REFILL_BACKOFF_MS = 1000;
/**
 * Refills wait until claims pause this long (ms), unless fewer than half of a pool's sandboxes
 * are ready: creating a sandbox costs the node's CPU that a burst of claims is waiting for.
 */
export const POOL_REFILL_QUIET_MS = 50;
/** Row state of a pool's ready, unclaimed sandbox (never returned by the API). */
export const POOLED_STATE = 'pooled';

/** What the pool manager needs of the control plane. */
export interface PoolHost {
  readonly store: StateStore;
  /** Creates one ready member of a pool (quota, placement, node); throws when refused. */
  createPoolMember(pool: PoolTable): Promise<void>;
  /** Destroys a member if it is still ready (not claimed meanwhile). */
  destroyPooled(row: SandboxTable): Promise<void>;
  /** Creates of a project waiting for admission: refills yield to them. */
  waitingAdmissions(projectId: string): number;
}

/** What the manager knows of a pool beyond its rows. */
export interface PoolProgress {
  /** Members being created now. */
  creating: number;
  /** Why the last refill failed, or null. */
  lastError: string | null;
}

/** True when a pool has not been used for its idle timeout. */
export function poolIsIdle(pool: PoolTable, now = Date.now()): boolean {
  return now - Date.parse(pool.last_used_at) > pool.idle_timeout_ms;
}

/** Refills, shrinks and cleans up warm pools. */
export class PoolManager {
  private readonly creating = new Map<string, number>();
  private readonly lastError = new Map<string, string>();
  private readonly backoffUntil = new Map<string, number>();
  private readonly inflight = new Set<Promise<void>>();
  private running = 0;
  private lastClaimAt = 0;
  private quietTimer: NodeJS.Timeout | undefined;
  private timer: NodeJS.Timeout | undefined;
  private passing: Promise<void> | undefined;
  private passAgain = false;
  private stopped = true;

  constructor(
    private readonly host: PoolHost,
    private readonly log: (line: string) => void = () => undefined,
  ) {}

  /** Starts the periodic passes. */
  start(): void {
    if (!this.stopped) return;
    this.stopped = false;
    this.timer = setInterval(() => this.kick(), POOL_PASS_INTERVAL_MS);
    this.timer.unref();
    this.kick();
  }

  /** Stops the passes and waits for the members being created. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    clearTimeout(this.quietTimer);
    this.timer = undefined;
    await this.passing;
    await Promise.allSettled([...this.inflight]);
  }

  /** What the manager knows of a pool. */
  progress(poolId: string): PoolProgress {
    return { creating: this.creating.get(poolId) ?? 0, lastError: this.lastError.get(poolId) ?? null };
  }

  /** A member was claimed: refill once claims pause (or now, for a pool that runs low). */
  claimed(): void {
    this.lastClaimAt = Date.now();
    // The periodic pass refills a pool below half meanwhile.
    if (!this.stopped && !this.quietTimer) this.armQuietTimer(POOL_REFILL_QUIET_MS);
  }

  private armQuietTimer(ms: number): void {
    this.quietTimer = setTimeout(() => {
      this.quietTimer = undefined;
      const left = this.lastClaimAt + POOL_REFILL_QUIET_MS - Date.now();
      if (left > 0 && !this.stopped) this.armQuietTimer(left);
      else this.kick();
    }, ms);
    this.quietTimer.unref();
  }

  /** Runs a pass soon (after a change of configuration, a freed quota). */
  kick(): void {
    if (this.stopped) return;
    if (this.passing) {
      this.passAgain = true;
      return;
    }
    this.passing = this.pass()
      .catch((err: unknown) => this.log(`pools: pass failed: ${(err as Error).message}`))
      .finally(() => {
        this.passing = undefined;
        if (this.passAgain) {
          this.passAgain = false;
          this.kick();
        }
      });
  }

  /** Destroys a pool's ready members now (the pool was deleted or replaced). */
  async drain(poolId: string): Promise<void> {
    for (const row of await this.host.store.pooledMembers(poolId, Number.MAX_SAFE_INTEGER)) await this.destroy(row);
  }

  private async pass(): Promise<void> {
    const store = this.host.store;
    const pools = await store.pools();
    const counts = await store.poolMemberCounts();
    // Ready members of pools that are gone (deleted, or replaced by a new spec).
    const live = new Set(pools.map((p) => p.id));
    for (const [poolId, states] of counts) {
      if (!live.has(poolId) && (states[POOLED_STATE] ?? 0) > 0) await this.drain(poolId);
    }
    const now = Date.now();
    for (const pool of pools) {
      if (this.stopped) return;
      const ready = counts.get(pool.id)?.[POOLED_STATE] ?? 0;
      const target = poolIsIdle(pool, now) ? 0 : pool.size;
      if (ready > target) {
        for (const row of await store.pooledMembers(pool.id, ready - target)) await this.destroy(row);
        continue;
      }
      let missing = target - ready - (this.creating.get(pool.id) ?? 0);
      if (missing <= 0 || (this.backoffUntil.get(pool.id) ?? 0) > now || this.host.waitingAdmissions(pool.project_id) > 0) continue;
      if (now - this.lastClaimAt < POOL_REFILL_QUIET_MS && ready * 2 >= target) continue;
      while (missing-- > 0 && this.running < POOL_REFILL_CONCURRENCY) this.fill(pool);
    }
  }

  private fill(pool: PoolTable): void {
    this.running++;
    this.creating.set(pool.id, (this.creating.get(pool.id) ?? 0) + 1);
    const task = this.host
      .createPoolMember(pool)
      .then(() => {
        this.lastError.delete(pool.id);
      })
      .catch((err: unknown) => {
        // Served in the pool's body: an internal fault's own text stays on the server.
        this.lastError.set(pool.id, publicError(err).message);
        this.backoffUntil.set(pool.id, Date.now() + POOL_REFILL_BACKOFF_MS);
      })
      .finally(() => {
        this.running--;
        const n = (this.creating.get(pool.id) ?? 1) - 1;
        if (n > 0) this.creating.set(pool.id, n);
        else this.creating.delete(pool.id);
        this.inflight.delete(task);
        this.kick();
      });
    this.inflight.add(task);
  }

  private async destroy(row: SandboxTable): Promise<void> {
    // A claim may take it first: the state guard decides, and a lost race is fine.
    await this.host.destroyPooled(row).catch((err: unknown) => this.log(`pools: removing ${row.id}: ${(err as Error).message}`));
  }
}
