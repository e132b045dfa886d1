// Admission control. A create that finds its project's quota or the nodes full is refused at
// once (with Retry-After), or, if its caller chose to wait, queued: FIFO within a project,
// round-robin across projects, bounded, and admitted as capacity frees. Nothing here holds
// capacity itself; an admission is whatever the caller's attempt reserved.
import { DEFAULT_ADMISSION_WAIT_MS, DsecError } from '@dsec/protocol';

/** Most requests waiting at once, over all projects. */
export const MAX_QUEUED_ADMISSIONS = 4096;
/** Most requests of one project waiting at once. */
export const MAX_QUEUED_PER_PROJECT = 1024;
/** How often waiting requests are tried again without a capacity-freed signal (ms). */
export const ADMISSION_RECHECK_MS = 1000;
/** Retry-After of a refusal (ms). */
export const ADMISSION_RETRY_AFTER_MS = 1000;

/** What an attempt reserved; given back when its waiter left before it could be handed over. */
export interface Admitted {
  release(): Promise<void>;
}

/** How one request is admitted. */
export interface AdmitOptions {
  /** Wait in the queue instead of being refused; default false. */
  wait?: boolean | undefined;
  /** Longest wait (ms); default {@link DEFAULT_ADMISSION_WAIT_MS}. */
  timeoutMs?: number | undefined;
  /** The request's signal: a caller that goes away leaves the queue. */
  signal?: AbortSignal | undefined;
}

/** True for refusals that a wait can outlast: the quota or the nodes are full. */
export function isCapacityRefusal(err: unknown): err is DsecError {
  return err instanceof DsecError && (err.code === 'QUOTA_EXCEEDED' || err.code === 'CAPACITY_EXHAUSTED');
}

interface Waiter {
  projectId: string;
  attempt: () => Promise<Admitted>;
  resolve(v: Admitted): void;
  reject(err: unknown): void;
  /** The latest refusal: what a timeout reports. */
  refusal: DsecError;
  since: number;
  settled: boolean;
  cleanup(): void;
}

/** Counters exported as metrics. */
export interface AdmissionCounters {
  waited: number;
  timedOut: number;
  cancelled: number;
  queueFull: number;
}

/** Bounds of an {@link AdmissionQueue}. */
export interface AdmissionQueueOptions {
  /** Default {@link MAX_QUEUED_ADMISSIONS}. */
  maxQueued?: number;
  /** Default {@link MAX_QUEUED_PER_PROJECT}. */
  maxQueuedPerProject?: number;
  /** Default {@link ADMISSION_RECHECK_MS}. */
  recheckMs?: number;
}

/** The fair admission queue. */
export class AdmissionQueue {
  readonly counters: AdmissionCounters = { waited: 0, timedOut: 0, cancelled: 0, queueFull: 0 };
  /** Per project, oldest first; the map's order is the round-robin order. */
  private readonly queues = new Map<string, Waiter[]>();
  private queued = 0;
  /** The project served last: the next round starts after it. */
  private lastServed: string | undefined;
  private passing: Promise<void> | undefined;
  private passAgain = false;
  private timer: NodeJS.Timeout | undefined;
  private closed = false;
  private readonly maxQueued: number;
  private readonly maxQueuedPerProject: number;
  private readonly recheckMs: number;

  constructor(o: AdmissionQueueOptions = {}) {
    this.maxQueued = o.maxQueued ?? MAX_QUEUED_ADMISSIONS;
    this.maxQueuedPerProject = o.maxQueuedPerProject ?? MAX_QUEUED_PER_PROJECT;
    this.recheckMs = o.recheckMs ?? ADMISSION_RECHECK_MS;
  }

  /** Requests waiting (of one project, or of all). */
  waiting(projectId?: string): number {
    return projectId === undefined ? this.queued : (this.queues.get(projectId)?.length ?? 0);
  }

  /**
   * Runs `attempt`, which reserves capacity or throws a capacity refusal. Refusals are thrown at
   * once unless `wait` is set; then the request waits its turn. While a project has waiting
   * requests, its new requests queue behind them (or are refused at once without `wait`).
   */
  async admit<T extends Admitted>(projectId: string, attempt: () => Promise<T>, o: AdmitOptions = {}): Promise<T> {
    const ahead = this.queues.get(projectId);
    let refusal: DsecError;
    if (!ahead?.length) {
      try {
        return await attempt();
      } catch (err) {
        if (!o.wait || !isCapacityRefusal(err)) throw err;
        refusal = err;
      }
    } else {
      const head = ahead[0]!.refusal;
      refusal = new DsecError(head.code, `${head.message}; ${ahead.length} earlier request(s) of this project are waiting`, {
        ...head.details,
        retryAfterMs: ADMISSION_RETRY_AFTER_MS,
      });
      if (!o.wait) throw refusal;
    }
    o.signal?.throwIfAborted();
    if (this.closed) throw new DsecError('UNAVAILABLE', 'the server is shutting down');
    const mine = this.queues.get(projectId)?.length ?? 0;
    if (this.queued >= this.maxQueued || mine >= this.maxQueuedPerProject) {
      this.counters.queueFull++;
      throw new DsecError('ADMISSION_QUEUE_FULL', `the admission queue is full (${this.queued} waiting); ${refusal.message}`, {
        retryAfterMs: ADMISSION_RETRY_AFTER_MS,
        reason: refusal.code,
      });
    }
    this.counters.waited++;
    const timeoutMs = o.timeoutMs ?? DEFAULT_ADMISSION_WAIT_MS;
    return new Promise<T>((resolve, reject) => {
      const w: Waiter = {
        projectId,
        attempt,
        resolve: resolve as (v: Admitted) => void,
        reject,
        refusal,
        since: Date.now(),
        settled: false,
        cleanup: () => {
          clearTimeout(timer);
          o.signal?.removeEventListener('abort', onAbort);
        },
      };
      const onAbort = (): void => {
        this.counters.cancelled++;
        this.leave(w, new DsecError('CANCELLED', 'the request was cancelled while waiting for admission'));
      };
      const timer = setTimeout(() => {
        this.counters.timedOut++;
        const r = w.refusal;
        const waitedMs = Date.now() - w.since;
        this.leave(
          w,
          new DsecError(r.code, `${r.message} (still refused after waiting ${waitedMs} ms for admission)`, {
            ...r.details,
            retryAfterMs: ADMISSION_RETRY_AFTER_MS,
            waitedMs,
            reason: 'wait-timeout',
          }),
        );
      }, timeoutMs);
      o.signal?.addEventListener('abort', onAbort, { once: true });
      const q = this.queues.get(projectId) ?? this.queues.set(projectId, []).get(projectId)!;
      q.push(w);
      this.queued++;
      this.kick();
    });
  }

  /** Capacity was freed (a sandbox went away, a reservation was returned): try the waiters. */
  notify(): void {
    if (this.queued > 0) this.kick();
  }

  /** Refuses every waiter (the server is stopping). */
  close(): void {
    this.closed = true;
    clearTimeout(this.timer);
    for (const q of [...this.queues.values()]) for (const w of [...q]) this.leave(w, new DsecError('UNAVAILABLE', 'the server is shutting down'));
  }

  /** Removes a waiter and rejects it (timeout, cancel, close). */
  private leave(w: Waiter, err: unknown): void {
    if (w.settled) return;
    w.settled = true;
    w.cleanup();
    this.remove(w);
    w.reject(err);
  }

  private remove(w: Waiter): void {
    const q = this.queues.get(w.projectId);
    const i = q ? q.indexOf(w) : -1;
    if (!q || i < 0) return;
    q.splice(i, 1);
    this.queued--;
    if (q.length === 0) this.queues.delete(w.projectId);
  }

  private kick(): void {
    if (this.passing) {
      this.passAgain = true;
      return;
    }
    clearTimeout(this.timer);
    this.timer = undefined;
    this.passing = this.pass().finally(() => {
      this.passing = undefined;
      if (this.passAgain) {
        this.passAgain = false;
        this.kick();
      } else if (this.queued > 0 && !this.closed) {
        this.timer = setTimeout(() => this.kick(), this.recheckMs);
        this.timer.unref();
      }
    });
  }

  /**
   * Rounds over the projects with waiters, starting after the one served last; each round tries
   * the head of each project's queue once. Stops after a round that admitted nobody.
   */
  private async pass(): Promise<void> {
    for (;;) {
      const projects = [...this.queues.keys()];
      const start = this.lastServed === undefined ? 0 : projects.indexOf(this.lastServed) + 1;
      let admitted = false;
      for (let k = 0; k < projects.length; k++) {
        const projectId = projects[(start + k) % projects.length]!;
        const w = this.queues.get(projectId)?.[0];
        if (!w) continue;
        let got: Admitted;
        try {
          got = await w.attempt();
        } catch (err) {
          if (isCapacityRefusal(err)) w.refusal = err;
          else this.leave(w, err);
          continue;
        }
        admitted = true;
        this.lastServed = projectId;
        if (w.settled) {
          // It timed out or was cancelled while its attempt ran: give the capacity back.
          await got.release().catch(() => undefined);
          continue;
        }
        w.settled = true;
        w.cleanup();
        this.remove(w);
        w.resolve(got);
      }
      if (!admitted || this.queued === 0) return;
    }
  }
}
