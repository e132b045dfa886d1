// The QEMU guest agent (qemu-ga) as a sandbox agent, for images that run no chronus (an imported
// disk of any OS): commands through `guest-exec` / `guest-exec-status` (output arrives when the
// command ends, stdin is not streamed), files through `guest-file-open/read/write/close`.
// What qemu-ga cannot do (a pty, stdin after the start, directory listings) is refused with the
// reason.
import type net from 'node:net';
import { DsecError } from '@dsec/protocol';
import type { FileStat } from '@dsec/protocol';
import type { SandboxAgent } from '../../backend.js';
import { Attachment } from '../../chronus/attachment.js';
import type { AttachmentOwner } from '../../chronus/attachment.js';
import type { AgentExit, AgentInfo, AgentProcess, SpawnOptions } from '../../chronus/client.js';

/** How often a running command's status is asked for. */
const EXEC_POLL_MS = 200;
/** Bytes per guest-file-read / guest-file-write. */
const FILE_CHUNK_BYTES = 48 * 1024;
/** How long the first guest-sync may wait (qemu-ga starts late in a boot). */
const SYNC_TIMEOUT_MS = 600_000;
/** How long one guest-agent command may take. */
const COMMAND_TIMEOUT_MS = 30_000;

interface ExecStatus {
  exited: boolean;
  exitcode?: number;
  signal?: number;
  'out-data'?: string;
  'err-data'?: string;
  'out-truncated'?: boolean;
  'err-truncated'?: boolean;
}

interface GuestProcess {
  proc: number;
  pid: number;
  argv: string[];
  startedAt: number;
  attachment: Attachment;
  exit?: AgentExit;
  stdoutBytes: number;
  stderrBytes: number;
}

type Pending = { resolve: (v: unknown) => void; reject: (e: Error) => void; timer: NodeJS.Timeout };

const unsupported = (what: string) => new DsecError('INVALID_ARGUMENT', `${what} is not available through the QEMU guest agent (the image runs no chronus)`);

/** One connection to a guest's qemu-ga over its virtio-serial port. */
export class GuestAgentClient implements SandboxAgent, AttachmentOwner {
  private buffer = '';
  private readonly queue: Pending[] = [];
  private chain: Promise<unknown> = Promise.resolve();
  private readonly procs = new Map<number, GuestProcess>();
  private closed: Error | undefined;
  private synced: Promise<void> | undefined;
  private readonly startedAt = Date.now();

  constructor(private readonly sock: net.Socket) {
    sock.setEncoding('utf8');
    sock.on('data', (chunk: string) => this.onData(chunk));
    sock.on('close', () => this.fail(new DsecError('UNAVAILABLE', 'the guest agent connection closed')));
    sock.on('error', (err) => this.fail(new DsecError('UNAVAILABLE', `guest agent: ${err.message}`)));
  }

  get connected(): boolean {
    return this.closed === undefined;
  }

  close(): void {
    this.sock.destroy();
    this.fail(new DsecError('UNAVAILABLE', 'the guest agent connection closed'));
  }

  private fail(err: Error): void {
    if (this.closed) return;
    this.closed = err;
    for (const p of this.queue.splice(0)) {
      clearTimeout(p.timer);
      p.reject(err);
    }
    for (const g of this.procs.values()) if (!g.exit) g.attachment.fail(err);
  }

  private onData(chunk: string): void {
    this.buffer += chunk;
    for (let nl = this.buffer.indexOf('\n'); nl >= 0; nl = this.buffer.indexOf('\n')) {
      const line = this.buffer.slice(0, nl).replace(/^\xff/, '').trim();
      this.buffer = this.buffer.slice(nl + 1);
      if (!line) continue;
      let msg: { return?: unknown; error?: { class?: string; desc?: string } };
      try {
        msg = JSON.parse(line) as typeof msg;
      } catch {
        continue;
      }
      const p = this.queue.shift();
      if (!p) continue;
      clearTimeout(p.timer);
      if (msg.error) p.reject(new DsecError('BACKEND_FAILED', `guest agent: ${msg.error.desc ?? msg.error.class ?? 'error'}`));
      else p.resolve(msg.return);
    }
  }

  /** One command; qemu-ga answers in order, one at a time. */
  private execute<T>(command: string, args?: object, timeoutMs = COMMAND_TIMEOUT_MS): Promise<T> {
    const run = async (): Promise<T> => {
      if (this.closed) throw this.closed;
      return new Promise<T>((resolve, reject) => {
        const timer = setTimeout(() => {
          // The answer may still come: the connection is out of step, so it is closed.
          this.sock.destroy();
          this.fail(new DsecError('TIMEOUT', `guest agent: ${command} got no answer within ${timeoutMs} ms`));
        }, timeoutMs);
        this.queue.push({ resolve: resolve as (v: unknown) => void, reject, timer });
        this.sock.write(JSON.stringify({ execute: command, ...(args ? { arguments: args } : {}) }) + '\n');
      });
    };
    const next = this.chain.then(run, run);
    this.chain = next.catch(() => undefined);
    return next;
  }

  /** Discards whatever an earlier connection left unread (guest-sync with a fresh id). */
  private sync(): Promise<void> {
    this.synced ??= (async () => {
      const id = Math.floor(Math.random() * 2 ** 31);
      for (;;) {
        // The first answer may wait for the guest's boot (the caller's deadline bounds it).
        const got = await this.execute<number>('guest-sync', { id }, SYNC_TIMEOUT_MS);
        if (got === id) return;
      }
    })();
    return this.synced;
  }

  /** Freezes the guest's file systems (`guest-fsfreeze-freeze`): how many it froze. */
  async fsfreeze(): Promise<number> {
    await this.sync();
    return this.execute<number>('guest-fsfreeze-freeze');
  }

  /** Thaws what {@link fsfreeze} froze (`guest-fsfreeze-thaw`). */
  async fsthaw(): Promise<void> {
    await this.execute('guest-fsfreeze-thaw');
  }

  async ping(): Promise<AgentInfo> {
    await this.sync();
    await this.execute('guest-ping');
    return { version: 'qemu-ga', pid: 0, uptimeMs: Date.now() - this.startedAt, processes: this.procs.size, outputCapBytes: 0 };
  }

  async spawn(opts: SpawnOptions): Promise<Attachment> {
    if (opts.pty) throw unsupported('a pty');
    if (opts.stdin) throw unsupported('stdin');
    if (opts.uid !== undefined && opts.uid !== 0) throw unsupported('running as another user');
    await this.sync();
    let argv = opts.shell !== undefined ? ['/bin/sh', '-c', opts.shell] : (opts.argv ?? []);
    if (argv.length === 0) throw new DsecError('INVALID_ARGUMENT', 'argv: empty', { field: 'argv' });
    if (opts.cwd !== undefined) argv = ['/bin/sh', '-c', 'cd "$1" && shift && exec "$@"', 'sh', opts.cwd, ...argv];
    const { pid } = await this.execute<{ pid: number }>('guest-exec', {
      path: argv[0],
      arg: argv.slice(1),
      ...(opts.env ? { env: Object.entries(opts.env).map(([k, v]) => `${k}=${v}`) } : {}),
      'capture-output': true,
    });
    const attachment = new Attachment(this, pid, pid, pid, 0, { stdout: 0, stderr: 0 });
    const g: GuestProcess = { proc: pid, pid, argv, startedAt: Date.now(), attachment, stdoutBytes: 0, stderrBytes: 0 };
    this.procs.set(pid, g);
    void this.follow(g, opts.timeoutMs);
    return attachment;
  }

  /** Polls the command's status until it ends; then its output and exit go to the attachment. */
  private async follow(g: GuestProcess, timeoutMs?: number): Promise<void> {
    let timedOut = false;
    try {
      for (;;) {
        const st = await this.execute<ExecStatus>('guest-exec-status', { pid: g.pid });
        if (st.exited) {
          const out = Buffer.from(st['out-data'] ?? '', 'base64');
          const err = Buffer.from(st['err-data'] ?? '', 'base64');
          if (out.length > 0) g.attachment.output({ kind: 'data', stream: 'stdout', offset: 0, data: out });
          if (err.length > 0) g.attachment.output({ kind: 'data', stream: 'stderr', offset: 0, data: err });
          g.stdoutBytes = out.length;
          g.stderrBytes = err.length;
          g.exit = {
            proc: g.proc,
            pid: g.pid,
            exitCode: st.signal !== undefined ? null : (st.exitcode ?? null),
            signal: st.signal !== undefined ? signalName(st.signal) : null,
            timedOut,
            durationMs: Date.now() - g.startedAt,
            cpuUserMs: 0,
            cpuSysMs: 0,
            peakMemoryKiB: 0,
            stdoutBytes: out.length,
            stderrBytes: err.length,
          };
          g.attachment.exit(g.exit);
          return;
        }
        if (timeoutMs !== undefined && !timedOut && Date.now() - g.startedAt > timeoutMs) {
          timedOut = true;
          await this.signal(g.proc, 'SIGKILL').catch(() => undefined);
        }
        await new Promise((r) => setTimeout(r, EXEC_POLL_MS));
      }
    } catch (err) {
      g.attachment.fail(err instanceof Error ? err : new Error(String(err)));
    }
  }

  private proc(proc: number): GuestProcess {
    const g = this.procs.get(proc);
    if (!g) throw new DsecError('PROCESS_NOT_FOUND', `no process ${proc}`);
    return g;
  }

  attach(proc: number): Promise<Attachment> {
    const g = this.proc(proc);
    if (g.exit) throw unsupported('attaching to a finished command');
    return Promise.resolve(g.attachment);
  }

  async wait(proc: number): Promise<AgentExit> {
    return this.proc(proc).attachment.exited;
  }

  /** A signal through a `kill` run in the guest (qemu-ga has no signal command). */
  async signal(proc: number, sig: string | number): Promise<void> {
    const g = this.proc(proc);
    const name = typeof sig === 'number' ? String(sig) : sig.replace(/^SIG/, '');
    await this.execute('guest-exec', { path: '/bin/kill', arg: [`-${name}`, String(g.pid)] });
  }

  writeStdin(): Promise<void> {
    return Promise.reject(unsupported('stdin'));
  }

  resize(): Promise<void> {
    return Promise.reject(unsupported('a pty'));
  }

  list(): Promise<AgentProcess[]> {
    return Promise.resolve(
      [...this.procs.values()].map((g) => ({
        proc: g.proc,
        pid: g.pid,
        argv: g.argv,
        running: !g.exit,
        stdoutBytes: g.stdoutBytes,
        stderrBytes: g.stderrBytes,
        ...(g.exit ? { exit: g.exit } : {}),
      })),
    );
  }

  release(proc: number): Promise<void> {
    this.procs.delete(proc);
    return Promise.resolve();
  }

  // AttachmentOwner: output is pushed whole at the exit, so there is no window to acknowledge.
  send(): void {}
  request(): Promise<unknown> {
    return Promise.resolve(undefined);
  }
  forget(): void {}

  stat(): Promise<FileStat> {
    return Promise.reject(unsupported('stat'));
  }

  async readFile(path: string, opts: { offset?: number; length?: number; maxBytes?: number; signal?: AbortSignal | undefined } = {}): Promise<Buffer> {
    await this.sync();
    const handle = await this.execute<number>('guest-file-open', { path, mode: 'r' });
    try {
      if (opts.offset) await this.execute('guest-file-seek', { handle, offset: opts.offset, whence: 'set' });
      const chunks: Buffer[] = [];
      let total = 0;
      const want = opts.length ?? Infinity;
      while (total < want) {
        opts.signal?.throwIfAborted();
        const r = await this.execute<{ count: number; 'buf-b64': string; eof: boolean }>('guest-file-read', {
          handle,
          count: Math.min(FILE_CHUNK_BYTES, want - total),
        });
        const data = Buffer.from(r['buf-b64'], 'base64');
        chunks.push(data);
        total += data.length;
        if (opts.maxBytes !== undefined && total > opts.maxBytes) throw new DsecError('PAYLOAD_TOO_LARGE', `${path}: more than ${opts.maxBytes} bytes`);
        if (r.eof || data.length === 0) break;
      }
      return Buffer.concat(chunks);
    } finally {
      await this.execute('guest-file-close', { handle }).catch(() => undefined);
    }
  }

  async writeFile(
    path: string,
    data: Uint8Array | string,
    opts: { mode?: number; uid?: number; gid?: number; append?: boolean; signal?: AbortSignal | undefined } = {},
  ): Promise<void> {
    await this.sync();
    const buf = typeof data === 'string' ? Buffer.from(data) : Buffer.from(data);
    const handle = await this.execute<number>('guest-file-open', { path, mode: opts.append ? 'a' : 'w' });
    try {
      for (let at = 0; at < buf.length; at += FILE_CHUNK_BYTES) {
        opts.signal?.throwIfAborted();
        await this.execute('guest-file-write', { handle, 'buf-b64': buf.subarray(at, at + FILE_CHUNK_BYTES).toString('base64') });
      }
    } finally {
      await this.execute('guest-file-close', { handle }).catch(() => undefined);
    }
  }

  listDir(): Promise<FileStat[]> {
    return Promise.reject(unsupported('listing a directory'));
  }
  mkdir(): Promise<void> {
    return Promise.reject(unsupported('mkdir'));
  }
  remove(): Promise<void> {
    return Promise.reject(unsupported('remove'));
  }
  rename(): Promise<void> {
    return Promise.reject(unsupported('rename'));
  }
  symlink(): Promise<void> {
    return Promise.reject(unsupported('symlink'));
  }
  statfs(): Promise<{ totalBytes: number; freeBytes: number; files: number; freeFiles: number }> {
    return Promise.reject(unsupported('statfs'));
  }
}

/** Linux signal numbers as names (what chronus reports). */
function signalName(n: number): string {
  const names: Record<number, string> = { 1: 'SIGHUP', 2: 'SIGINT', 3: 'SIGQUIT', 6: 'SIGABRT', 9: 'SIGKILL', 13: 'SIGPIPE', 14: 'SIGALRM', 15: 'SIGTERM' };
  return names[n] ?? `SIG${n}`;
}
