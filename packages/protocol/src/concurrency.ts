// Three shapes of "not everything at once": a bounded number of tasks in flight (over a list, or
// across callers through a semaphore), and tasks of one key run one after another.

/**
 * Runs `task` for every item with at most `limit` in flight, in item order. `stop` is asked
 * before each item is taken: once it says true, no further item starts (those in flight finish).
 */
export async function forEachBounded<T>(
  items: readonly T[],
  limit: number,
  task: (item: T, index: number) => Promise<void>,
  stop: () => boolean = () => false,
): Promise<void> {
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < items.length && !stop()) {
      const i = next++;
      await task(items[i] as T, i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(Math.max(1, limit), items.length) }, worker));
}

/** Runs tasks of one key strictly one after another (a failed task does not stop the next). */
export class KeyedSerialQueue {
  private readonly tails = new Map<string, Promise<unknown>>();

  /** Runs `fn` once every earlier task of `key` has settled. */
  run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.tails.get(key) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const tail = next.catch(() => undefined);
    this.tails.set(key, tail);
    void tail.then(() => {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    });
    return next;
  }

  /** The last task of `key` still queued or running, if any (settles, never rejects). */
  pending(key: string): Promise<unknown> | undefined {
    return this.tails.get(key);
  }

  /** Settles when every task of `key` queued so far has settled. */
  async idle(key: string): Promise<void> {
    await this.tails.get(key);
  }
}

/** A counting semaphore: at most `limit` of the functions given to {@link run} run at once, the rest wait in order. */
export class Limiter {
  private active = 0;
  private readonly queue: Array<() => void> = [];
  constructor(private readonly limit: number) {}
  async run<T>(fn: () => Promise<T>): Promise<T> {
    if (this.active >= this.limit) await new Promise<void>((r) => this.queue.push(r));
    else this.active++;
    try {
      return await fn();
    } finally {
      const next = this.queue.shift();
      if (next) next();
      else this.active--;
    }
  }
}
