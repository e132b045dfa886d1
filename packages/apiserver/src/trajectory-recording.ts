// Steps being recorded: a command's or a file change's step is built in memory while it runs
// (output hashed as it streams by, bounded copies kept) and handed to the trajectory log when it
// ends. A command whose reader leaves is followed to its exit on a connection of its own.
import { createHash } from 'node:crypto';
import type { Hash } from 'node:crypto';
import { DsecError } from '@dsec/protocol';
import type { EdgeClient, ExecSpec, ExitInfo, OutputEvent, RecordedBytes, TrajectoryStep, TrajectoryStepKind } from '@dsec/protocol';
import type { TrajectoryLog } from './trajectory.js';

/** Bytes of stdout and of stderr copied into each step (the digest covers all of it). */
export const TRAJECTORY_OUTPUT_COPY_BYTES = 65_536;
/** Bytes of file content, tar or stdin copied into a step; larger ones are not replayable. */
export const TRAJECTORY_DATA_COPY_BYTES = 1_048_576;

/** The hex sha256 of no bytes. */
const EMPTY_SHA256 = createHash('sha256').digest('hex');

/** The digest of a byte stream and a bounded copy of its first bytes. */
export class ByteRecorder {
  /** Made with the first byte: most commands leave a stream empty (issue 15: three per exec). */
  private hash: Hash | undefined;
  private readonly chunks: Buffer[] = [];
  private copied = 0;
  /** Bytes seen. */
  bytes = 0;
  /** Bytes that were dropped before they were seen (output gaps). */
  lostBytes = 0;
  /** Offset just past the last byte seen or skipped (where a reader resumes). */
  end = 0;

  constructor(private readonly copyLimit: number) {}

  /** Adds bytes. */
  add(data: Uint8Array): void {
    (this.hash ??= createHash('sha256')).update(data);
    this.bytes += data.byteLength;
    this.end += data.byteLength;
    const room = this.copyLimit - this.copied;
    if (room > 0) {
      const part = Buffer.from(data.buffer, data.byteOffset, Math.min(room, data.byteLength));
      this.chunks.push(Buffer.from(part));
      this.copied += part.length;
    }
  }

  /** Takes an output event of a command (data, or a gap the agent reports). */
  output(ev: OutputEvent): void {
    if (ev.kind === 'gap') {
      this.lostBytes += ev.bytes;
      this.end = Math.max(this.end, ev.offset + ev.bytes);
      return;
    }
    // A reattached reader can see bytes again: only what lies past `end` is new.
    const skip = Math.max(0, this.end - ev.offset);
    if (ev.offset > this.end) this.lostBytes += ev.offset - this.end;
    if (skip < ev.data.length) this.add(skip > 0 ? ev.data.subarray(skip) : ev.data);
    this.end = Math.max(this.end, ev.offset + ev.data.length);
  }

  /** True when every byte is in the copy. */
  get complete(): boolean {
    return this.copied === this.bytes && this.lostBytes === 0;
  }

  /** The hex sha256 of everything seen so far (more bytes may follow). */
  sha256(): string {
    return this.hash ? this.hash.copy().digest('hex') : EMPTY_SHA256;
  }

  /** The copy of the first bytes. */
  copy(): Buffer {
    return Buffer.concat(this.chunks);
  }

  /** As a trajectory step stores it. */
  recorded(): RecordedBytes {
    const r: RecordedBytes = { sha256: this.sha256(), bytes: this.bytes, base64: this.copy().toString('base64'), partial: this.copied < this.bytes };
    if (this.lostBytes > 0) r.lostBytes = this.lostBytes;
    return r;
  }
}

/** Hex sha256 of bytes. */
export function sha256Hex(data: Uint8Array | string): string {
  return createHash('sha256').update(data).digest('hex');
}

/** A step being recorded: its seq is fixed when it starts, it is stored when it ends. */
export class StepRecording {
  /** Set once the step is stored (or dropped): later calls do nothing. */
  protected ended = false;
  protected readonly t0 = performance.now();
  protected readonly fields: Partial<TrajectoryStep> = {};

  constructor(
    protected readonly log: TrajectoryLog,
    readonly sandboxId: string,
    readonly seq: number,
    readonly kind: TrajectoryStepKind,
    readonly startedAt: string,
  ) {}

  /** Adds fields to the step (path, mode, ...). */
  set(fields: Partial<TrajectoryStep>): this {
    Object.assign(this.fields, fields);
    return this;
  }

  /** The step as it stands. */
  protected build(durationMs: number | null): TrajectoryStep {
    return { seq: this.seq, kind: this.kind, startedAt: this.startedAt, durationMs, replayable: true, ...this.fields };
  }

  /** Stores the step as successful. */
  ok(): void {
    if (this.ended) return;
    this.ended = true;
    this.log.commit(this.sandboxId, this.build(performance.now() - this.t0));
  }

  /** Stores the step with its error and rethrows it (use as a promise's rejection handler). */
  failed = (err: unknown): never => {
    if (!this.ended) {
      this.ended = true;
      this.log.commit(this.sandboxId, { ...this.build(performance.now() - this.t0), error: errorOf(err) });
    }
    throw err;
  };
}

/** A file change being recorded, with the bytes it writes (tapped as they stream by). */
export class FileRecording extends StepRecording {
  private data: ByteRecorder | undefined;

  /** Passes a body through, keeping its digest and a bounded copy for the step. */
  tap(body: AsyncIterable<Uint8Array>): AsyncIterable<Uint8Array> {
    const rec = (this.data = new ByteRecorder(TRAJECTORY_DATA_COPY_BYTES));
    return (async function* () {
      for await (const chunk of body) {
        rec.add(chunk);
        yield chunk;
      }
    })();
  }

  protected override build(durationMs: number | null): TrajectoryStep {
    const step = super.build(durationMs);
    if (this.data) {
      step.data = this.data.recorded();
      if (!this.data.complete) Object.assign(step, { replayable: false, reason: `content over ${TRAJECTORY_DATA_COPY_BYTES} bytes (only its digest is kept)` });
    }
    return step;
  }
}

/** A command being recorded: output hashed as it arrives, stored when it exits. */
export class ExecRecording extends StepRecording {
  readonly stdout = new ByteRecorder(TRAJECTORY_OUTPUT_COPY_BYTES);
  readonly stderr = new ByteRecorder(TRAJECTORY_OUTPUT_COPY_BYTES);
  private readonly stdin = new ByteRecorder(TRAJECTORY_DATA_COPY_BYTES);
  private proc: number | undefined;
  private edge: Pick<EdgeClient, 'attach'> | undefined;
  private following = false;

  constructor(
    log: TrajectoryLog,
    sandboxId: string,
    seq: number,
    startedAt: string,
    spec: ExecSpec,
    via: 'exec' | 'stream' | 'ws',
    /** The caller's request: when it is aborted, the command was cut off (killed) by it. */
    private readonly signal?: AbortSignal,
  ) {
    super(log, sandboxId, seq, 'exec', startedAt);
    const command: NonNullable<TrajectoryStep['command']> = {};
    for (const k of ['cmd', 'argv', 'cwd', 'env', 'uid', 'gid', 'timeoutMs', 'pty'] as const) {
      if (spec[k] !== undefined) (command as Record<string, unknown>)[k] = spec[k];
    }
    this.fields.via = via;
    this.fields.command = command;
    if (spec.stdin !== undefined) this.stdin.add(typeof spec.stdin === 'string' ? Buffer.from(spec.stdin) : spec.stdin);
  }

  /** Output of the command (pass as `onOutput`, or call from a stream's tap). */
  onOutput = (ev: OutputEvent): void => {
    (ev.stream === 'stdout' ? this.stdout : this.stderr).output(ev);
  };

  /** Bytes written to the command's stdin after it started. */
  addStdin(data: Uint8Array | string): void {
    this.stdin.add(typeof data === 'string' ? Buffer.from(data) : data);
  }

  /**
   * The command started as process `proc` on `edge`: stored now as running (it may outlive the
   * episode); `follow` reads it on from there if its reader goes.
   */
  started(proc: number, edge: Pick<EdgeClient, 'attach'>): void {
    this.proc = proc;
    this.edge = edge;
    this.log.running(this);
    this.log.commit(this.sandboxId, this.build(null), true);
  }

  /** The agent's handle of the process, once started. */
  get procId(): number | undefined {
    return this.proc;
  }

  /** True once the step is stored with its exit. */
  get finished(): boolean {
    return this.ended;
  }

  /** Stores the command's exit; returns `result` (use as a promise's fulfilment handler). */
  exited = <T extends Pick<ExitInfo, 'exitCode' | 'signal' | 'timedOut' | 'oomKilled' | 'durationMs'>>(result: T): T => {
    if (!this.ended) {
      this.ended = true;
      this.log.notRunning(this);
      const step = this.build(result.durationMs);
      step.exit = { exitCode: result.exitCode, signal: result.signal, timedOut: result.timedOut, oomKilled: result.oomKilled };
      this.log.commit(this.sandboxId, step);
    }
    return result;
  };

  override failed = (err: unknown): never => {
    if (!this.ended) {
      this.ended = true;
      this.log.notRunning(this);
      const cancelled = this.signal?.aborted === true;
      const error = cancelled ? { code: 'CANCELLED', message: 'the caller went away; the command was killed' } : errorOf(err);
      const step = { ...this.build(performance.now() - this.t0), error };
      // A command that could not start (no such program or directory) replays as such; one
      // cut off while it ran did an unknown part of its work.
      if (cancelled || this.proc !== undefined || !START_ERRORS.has(error.code)) {
        Object.assign(step, {
          replayable: false,
          reason: cancelled ? 'cancelled by the caller while it ran' : `it ended in an error (${error.code}), not an exit`,
        });
      }
      this.log.commit(this.sandboxId, step);
    }
    throw err;
  };

  /**
   * The reader went away before the command ended: read on from where it stopped, on a
   * connection of its own, until the exit (or the sandbox goes), so that the step is complete.
   */
  follow = (): void => {
    const edge = this.edge;
    if (this.ended || this.following || this.proc === undefined || edge === undefined) return;
    this.following = true;
    const proc = this.proc;
    void (async () => {
      const att = await edge.attach(this.sandboxId, proc, { stdout: this.stdout.end, stderr: this.stderr.end });
      for await (const ev of att) this.onOutput(ev);
      this.exited(await att.exited);
    })().catch(() => {
      // The sandbox (or its agent) went before the command ended: the step stays as running.
      this.log.notRunning(this);
      this.log.abandoned(this);
    });
  };

  /** The stream that carried the output broke before the exit: read on alone. */
  interrupted = (): void => this.follow();

  protected override build(durationMs: number | null): TrajectoryStep {
    const step = super.build(durationMs);
    step.exit = null;
    step.stdout = this.stdout.recorded();
    step.stderr = this.stderr.recorded();
    if (this.stdin.bytes > 0) {
      step.stdin = this.stdin.recorded();
      if (!this.stdin.complete) Object.assign(step, { replayable: false, reason: `stdin over ${TRAJECTORY_DATA_COPY_BYTES} bytes (only its digest is kept)` });
    }
    return step;
  }
}

/** Errors of a command that never started: replaying it should give the same error. */
const START_ERRORS = new Set(['FILE_NOT_FOUND', 'INVALID_ARGUMENT', 'PERMISSION_DENIED']);

function errorOf(err: unknown): { code: string; message: string } {
  if (err instanceof DsecError) return { code: err.code, message: err.message };
  if (err instanceof Error && err.name === 'AbortError') return { code: 'CANCELLED', message: 'the request was cancelled' };
  // Trajectories are served to the tenant: an internal fault's own text stays on the server.
  return { code: 'INTERNAL', message: 'internal error' };
}
