// The outside half of the reset between two calls of a reused sandbox: one long-lived
// dsec-fnreset process per runner (a process start per call cost the edge more CPU than the rest
// of the call), asked "ID PID STARTTIME" per reset; it forks a child that joins the sandbox's
// namespaces through a pidfd, empties System V IPC and POSIX message queues and mounts fresh tmpfs
// mounts (chronus/launch/dsec-fnreset.c).
import { HelperProcess } from '../../host/helper-process.js';
import type { FreshTmpfs } from './bundle.js';

/** Longest one reset may take before its sandbox is given up (destroyed instead of reused). */
export const RESET_TIMEOUT_MS = 5_000;

/** Options of {@link SandboxResetter}. */
export interface SandboxResetterOptions {
  /** Host path of dsec-fnreset. */
  binary: string;
  /** The writable tmpfs mounts of every call sandbox, mounted afresh at each reset. */
  tmpfs: readonly FreshTmpfs[];
  /** Why a reset failed (dsec-fnreset's standard error). */
  log?: ((line: string) => void) | undefined;
}

/** A dsec-fnreset process serving the resets of one runner's sandboxes, started on first use. */
export class SandboxResetter {
  private readonly server: HelperProcess<boolean>;

  constructor(o: SandboxResetterOptions) {
    const args: string[] = [];
    for (const t of o.tmpfs) args.push('--tmpfs', t.path, t.flags.join(',') || '-', t.data.join(','));
    this.server = new HelperProcess({
      name: 'dsec-fnreset',
      binary: o.binary,
      args,
      // "ID CODE": 0 when the reset was complete.
      parse: (line) => {
        const [id, code] = line.split(' ').map(Number);
        return id === undefined || !Number.isInteger(id) ? undefined : { id, value: code === 0 };
      },
      stderrLine: (line) => o.log?.(`fncall reset: ${line}`),
      closeTimeoutMs: RESET_TIMEOUT_MS,
    });
  }

  /** Resets the sandbox whose PID 1 is `pid` (started at `startTime`, clock ticks); true when complete. */
  reset(pid: number, startTime: number): Promise<boolean> {
    const id = this.server.nextId();
    // A reset that failed, timed out or lost its helper leaves the sandbox to be destroyed.
    return this.server.request(id, `${id} ${pid} ${startTime}\n`, { timeoutMs: RESET_TIMEOUT_MS }).catch(() => false);
  }

  /** Stops the process (its standard input closed); pending resets answer false. */
  close(): Promise<void> {
    return this.server.close();
  }
}
