// A small async queue: producers push, one consumer iterates; end() or fail() finishes it.

/** An unbounded single-consumer async queue. */
export class PushQueue<T> implements AsyncIterable<T> {
  #items: T[] = [];
  #waiter: ((r: IteratorResult<T>) => void) | undefined;
  #failWaiter: ((err: unknown) => void) | undefined;
  #ended = false;
  /** What `fail` was given (rejected as it is: the queue never wraps it). */
  #error: Error = new Error('queue failed');
  #hasError = false;

  /** Number of items not yet taken. */
  get length(): number {
    return this.#items.length;
  }

  /** Adds an item (ignored once ended). */
  push(item: T): void {
    if (this.#ended) return;
    const w = this.#waiter;
    if (w) {
      this.#waiter = undefined;
      this.#failWaiter = undefined;
      w({ value: item, done: false });
    } else this.#items.push(item);
  }

  /** Drops the oldest item, returning it. */
  shift(): T | undefined {
    return this.#items.shift();
  }

  /** Ends the queue after the items already in it. */
  end(): void {
    if (this.#ended) return;
    this.#ended = true;
    const w = this.#waiter;
    this.#waiter = undefined;
    this.#failWaiter = undefined;
    w?.({ value: undefined, done: true });
  }

  /** Ends the queue with an error, thrown after the items already in it. */
  fail(err: unknown): void {
    if (this.#ended) return;
    this.#ended = true;
    this.#hasError = true;
    this.#error = err as Error;
    const f = this.#failWaiter;
    this.#waiter = undefined;
    this.#failWaiter = undefined;
    f?.(err);
  }

  /** Takes the next item; resolves done once ended and empty. */
  next(): Promise<IteratorResult<T>> {
    if (this.#items.length > 0) return Promise.resolve({ value: this.#items.shift() as T, done: false });
    if (this.#ended) return this.#hasError ? Promise.reject(this.#error) : Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve, reject) => {
      this.#waiter = resolve;
      this.#failWaiter = reject;
    });
  }

  [Symbol.asyncIterator](): AsyncIterator<T> {
    return {
      next: () => this.next(),
      return: async () => {
        this.end();
        this.#items = [];
        return { value: undefined, done: true };
      },
    };
  }
}
