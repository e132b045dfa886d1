// A client of a long-lived helper process that answers requests one line each: the container
// backend's launch server (`dsec-launch --serve`) and the fncall runner's resetter
// (`dsec-fnreset`). Started on first use and again after it died; requests go to its standard
// input (each caller frames its own), answers come back as lines on its standard output, matched
// to their request by id; closed by ending its input, then SIGKILL if it does not exit.
import { spawn } from 'node:child_process';
import type { ChildProcessByStdio } from 'node:child_process';
import { createInterface } from 'node:readline';
import type { Readable, Writable } from 'node:stream';
import { DsecError } from '@dsec/protocol';

/** An answer line taken apart: the request it answers and what it says. */
export interface HelperAnswer<T> {
  id: number;
  value: T;
}

/** Options of {@link HelperProcess}. */
export interface HelperProcessOptions<T> {
  /** Named in errors (`<name>: <why>`). */
  name: string;
  binary: string;
  args?: readonly string[];
  /** Takes one line of standard output apart; undefined for a line that answers nothing. */
  parse(line: string): HelperAnswer<T> | undefined;
  /** Each line of the helper's standard error (the last 4 KiB are also kept for its death's error). */
  stderrLine?: ((line: string) => void) | undefined;
  /** How long close() waits for the helper to exit after its input ended before SIGKILL (default 5 s). */
  closeTimeoutMs?: number;
}

/** Options of one request. */
export interface HelperRequestOptions {
  timeoutMs: number;
  /**
   * Called once when the request times out; the request then goes on waiting for its answer
   * (the helper is expected to give one, e.g. after killing what the request started). Without
   * it a timed-out request fails with a TIMEOUT error.
   */
  onTimeout?: () => void;
}

interface Pending<T> {
  resolve(value: T): void;
  reject(err: Error): void;
  timer: NodeJS.Timeout;
}

type Child = ChildProcessByStdio<Writable, Readable, Readable>;

/** Largest id before ids start again at 1 (they travel as 32-bit numbers). */
const MAX_ID = 0xffff_ffff;
/** Bytes of standard error kept for the error of a helper that died. */
const MAX_STDERR = 4096;

/** One long-lived helper process and its requests in flight. */
export class HelperProcess<T> {
  private child: Child | undefined;
  private readonly pending = new Map<number, Pending<T>>();
  private lastId = 0;

  constructor(private readonly o: HelperProcessOptions<T>) {}

  /** A fresh request id (1 to 2^32-1, not in flight). */
  nextId(): number {
    do this.lastId = (this.lastId % MAX_ID) + 1;
    while (this.pending.has(this.lastId));
    return this.lastId;
  }

  /** The running helper's process id (undefined when none runs). */
  get pid(): number | undefined {
    return this.child?.pid;
  }

  /** Requests in flight. */
  get inFlight(): number {
    return this.pending.size;
  }

  /**
   * Writes `frame` (the request `id`, framed as the helper reads it) and resolves with the
   * answer to `id`; rejects with BACKEND_FAILED when the helper dies or cannot be started first.
   */
  request(id: number, frame: Buffer | string, opts: HelperRequestOptions): Promise<T> {
    let child: Child;
    try {
      child = this.process();
    } catch (err) {
      return Promise.reject(err instanceof Error ? err : new Error(String(err)));
    }
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        if (opts.onTimeout) opts.onTimeout();
        else this.settle(id)?.reject(new DsecError('TIMEOUT', `${this.o.name}: no answer within ${opts.timeoutMs} ms`));
      }, opts.timeoutMs);
      this.pending.set(id, { resolve, reject, timer });
      this.hold(child, true);
      child.stdin.write(frame);
    });
  }

  /** Writes to the running helper without waiting for an answer (nothing when it is not running). */
  send(frame: Buffer | string): void {
    this.child?.stdin.write(frame);
  }

  /** Ends the helper (its input closed, SIGKILL after the close timeout); requests in flight fail. */
  async close(): Promise<void> {
    const child = this.child;
    this.child = undefined;
    this.failAll(new DsecError('BACKEND_FAILED', `${this.o.name}: closing`));
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => child.once('close', () => resolve()));
    child.stdin.end();
    const timer = setTimeout(() => child.kill('SIGKILL'), this.o.closeTimeoutMs ?? 5_000);
    await exited;
    clearTimeout(timer);
  }

  private process(): Child {
    if (this.child) return this.child;
    const child = spawn(this.o.binary, this.o.args ?? [], { stdio: ['pipe', 'pipe', 'pipe'] });
    let stderr = '';
    createInterface({ input: child.stderr }).on('line', (line) => {
      if (stderr.length < MAX_STDERR) stderr += `${line}\n`;
      this.o.stderrLine?.(line);
    });
    createInterface({ input: child.stdout }).on('line', (line) => {
      const answer = this.o.parse(line);
      if (answer) this.settle(answer.id)?.resolve(answer.value);
    });
    const gone = (why: string): void => {
      if (this.child !== child) return;
      this.child = undefined;
      this.failAll(new DsecError('BACKEND_FAILED', `${this.o.name}: ${stderr.trim() || why}`));
    };
    child.on('error', (err) => gone(err.message));
    child.on('close', (code, signal) => gone(`exited with ${code ?? signal}`));
    child.stdin.on('error', () => undefined);
    this.child = child;
    this.hold(child, false);
    return child;
  }

  /** Takes a request out of the pending map (undefined when it is not there any more). */
  private settle(id: number): Pending<T> | undefined {
    const p = this.pending.get(id);
    if (!p) return undefined;
    this.pending.delete(id);
    clearTimeout(p.timer);
    if (this.pending.size === 0 && this.child) this.hold(this.child, false);
    return p;
  }

  private failAll(err: Error): void {
    for (const id of [...this.pending.keys()]) this.settle(id)?.reject(err);
  }

  /**
   * An idle helper does not keep this process alive (an owner dropped without close must not
   * hang its process's exit); while a request is in flight it does, like a child process would.
   */
  private hold(child: Child, busy: boolean): void {
    for (const h of [child, child.stdin, child.stdout, child.stderr] as unknown as Array<{ ref?(): void; unref?(): void }>) {
      if (busy) h.ref?.();
      else h.unref?.();
    }
  }
}
