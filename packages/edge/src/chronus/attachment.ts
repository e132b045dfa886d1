// One attachment to a process running under the chronus agent: its output in order, flow
// control by acknowledging what was consumed, and its exit.
import type { AgentExit, OutputEvent } from './client.js';
import { agentError, parseExit } from './replies.js';
import { F, T } from './wire.js';
import type { Field, Frame } from './wire.js';

/**
 * What an attachment needs of the connection it came from: chronus's client, or another agent
 * (the QEMU guest agent) that feeds it through {@link Attachment.output} and {@link Attachment.exit}.
 */
export interface AttachmentOwner {
  send(type: number, id: number, fields: readonly Field[]): void;
  request(type: number, fields: readonly Field[], what: string): Promise<unknown>;
  forget(id: number): void;
  writeStdin(proc: number, data: Uint8Array | string, eof?: boolean): Promise<void>;
  signal(proc: number, sig: string | number, group?: boolean): Promise<void>;
}

/**
 * A running (or finished) process seen through one attachment: output events in order, then
 * the exit. Output is acknowledged as it is consumed, so an unread attachment applies
 * back-pressure to the process instead of buffering without bound.
 */
export class Attachment {
  readonly proc: number;
  readonly pid: number;
  /** Resolves with the exit report; rejects if the connection is lost first. */
  readonly exited: Promise<AgentExit>;
  private readonly queue: OutputEvent[] = [];
  private waiter: (() => void) | undefined;
  private done = false;
  private failure: Error | undefined;
  private listener: ((ev: OutputEvent) => void) | undefined;
  private readonly detachHooks: Array<() => void> = [];
  private readonly consumed = { stdout: 0, stderr: 0 };
  private readonly receivedTo = { stdout: 0, stderr: 0 };
  private readonly acked = { stdout: 0, stderr: 0 };
  private resolveExit!: (e: AgentExit) => void;
  private rejectExit!: (e: Error) => void;

  constructor(
    private readonly client: AttachmentOwner,
    readonly requestId: number,
    proc: number,
    pid: number,
    private readonly windowBytes: number,
    from: { stdout: number; stderr: number },
  ) {
    this.proc = proc;
    this.pid = pid;
    this.consumed = { ...from };
    this.acked = { ...from };
    this.receivedTo = { ...from };
    this.exited = new Promise<AgentExit>((resolve, reject) => {
      this.resolveExit = resolve;
      this.rejectExit = reject;
    });
    // The exit promise is also observed through wait(); never let it go unhandled.
    this.exited.catch(() => undefined);
  }

  /** Delivers every output event to `fn` as it arrives (instead of the async iterator). */
  onOutput(fn: (ev: OutputEvent) => void): void {
    this.listener = fn;
    for (const ev of this.queue.splice(0)) this.deliver(ev);
  }

  /** Output events in order; ends after the exit. */
  async *[Symbol.asyncIterator](): AsyncIterator<OutputEvent> {
    for (;;) {
      const ev = this.queue.shift();
      if (ev !== undefined) {
        this.consume(ev);
        yield ev;
        continue;
      }
      if (this.failure) throw this.failure;
      if (this.done) return;
      await new Promise<void>((r) => (this.waiter = r));
    }
  }

  /** Writes to the process's stdin; resolves when the agent has put it in the pipe. */
  write(data: Uint8Array | string, eof = false): Promise<void> {
    return this.client.writeStdin(this.proc, data, eof);
  }

  /** Closes the process's stdin. */
  closeStdin(): Promise<void> {
    return this.write(Buffer.alloc(0), true);
  }

  /** Sends a signal to the process (or its whole group). */
  kill(signal: string | number = 'SIGKILL', group = true): Promise<void> {
    return this.client.signal(this.proc, signal, group);
  }

  /** Stops receiving events; the process keeps running. */
  async detach(): Promise<void> {
    this.client.forget(this.requestId);
    this.finish();
    await this.client.request(T.DETACH, [[F.PROC, this.proc]], 'detach').catch(() => undefined);
    for (const fn of this.detachHooks.splice(0)) fn();
  }

  /** Runs `fn` once the attachment is detached. */
  onDetach(fn: () => void): void {
    this.detachHooks.push(fn);
  }

  /** @internal */
  handle(frame: Frame): void {
    const f = frame.fields;
    if (frame.type === T.OUTPUT || frame.type === T.GAP) {
      const stream = f.num(F.STREAM) === 2 ? 'stderr' : 'stdout';
      const offset = f.num(F.OFFSET) ?? 0;
      const ev: OutputEvent =
        frame.type === T.OUTPUT
          ? { kind: 'data', stream, offset, data: f.bytes(F.DATA) ?? Buffer.alloc(0) }
          : { kind: 'gap', stream, offset, bytes: f.num(F.COUNT) ?? 0 };
      this.output(ev);
    } else if (frame.type === T.EXIT) {
      this.exit(parseExit(f));
    } else if (frame.type === T.ERROR) {
      this.fail(agentError(f, 'attachment'));
    }
  }

  /** Offsets per stream up to which output has arrived (read or queued): where a new attachment goes on. */
  get received(): { stdout: number; stderr: number } {
    return { ...this.receivedTo };
  }

  /** @internal An output event (in order, per stream). */
  output(ev: OutputEvent): void {
    const end = ev.kind === 'data' ? ev.offset + ev.data.length : ev.offset + ev.bytes;
    this.receivedTo[ev.stream] = Math.max(this.receivedTo[ev.stream], end);
    if (this.listener) this.deliver(ev);
    else this.push(ev);
  }

  /** @internal The process's exit (after its last output). */
  exit(e: AgentExit): void {
    this.client.forget(this.requestId);
    this.resolveExit(e);
    this.finish();
  }

  /** @internal */
  fail(err: Error): void {
    if (this.done) return;
    this.failure = err;
    this.rejectExit(err);
    this.finish();
  }

  private deliver(ev: OutputEvent): void {
    this.consume(ev);
    this.listener?.(ev);
  }

  private push(ev: OutputEvent): void {
    this.queue.push(ev);
    this.wake();
  }

  private finish(): void {
    this.done = true;
    this.wake();
  }

  private wake(): void {
    const w = this.waiter;
    this.waiter = undefined;
    w?.();
  }

  private consume(ev: OutputEvent): void {
    const end = ev.kind === 'data' ? ev.offset + ev.data.length : ev.offset + ev.bytes;
    this.consumed[ev.stream] = Math.max(this.consumed[ev.stream], end);
    // Once half the window is consumed: each ACK is a write that wakes the agent, and the other
    // half keeps the agent sending while the ACK travels.
    if (this.consumed[ev.stream] - this.acked[ev.stream] >= this.windowBytes / 2) {
      this.acked[ev.stream] = this.consumed[ev.stream];
      this.client.send(T.ACK, 0, [[F.PROC, this.proc], [F.STREAM, ev.stream === 'stdout' ? 1 : 2], [F.OFFSET, this.acked[ev.stream]]]);
    }
  }
}
