// Errors of the SDK itself. API errors are DsecError from @dsec/protocol; so is this one.
import { DsecError } from '@dsec/protocol';
import type { ExecResult } from './types.js';

/**
 * Thrown by `exec(..., {check: true})` when the command does not exit 0: a {@link DsecError}
 * with code `COMMAND_FAILED` that carries the whole result, so it reads like one
 * (`err.exitCode`, `err.stdout`, `err.stderr`, `err.result`).
 */
export class CommandExitError extends DsecError {
  /** The command's result. */
  readonly result: ExecResult;
  /** The command as it was given (a shell string, or argv joined by spaces). */
  readonly command: string;

  constructor(result: ExecResult, command: string, sandboxId?: string) {
    const how = result.timedOut ? 'timed out' : result.signal ? `was killed by ${result.signal}` : `exited with ${result.exitCode}`;
    const tail = result.stderr.trim().split('\n').slice(-3).join('\n');
    const details = {
      ...(sandboxId !== undefined ? { sandboxId } : {}),
      pid: result.pid,
      exitCode: result.exitCode,
      signal: result.signal,
      timedOut: result.timedOut,
    };
    super('COMMAND_FAILED', `command ${how}: ${command}${tail ? `\n${tail}` : ''}`, details);
    this.name = 'CommandExitError';
    this.result = result;
    this.command = command;
  }

  /** Exit status, or null when killed by a signal. */
  get exitCode(): number | null {
    return this.result.exitCode;
  }

  /** Signal that killed the command, if any. */
  get signal(): string | null {
    return this.result.signal;
  }

  /** Collected stdout. */
  get stdout(): string {
    return this.result.stdout;
  }

  /** Collected stderr. */
  get stderr(): string {
    return this.result.stderr;
  }

  /** True when the command's timeout killed it. */
  get timedOut(): boolean {
    return this.result.timedOut;
  }

  /** The process's handle in the sandbox. */
  get pid(): number {
    return this.result.pid;
  }
}
