// The end of a QEMU process, shared by the QEMU backends: a kill that waits for the exit (also of
// a previous edge's QEMU, found by its pid file), and the event of a QEMU that died on its own.
import type { ChildProcess } from 'node:child_process';
import { readFile, stat } from 'node:fs/promises';
import type { BackendKind, EventSink } from '@dsec/protocol';
import { QmpClient } from './qmp.js';

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
  const pid = await qemuPid(pidFile, runDir);
  if (pid !== undefined) {
    process.kill(pid, 'SIGKILL');
    for (let i = 0; i < 500 && (await exists(`/proc/${pid}`)); i++) await new Promise((r) => setTimeout(r, 10));
  }
}

/**
 * The pid in a sandbox's QEMU pid file, if that process is still its QEMU: its command line names
 * the sandbox's run folder and, when `uid` is given, it runs as the sandbox's QEMU uid (a pid
 * reused by another process is not it).
 */
export async function qemuPid(pidFile: string, runDir: string, uid?: number): Promise<number | undefined> {
  const pid = Number(await readFile(pidFile, 'utf8').catch(() => ''));
  if (!Number.isInteger(pid) || pid <= 0) return undefined;
  const cmdline = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '');
  if (!cmdline.split('\0').some((arg) => arg.includes(runDir))) return undefined;
  if (uid !== undefined) {
    const status = await readFile(`/proc/${pid}/status`, 'utf8').catch(() => '');
    const real = /^Uid:\s+(\d+)/m.exec(status)?.[1];
    if (real === undefined || Number(real) !== uid) return undefined;
  }
  return pid;
}

/**
 * Watches a QEMU process: when it exits while nobody stops it (`stopping()` false), the sandbox
 * is lost: an event says so and `teardown` removes everything of it. A QEMU this process did not
 * start (adopted after an edge restart) is watched through its QMP connection: it closes when the
 * process ends.
 */
export function watchQemu(
  source: ChildProcess | QmpClient | undefined,
  o: { id: string; backend: BackendKind; events: EventSink; stopping: () => boolean; teardown: () => Promise<void> },
): void {
  const lost = (how: string, data: Record<string, unknown>): void => {
    if (o.stopping()) return;
    o.events({
      kind: 'sandbox.lost',
      severity: 'warning',
      sandboxId: o.id,
      message: `sandbox ${o.id}: its QEMU process exited (${how})`,
      data: { backend: o.backend, ...data },
    });
    void o.teardown().catch(() => undefined);
  };
  if (source instanceof QmpClient) source.once('close', () => lost('its QMP connection ended', {}));
  else source?.once('exit', (code, sig) => lost(sig ?? `code ${code}`, sig ? { signal: sig } : { code }));
}

async function exists(p: string): Promise<boolean> {
  return stat(p).then(
    () => true,
    () => false,
  );
}
