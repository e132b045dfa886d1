// How the node lets a caller stop waiting for work that must run to its end (a pause, a
// destroy): the caller's promise settles with the abort (or a deadline), the work goes on by itself.
import { DsecError } from '@dsec/protocol';

/**
 * `work`, or the signal's reason as soon as it aborts (whichever comes first). The work is not
 * stopped.
 */
export async function untilAborted<T>(work: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  if (!signal) return work;
  // A failure after the abort is nobody's to see: it must not be left unhandled.
  work.catch(() => undefined);
  signal.throwIfAborted();
  let onAbort: () => void = () => undefined;
  const aborted = new Promise<never>((_, reject) => {
    onAbort = () => reject(signal.reason as Error);
    signal.addEventListener('abort', onAbort, { once: true });
  });
  try {
    return await Promise.race([work, aborted]);
  } finally {
    signal.removeEventListener('abort', onAbort);
  }
}

/**
 * `work`, or a TIMEOUT error with `message` once `ms` have passed (whichever comes first). The
 * work is not stopped.
 */
export function withTimeout<T>(work: Promise<T>, ms: number, message: string): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const t = setTimeout(() => reject(new DsecError('TIMEOUT', message)), Math.max(0, ms));
    work.then(
      (v) => {
        clearTimeout(t);
        resolve(v);
      },
      (e: unknown) => {
        clearTimeout(t);
        reject(e instanceof Error ? e : new Error(String(e)));
      },
    );
  });
}
