// The outside half of the reset between two calls of a reused sandbox: one long-lived
// dsec-fnreset process per runner (a process start per call cost the edge more CPU than the rest
// of the call), asked "ID PID STARTTIME" per reset; it forks a child that joins the sandbox's
// namespaces through a pidfd, empties System V IPC and POSIX message queues and mounts fresh tmpfs
// mounts (chronus/launch/dsec-fnreset.c).
import { spawn } from 'node:child_process';
import type { ChildProcessWithoutNullStreams } from 'node:child_process';
import { createInterface } from 'node:readline';
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
  private child: ChildProcessWithoutNullStreams | undefined;
  private nextId = 1;
  private readonly pending = new Map<number, (ok: boolean) => void>();

  constructor(private readonly o: SandboxResetterOptions) {}

  /** Resets the sandbox whose PID 1 is `pid` (started at `startTime`, clock ticks); true when complete. */
  reset(pid: number, startTime: number): Promise<boolean> {
    const child = this.start();
    const id = this.nextId++;
    return new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => done(false), RESET_TIMEOUT_MS);
      const done = (ok: boolean): void => {
        clearTimeout(timer);
        this.pending.delete(id);
        resolve(ok);
      };
      this.pending.set(id, done);
      child.stdin.write(`${id} ${pid} ${startTime}\n`);
    });
  }

  private start(): ChildProcessWithoutNullStreams {
    if (this.child) return this.child;
    const args: string[] = [];
    for (const t of this.o.tmpfs) args.push('--tmpfs', t.path, t.flags.join(',') || '-', t.data.join(','));
    const child = spawn(this.o.binary, args, { stdio: ['pipe', 'pipe', 'pipe'] });
    this.child = child;
    child.stdin.on('error', () => undefined);
    createInterface({ input: child.stdout }).on('line', (line) => {
      const [id, code] = line.split(' ').map(Number);
      this.pending.get(id ?? 0)?.(code === 0);
    });
    createInterface({ input: child.stderr }).on('line', (line) => this.o.log?.(`fncall reset: ${line}`));
    const gone = (): void => {
      if (this.child === child) this.child = undefined;
      for (const done of [...this.pending.values()]) done(false);
    };
    child.on('error', gone);
    child.on('exit', gone);
    return child;
  }

  /** Stops the process (its standard input closed); pending resets answer false. */
  async close(): Promise<void> {
    const child = this.child;
    if (!child) return;
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    child.stdin.end();
    const timer = setTimeout(() => child.kill('SIGKILL'), RESET_TIMEOUT_MS);
    await exited;
    clearTimeout(timer);
  }
}
