// Launches container sandboxes through one long-running `dsec-launch --serve` per edge process
// instead of a Node child process per create. Node's spawn forks the whole edge process (page
// tables of a large heap) on the event loop's thread: ~1.5-3.5 ms of blocked loop per create,
// which also serializes concurrent creates. The server is a small static process whose fork costs
// a fraction of that; it opens the log, makes the agent's listening socket as fd 3 and runs
// exactly what a separate dsec-launch would (chronus/launch/dsec-launch.c, "--serve").
import { spawn } from 'node:child_process';
import type { ChildProcessByStdio } from 'node:child_process';
import { createInterface } from 'node:readline';
import type { Readable, Writable } from 'node:stream';
import { DsecError } from '@dsec/protocol';
import { CRUN_TIMEOUT_MS } from './crun.js';

/** One launch: where its output goes, where its agent listens, and dsec-launch's arguments. */
export interface LaunchRequest {
  /** Log file (created 0600, appended): the launcher's, crun's and the container's stdout and stderr. */
  log: string;
  /** Path of the agent's listening unix socket, made by the launcher and passed as fd 3. */
  socket: string;
  /** dsec-launch's arguments (`--rootfs ... -- crun ...`), without the program name. */
  args: string[];
  timeoutMs?: number;
}

/** What child processes and their pipes have to (not) keep the event loop alive. */
interface Ref {
  ref(): void;
  unref(): void;
}

interface Pending {
  resolve(code: number): void;
  reject(err: Error): void;
  timer: NodeJS.Timeout;
}

/** Largest request the server takes (its MAX_REQUEST). */
const MAX_REQUEST_BYTES = 256 * 1024;

/** A `dsec-launch --serve`, started on first use and again after it died. */
export class LaunchServer {
  private child: ChildProcessByStdio<Writable, Readable, Readable> | undefined;
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;

  constructor(private readonly binary: string) {}

  private process(): ChildProcessByStdio<Writable, Readable, Readable> {
    if (this.child) return this.child;
    const child = spawn(this.binary, ['--serve'], { stdio: ['pipe', 'pipe', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => {
      if (stderr.length < 4096) stderr += d.toString();
    });
    createInterface({ input: child.stdout }).on('line', (line) => this.answer(line));
    const fail = (why: string): void => {
      if (this.child !== child) return;
      this.child = undefined;
      const err = new DsecError('BACKEND_FAILED', `dsec-launch --serve: ${stderr.trim() || why}`);
      for (const [id, p] of this.pending) {
        clearTimeout(p.timer);
        this.pending.delete(id);
        p.reject(err);
      }
    };
    child.on('error', (err) => fail(err.message));
    child.on('close', (code, signal) => fail(`exited with ${code ?? signal}`));
    child.stdin.on('error', () => undefined);
    this.child = child;
    return child;
  }

  /**
   * The idle server does not keep this process alive (an edge dropped without close must not
   * hang its process's exit); while a launch is in flight it does, like a child process would.
   */
  private hold(child: ChildProcessByStdio<Writable, Readable, Readable>, busy: boolean): void {
    for (const h of [child, child.stdin as unknown as Partial<Ref>, child.stdout as unknown as Partial<Ref>, child.stderr as unknown as Partial<Ref>]) {
      if (busy) h.ref?.();
      else h.unref?.();
    }
  }

  /** "E <id> <status>" (the launch ended) or "F <id> <errno>" (the server could not start it). */
  private answer(line: string): void {
    const m = /^([EF]) (\d+) (\d+)$/.exec(line);
    if (!m) return;
    const id = Number(m[2]);
    const p = this.pending.get(id);
    if (!p) return;
    this.pending.delete(id);
    clearTimeout(p.timer);
    if (this.pending.size === 0 && this.child) this.hold(this.child, false);
    if (m[1] === 'E') p.resolve(Number(m[3]));
    else p.reject(new DsecError('BACKEND_FAILED', `dsec-launch --serve: cannot start a launch (errno ${m[3]})`));
  }

  /** Runs one launch; resolves with its exit status (128 + the signal when killed). */
  run(req: LaunchRequest): Promise<number> {
    const strings = [req.log, req.socket, ...req.args];
    if (strings.some((s) => s.includes('\0'))) return Promise.reject(new DsecError('INTERNAL', 'a launch argument holds a NUL byte'));
    const body = Buffer.from(strings.map((s) => `${s}\0`).join(''));
    if (body.length + 5 > MAX_REQUEST_BYTES) return Promise.reject(new DsecError('INTERNAL', 'launch request too large'));
    const child = this.process();
    const id = this.nextId;
    this.nextId = (this.nextId % 0xffff_ffff) + 1;
    const frame = Buffer.alloc(9);
    frame.writeUInt32LE(5 + body.length, 0);
    frame.writeUInt32LE(id, 4);
    frame.write('R', 8);
    return new Promise<number>((resolve, reject) => {
      // A launch that hangs is killed (the server sends SIGKILL to that child only) and
      // answers 128 + 9 like any killed one.
      const timer = setTimeout(() => this.kill(id), req.timeoutMs ?? CRUN_TIMEOUT_MS);
      this.pending.set(id, { resolve, reject, timer });
      this.hold(child, true);
      child.stdin.write(Buffer.concat([frame, body]));
    });
  }

  private kill(id: number): void {
    const frame = Buffer.alloc(9);
    frame.writeUInt32LE(5, 0);
    frame.writeUInt32LE(id, 4);
    frame.write('K', 8);
    this.child?.stdin.write(frame);
  }

  /** Ends the server (it exits when its input closes); launches in flight finish on their own, unanswered. */
  async close(): Promise<void> {
    const child = this.child;
    this.child = undefined;
    for (const [id, p] of this.pending) {
      clearTimeout(p.timer);
      this.pending.delete(id);
      p.reject(new DsecError('BACKEND_FAILED', 'the edge is closing'));
    }
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => child.once('close', () => resolve()));
    child.stdin.end();
    const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
    await exited;
    clearTimeout(timer);
  }
}
