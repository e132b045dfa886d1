// What reaches a sandbox's agent: commands (start, run to completion, attach, stdin, signals,
// terminals) and file operations. Each is one agent call made through the sandbox's state
// machine (`withAgent`, which `Edge` implements): it waits for a pause or resume under way, is
// refused while the sandbox is paused, and a pause waits for it.
import type { EdgeExecOptions, ExecResult, ExecSpec, FileStat, ProcessInfo } from '@dsec/protocol';
import type { SandboxAgent } from './backend.js';
import { collectResult, toSpawnOptions, writeStdinIgnoringExit } from './commands.js';
import { checkLinkTarget, checkPath, MAX_FILE_READ_BYTES } from './files.js';
import { EdgeProcessStream } from './process-stream.js';
import type { SandboxMonitor } from './sandbox-monitor.js';

/** Commands and file operations of a node's sandboxes, routed to their agents. */
export abstract class SandboxCalls {
  /** OOM baselines and verdicts, survivor checks after exits. */
  protected abstract readonly monitor: SandboxMonitor;

  /**
   * Runs one agent call with the sandbox held running (see `Edge`); `connect` gives the call a
   * connection of its own.
   */
  protected abstract withAgent<T>(id: string, fn: (agent: SandboxAgent) => Promise<T>, connect?: boolean): Promise<T>;

  /** The environment a command starts with below its own: the network's, then the sandbox's. */
  protected abstract commandEnv(id: string): Record<string, string> | undefined;

  /** Starts a command and returns its stream (output, stdin, kill, exit). */
  async spawn(id: string, spec: ExecSpec): Promise<EdgeProcessStream> {
    const proc = await this.start(id, spec);
    if (spec.stdin !== undefined) await writeStdinIgnoringExit(proc, spec.stdin, !spec.keepStdinOpen);
    return proc;
  }

  /** Starts a command, remembering the sandbox's OOM-kill count at its start. */
  protected async start(id: string, spec: ExecSpec): Promise<EdgeProcessStream> {
    const oomBaseline = this.monitor.oomBaseline(id);
    const env = this.commandEnv(id);
    const att = await this.withAgent(id, (agent) => agent.spawn(toSpawnOptions(spec, env)));
    this.monitor.spawned(id, att.proc, oomBaseline);
    const proc = new EdgeProcessStream(att, (exit) => this.monitor.judge(id, exit));
    void att.exited.then(
      () => this.monitor.exited(id),
      () => undefined,
    );
    return proc;
  }

  /** Forgets an exited process (its output and exit report). */
  async release(id: string, proc: number): Promise<void> {
    this.monitor.released(id, proc);
    await this.withAgent(id, (agent) => agent.release(proc));
  }

  /** Runs a command to completion and collects its output. */
  async exec(id: string, spec: ExecSpec, opts: EdgeExecOptions = {}): Promise<ExecResult> {
    const proc = await this.start(id, spec);
    try {
      return await collectResult(proc, spec, opts);
    } finally {
      // Nobody reattaches to a command whose result was returned: free it without waiting.
      this.release(id, proc.pid).catch(() => undefined);
    }
  }

  /** Running and recently exited processes of a sandbox. */
  async processes(id: string): Promise<ProcessInfo[]> {
    const list = await this.withAgent(id, (agent) => agent.list());
    return list.map((p) => ({
      pid: p.proc,
      osPid: p.pid,
      argv: p.argv,
      state: p.running ? 'running' : 'exited',
      stdoutBytes: p.stdoutBytes,
      stderrBytes: p.stderrBytes,
      ...(p.exit ? { exit: this.monitor.judge(id, p.exit) } : {}),
    }));
  }

  /** Reattaches to a process from byte offsets. */
  async attach(id: string, proc: number, from: { stdout?: number; stderr?: number } = {}): Promise<EdgeProcessStream> {
    // A connection holds one attachment per process; a reader that comes back gets a
    // connection of its own, closed when its attachment ends. Held like any agent call until
    // the attachment is made (a pause waits for it); the attachment itself then outlives
    // pauses, seeing no output while the sandbox is frozen.
    const att = await this.withAgent(
      id,
      async (conn) => {
        try {
          const a = await conn.attach(proc, from);
          void a.exited.then(
            () => conn.close(),
            () => conn.close(),
          );
          a.onDetach(() => conn.close());
          return a;
        } catch (err) {
          conn.close();
          throw err;
        }
      },
      true,
    );
    return new EdgeProcessStream(att, (exit) => this.monitor.judge(id, exit));
  }

  /** Writes to a running process's stdin (and closes it after when `eof`). */
  async writeStdin(id: string, proc: number, data: Uint8Array | string, eof = false): Promise<void> {
    await this.withAgent(id, (agent) => agent.writeStdin(proc, data, eof));
  }

  /** Sends a signal to a process's group. */
  async signal(id: string, proc: number, sig: string | number): Promise<void> {
    await this.withAgent(id, (agent) => agent.signal(proc, sig, true));
  }

  /** Resizes a process's terminal. */
  async resize(id: string, proc: number, rows: number, cols: number): Promise<void> {
    await this.withAgent(id, (agent) => agent.resize(proc, rows, cols));
  }

  /** Reads a file (or a byte range of it). */
  async readFile(id: string, file: string, opts: { offset?: number; length?: number } = {}): Promise<Buffer> {
    checkPath(file);
    return this.withAgent(id, (agent) => agent.readFile(file, { ...opts, maxBytes: MAX_FILE_READ_BYTES }));
  }

  /** Writes a whole file. */
  async writeFile(id: string, file: string, data: Uint8Array | string, opts: { mode?: number; append?: boolean } = {}): Promise<void> {
    checkPath(file);
    await this.withAgent(id, (agent) => agent.writeFile(file, data, opts));
  }

  /** Lists a directory. */
  async listDir(id: string, dir: string): Promise<FileStat[]> {
    checkPath(dir);
    return this.withAgent(id, (agent) => agent.listDir(dir));
  }

  /** Metadata of a path. */
  async stat(id: string, file: string): Promise<FileStat> {
    checkPath(file);
    return this.withAgent(id, (agent) => agent.stat(file, { followSymlinks: false }));
  }

  /** `mkdir -p`. */
  async mkdir(id: string, dir: string): Promise<void> {
    checkPath(dir);
    await this.withAgent(id, (agent) => agent.mkdir(dir, { parents: true }));
  }

  /** Removes a file or a directory tree. */
  async remove(id: string, file: string, opts: { recursive?: boolean } = {}): Promise<void> {
    checkPath(file);
    await this.withAgent(id, (agent) => agent.remove(file, opts));
  }

  /** Renames a path. */
  async rename(id: string, from: string, to: string): Promise<void> {
    checkPath(from);
    checkPath(to);
    await this.withAgent(id, (agent) => agent.rename(from, to));
  }

  /** Creates a symbolic link in a sandbox. */
  async symlink(id: string, link: string, target: string): Promise<void> {
    checkPath(link);
    checkLinkTarget(target);
    await this.withAgent(id, (agent) => agent.symlink(link, target));
  }
}
