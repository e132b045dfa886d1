// Idempotency keys on create. The first request with a key holds it (`pending`) while it runs
// and records its sandbox (`done`); a retry with the same key and the same request gets that
// sandbox, waiting while the first still runs; the same key with another request is refused.
// Keys live in the state store, scoped to a project, for a TTL.
import { createHash } from 'node:crypto';
import { DEFAULT_IDEMPOTENCY_TTL_MS, DsecError, IDEMPOTENCY_KEY_HEADER } from '@dsec/protocol';
import type { IdempotencyKeyTable } from './db/schema.js';
import type { StateStore } from './db/store.js';

/**
 * A pending key older than this belongs to a request that died with its server (ms): well past
 * the longest admission wait (10 min) plus a create.
 */
export const IDEMPOTENCY_PENDING_STALE_MS = 1_800_000;
/** How often a retry looks again at a key another server holds (ms). */
export const IDEMPOTENCY_POLL_MS = 100;
/** How often expired keys are purged (ms). */
const PURGE_INTERVAL_MS = 60_000;

/** JSON with object keys sorted, so that equal requests hash equally. */
export function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  if (value !== null && typeof value === 'object') {
    const entries = Object.entries(value as Record<string, unknown>)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(',')}}`;
  }
  return JSON.stringify(value);
}

/** sha256 of a value's canonical JSON. */
export function hashOf(value: unknown): string {
  return createHash('sha256').update(canonicalJson(value)).digest('hex');
}

/** What a key holds when this caller is not the first to use it. */
export type HeldKey = { owned: true } | { owned: false; row: IdempotencyKeyTable } | { owned: false; pending: true };

/** The idempotency keys of every project. */
export class IdempotencyKeys {
  /** In-process wake-ups of retries waiting on a pending key. */
  private readonly wakers = new Map<string, Set<() => void>>();
  private lastPurge = 0;

  constructor(
    private readonly store: StateStore,
    readonly ttlMs = DEFAULT_IDEMPOTENCY_TTL_MS,
  ) {}

  /**
   * Takes the key for a request, or returns the finished row of the request that took it
   * first. Waits while that request is still running; IDEMPOTENCY_KEY_REUSED when the key was
   * used with a different request.
   */
  async acquire(
    projectId: string,
    key: string,
    requestHash: string,
    signal?: AbortSignal,
  ): Promise<{ owned: true } | { owned: false; row: IdempotencyKeyTable }> {
    for (;;) {
      const held = await this.tryAcquire(projectId, key, requestHash);
      if (!('pending' in held)) return held;
      await this.waitFor(projectId, key, signal);
    }
  }

  /** Like {@link acquire}, but answers `pending` instead of waiting. */
  async tryAcquire(projectId: string, key: string, requestHash: string): Promise<HeldKey> {
    await this.purgeNowAndThen();
    for (;;) {
      const got = await this.store.acquireIdempotencyKey({ projectId, key, requestHash, ttlMs: this.ttlMs });
      if (got.owned) return got;
      const row = got.row;
      if (row.request_hash !== requestHash) {
        throw new DsecError('IDEMPOTENCY_KEY_REUSED', `${IDEMPOTENCY_KEY_HEADER} ${key} was already used with a different request`, {
          field: IDEMPOTENCY_KEY_HEADER,
        });
      }
      if (row.state === 'done') return { owned: false, row };
      if (Date.now() - Date.parse(row.created_at) < IDEMPOTENCY_PENDING_STALE_MS) return { owned: false, pending: true };
      // The request that held it never finished (its server stopped): a key whose sandbox stands
      // is done with it, any other is taken over.
      await this.store.settlePendingIdempotencyKeys(new Date(Date.now() - IDEMPOTENCY_PENDING_STALE_MS + 1).toISOString());
    }
  }

  /** Records the sandbox a held key created (or, for a batch's own key, nothing). */
  async complete(projectId: string, key: string, sandbox: { id: string } | null): Promise<void> {
    await this.store.completeIdempotencyKey(projectId, key, sandbox?.id ?? null, sandbox ? JSON.stringify(sandbox) : null);
    this.wake(projectId, key);
  }

  /** Lets go of a held key after its request failed: a retry runs the request again. */
  async release(projectId: string, key: string): Promise<void> {
    await this.store.releaseIdempotencyKey(projectId, key);
    this.wake(projectId, key);
  }

  private wake(projectId: string, key: string): void {
    const id = `${projectId}\n${key}`;
    const set = this.wakers.get(id);
    this.wakers.delete(id);
    for (const w of set ?? []) w();
  }

  /** Resolves when the key changes in this process, or after a poll interval (another server). */
  private waitFor(projectId: string, key: string, signal?: AbortSignal): Promise<void> {
    signal?.throwIfAborted();
    const id = `${projectId}\n${key}`;
    return new Promise<void>((resolve, reject) => {
      const set = this.wakers.get(id) ?? this.wakers.set(id, new Set()).get(id)!;
      const finish = (err?: DsecError): void => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        set.delete(wake);
        if (set.size === 0 && this.wakers.get(id) === set) this.wakers.delete(id);
        if (err) reject(err);
        else resolve();
      };
      const wake = (): void => finish();
      const onAbort = (): void => finish(new DsecError('CANCELLED', 'the request was cancelled while waiting for an earlier request with its idempotency key'));
      const timer = setTimeout(wake, IDEMPOTENCY_POLL_MS);
      set.add(wake);
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  private async purgeNowAndThen(): Promise<void> {
    const now = Date.now();
    if (now - this.lastPurge < PURGE_INTERVAL_MS) return;
    this.lastPurge = now;
    await this.store.purgeIdempotencyKeys(new Date(now).toISOString());
  }
}
