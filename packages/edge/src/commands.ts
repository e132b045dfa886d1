// Commands as the node runs them: an ExecSpec turned into the agent's spawn options, and a
// started process run to completion with its output collected (capped).
import { DsecError } from '@dsec/protocol';
import type { EdgeExecOptions, ExecResult, ExecSpec } from '@dsec/protocol';
import type { SpawnOptions } from './chronus/client.js';
import type { EdgeProcessStream } from './process-stream.js';

/** Default cap on stdout and stderr collected into one ExecResult (each). */
export const DEFAULT_MAX_OUTPUT_BYTES = 16 * 1024 * 1024;

/** Environment every command starts with, below the sandbox's and the command's own. */
const BASE_ENV = { PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', HOME: '/root' };

/** The agent's spawn options of a command, with the sandbox's env below the command's. */
export function toSpawnOptions(spec: ExecSpec, sandboxEnv: Record<string, string> | undefined): SpawnOptions {
  const o: SpawnOptions = {};
  if (spec.cmd !== undefined) o.shell = spec.cmd;
  if (spec.argv !== undefined) o.argv = spec.argv;
  if (spec.env !== undefined || sandboxEnv !== undefined) o.env = { ...BASE_ENV, ...sandboxEnv, ...spec.env };
  if (spec.cwd !== undefined) o.cwd = spec.cwd;
  if (spec.uid !== undefined) o.uid = spec.uid;
  if (spec.gid !== undefined) o.gid = spec.gid;
  if (spec.stdin !== undefined || spec.keepStdinOpen) o.stdin = true;
  if (spec.pty !== undefined) {
    o.pty = spec.pty;
    // A terminal without TERM confuses most programs; default it as ssh and docker do.
    if (!o.env?.TERM) o.env = { ...BASE_ENV, ...sandboxEnv, TERM: 'xterm', ...spec.env };
  }
  if (spec.timeoutMs !== undefined) o.timeoutMs = spec.timeoutMs;
  return o;
}

/**
 * Writes stdin; a command that already exited (or closed stdin) is not an error here. Waits no
 * longer than the command: a stream given up on (its agent does not answer) ends the wait too.
 */
export async function writeStdinIgnoringExit(proc: EdgeProcessStream, data: string | Uint8Array, eof: boolean): Promise<void> {
  const written = proc.write(data, eof).catch((err: unknown) => {
    if (!(err instanceof DsecError && err.code === 'CONFLICT')) throw err;
  });
  written.catch(() => undefined);
  await Promise.race([written, proc.exited.then(() => written)]);
}

/**
 * Runs a started process to its exit: writes the spec's stdin (then closes it), collects
 * stdout and stderr up to the cap (the rest is drained and `truncated` set), and kills the
 * process when the signal aborts.
 */
export async function collectResult(proc: EdgeProcessStream, spec: ExecSpec, opts: EdgeExecOptions): Promise<ExecResult> {
  const max = opts.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES;
  const out = { stdout: [] as Uint8Array[], stderr: [] as Uint8Array[] };
  const size = { stdout: 0, stderr: 0 };
  let truncated = false;
  proc.onOutput((ev) => {
    opts.onOutput?.(ev);
    if (ev.kind !== 'data') return;
    const room = max - size[ev.stream];
    if (room <= 0) {
      truncated = true;
      return;
    }
    const chunk = ev.data.length > room ? ev.data.subarray(0, room) : ev.data;
    if (chunk.length < ev.data.length) truncated = true;
    out[ev.stream].push(chunk);
    size[ev.stream] += chunk.length;
  });
  const onAbort = (): void => void proc.kill('SIGKILL').catch(() => undefined);
  opts.signal?.addEventListener('abort', onAbort, { once: true });
  try {
    if (spec.stdin !== undefined) await writeStdinIgnoringExit(proc, spec.stdin, true);
    const exit = await proc.exited;
    opts.signal?.throwIfAborted();
    return { ...exit, stdout: Buffer.concat(out.stdout).toString('utf8'), stderr: Buffer.concat(out.stderr).toString('utf8'), truncated };
  } finally {
    opts.signal?.removeEventListener('abort', onAbort);
  }
}
