// What reaches a sandbox's agent: commands (start, run to completion, attach, stdin, signals,
// terminals) and file operations. Each is one agent call made through the sandbox's state
// machine (`withAgent`, which `Edge` implements): it waits for a pause or resume under way, is
// refused while the sandbox is paused, and a pause waits for it.
import type { EdgeCallOptions, EdgeExecOptions, ExecResult, ExecSpec, FileStat, ProcessInfo } from '@dsec/protocol';
import { DsecError } from '@dsec/protocol';
import type { SandboxAgent } from './backend.js';
import { collectResult, toSpawnOptions, writeStdinIgnoringExit } from './commands.js';
import { checkLinkTarget, checkPath, checkXattrs, MAX_FILE_READ_BYTES } from './files.js';
import { EdgeProcessStream } from './process-stream.js';
import type { Reattach } from './process-stream.js';
import type { Attachment } from './chronus/attachment.js';
import type { SandboxMonitor } from './sandbox-monitor.js';
import type { AgentWatch } from './agent-watch.js';
import { untilAborted } from './abortable.js';

/** Commands and file operations of a node's sandboxes, routed to their agents. */
export abstract class SandboxCalls {
  /** OOM baselines and verdicts, survivor checks after exits. */
  protected abstract readonly monitor: SandboxMonitor;
  /** Bounds on how long commands wait on an agent that stopped answering. */
  protected abstract readonly agentWatch: AgentWatch;

  /**
   * Runs one agent call with the sandbox held running (see `Edge`); `connect` gives the call a
   * connection of its own; an aborted `signal` refuses the call before it is made.
   */
  protected abstract withAgent<T>(
    id: string,
    fn: (agent: SandboxAgent) => Promise<T>,
    opts?: { connect?: boolean; signal?: AbortSignal | undefined },
  ): Promise<T>;

  /** The environment a command starts with below its own: the network's, then the sandbox's. */
  protected abstract commandEnv(id: string): Record<string, string> | undefined;

  /**
   * Starts a command and returns its stream (output, stdin, kill, exit). An abort before the
   * command starts (also while a pause or resume is under way) refuses it; once started it runs.
   */
  async spawn(id: string, spec: ExecSpec, opts: EdgeCallOptions = {}): Promise<EdgeProcessStream> {
    const proc = await this.start(id, spec, opts.signal);
    if (spec.stdin !== undefined) await writeStdinIgnoringExit(proc, spec.stdin, !spec.keepStdinOpen);
    return proc;
  }

  /** A command of the sandbox ended (lazy layers record their access profile at the first). */
  protected commandEnded(_id: string): void {}

  /**
   * Starts a command, remembering the sandbox's OOM-kill count at its start. A command with
   * `timeoutMs` is bounded on the node too (its start included): when its exit is late and the
   * agent does not answer a ping, its stream ends with a TIMEOUT error (`AgentWatch`).
   */
  protected async start(id: string, spec: ExecSpec, signal?: AbortSignal): Promise<EdgeProcessStream> {
    const oomBaseline = this.monitor.oomBaseline(id);
    const env = this.commandEnv(id);
    const deadline = spec.timeoutMs === undefined ? undefined : this.agentWatch.deadline(id, spec.timeoutMs);
    const spawned = this.withAgent(id, (agent) => agent.spawn(toSpawnOptions(spec, env)), { signal });
    let att: Attachment;
    try {
      att = await untilAborted(spawned, deadline?.signal);
    } catch (err) {
      deadline?.stop();
      // Given up on while the agent was silent: should it start the command after all, it goes.
      if (deadline?.signal.aborted) {
        void spawned.then(
          (late) => late.kill('SIGKILL', true).catch(() => undefined),
          () => undefined,
        );
      }
      throw err;
    }
    this.monitor.spawned(id, att.proc, oomBaseline);
    const proc = new EdgeProcessStream(att, (exit) => this.monitor.judge(id, exit), { reattach: this.reattacher(id, att.proc, false) });
    if (deadline) {
      deadline.signal.addEventListener('abort', () => proc.giveUp(deadline.signal.reason as Error), { once: true });
      const stop = (): void => deadline.stop();
      void proc.exited.then(stop, stop);
    }
    void proc.exited.then(
      () => {
        this.monitor.exited(id);
        this.commandEnded(id);
      },
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
    const proc = await this.start(id, spec, opts.signal);
    try {
      return await collectResult(proc, spec, opts);
    } finally {
      // Nobody reattaches to a command whose result was returned: free it without waiting.
      this.release(id, proc.pid).catch(() => undefined);
    }
  }

  /** Running and recently exited processes of a sandbox. */
  async processes(id: string, opts: EdgeCallOptions = {}): Promise<ProcessInfo[]> {
    const list = await this.withAgent(id, (agent) => agent.list(), opts);
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

  /** Reattaches to a process from byte offsets (refused when `signal` aborts before the attachment is made). */
  async attach(id: string, proc: number, from: { stdout?: number; stderr?: number } = {}, opts: EdgeCallOptions = {}): Promise<EdgeProcessStream> {
    const att = await this.attachment(id, proc, from, opts.signal);
    return new EdgeProcessStream(att, (exit) => this.monitor.judge(id, exit), { reattach: this.reattacher(id, proc, true) });
  }

  /**
   * Whether a sandbox whose agent connection was just lost runs again after a pause to a file
   * (waited for until it is resumed or `signal` aborts); false when the loss was anything else.
   */
  protected abstract runningAgain(id: string, signal: AbortSignal): Promise<boolean>;

  /**
   * How a stream of process `proc` attaches again after a pause to a file ended its connection:
   * on the kind of connection it had. A command's own stream (`spawn`) was on the sandbox's main
   * connection, which holds one attachment per process, and goes back to it; a reader that came
   * back (`attach`, `own`) takes a connection of its own again. So every stream attached before
   * the pause finds a place after it, however many commands were streaming (a VM's extra agent
   * ports serve the readers of `attach` alone, which had one each before).
   */
  private reattacher(id: string, proc: number, own: boolean): Reattach {
    return async (from, signal) => {
      if (!(await this.runningAgain(id, signal))) return undefined;
      return own ? this.attachment(id, proc, from, signal) : this.withAgent(id, (agent) => agent.attach(proc, from), { signal });
    };
  }

  private async attachment(id: string, proc: number, from: { stdout?: number; stderr?: number }, signal?: AbortSignal): Promise<Attachment> {
    // A connection holds one attachment per process; a reader that comes back gets a
    // connection of its own, closed when its attachment ends. Held like any agent call until
    // the attachment is made (a pause waits for it); the attachment itself then outlives
    // pauses, seeing no output while the sandbox is frozen.
    return this.withAgent(
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
      { connect: true, signal },
    );
  }

  /** Writes to a running process's stdin (and closes it after when `eof`). */
  async writeStdin(id: string, proc: number, data: Uint8Array | string, eof = false, opts: EdgeCallOptions = {}): Promise<void> {
    await this.withAgent(id, (agent) => agent.writeStdin(proc, data, eof), opts);
  }

  /** Sends a signal to a process's group. */
  async signal(id: string, proc: number, sig: string | number, opts: EdgeCallOptions = {}): Promise<void> {
    await this.withAgent(id, (agent) => agent.signal(proc, sig, true), opts);
  }

  /** Resizes a process's terminal. */
  async resize(id: string, proc: number, rows: number, cols: number, opts: EdgeCallOptions = {}): Promise<void> {
    await this.withAgent(id, (agent) => agent.resize(proc, rows, cols), opts);
  }

  /** Reads a file (or a byte range of it); an abort stops the read between chunks. */
  async readFile(id: string, file: string, opts: EdgeCallOptions & { offset?: number; length?: number } = {}): Promise<Buffer> {
    checkPath(file);
    return this.withAgent(id, (agent) => agent.readFile(file, { ...opts, maxBytes: MAX_FILE_READ_BYTES }), opts);
  }

  /** Writes a whole file; an abort stops the write between chunks (those written stay). */
  async writeFile(id: string, file: string, data: Uint8Array | string, opts: EdgeCallOptions & { mode?: number; append?: boolean } = {}): Promise<void> {
    checkPath(file);
    await this.withAgent(id, (agent) => agent.writeFile(file, data, opts), opts);
  }

  /** Lists a directory. */
  async listDir(id: string, dir: string, opts: EdgeCallOptions = {}): Promise<FileStat[]> {
    checkPath(dir);
    return this.withAgent(id, (agent) => agent.listDir(dir), opts);
  }

  /** Extended attributes under `prefix` of each path; with `replace`, set those first (one path). */
  async xattrs(
    id: string,
    paths: string[],
    prefix: string,
    opts: EdgeCallOptions & { replace?: Record<string, string> } = {},
  ): Promise<Array<Record<string, string> | null>> {
    checkXattrs(paths, prefix, opts.replace);
    return this.withAgent(
      id,
      (agent) => {
        if (!agent.xattrs) throw new DsecError('INVALID_ARGUMENT', "extended attributes are not available through this sandbox's agent");
        return agent.xattrs(paths, prefix, opts.replace ? { replace: opts.replace } : {});
      },
      opts,
    );
  }

  /** Metadata of a path. */
  async stat(id: string, file: string, opts: EdgeCallOptions = {}): Promise<FileStat> {
    checkPath(file);
    return this.withAgent(id, (agent) => agent.stat(file, { followSymlinks: false }), opts);
  }

  /** `mkdir -p`. */
  async mkdir(id: string, dir: string, opts: EdgeCallOptions = {}): Promise<void> {
    checkPath(dir);
    await this.withAgent(id, (agent) => agent.mkdir(dir, { parents: true }), opts);
  }

  /** Removes a file or a directory tree. */
  async remove(id: string, file: string, opts: EdgeCallOptions & { recursive?: boolean } = {}): Promise<void> {
    checkPath(file);
    await this.withAgent(id, (agent) => agent.remove(file, opts.recursive === undefined ? {} : { recursive: opts.recursive }), opts);
  }

  /** Renames a path. */
  async rename(id: string, from: string, to: string, opts: EdgeCallOptions = {}): Promise<void> {
    checkPath(from);
    checkPath(to);
    await this.withAgent(id, (agent) => agent.rename(from, to), opts);
  }

  /** Creates a symbolic link in a sandbox. */
  async symlink(id: string, link: string, target: string, opts: EdgeCallOptions = {}): Promise<void> {
    checkPath(link);
    checkLinkTarget(target);
    await this.withAgent(id, (agent) => agent.symlink(link, target), opts);
  }
}
