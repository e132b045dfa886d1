// Everything the benchmark starts registers its undo here; the undos run in reverse order on
// normal exit, on error, and on Ctrl-C / SIGTERM.
import { progress } from './stats.js';

type Undo = { what: string; run: () => unknown };

const undos: Undo[] = [];
let running: Promise<void> | undefined;

/** Registers an undo step; returns a function that runs it now (and unregisters it). */
export function onCleanup(what: string, run: () => unknown): () => Promise<void> {
  const undo: Undo = { what, run };
  undos.push(undo);
  return async () => {
    const i = undos.indexOf(undo);
    if (i < 0) return;
    undos.splice(i, 1);
    await undo.run();
  };
}

/** Runs every registered undo, newest first; errors are reported, not thrown. */
export function cleanupAll(): Promise<void> {
  running ??= (async () => {
    while (undos.length) {
      const undo = undos.pop()!;
      try {
        await undo.run();
      } catch (err) {
        progress(`cleanup of ${undo.what} failed: ${(err as Error).message}`);
      }
    }
  })();
  return running;
}

/** Cleans up and exits on SIGINT/SIGTERM (a second signal exits at once). */
export function cleanupOnSignals(): void {
  for (const sig of ['SIGINT', 'SIGTERM'] as const) {
    process.on(sig, () => {
      if (running) process.exit(130);
      progress(`${sig}: cleaning up`);
      void cleanupAll().finally(() => process.exit(130));
    });
  }
}
