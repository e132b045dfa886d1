// A process as an edge hands it out: a chronus attachment behind the protocol's ProcessStream,
// whose exit carries what only the node can tell (an OOM kill) and whose end is told once.
import type { ExitInfo, OutputEvent, ProcessStream } from '@dsec/protocol';
import type { AgentExit } from './chronus/client.js';
import type { Attachment } from './chronus/attachment.js';

/** Turns the agent's exit report into the sandbox's verdict (OOM kills told apart). */
export type ExitJudge = (exit: AgentExit) => ExitInfo | Promise<ExitInfo>;

/** {@link ProcessStream} over one chronus attachment. */
export class EdgeProcessStream implements ProcessStream {
  /** The agent's handle of the process (the API's `pid`). */
  readonly pid: number;
  /** Its process id inside the sandbox. */
  readonly osPid: number;
  /** How it ended, OOM kills told apart; rejects when the connection is lost first. */
  readonly exited: Promise<ExitInfo>;
  private readonly endHooks: Array<() => void> = [];
  private ended = false;

  constructor(
    private readonly att: Attachment,
    judge: ExitJudge,
  ) {
    this.pid = att.proc;
    this.osPid = att.pid;
    // Judged as soon as the exit arrives: the OOM counter is read while it still tells this exit.
    this.exited = att.exited.then(judge);
    this.exited.catch(() => undefined);
    // The end is told after the exit's own handlers ran: a reader hearing of both takes the exit.
    const later = (): void => void setImmediate(() => this.end());
    void this.exited.then(later, later);
    att.onDetach(() => this.end());
  }

  /** Output in order; ends after the exit (applies back-pressure while unread). */
  [Symbol.asyncIterator](): AsyncIterator<OutputEvent> {
    return this.att[Symbol.asyncIterator]();
  }

  /** Delivers every output event to `fn` as it arrives, instead of the iterator (in-process use). */
  onOutput(fn: (ev: OutputEvent) => void): void {
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

  /** Stops the stream; the process runs on. */
  detach(): Promise<void> {
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
