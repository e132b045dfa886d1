// ndjson responses: events pulled one at a time, so that a slow HTTP client back-pressures the
// producer (a command's output) instead of filling the server's memory.
import { EXEC_FRAMES_MEDIA_TYPE, encodeExecFrame } from '@dsec/protocol';
import type { ExecStreamEvent } from '@dsec/protocol';
import { DsecError } from '@dsec/protocol';
import type { Context } from 'hono';
import type { Principal } from '../auth.js';
import { ROOT_PROJECT_ID } from '../db/store.js';
import { toDsecError } from '../errors.js';
import { jsonEvent } from '../services/commands.js';
import type { Env } from './env.js';
import { STREAM_REPLICA } from '../tenant-limits.js';
import type { TenantSlots } from '../tenant-limits.js';
import { requestHeader, requestSignal } from './validate.js';

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

/** The media type of a followed answer (`Accept`): the answer now, then again each time it changes. */
export const FOLLOW_MEDIA_TYPE = 'application/vnd.dsec.follow+ndjson';

/** True when a request asks to follow its answer ({@link FOLLOW_MEDIA_TYPE}). */
export function wantsFollow(accept: string | undefined): boolean {
  return (accept ?? '').includes(FOLLOW_MEDIA_TYPE);
}

/**
 * The answer of a GET: as JSON, or followed ({@link LiveStreams.follow}) when the request asks
 * for {@link FOLLOW_MEDIA_TYPE}.
 */
export async function followOr<E extends Env>(c: Context<E>, streams: LiveStreams, load: () => Promise<object>): Promise<Response> {
  if (wantsFollow(requestHeader(c, 'accept'))) return streams.follow(c.get('principal'), requestSignal(c), load);
  return c.json(await load());
}

/** Options of {@link LiveStreams}. */
export interface LiveStreamOptions {
  /** How often every open stream's principal is checked again, besides after each key or project change (ms). */
  recheckMs?: number;
  /** How often a followed answer is read again when no write was seen here (changes made elsewhere) (ms). */
  followMs?: number;
  /** How long after a write here followed answers are read again (writes come in bursts) (ms). */
  settleMs?: number;
}

/** Default of {@link LiveStreamOptions.recheckMs}. */
export const DEFAULT_STREAM_RECHECK_MS = 10_000;
/** Default of {@link LiveStreamOptions.followMs}. */
export const DEFAULT_FOLLOW_MS = 5000;
/** Default of {@link LiveStreamOptions.settleMs}. */
export const DEFAULT_FOLLOW_SETTLE_MS = 150;

interface OpenStream {
  p: Principal;
  /** Ends the stream with a final message naming `err`. */
  end: (err: DsecError) => void;
}

/**
 * The live streams of this replica (events, usage samples, followed answers). Each holds one of
 * its tenant's stream slots (`limits.streamsPerTenant`, and `limits.streamsPerReplica` for every
 * tenant together: 429 LIMIT_EXCEEDED past either) until its body ends, its reader leaves or the
 * request is aborted. Each keeps its principal under watch: when a key is revoked or a project
 * changes (`recheckNow`, called by the authenticator when it forgets its cache, here or on
 * another replica) and every `recheckMs` besides, the principal is checked again, and a stream
 * whose key no longer authenticates ends with a final message (an SSE `ended` event, or an
 * ndjson line `{at, error}`) instead of running on with the rights it opened with.
 */
export class LiveStreams {
  private readonly streams = new Set<OpenStream>();
  private timer: NodeJS.Timeout | undefined;
  private checking = false;
  private again = false;
  /** Followed answers waiting for a change, each with its tenant. */
  private readonly waiters = new Map<() => void, string>();
  /** Tenants written to since the last wake-up (`*`: every tenant). */
  private readonly touched = new Set<string>();
  private settle: NodeJS.Timeout | undefined;
  /** Set by close(): no timer is started again (streams still open, or opened later, run unwatched until they end). */
  private closed = false;

  constructor(
    readonly slots: TenantSlots,
    private readonly check: (p: Principal) => Promise<void>,
    private readonly o: LiveStreamOptions = {},
  ) {}

  /** Live streams open now. */
  get size(): number {
    return this.streams.size;
  }

  /** Checks every open stream's principal again now (a key was revoked, a project changed). */
  recheckNow(): void {
    if (this.checking) {
      this.again = true;
      return;
    }
    if (this.streams.size === 0) return;
    this.checking = true;
    void this.recheck().finally(() => {
      this.checking = false;
      if (this.again) {
        this.again = false;
        this.recheckNow();
      }
    });
  }

  private async recheck(): Promise<void> {
    // One check per key and project, however many streams it holds.
    const byPrincipal = new Map<string, OpenStream[]>();
    for (const s of this.streams) {
      const k = `${s.p.keyId}\0${s.p.projectId}`;
      (byPrincipal.get(k) ?? byPrincipal.set(k, []).get(k)!).push(s);
    }
    for (const group of byPrincipal.values()) {
      try {
        await this.check(group[0]!.p);
      } catch (err) {
        // Only a refusal ends a stream; a store that did not answer is tried again next time.
        if (err instanceof DsecError && (err.code === 'UNAUTHENTICATED' || err.code === 'PERMISSION_DENIED')) for (const s of group) s.end(err);
      }
    }
  }

  /**
   * A write was served here: followed answers of its tenant are read again (once, shortly
   * after). A write by the root project's keys (operators, who reach every tenant) or by no
   * principal wakes every tenant's.
   */
  changed(tenantId?: string): void {
    if (this.closed) return;
    this.touched.add(tenantId === undefined || tenantId === ROOT_PROJECT_ID ? '*' : tenantId);
    this.settle ??= setTimeout(() => {
      this.settle = undefined;
      const all = this.touched.has('*');
      const tenants = new Set(this.touched);
      this.touched.clear();
      for (const [wake, tenant] of [...this.waiters]) if (all || tenants.has(tenant)) wake();
    }, this.o.settleMs ?? DEFAULT_FOLLOW_SETTLE_MS);
  }

  /** Waits for a write here by `tenantId` (or the root project), `ms`, or `signal`, whichever comes first. */
  private nextChange(tenantId: string, ms: number, signal: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      if (signal.aborted) return resolve();
      const done = (): void => {
        clearTimeout(timer);
        this.waiters.delete(done);
        signal.removeEventListener('abort', done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.waiters.set(done, tenantId);
      signal.addEventListener('abort', done, { once: true });
    });
  }

  /** Stops the periodic re-check and the reads after writes for good (the server is closing). */
  close(): void {
    this.closed = true;
    clearInterval(this.timer);
    this.timer = undefined;
    clearTimeout(this.settle);
    this.settle = undefined;
  }

  private watch(s: OpenStream): () => void {
    this.streams.add(s);
    if (!this.timer && !this.closed) {
      this.timer = setInterval(() => this.recheckNow(), this.o.recheckMs ?? DEFAULT_STREAM_RECHECK_MS);
      this.timer.unref();
    }
    return () => {
      this.streams.delete(s);
      if (this.streams.size === 0) {
        clearInterval(this.timer);
        this.timer = undefined;
      }
    };
  }

  /**
   * Opens a live stream in one of the tenant's stream slots, under watch of its principal.
   * `open` refusing (throwing) gives the slot back at once.
   */
  async open(p: Principal, request: AbortSignal, open: () => Promise<Response> | Response): Promise<Response> {
    const release = this.slots.acquire('stream', p.tenantId, STREAM_REPLICA);
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
    const sse = (res.headers.get('content-type') ?? '').startsWith('text/event-stream');
    const reader = res.body.getReader();
    let finished = false;
    const finish = (): void => {
      if (finished) return;
      finished = true;
      request.removeEventListener('abort', release);
      unwatch();
      release();
    };
    let ctl!: ReadableStreamDefaultController<Uint8Array>;
    // Each pull awaits only the source's next chunk (a race against a promise that settles only
    // on revocation would keep every chunk ever sent reachable from that promise).
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        ctl = controller;
      },
      async pull(controller) {
        try {
          const next = await reader.read();
          if (finished) return;
          if (next.done) {
            finish();
            controller.close();
          } else controller.enqueue(next.value as Uint8Array);
        } catch (err) {
          if (finished) return;
          finish();
          controller.error(err);
        }
      },
      async cancel(reason) {
        finish();
        await reader.cancel(reason).catch(() => undefined);
      },
    });
    const unwatch = this.watch({
      p,
      end: (err) => {
        if (finished) return;
        // The principal no longer holds: a last message, and the stream ends.
        finish();
        ctl.enqueue(finalMessage(sse, err));
        ctl.close();
        void reader.cancel().catch(() => undefined);
      },
    });
    request.addEventListener('abort', release, { once: true });
    return new Response(body, { status: res.status, headers: res.headers });
  }

  /**
   * A stream of samples that runs until its reader leaves (or the request is aborted), in a
   * stream slot ({@link open}): `open` gets a signal that aborts then, and refuses (throws)
   * before anything is sent.
   */
  async samples(p: Principal, request: AbortSignal, open: (signal: AbortSignal) => Promise<AsyncIterable<object>> | AsyncIterable<object>): Promise<Response> {
    return this.open(p, request, async () => {
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
   * A followed answer ({@link FOLLOW_MEDIA_TYPE}): `{at, value}` with what `load` answers now
   * (a refusal is a plain error reply), then a new line each time its answer changes. It is read
   * again shortly after each write its tenant (or the root project) makes here, and every `followMs` for changes made elsewhere
   * (another replica, the platform's own work); a line is sent only when the answer differs. A
   * read that fails ends the stream with `{at, error}`.
   */
  async follow(p: Principal, request: AbortSignal, load: () => Promise<unknown>): Promise<Response> {
    const first = await load();
    const every = this.o.followMs ?? DEFAULT_FOLLOW_MS;
    const nextChange = (signal: AbortSignal): Promise<void> => this.nextChange(p.tenantId, every, signal);
    return this.samples(p, request, (signal) => followed(first, load, nextChange, signal));
  }
}

async function* followed(
  first: unknown,
  load: () => Promise<unknown>,
  nextChange: (signal: AbortSignal) => Promise<void>,
  signal: AbortSignal,
): AsyncGenerator<object> {
  let last = JSON.stringify(first);
  yield { at: new Date().toISOString(), value: first };
  while (!signal.aborted) {
    await nextChange(signal);
    if (signal.aborted) return;
    let value: unknown;
    try {
      value = await load();
    } catch (err) {
      const e = toDsecError(err);
      yield { at: new Date().toISOString(), error: { code: e.code, message: e.message } };
      return;
    }
    const text = JSON.stringify(value);
    if (text === last) continue;
    last = text;
    yield { at: new Date().toISOString(), value };
  }
}

/** The last message of a stream whose principal no longer holds. */
function finalMessage(sse: boolean, err: DsecError): Uint8Array {
  const error = { code: err.code, message: `${err.message}: this stream has ended` };
  const text = sse ? `event: ended\ndata: ${JSON.stringify({ error })}\n\n` : `${JSON.stringify({ at: new Date().toISOString(), error })}\n`;
  return new TextEncoder().encode(text);
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
