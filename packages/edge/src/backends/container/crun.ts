// Runs crun, inside the runtime mount namespace when the host needs one. crun runs from a
// sealed memfd copy of itself, made once per process: a crun started from a file on disk
// protects itself against a container that overwrites the runtime's binary through
// /proc/<pid>/exe (CVE-2019-5736) by bind-mounting its own executable on a temporary file and
// executing itself again, on every call (~3 ms, and two mount table changes). From a sealed
// memfd (which nothing can change) it skips that.
import { spawn } from 'node:child_process';
import type { StdioOptions } from 'node:child_process';
import { accessSync, constants as fsConstants, readFileSync } from 'node:fs';
import { readFile, rm } from 'node:fs/promises';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { DsecError } from '@dsec/protocol';
import { closeFd, pidfdOpen, pidfdSendSignal, sealedCopy } from '../../sys/linux.js';

/** How long an ended container's processes may take to exit before the caller falls back to crun. */
const END_TIMEOUT_MS = 2_000;
const SIGKILL = 9;

/** What ending a container needs of its cgroups. */
export interface ContainerCgroups {
  thaw(id: string): Promise<void>;
  waitEmpty(id: string, timeoutMs: number): Promise<boolean>;
  remove(id: string): Promise<void>;
  existing(id: string): Promise<string[]>;
}

/** Output kept from a crun call for error messages. */
const MAX_CAPTURE_BYTES = 65_536;
/** Time after which a crun call is considered hung. */
export const CRUN_TIMEOUT_MS = 30_000;

/** Sealed copies made by this process, by the binary's path: the path to exec each one through. */
const sealedExecutables = new Map<string, string>();

/** Absolute path of `binary`, looked up in PATH when it has no slash; undefined when not found. */
function resolveBinary(binary: string): string | undefined {
  const candidates = binary.includes('/')
    ? [binary]
    : (process.env['PATH'] ?? '/usr/sbin:/usr/bin:/sbin:/bin').split(':').map((d) => path.join(d || '.', binary));
  for (const file of candidates) {
    try {
      accessSync(file, fsConstants.X_OK);
      return path.resolve(file);
    } catch {
      // next
    }
  }
  return undefined;
}

/**
 * The path to exec `binary` by: `/proc/<this pid>/fd/<n>` of a sealed memfd copy of it, made on
 * first use and kept open (close-on-exec) for the life of the process; the binary itself when
 * no copy can be made (no memfd support: crun then protects itself as before).
 */
export function sealedExecutable(binary: string): string {
  const known = sealedExecutables.get(binary);
  if (known) return known;
  let exe = binary;
  const file = resolveBinary(binary);
  if (file) {
    try {
      exe = `/proc/${process.pid}/fd/${sealedCopy(file)}`;
    } catch {
      exe = binary;
    }
  }
  sealedExecutables.set(binary, exe);
  return exe;
}

/** Result of one crun call. */
export interface CrunResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** A crun binary with a state root, reached through an argv prefix (nsenter on hybrid hosts). */
export class Crun {
  private readonly executable: string;

  constructor(
    private readonly prefix: string[],
    private readonly stateRoot: string,
    binary: string = 'crun',
  ) {
    this.executable = sealedExecutable(binary);
  }

  /**
   * Runs `crun --root R <args>`. `extraFds` are passed as fds 3, 4, ... of crun; `logFd`, when
   * given, receives crun's (and a detached container's) stdout and stderr; `prefix` replaces
   * the default way into the runtime namespace (dsec-launch on create).
   */
  /** `crun --root R <args>` as an argv (no prefix): what a launcher runs after its own set-up. */
  argv(args: string[]): string[] {
    return [this.executable, '--root', this.stateRoot, ...args];
  }

  run(args: string[], opts: { extraFds?: number[]; logFd?: number; timeoutMs?: number; prefix?: string[] } = {}): Promise<CrunResult> {
    const argv = [...(opts.prefix ?? this.prefix), ...this.argv(args)];
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

  /** PID 1 of a container and its start time (clock ticks), from crun's state file. */
  async initProcess(id: string): Promise<{ pid: number; startTime: number | undefined } | undefined> {
    try {
      const state = JSON.parse(await readFile(path.join(this.stateRoot, id, 'status'), 'utf8')) as { pid?: number; 'process-start-time'?: number };
      return state.pid ? { pid: state.pid, startTime: state['process-start-time'] } : undefined;
    } catch {
      return undefined;
    }
  }

  /**
   * Ends a container without a crun process (a `crun delete --force` costs a process start and
   * crun's own state handling, ~15 ms): SIGKILL to its PID 1 through a pidfd checked against the
   * start time crun recorded (the kernel then kills everything else in its PID namespace), a
   * thaw (a frozen process takes the kill only once thawed), the wait until its cgroup is empty,
   * its cgroup directories removed, then crun's state directory. The container's root mounts
   * lived in mount namespaces of its own, gone with its processes. False when a process or a
   * cgroup directory is left: the caller then asks crun to delete it.
   */
  async end(id: string, cgroups: ContainerCgroups): Promise<boolean> {
    const init = await this.initProcess(id);
    if (init) {
      const fd = pidfdOpen(init.pid);
      if (fd !== undefined) {
        try {
          if (processStartTime(init.pid) === init.startTime) pidfdSendSignal(fd, SIGKILL);
        } catch {
          // It exited meanwhile.
        } finally {
          closeFd(fd);
        }
      }
    }
    await cgroups.thaw(id).catch(() => undefined);
    const deadline = Date.now() + END_TIMEOUT_MS;
    if (!(await cgroups.waitEmpty(id, END_TIMEOUT_MS))) return false;
    // A process leaves its cgroup before it is reaped: the PID namespace's init reaps the others
    // before it becomes a zombie itself, so once it is one (or gone) none of them is left even
    // as a zombie.
    if (init && !(await reaped(init.pid, init.startTime, deadline))) return false;
    await cgroups.remove(id);
    if ((await cgroups.existing(id)).length > 0) return false;
    await rm(path.join(this.stateRoot, id), { recursive: true, force: true });
    return true;
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

/**
 * Waits until the process is a zombie or gone (another process under its pid counts as gone);
 * false at the deadline.
 */
async function reaped(pid: number, startTime: number | undefined, deadline: number): Promise<boolean> {
  for (let poll = 0; ; poll++) {
    const stat = procStat(pid);
    if (!stat || (startTime !== undefined && stat.startTime !== startTime) || stat.state === 'Z' || stat.state === 'X') return true;
    if (Date.now() >= deadline) return false;
    await sleep(poll < 20 ? 1 : 10);
  }
}

/** State (field 3) and start time (field 22) of /proc/<pid>/stat; undefined when it is gone. */
function procStat(pid: number): { state: string; startTime: number } | undefined {
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return undefined;
  }
  // The fields count from after the command name, which may hold spaces.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return { state: fields[0] ?? '', startTime: Number(fields[19]) };
}

/** Whether process `pid`, started at `startTime` (clock ticks), still runs: neither gone nor a zombie not reaped yet. */
export function processRunning(pid: number, startTime: number): boolean {
  const st = procStat(pid);
  return st !== undefined && st.startTime === startTime && st.state !== 'Z' && st.state !== 'X';
}

/** A process's start time (field 22 of /proc/<pid>/stat, in clock ticks); undefined when it is gone. */
export function processStartTime(pid: number): number | undefined {
  const value = procStat(pid)?.startTime;
  return value !== undefined && Number.isFinite(value) ? value : undefined;
}
