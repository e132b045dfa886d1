// Runs crun, inside the runtime mount namespace when the host needs one.
import { spawn } from 'node:child_process';
import type { StdioOptions } from 'node:child_process';
import { DsecError } from '@dsec/protocol';

/** Output kept from a crun call for error messages. */
const MAX_CAPTURE_BYTES = 65_536;
/** Time after which a crun call is considered hung. */
export const CRUN_TIMEOUT_MS = 30_000;

/** Result of one crun call. */
export interface CrunResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** A crun binary with a state root, reached through an argv prefix (nsenter on hybrid hosts). */
export class Crun {
  constructor(
    private readonly prefix: string[],
    private readonly stateRoot: string,
    private readonly binary: string = 'crun',
  ) {}

  /**
   * Runs `crun --root R <args>`. `extraFds` are passed as fds 3, 4, ... of crun; `logFd`, when
   * given, receives crun's (and a detached container's) stdout and stderr; `prefix` replaces
   * the default way into the runtime namespace (dsec-launch on create).
   */
  run(args: string[], opts: { extraFds?: number[]; logFd?: number; timeoutMs?: number; prefix?: string[] } = {}): Promise<CrunResult> {
    const argv = [...(opts.prefix ?? this.prefix), this.binary, '--root', this.stateRoot, ...args];
    const out = opts.logFd ?? 'pipe';
    const stdio: StdioOptions = ['ignore', out, out, ...(opts.extraFds ?? [])];
    return new Promise((resolve, reject) => {
      const child = spawn(argv[0] as string, argv.slice(1), { stdio });
      let stdout = '';
      let stderr = '';
      child.stdout?.on('data', (d: Buffer) => {
        if (stdout.length < MAX_CAPTURE_BYTES) stdout += d.toString();
      });
      child.stderr?.on('data', (d: Buffer) => {
        if (stderr.length < MAX_CAPTURE_BYTES) stderr += d.toString();
      });
      const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? CRUN_TIMEOUT_MS);
      child.on('error', (err) => {
        clearTimeout(timer);
        reject(new DsecError('BACKEND_FAILED', `cannot run crun: ${err.message}`));
      });
      child.on('close', (code, signal) => {
        clearTimeout(timer);
        resolve({ code: code ?? (signal ? 128 : 1), stdout, stderr });
      });
    });
  }

  /** Runs crun and throws BACKEND_FAILED with its message when it fails. */
  async check(args: string[], what: string, opts: { extraFds?: number[]; logFd?: number; prefix?: string[] } = {}): Promise<CrunResult> {
    const res = await this.run(args, opts);
    if (res.code !== 0) {
      throw new DsecError('BACKEND_FAILED', `${what}: crun ${args[0]} failed: ${(res.stderr || res.stdout).trim() || `exit ${res.code}`}`);
    }
    return res;
  }

  /** The container's status (`running`, `stopped`, ...) or undefined when crun does not know it. */
  async status(id: string): Promise<string | undefined> {
    const res = await this.run(['state', id]);
    if (res.code !== 0) return undefined;
    try {
      return (JSON.parse(res.stdout) as { status?: string }).status;
    } catch {
      return undefined;
    }
  }
}
