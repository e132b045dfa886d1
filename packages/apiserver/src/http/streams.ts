// ndjson responses: events pulled one at a time, so that a slow HTTP client back-pressures the
// producer (a command's output) instead of filling the server's memory.
/** An ndjson HTTP response from events; a reader that leaves runs `onCancel`. */
export function ndjsonResponse(events: AsyncIterable<object>, onCancel: () => void = () => undefined, status = 200): Response {
  const encoder = new TextEncoder();
  const it = events[Symbol.asyncIterator]();
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      const next = await it.next();
      if (next.done) controller.close();
      else controller.enqueue(encoder.encode(JSON.stringify(next.value) + '\n'));
    },
    cancel() {
      onCancel();
      void it.return?.(undefined);
    },
  });
  return new Response(body, { status, headers: { 'content-type': 'application/x-ndjson', 'cache-control': 'no-store' } });
}

/** A queue of events written by a producer and read by one consumer as they come. */
export class AsyncQueue<T> implements AsyncIterable<T> {
  private readonly items: T[] = [];
  private wake: (() => void) | undefined;
  private closed = false;

  /** Adds an event. */
  push(item: T): void {
    this.items.push(item);
    this.wake?.();
  }

  /** No more events: the reader ends after the ones queued. */
  end(): void {
    this.closed = true;
    this.wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    for (;;) {
      const item = this.items.shift();
      if (item !== undefined) {
        yield item;
        continue;
      }
      if (this.closed) return;
      await new Promise<void>((r) => (this.wake = r));
      this.wake = undefined;
    }
  }
}
