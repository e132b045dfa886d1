// Errors of the SDK itself (API errors are DsecError from @dsec/protocol).
import type { ExecResult } from './types.js';

/**
 * Thrown by `exec(..., {check: true})` when the command does not exit 0. It carries the whole
 * result, so it reads like one (`err.exitCode`, `err.stdout`, `err.stderr`).
 */
export class CommandExitError extends Error {
  /** The command's result. */
  readonly result: ExecResult;

  constructor(result: ExecResult, command: string) {
    const how = result.timedOut ? 'timed out' : result.signal ? `was killed by ${result.signal}` : `exited with ${result.exitCode}`;
    const tail = result.stderr.trim().split('\n').slice(-3).join('\n');
    super(`command ${how}: ${command}${tail ? `\n${tail}` : ''}`);
    this.name = 'CommandExitError';
    this.result = result;
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
}
