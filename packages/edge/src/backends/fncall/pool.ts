// A pool of pre-created sandboxes of one kind, sized by load: each claim takes one sandbox for
// exactly one call, and the pool refills in the background.
import { DsecError } from '@dsec/protocol';

/** Idle sandboxes a pool keeps at least (once it has been used). */
export const DEFAULT_POOL_MIN = 1;
/** Idle sandboxes a pool keeps at most. */
export const DEFAULT_POOL_MAX = 32;
/** How often a pool reconsiders its size. */
export const POOL_RESIZE_INTERVAL_MS = 2_000;
/** Pause after a failed create before the pool tries again. */
const CREATE_BACKOFF_MS = 1_000;

/** How a pool makes and disposes of its items. */
export interface PoolHooks<T> {
  create(): Promise<T>;
  /** Disposes of an item in the background (the pool does not wait). */
  discard(item: T): void;
  /** False for an idle item that died while waiting (it is discarded, not handed out). */
  healthy(item: T): boolean;
}

/** Options of {@link WarmPool}. */
export interface WarmPoolOptions {
  min?: number;
  max?: number;
}

interface Waiter<T> {
  resolve(item: T): void;
  reject(err: Error): void;
}

/**
 * Pre-created items of one kind. Sizing: the target starts at `min`, doubles (up to `max`)
 * whenever a claim finds no idle item, and halves after an interval without such a miss; idle
 * items above the target are discarded.
 */
export class WarmPool<T> {
  private readonly idle: T[] = [];
  private readonly waiters: Array<Waiter<T>> = [];
  private creating = 0;
  /** Items being reset to come back ({@link recycle}): counted as supply by refills. */
  private returning = 0;
  private target: number;
  private missed = false;
  private closed = false;
  private backoffUntil = 0;
  private lastClaimAt = Date.now();
  private readonly min: number;
  private readonly max: number;
  private readonly timer: NodeJS.Timeout;
  private readonly inflight = new Set<Promise<void>>();

  constructor(
    private readonly hooks: PoolHooks<T>,
    opts: WarmPoolOptions = {},
  ) {
    this.min = opts.min ?? DEFAULT_POOL_MIN;
    this.max = Math.max(this.min, opts.max ?? DEFAULT_POOL_MAX);
    this.target = this.min;
    this.timer = setInterval(() => this.resize(), POOL_RESIZE_INTERVAL_MS);
    this.timer.unref();
  }

  /** Idle items ready to hand out. */
  get size(): number {
    return this.idle.length;
  }

  /** Milliseconds since the last claim. */
  get idleMs(): number {
    return Date.now() - this.lastClaimAt;
  }

  /** Takes one item for one use; waits for the next one made when none is idle. */
  claim(signal?: AbortSignal): Promise<T> {
    if (this.closed) return Promise.reject(new DsecError('UNAVAILABLE', 'the call pool is closed'));
    this.lastClaimAt = Date.now();
    for (let item = this.idle.pop(); item !== undefined; item = this.idle.pop()) {
      if (this.hooks.healthy(item)) {
        this.refill();
        return Promise.resolve(item);
      }
      this.hooks.discard(item);
    }
    if (!this.missed) {
      this.missed = true;
      this.target = Math.min(this.max, Math.max(2, this.target * 2));
    }
    return new Promise<T>((resolve, reject) => {
      const waiter: Waiter<T> = {
        resolve: (item) => {
          signal?.removeEventListener('abort', onAbort);
          resolve(item);
        },
        reject: (err) => {
          signal?.removeEventListener('abort', onAbort);
          reject(err);
        },
      };
      const onAbort = (): void => {
        const i = this.waiters.indexOf(waiter);
        if (i >= 0) this.waiters.splice(i, 1);
        reject(signal?.reason instanceof Error ? signal.reason : new DsecError('TIMEOUT', 'call aborted'));
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.waiters.push(waiter);
      this.refill();
    });
  }

  /**
   * Gives a claimed item back once `reset` resolves true (to a waiter, else to the idle list);
   * discards it when `reset` resolves false or fails, or when the pool has closed meanwhile.
   */
  recycle(item: T, reset: () => Promise<boolean>): void {
    this.returning++;
    const p = reset()
      .catch(() => false)
      .then((ok) => {
        this.returning--;
        if (ok) this.deliver(item);
        else this.hooks.discard(item);
        this.refill();
      })
      .finally(() => this.inflight.delete(p));
    this.inflight.add(p);
  }

  private refill(): void {
    if (this.closed) return;
    const wanted = Math.max(0, this.waiters.length + this.target - this.idle.length - this.returning);
    while (this.creating < wanted && Date.now() >= this.backoffUntil) {
      this.creating++;
      const p = this.hooks
        .create()
        .then(
          (item) => this.deliver(item),
          (err: unknown) => {
            this.backoffUntil = Date.now() + CREATE_BACKOFF_MS;
            // A waiter would otherwise wait for the backoff: tell it now.
            this.waiters.shift()?.reject(err instanceof Error ? err : new Error(String(err)));
          },
        )
        .finally(() => {
          this.creating--;
          this.inflight.delete(p);
          if (this.waiters.length > 0 && Date.now() < this.backoffUntil) {
            setTimeout(() => this.refill(), CREATE_BACKOFF_MS).unref();
          }
        });
      this.inflight.add(p);
    }
  }

  private deliver(item: T): void {
    if (this.closed) {
      this.hooks.discard(item);
      return;
    }
    const waiter = this.waiters.shift();
    if (waiter) waiter.resolve(item);
    else this.idle.push(item);
  }

  private resize(): void {
    if (!this.missed) this.target = Math.max(this.min, Math.floor(this.target / 2));
    this.missed = false;
    while (this.idle.length > this.target) {
      const item = this.idle.shift();
      if (item !== undefined) this.hooks.discard(item);
    }
    this.refill();
  }

  /** Discards every idle item and stops refilling; in-flight creates are awaited and discarded. */
  async close(): Promise<void> {
    this.closed = true;
    clearInterval(this.timer);
    for (const w of this.waiters.splice(0)) w.reject(new DsecError('UNAVAILABLE', 'the call pool is closed'));
    await Promise.allSettled([...this.inflight]);
    for (const item of this.idle.splice(0)) this.hooks.discard(item);
  }
}
