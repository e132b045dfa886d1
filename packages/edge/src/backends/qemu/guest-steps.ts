// A snapshot's steps inside a VM's guest (sync and freeze, read, thaw), shared by the microVM and
// the full VM: the freeze and thaw scripts, and one runner that bounds every step. The guest's
// root controls the guest (its `sh`, `sync` and `fsfreeze` can stop, and so can its agent), so a
// step that does not end is abandoned, its process killed where the agent still listens, and the
// snapshot fails, instead of holding the sandbox's transition (and a delete behind it) for ever.
import { DsecError } from '@dsec/protocol';
import type { SandboxAgent } from '../../backend.js';
import type { Attachment } from '../../chronus/attachment.js';

/** Longest a guest's file system stays frozen for a snapshot, whatever happens to the edge (a guard in the guest lifts it). */
export const FREEZE_GUARD_S = 120;
/**
 * Longest a snapshot's step in the guest may take (sync + freeze, thaw), or, for a step that
 * streams (a tar of the writable layer), may go without output.
 */
export const GUEST_STEP_TIMEOUT_MS = 60_000;
/**
 * Longest a streaming step may take in all, however steadily it writes: a guest that trickles a
 * byte a minute must not hold the sandbox's transition (and a delete behind it) for ever. A tar
 * of a large writable layer under software emulation takes minutes, not half an hour.
 */
export const GUEST_STEP_TOTAL_MS = 30 * 60_000;
/** Most bytes of a step's stderr kept for its error. */
const STDERR_KEEP = 4096;
/** Most bytes of a step's output that {@link collectOutput} keeps. */
const MAX_OUTPUT_BYTES = 64 * 1024 * 1024;

/**
 * Shell lines that start the guard (a process of its own session that lifts the freeze of
 * `mount` after {@link FREEZE_GUARD_S}) and print its pid, then sync and freeze `mount`. `tool`
 * prefixes every command (a busybox path and a space, or '' for the guest's own tools).
 */
export function freezeLines(mount: string, tool = ''): string {
  return `${tool}setsid ${tool}sh -c "${tool}sleep ${FREEZE_GUARD_S}; ${tool}fsfreeze --unfreeze ${mount}" </dev/null >/dev/null 2>&1 &
echo $!
${tool}sync
${tool}fsfreeze --freeze ${mount}
`;
}

/**
 * Shell lines that lift the freeze of `mount` and end the guard (`$1`, the leader of its own
 * process group: its sleep ends with it, so an old guard never lifts a later snapshot's freeze);
 * safe to run again.
 */
export function thawLines(mount: string, tool = ''): string {
  return `${tool}fsfreeze --unfreeze ${mount} 2>/dev/null
[ -n "$1" ] && { kill -TERM "-$1" 2>/dev/null || kill -TERM "$1" 2>/dev/null; }
`;
}

/** One step of {@link runGuestStep}. */
export interface GuestStep<T> {
  /** The sandbox, named in errors. */
  id: string;
  /** The step's name in errors ("freeze", "tar", "thaw"). */
  step: string;
  /** The shell that runs `script` as root (`['/bin/sh']`, or a busybox and `sh`). */
  shell: string[];
  script: string;
  args?: string[];
  /** Gets the step's stdout as chunks (read with the attachment's flow control); its result is the step's. */
  consume: (chunks: AsyncIterable<Buffer>) => Promise<T>;
  /**
   * `total` (default): the step ends within `timeoutMs`. `idle`: it writes or ends within
   * `timeoutMs` of its start or its last output (a stream whose length grows with the layer).
   */
  bound?: 'total' | 'idle';
  /** Default {@link GUEST_STEP_TIMEOUT_MS}. */
  timeoutMs?: number;
  /** With `bound: 'idle'`, the step's whole bound however it writes. Default {@link GUEST_STEP_TOTAL_MS}. */
  totalMs?: number;
  signal?: AbortSignal | undefined;
}

/**
 * Runs a step's script under the guest's shell as root: `consume`'s result once the script
 * exited 0, else BACKEND_FAILED naming the step and its stderr; TIMEOUT past its bound, or the
 * signal's reason when it aborts. On any failure the step's process is killed (not waited for:
 * an agent that stopped answering must not hold the caller as well).
 */
export async function runGuestStep<T>(agent: SandboxAgent, o: GuestStep<T>): Promise<T> {
  const timeoutMs = o.timeoutMs ?? GUEST_STEP_TIMEOUT_MS;
  o.signal?.throwIfAborted();
  const att = await agent.spawn({ argv: [...o.shell, '-c', o.script, 'dsec-snapshot', ...(o.args ?? [])], uid: 0, gid: 0 });
  const stderr: Buffer[] = [];
  let kept = 0;
  let onAbort: (() => void) | undefined;
  let timer: NodeJS.Timeout | undefined;
  let total: NodeJS.Timeout | undefined;
  const totalMs = o.totalMs ?? GUEST_STEP_TOTAL_MS;
  let rearm = (): void => undefined;
  const stopped = new Promise<never>((_, reject) => {
    const timedOut = (): void =>
      reject(
        new DsecError(
          'TIMEOUT',
          `sandbox ${o.id}: the snapshot's ${o.step} step ${o.bound === 'idle' ? 'wrote nothing and did not end' : 'did not end'} in the guest within ${timeoutMs} ms`,
          { sandboxId: o.id },
        ),
      );
    const arm = (): void => {
      clearTimeout(timer);
      timer = setTimeout(timedOut, timeoutMs);
    };
    arm();
    if (o.bound === 'idle') {
      rearm = arm;
      // However steadily it writes, an idle-bounded step ends within its total bound.
      total = setTimeout(() => {
        rearm = () => undefined;
        clearTimeout(timer);
        reject(new DsecError('TIMEOUT', `sandbox ${o.id}: the snapshot's ${o.step} step did not end in the guest within ${totalMs} ms`, { sandboxId: o.id }));
      }, totalMs);
    }
    onAbort = () => reject(o.signal?.reason instanceof Error ? o.signal.reason : new DsecError('CANCELLED', `sandbox ${o.id}: the snapshot was cancelled`));
    o.signal?.addEventListener('abort', onAbort, { once: true });
    // Aborted while the step was being spawned.
    if (o.signal?.aborted) onAbort();
  });
  const work = (async (): Promise<T> => {
    const out = stdoutOf(
      att,
      (b) => {
        if (kept < STDERR_KEEP) stderr.push(b.subarray(0, STDERR_KEEP - kept));
        kept += b.length;
      },
      () => rearm(),
    );
    const result = await o.consume(out);
    // Whatever the consumer left unread.
    for await (const _ of out);
    const exit = await att.exited;
    if (exit.exitCode !== 0) {
      const why = Buffer.concat(stderr).toString('utf8').trim();
      throw new DsecError(
        'BACKEND_FAILED',
        `sandbox ${o.id}: the snapshot's ${o.step} step failed in the guest (exit ${exit.exitCode ?? exit.signal})${why ? `: ${why}` : ''}`,
        { sandboxId: o.id },
      );
    }
    return result;
  })();
  try {
    return await Promise.race([work, stopped]);
  } catch (err) {
    work.catch(() => undefined);
    void agent.signal(att.proc, 'KILL', true).catch(() => undefined);
    throw err;
  } finally {
    clearTimeout(timer);
    clearTimeout(total);
    stopped.catch(() => undefined);
    if (onAbort) o.signal?.removeEventListener('abort', onAbort);
    void agent.release(att.proc).catch(() => undefined);
  }
}

/** A step's whole stdout, at most 64 MiB (the directory list of a large layer fits). */
export async function collectOutput(chunks: AsyncIterable<Buffer>): Promise<Buffer> {
  const parts: Buffer[] = [];
  let n = 0;
  for await (const c of chunks) {
    n += c.length;
    if (n > MAX_OUTPUT_BYTES) throw new DsecError('BACKEND_FAILED', `the guest's output of a snapshot step is over ${MAX_OUTPUT_BYTES} bytes`);
    parts.push(c);
  }
  return Buffer.concat(parts);
}

/** The attachment's stdout as chunks (stderr to `onStderr`, each stdout chunk to `onOutput`); a gap (output lost) fails it. */
function stdoutOf(att: Attachment, onStderr: (b: Buffer) => void, onOutput: () => void): AsyncIterable<Buffer> & AsyncIterator<Buffer> {
  const it = att[Symbol.asyncIterator]();
  const self: AsyncIterable<Buffer> & AsyncIterator<Buffer> = {
    [Symbol.asyncIterator]: () => self,
    async next(): Promise<IteratorResult<Buffer>> {
      for (;;) {
        const r = await it.next();
        if (r.done) return { done: true, value: undefined };
        const ev = r.value;
        if (ev.kind === 'gap') throw new DsecError('BACKEND_FAILED', `the guest's output lost ${ev.bytes} bytes of ${ev.stream}`);
        if (ev.stream === 'stderr') onStderr(ev.data);
        else {
          // Only the step's product keeps an idle-bounded step alive: stderr is the guest's to write.
          onOutput();
          return { done: false, value: ev.data };
        }
      }
    },
  };
  return self;
}
