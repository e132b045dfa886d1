// The end of a QEMU process, shared by the QEMU backends: a kill that waits for the exit (also of
// a previous edge's QEMU, found by its pid file), and the event of a QEMU that died on its own.
import type { ChildProcess } from 'node:child_process';
import { readFile, stat } from 'node:fs/promises';
import type { BackendKind, EventSink } from '@dsec/protocol';

/**
 * Ends QEMU with SIGKILL and waits for its exit: our child, or else the pid in `pidFile` when
 * that process's command line still names `runDir` (a previous edge's QEMU).
 */
export async function killQemu(child: ChildProcess | undefined, pidFile: string, runDir: string): Promise<void> {
  if (child && child.exitCode === null && child.signalCode === null) {
    const gone = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    child.kill('SIGKILL');
    await gone;
    return;
  }
  const pid = Number(await readFile(pidFile, 'utf8').catch(() => ''));
  if (pid > 0 && (await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '')).includes(runDir)) {
    process.kill(pid, 'SIGKILL');
    for (let i = 0; i < 500 && (await exists(`/proc/${pid}`)); i++) await new Promise((r) => setTimeout(r, 10));
  }
}

/**
 * Watches a QEMU process: when it exits while nobody stops it (`stopping()` false), the sandbox
 * is lost: an event says so and `teardown` removes everything of it.
 */
export function watchQemu(
  child: ChildProcess | undefined,
  o: { id: string; backend: BackendKind; events: EventSink; stopping: () => boolean; teardown: () => Promise<void> },
): void {
  child?.once('exit', (code, sig) => {
    if (o.stopping()) return;
    o.events({
      kind: 'sandbox.lost',
      severity: 'warning',
      sandboxId: o.id,
      message: `sandbox ${o.id}: its QEMU process exited (${sig ?? `code ${code}`})`,
      data: { backend: o.backend, ...(sig ? { signal: sig } : { code }) },
    });
    void o.teardown().catch(() => undefined);
  });
}

async function exists(p: string): Promise<boolean> {
  return stat(p).then(
    () => true,
    () => false,
  );
}
