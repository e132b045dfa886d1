// ndjson responses: events pulled one at a time, so that a slow HTTP client back-pressures the
// producer (a command's output) instead of filling the server's memory.
import { EXEC_FRAMES_MEDIA_TYPE, encodeExecFrame } from '@dsec/protocol';
import type { ExecStreamEvent } from '@dsec/protocol';
import type { Principal } from '../auth.js';
import { jsonEvent } from '../services/commands.js';
import { STREAM_REPLICA } from '../tenant-limits.js';
import type { TenantSlots } from '../tenant-limits.js';

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

/**
 * Opens a live stream in one of its tenant's stream slots (`limits.streamsPerTenant`, and
 * `limits.streamsPerReplica` for every tenant together: 429 LIMIT_EXCEEDED past either). The slot
 * is held until the response's body ends, its reader leaves, or the request is aborted; `open`
 * refusing (throwing) gives it back at once.
 */
export async function liveStream(
  slots: TenantSlots,
  p: Pick<Principal, 'tenantId'>,
  request: AbortSignal,
  open: () => Promise<Response> | Response,
): Promise<Response> {
  const release = slots.acquire('stream', p.tenantId, STREAM_REPLICA);
  let res: Response;
  try {
    res = await open();
  } catch (err) {
    release();
    throw err;
  }
  if (!res.body) {
    release();
    return res;
  }
  request.addEventListener('abort', release, { once: true });
  const done = (): void => {
    request.removeEventListener('abort', release);
    release();
  };
  const reader = res.body.getReader();
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      try {
        const next = await reader.read();
        if (next.done) {
          done();
          controller.close();
        } else controller.enqueue(next.value as Uint8Array);
      } catch (err) {
        done();
        controller.error(err);
      }
    },
    async cancel(reason) {
      done();
      await reader.cancel(reason).catch(() => undefined);
    },
  });
  return new Response(body, { status: res.status, headers: res.headers });
}

/**
 * A stream of samples that runs until its reader leaves (or the request is aborted), in one of
 * the tenant's stream slots (`liveStream`): `open` gets a signal that aborts then, and refuses
 * (throws) before anything is sent.
 */
export async function usageStreamResponse(
  slots: TenantSlots,
  p: Pick<Principal, 'tenantId'>,
  request: AbortSignal,
  open: (signal: AbortSignal) => Promise<AsyncIterable<object>> | AsyncIterable<object>,
): Promise<Response> {
  return liveStream(slots, p, request, async () => {
    const ctl = new AbortController();
    const stop = (): void => ctl.abort();
    request.addEventListener('abort', stop, { once: true });
    let samples: AsyncIterable<object>;
    try {
      samples = await open(ctl.signal);
    } catch (err) {
      request.removeEventListener('abort', stop);
      throw err;
    }
    return ndjsonResponse(samples, () => {
      request.removeEventListener('abort', stop);
      stop();
    });
  });
}

/**
 * An exec's events as a binary frame stream (`application/vnd.dsec.exec-frames`): output bytes
 * as they are. Pulled one event at a time, like the ndjson form.
 */
export function execFramesResponse(events: AsyncIterable<ExecStreamEvent>, onCancel: () => void = () => undefined, status = 200): Response {
  const it = events[Symbol.asyncIterator]();
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      const next = await it.next();
      if (next.done) controller.close();
      else for (const piece of encodeExecFrame(next.value)) controller.enqueue(piece);
    },
    cancel() {
      onCancel();
      void it.return?.(undefined);
    },
  });
  return new Response(body, { status, headers: { 'content-type': EXEC_FRAMES_MEDIA_TYPE, 'cache-control': 'no-store' } });
}

/** An exec's events in the form the client asked for: binary frames, or ndjson (base64 output). */
export function execStreamResponse(accept: string | undefined, events: AsyncIterable<ExecStreamEvent>, onCancel: () => void = () => undefined): Response {
  if (wantsExecFrames(accept)) return execFramesResponse(events, onCancel);
  return ndjsonResponse(mapEvents(events, jsonEvent), onCancel);
}

/** True when an Accept header asks for the binary exec stream. */
export function wantsExecFrames(accept: string | undefined): boolean {
  return (accept ?? '').includes(EXEC_FRAMES_MEDIA_TYPE);
}

async function* mapEvents<T, U>(events: AsyncIterable<T>, fn: (ev: T) => U): AsyncGenerator<U> {
  for await (const ev of events) yield fn(ev);
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
