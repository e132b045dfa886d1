// A process as an edge hands it out: a chronus attachment behind the protocol's ProcessStream,
// whose exit carries what only the node can tell (an OOM kill) and whose end is told once. When
// the sandbox's agent connection goes away with a pause to a file (a VM's QEMU ends), the stream
// waits for the resume and attaches again from the offsets it reached (`Reattach`).
import type { ExitInfo, OutputEvent, ProcessStream } from '@dsec/protocol';
import type { AgentExit } from './chronus/client.js';
import type { Attachment } from './chronus/attachment.js';

/** Turns the agent's exit report into the sandbox's verdict (OOM kills told apart). */
export type ExitJudge = (exit: AgentExit) => ExitInfo | Promise<ExitInfo>;

/**
 * After the attachment's connection was lost: a new attachment from `from` once the sandbox runs
 * again when the loss was a pause to a file; undefined when it was not (the stream ends).
 * `signal` aborts the wait (the stream was detached).
 */
export type Reattach = (from: { stdout: number; stderr: number }, signal: AbortSignal) => Promise<Attachment | undefined>;

/** {@link ProcessStream} over one chronus attachment. */
export class EdgeProcessStream implements ProcessStream {
  /** The agent's handle of the process (the API's `pid`). */
  readonly pid: number;
  /** Its process id inside the sandbox. */
  readonly osPid: number;
  /** How it ended, OOM kills told apart; rejects when the connection is lost first (not by a pause to a file). */
  readonly exited: Promise<ExitInfo>;
  private readonly endHooks: Array<() => void> = [];
  private ended = false;
  /** The attachment now in use (a new one after each reattach). */
  private att: Attachment;
  private listener: ((ev: OutputEvent) => void) | undefined;
  /** The next attachment after one whose connection was lost (one wait shared by its readers). */
  private readonly successors = new WeakMap<Attachment, Promise<Attachment | undefined>>();
  private readonly stopped = new AbortController();

  constructor(
    att: Attachment,
    judge: ExitJudge,
    private readonly o: { reattach?: Reattach } = {},
  ) {
    this.att = att;
    this.pid = att.proc;
    this.osPid = att.pid;
    // Judged as soon as the exit arrives: the OOM counter is read while it still tells this exit.
    this.exited = this.follow(att).then(judge);
    this.exited.catch(() => undefined);
    // The end is told after the exit's own handlers ran: a reader hearing of both takes the exit.
    const later = (): void => void setImmediate(() => this.end());
    void this.exited.then(later, later);
    att.onDetach(() => this.end());
  }

  /** The agent's exit report, across reattaches. */
  private async follow(att: Attachment): Promise<AgentExit> {
    for (;;) {
      try {
        return await att.exited;
      } catch (err) {
        const next = await this.successor(att);
        if (!next) throw err;
        att = next;
      }
    }
  }

  /** The attachment after `att`, whose connection was lost; undefined: the stream ends there. */
  private successor(att: Attachment): Promise<Attachment | undefined> {
    let next = this.successors.get(att);
    if (!next) {
      const reattach = this.o.reattach;
      next =
        reattach && !this.stopped.signal.aborted
          ? // From what the lost attachment received: its queued output is still read from it.
            reattach(att.received, this.stopped.signal).then(
              (a) => {
                if (a) this.adopt(a);
                return a;
              },
              () => undefined,
            )
          : Promise.resolve(undefined);
      this.successors.set(att, next);
    }
    return next;
  }

  private adopt(att: Attachment): void {
    this.att = att;
    att.onDetach(() => this.end());
    if (this.listener) att.onOutput(this.listener);
  }

  /** Output in order; ends after the exit (applies back-pressure while unread). */
  async *[Symbol.asyncIterator](): AsyncIterator<OutputEvent> {
    let att = this.att;
    for (;;) {
      try {
        for await (const ev of att) yield ev;
        return;
      } catch (err) {
        const next = await this.successor(att);
        if (!next) throw err;
        att = next;
      }
    }
  }

  /** Delivers every output event to `fn` as it arrives, instead of the iterator (in-process use). */
  onOutput(fn: (ev: OutputEvent) => void): void {
    this.listener = fn;
    this.att.onOutput(fn);
  }

  /** Writes to its stdin (`eof` closes it after). */
  write(data: Uint8Array | string, eof = false): Promise<void> {
    return this.att.write(data, eof);
  }

  /** Closes its stdin. */
  closeStdin(): Promise<void> {
    return this.att.closeStdin();
  }

  /** Signals its process group. */
  kill(signal: string | number = 'SIGKILL'): Promise<void> {
    return this.att.kill(signal, true);
  }

  /**
   * Ends the stream with `err` (its exit rejects with it, no reattach) when its agent does not
   * answer; the agent is still asked to kill the process group, should it answer later.
   */
  giveUp(err: Error): void {
    this.stopped.abort();
    this.att.kill('SIGKILL', true).catch(() => undefined);
    this.att.fail(err);
  }

  /** Stops the stream; the process runs on. */
  detach(): Promise<void> {
    this.stopped.abort();
    return this.att.detach();
  }

  /** Runs `fn` once when the stream ends (exit, detach or a lost connection). */
  onDetach(fn: () => void): void {
    if (this.ended) fn();
    else this.endHooks.push(fn);
  }

  private end(): void {
    if (this.ended) return;
    this.ended = true;
    for (const fn of this.endHooks.splice(0)) fn();
  }
}
