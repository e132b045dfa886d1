// Long host work on data a sandbox controls (hashing its files, counting a tree to pack, the
// digest of a packed layer) runs here, on a few worker threads, never on the event loop that
// serves every tenant. The queue is bounded (a full queue refuses with UNAVAILABLE rather than
// growing) and each task has a deadline: a worker past it is terminated and replaced, and its
// task fails with TIMEOUT. Workers do not keep the process alive while idle: `dsec up` and
// `dsec edge` exit on stop whether or not the pool was ever used.
import { Worker } from 'node:worker_threads';
import { DsecError } from '@dsec/protocol';

/** Worker threads of the node's pool. */
export const READ_POOL_THREADS = 2;
/** Tasks waiting for a thread at most; past it a task is refused. */
export const READ_POOL_MAX_QUEUE = 1024;
/** Longest a task may run before its worker is replaced. */
export const READ_POOL_DEADLINE_MS = 120_000;

/** What a worker can do. Fds stay open (the caller's) until the task settles. */
export type ReadTask =
  { op: 'hash-fd'; fd: number; maxBytes: number } | { op: 'hash-files'; paths: string[] } | { op: 'count-tree'; root: string } | { op: 'sleep'; ms: number };

/** Result of a `hash-fd` task. */
export interface HashFdResult {
  sha256?: string;
  bytes: number;
  tooLarge?: boolean;
}

/** Options of {@link ReadPool}. */
export interface ReadPoolOptions {
  /** Default {@link READ_POOL_THREADS}. */
  threads?: number;
  /** Default {@link READ_POOL_MAX_QUEUE}. */
  maxQueue?: number;
  /** Default {@link READ_POOL_DEADLINE_MS}. */
  deadlineMs?: number;
}

interface Job {
  task: ReadTask;
  resolve(value: unknown): void;
  reject(err: Error): void;
  signal?: AbortSignal | undefined;
  onAbort?: () => void;
}

interface Slot {
  worker: Worker;
  job?: Job & { id: number; timer: NodeJS.Timeout };
}

const WORKER_URL = new URL('./read-pool-worker.js', import.meta.url);

/** A small pool of threads for host reads of sandbox data. */
export class ReadPool {
  private readonly slots: Slot[] = [];
  private readonly queue: Job[] = [];
  private readonly threads: number;
  private readonly maxQueue: number;
  private readonly deadlineMs: number;
  private nextId = 1;
  private closed = false;

  constructor(opts: ReadPoolOptions = {}) {
    this.threads = opts.threads ?? READ_POOL_THREADS;
    this.maxQueue = opts.maxQueue ?? READ_POOL_MAX_QUEUE;
    this.deadlineMs = opts.deadlineMs ?? READ_POOL_DEADLINE_MS;
  }

  /** sha256 of what is left to read of `fd` (a regular file the caller keeps open until this settles). */
  hashFd(fd: number, maxBytes: number, signal?: AbortSignal): Promise<HashFdResult> {
    return this.run({ op: 'hash-fd', fd, maxBytes }, signal) as Promise<HashFdResult>;
  }

  /** Runs a task on a free thread, or queues it; an abort of `signal` drops it while queued. */
  run(task: ReadTask, signal?: AbortSignal): Promise<unknown> {
    if (this.closed) return Promise.reject(new DsecError('UNAVAILABLE', 'the host-read pool is closed'));
    if (signal?.aborted) return Promise.reject(abortError(signal));
    if (this.queue.length >= this.maxQueue) {
      return Promise.reject(new DsecError('UNAVAILABLE', `too many host reads waiting (${this.maxQueue}); try again`, { retryAfterMs: 1000 }));
    }
    return new Promise((resolve, reject) => {
      const job: Job = { task, resolve, reject, signal };
      if (signal) {
        job.onAbort = () => {
          const at = this.queue.indexOf(job);
          if (at >= 0) {
            this.queue.splice(at, 1);
            reject(abortError(signal));
          }
          // A running task finishes (bounded by its deadline): its fds stay the caller's until then.
        };
        signal.addEventListener('abort', job.onAbort, { once: true });
      }
      this.queue.push(job);
      this.dispatch();
    });
  }

  /** Terminates the threads; queued tasks fail. */
  async close(): Promise<void> {
    this.closed = true;
    for (const job of this.queue.splice(0)) this.settle(job, new DsecError('UNAVAILABLE', 'the host-read pool is closed'));
    await Promise.all(
      this.slots.splice(0).map(async (s) => {
        if (s.job) {
          clearTimeout(s.job.timer);
          this.settle(s.job, new DsecError('UNAVAILABLE', 'the host-read pool is closed'));
        }
        await s.worker.terminate();
      }),
    );
  }

  private dispatch(): void {
    while (this.queue.length > 0) {
      let slot = this.slots.find((s) => !s.job);
      if (!slot && this.slots.length < this.threads) slot = this.spawn();
      if (!slot) return;
      const job = this.queue.shift() as Job;
      const id = this.nextId++;
      const busy = slot;
      const timer = setTimeout(() => this.expire(busy), this.deadlineMs);
      timer.unref();
      slot.job = { ...job, id, timer };
      // Busy: the process waits for the task (an idle worker keeps nothing alive).
      slot.worker.ref();
      slot.worker.postMessage({ id, task: job.task });
    }
  }

  private spawn(): Slot {
    // execArgv: the process's own flags (--input-type, --inspect, ...) are not the worker's.
    const worker = new Worker(WORKER_URL, { execArgv: [] });
    const slot: Slot = { worker };
    worker.on('message', (msg: { id: number; ok: boolean; value?: unknown; message?: string; code?: string }) => {
      const job = slot.job;
      if (!job || job.id !== msg.id) return;
      clearTimeout(job.timer);
      delete slot.job;
      worker.unref();
      if (msg.ok) this.settle(job, undefined, msg.value);
      else this.settle(job, new DsecError('INTERNAL', `host read failed: ${msg.message ?? 'unknown error'}`, msg.code ? { errno: msg.code } : {}));
      this.dispatch();
    });
    worker.on('error', (err) => this.replace(slot, new DsecError('INTERNAL', `host-read worker failed: ${err.message}`)));
    worker.on('exit', () => this.replace(slot, new DsecError('INTERNAL', 'host-read worker exited')));
    // Only now: a 'message' listener refs the worker's port again, so an unref before the
    // listeners would be undone and every stop of the node would hang on an idle pool.
    worker.unref();
    this.slots.push(slot);
    return slot;
  }

  /** A task overran its deadline: its worker is terminated (so its fds are no longer read) and replaced. */
  private expire(slot: Slot): void {
    const job = slot.job;
    if (!job) return;
    delete slot.job;
    this.drop(slot);
    void slot.worker.terminate().finally(() => {
      this.settle(job, new DsecError('TIMEOUT', `host read took longer than ${this.deadlineMs} ms`));
      this.dispatch();
    });
  }

  private replace(slot: Slot, err: DsecError): void {
    if (!this.drop(slot)) return;
    const job = slot.job;
    if (job) {
      delete slot.job;
      clearTimeout(job.timer);
      this.settle(job, err);
    }
    if (!this.closed) this.dispatch();
  }

  private drop(slot: Slot): boolean {
    const at = this.slots.indexOf(slot);
    if (at < 0) return false;
    this.slots.splice(at, 1);
    return true;
  }

  private settle(job: Job, err: Error | undefined, value?: unknown): void {
    if (job.onAbort) job.signal?.removeEventListener('abort', job.onAbort);
    if (err) job.reject(err);
    else job.resolve(value);
  }
}

function abortError(signal: AbortSignal): Error {
  return signal.reason instanceof Error ? signal.reason : new DsecError('CANCELLED', 'cancelled');
}

let shared: ReadPool | undefined;

/** The node's pool (made on first use; its idle threads keep nothing alive). */
export function readPool(): ReadPool {
  shared ??= new ReadPool();
  return shared;
}
