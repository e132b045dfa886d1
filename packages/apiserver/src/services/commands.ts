// Commands in sandboxes, recorded: the one path by which a command runs through the API (JSON
// exec, the ndjson stream, the WebSocket session and replay all come here). Each run is a
// trajectory step; streamed output is read with back-pressure, and a command whose reader
// leaves keeps running while its recording reads on alone.
import { DsecError } from '@dsec/protocol';
import type { EdgeClient, ExecEvent, ExecResult, ExecSpec, ExecStreamEvent, OutputEvent, ProcessInfo, ProcessStream, TenantLimits } from '@dsec/protocol';
import { publicError } from '../errors.js';
import type { ActivityTracker } from '../leases.js';
import type { ExecRecording, TrajectoryLog } from '../trajectory.js';

/** Where a command runs: a sandbox and the node that holds it. */
export interface CommandTarget {
  sandboxId: string;
  edge: EdgeClient;
}

/** How a command was asked for (recorded in its step): plain exec, ndjson stream, WebSocket. */
export type StreamVia = 'exec' | 'stream' | 'ws';

/** A command run to its end, with its recording (digests of its output). */
export interface RecordedExec {
  result: ExecResult;
  recording: ExecRecording;
}

/** One output event as the API sends it. */
export function outputEvent(ev: OutputEvent): ExecEvent {
  return ev.kind === 'data'
    ? { type: 'output', stream: ev.stream, offset: ev.offset, data: Buffer.from(ev.data.buffer, ev.data.byteOffset, ev.data.byteLength).toString('base64') }
    : { type: 'gap', stream: ev.stream, offset: ev.offset, bytes: ev.bytes };
}

/** One output event as the binary stream sends it (bytes as they are). */
function streamEvent(ev: OutputEvent): ExecStreamEvent {
  return ev.kind === 'data'
    ? { type: 'output', stream: ev.stream, offset: ev.offset, data: ev.data }
    : { type: 'gap', stream: ev.stream, offset: ev.offset, bytes: ev.bytes };
}

/** An event in its JSON form (ndjson lines, WebSocket messages): output bytes as base64. */
export function jsonEvent(ev: ExecStreamEvent): ExecEvent {
  return ev.type === 'output' ? { ...ev, data: Buffer.from(ev.data.buffer, ev.data.byteOffset, ev.data.byteLength).toString('base64') } : ev;
}

/** A process the edge no longer knows (or never knew) is the API's PROCESS_NOT_FOUND. */
function processError(pid: number): (err: unknown) => never {
  return (err: unknown): never => {
    if (err instanceof DsecError && (err.code === 'FILE_NOT_FOUND' || err.code === 'PROCESS_NOT_FOUND'))
      throw new DsecError('PROCESS_NOT_FOUND', `process ${pid} not found`, { pid });
    throw err;
  };
}

/** What watches a stream as it is sent (the trajectory recording of the command). */
interface StreamTap {
  onOutput(ev: OutputEvent): void;
  exited(exit: ExecResult | Parameters<ExecRecording['exited']>[0]): unknown;
  /** The stream broke before the exit (the command may still run). */
  interrupted(): void;
}

/** A streamed command, started and recorded. */
export class RunningCommand {
  /** Its exit status once it exits; null when the stream ends first. For audit entries. */
  readonly exitCode: Promise<number | null>;
  private outcome: { code: number | null } | undefined;
  private readonly outcomeListeners: Array<(code: number | null) => void> = [];

  constructor(
    private readonly target: CommandTarget,
    /** The process's stream. */
    readonly process: ProcessStream,
    private readonly recording: ExecRecording,
    private readonly activity: ActivityTracker,
  ) {
    this.exitCode = new Promise<number | null>((resolve) => this.onSettled(resolve));
    // Without a reader of its events (or before one gets there), the process's own end settles it.
    process.exited.then(
      (e) => this.settle(e.exitCode),
      () => this.settle(null),
    );
    process.onDetach(() => this.settle(null));
  }

  /**
   * Runs `fn` once with its exit status (null when the stream ends first). A reader of
   * {@link events} settles it before the exit event is handed on, so that what `fn` records (the
   * audit entry) is there by the time a client has read the stream's end.
   */
  onSettled(fn: (code: number | null) => void): void {
    if (this.outcome) fn(this.outcome.code);
    else this.outcomeListeners.push(fn);
  }

  private settle(code: number | null): void {
    if (this.outcome) return;
    this.outcome = { code };
    for (const fn of this.outcomeListeners.splice(0)) fn(code);
  }

  /** dsec's id of the process. */
  get pid(): number {
    return this.process.pid;
  }

  /** Start, output and exit (or an error) as API events; the sandbox is held active meanwhile. */
  events(): AsyncGenerator<ExecStreamEvent> {
    return heldEvents(this.activity, this.target.sandboxId, this.settling(processEvents(this.process, true, this.recording)));
  }

  /** Settles the exit status as the exit (or error) event passes, before it is handed on. */
  private async *settling(events: AsyncGenerator<ExecStreamEvent>): AsyncGenerator<ExecStreamEvent> {
    try {
      for await (const ev of events) {
        if (ev.type === 'exit') this.settle(ev.exitCode);
        else if (ev.type === 'error') this.settle(null);
        yield ev;
      }
    } finally {
      // A reader that leaves first: the command runs on unknown to this entry.
      if (!this.outcome) this.settle(null);
    }
  }

  /** Writes to the command's stdin, recording what was written. */
  async write(data: Uint8Array): Promise<void> {
    await this.process.write(data);
    this.recording.addStdin(data);
  }

  /** Closes the command's stdin. */
  closeStdin(): Promise<void> {
    return this.process.closeStdin();
  }

  /** Sends a signal to the command. */
  kill(signal: string): Promise<void> {
    return this.process.kill(signal);
  }

  /** Changes the command's terminal size. */
  resize(rows: number, cols: number): Promise<void> {
    return this.target.edge.resize(this.target.sandboxId, this.process.pid, rows, cols);
  }

  /** The reader went away: the command runs on, and its recording reads on alone. */
  leave(): Promise<void> {
    return this.process
      .detach()
      .catch(() => undefined)
      .finally(this.recording.follow);
  }

  /** Nobody can end the command any more (its client went while it started): kill it. */
  stop(): void {
    void this.process.kill('SIGKILL').catch(() => undefined);
    void this.process.detach().catch(() => undefined);
    this.recording.follow();
  }
}

/** Events of a process stream: optional start, output, then exit (or an error event). */
async function* processEvents(proc: ProcessStream, withStart: boolean, tap?: StreamTap): AsyncGenerator<ExecStreamEvent> {
  if (withStart) yield { type: 'start', pid: proc.pid, osPid: proc.osPid };
  try {
    for await (const ev of proc) {
      tap?.onOutput(ev);
      yield streamEvent(ev);
    }
    const exit = await proc.exited;
    tap?.exited(exit);
    yield { type: 'exit', pid: proc.pid, ...exit };
  } catch (err) {
    tap?.interrupted();
    yield { type: 'error', error: publicError(err) };
  }
}

/** A stream of events that holds its sandbox active (no idle timeout) until it ends. */
async function* heldEvents(activity: ActivityTracker, id: string, events: AsyncGenerator<ExecStreamEvent>): AsyncGenerator<ExecStreamEvent> {
  const release = activity.hold(id);
  try {
    yield* events;
  } finally {
    release();
  }
}

/** Recorded commands. */
export class CommandService {
  constructor(
    private readonly trajectory: TrajectoryLog,
    private readonly activity: ActivityTracker,
    private readonly limits: Pick<TenantLimits, 'execOutputBytes'>,
  ) {}

  /**
   * Runs a command to its end, recorded. A caller that goes away (its signal) takes the
   * command with it. Waiting for it counts as the sandbox's activity.
   */
  async exec(t: CommandTarget, spec: ExecSpec, signal?: AbortSignal): Promise<RecordedExec> {
    const release = this.activity.hold(t.sandboxId);
    try {
      const recording = await this.trajectory.beginExec(t.sandboxId, spec, 'exec', signal);
      const result = await t.edge
        .exec(t.sandboxId, spec, { onOutput: recording.onOutput, maxOutputBytes: this.limits.execOutputBytes, ...(signal ? { signal } : {}) })
        .then(recording.exited, recording.failed);
      return { result, recording };
    } finally {
      release();
    }
  }

  /** Starts a command whose output is streamed, recorded as it goes. */
  async spawn(t: CommandTarget, spec: ExecSpec, via: StreamVia): Promise<RunningCommand> {
    const recording = await this.trajectory.beginExec(t.sandboxId, spec, via);
    const proc = await t.edge.spawn(t.sandboxId, spec).catch(recording.failed);
    recording.started(proc.pid, t.edge);
    return new RunningCommand(t, proc, recording, this.activity);
  }

  /** The processes of a sandbox. */
  processes(t: CommandTarget, signal?: AbortSignal): Promise<ProcessInfo[]> {
    return t.edge.processes(t.sandboxId, { signal });
  }

  /**
   * A process's output from byte offsets, then its exit, as API events (no start event).
   * `signal` covers the attaching; the stream then ends when its reader goes (`detach`).
   */
  async output(
    t: CommandTarget,
    pid: number,
    from: { stdout: number; stderr: number },
    signal?: AbortSignal,
  ): Promise<{ events: AsyncGenerator<ExecStreamEvent>; detach: () => void }> {
    const proc = await t.edge.attach(t.sandboxId, pid, from, { signal }).catch(processError(pid));
    return { events: heldEvents(this.activity, t.sandboxId, processEvents(proc, false)), detach: () => void proc.detach().catch(() => undefined) };
  }

  /** Writes to a process's stdin (`eof` closes it after), recorded in its step. */
  async writeStdin(t: CommandTarget, pid: number, data: Uint8Array, eof: boolean, signal?: AbortSignal): Promise<void> {
    await t.edge.writeStdin(t.sandboxId, pid, data, eof, { signal }).catch(processError(pid));
    if (data.length > 0) this.trajectory.noteStdin(t.sandboxId, pid, data);
  }

  /** Sends a signal to a process. */
  async signal(t: CommandTarget, pid: number, signal: string): Promise<void> {
    await t.edge.signal(t.sandboxId, pid, signal).catch(processError(pid));
  }
}
