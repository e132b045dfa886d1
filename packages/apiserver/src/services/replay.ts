// Replay ("fast-forward"): re-runs one recorded trajectory step on a fresh sandbox and compares
// the outcome with the record. Steps are recorded in the new sandbox's own trajectory too.
import { DsecError } from '@dsec/protocol';
import type { ExecSpec, ReplayStep, ReplaySummary, TrajectoryStep } from '@dsec/protocol';
import type { ExecRecording } from '../trajectory.js';
import type { CommandService, CommandTarget } from './commands.js';
import type { FileService } from './files.js';

/** Largest file or tar a replayed step writes (bounded by what a trajectory keeps anyway). */
const MAX_REPLAY_WRITE_BYTES = 64 * 1024 * 1024;
/** Time limit of a replayed command that had none: ten times its recorded run, at least a minute. */
const MIN_REPLAY_TIMEOUT_MS = 60_000;
const MAX_REPLAY_TIMEOUT_MS = 86_400_000;

/** Where a replay runs, and the services that run (and record) each step. */
export interface ReplayTarget {
  target: CommandTarget;
  commands: CommandService;
  files: FileService;
}

/** Counts of each verdict. */
export function summarize(steps: ReplayStep[]): ReplaySummary {
  const s: ReplaySummary = { same: 0, exitDiffers: 0, outputDiffers: 0, notReplayable: 0 };
  for (const step of steps) {
    if (step.verdict === 'same') s.same++;
    else if (step.verdict === 'exit-differs') s.exitDiffers++;
    else if (step.verdict === 'output-differs') s.outputDiffers++;
    else s.notReplayable++;
  }
  return s;
}

function codeOf(err: unknown): string {
  return err instanceof DsecError ? err.code : 'INTERNAL';
}

/** Re-runs one step and says how it compares. */
export async function replayStep(t: ReplayTarget, step: TrajectoryStep, signal?: AbortSignal): Promise<ReplayStep> {
  const t0 = performance.now();
  const out = (verdict: ReplayStep['verdict'], extra: Partial<ReplayStep> = {}): ReplayStep => ({
    seq: step.seq,
    kind: step.kind,
    verdict,
    durationMs: performance.now() - t0,
    ...extra,
  });
  if (!step.replayable) return out('not-replayable', { reason: step.reason ?? 'not replayable' });
  if (step.kind === 'exec') return replayExec(t, step, out, signal);
  const data = step.data?.base64 !== undefined ? Buffer.from(step.data.base64, 'base64') : undefined;
  if ((step.kind === 'write' || step.kind === 'tar') && (data === undefined || step.data?.partial)) {
    return out('not-replayable', { reason: 'the content was not kept' });
  }
  const expectedError = step.error?.code;
  let actualError: string | undefined;
  try {
    const path = step.path ?? '/';
    const body = oneChunk(data ?? Buffer.alloc(0));
    const { files, target } = t;
    if (step.kind === 'write') await files.write(target, path, body, { mode: step.mode, append: step.append === true, limitBytes: MAX_REPLAY_WRITE_BYTES });
    else if (step.kind === 'tar') await files.uploadTar(target, path, body, MAX_REPLAY_WRITE_BYTES);
    else if (step.kind === 'mkdir') await files.mkdir(target, path);
    else if (step.kind === 'remove') await files.remove(target, path, step.recursive === true);
    else if (step.kind === 'rename') await files.rename(target, step.from ?? '', step.to ?? '');
  } catch (err) {
    if (signal?.aborted) throw err;
    actualError = codeOf(err);
  }
  const expected = expectedError !== undefined ? { error: expectedError } : {};
  const actual = actualError !== undefined ? { error: actualError } : {};
  if (expectedError === actualError) return out('same');
  return out('exit-differs', { reason: `expected ${expectedError ?? 'success'}, got ${actualError ?? 'success'}`, expected, actual });
}

async function replayExec(
  t: ReplayTarget,
  step: TrajectoryStep,
  out: (v: ReplayStep['verdict'], extra?: Partial<ReplayStep>) => ReplayStep,
  signal?: AbortSignal,
): Promise<ReplayStep> {
  const command = step.command ?? {};
  if (step.stdin && (step.stdin.base64 === undefined || step.stdin.partial)) return out('not-replayable', { reason: 'stdin was not kept' });
  const stdin = step.stdin?.base64 !== undefined ? Buffer.from(step.stdin.base64, 'base64') : undefined;
  const recordedMs = step.durationMs ?? 0;
  const spec: ExecSpec = {
    ...command,
    timeoutMs: command.timeoutMs ?? Math.min(MAX_REPLAY_TIMEOUT_MS, Math.max(MIN_REPLAY_TIMEOUT_MS, Math.ceil(recordedMs * 10))),
    ...(stdin !== undefined ? { stdin } : {}),
  };
  const expected = {
    ...(step.exit ? { exitCode: step.exit.exitCode, signal: step.exit.signal } : {}),
    ...(step.error ? { error: step.error.code } : {}),
    ...(step.stdout ? { stdoutSha256: step.stdout.sha256 } : {}),
    ...(step.stderr ? { stderrSha256: step.stderr.sha256 } : {}),
  };
  if (step.exit === null && step.error === undefined) {
    // Still running when recorded (a server, a watcher): start it again and let it run.
    try {
      const running = await t.commands.spawn(
        t.target,
        { ...spec, timeoutMs: command.timeoutMs, ...(step.via === 'ws' ? { keepStdinOpen: true } : {}) },
        step.via ?? 'stream',
      );
      await running.leave();
    } catch (err) {
      if (signal?.aborted) throw err;
      return out('exit-differs', { reason: 'it was running when recorded; it did not start again', expected, actual: { error: codeOf(err) } });
    }
    return out('same', { reason: 'it was running when recorded: started again in the background', expected });
  }
  let rec: ExecRecording | undefined;
  let actual: NonNullable<ReplayStep['actual']>;
  try {
    const { result, recording } = await t.commands.exec(t.target, spec, signal);
    rec = recording;
    actual = { exitCode: result.exitCode, signal: result.signal, stdoutSha256: recording.stdout.sha256(), stderrSha256: recording.stderr.sha256() };
  } catch (err) {
    if (signal?.aborted) throw err;
    actual = { error: codeOf(err) };
  }
  if (step.error !== undefined || actual.error !== undefined) {
    return step.error?.code === actual.error
      ? out('same', { expected, actual })
      : out('exit-differs', { reason: `expected ${step.error?.code ?? 'an exit'}, got ${actual.error ?? 'an exit'}`, expected, actual });
  }
  if (step.exit?.exitCode !== actual.exitCode || step.exit?.signal !== actual.signal) {
    return out('exit-differs', {
      reason: `exit ${describeExit(step.exit?.exitCode, step.exit?.signal)} recorded, ${describeExit(actual.exitCode, actual.signal)} now`,
      expected,
      actual,
    });
  }
  const lost = (step.stdout?.lostBytes ?? 0) + (step.stderr?.lostBytes ?? 0) + (rec?.stdout.lostBytes ?? 0) + (rec?.stderr.lostBytes ?? 0);
  if (lost > 0) return out('same', { reason: 'output was dropped before it was read: only the exit is compared', expected, actual });
  const streams = [
    ['stdout', step.stdout?.sha256, actual.stdoutSha256],
    ['stderr', step.stderr?.sha256, actual.stderrSha256],
  ] as const;
  const differ = streams.filter(([, a, b]) => a !== undefined && a !== b).map(([name]) => name);
  if (differ.length > 0) return out('output-differs', { reason: `${differ.join(' and ')} differ`, expected, actual });
  return out('same', { expected, actual });
}

function describeExit(code: number | null | undefined, signal: string | null | undefined): string {
  return signal ? signal : String(code ?? '?');
}

async function* oneChunk(data: Buffer): AsyncGenerator<Uint8Array> {
  if (data.length > 0) yield data;
}
