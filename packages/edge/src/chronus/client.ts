// Client side of the chronus wire protocol: one connection, many concurrent requests and
// attachments multiplexed by request id, with window-based flow control on output.
import net from 'node:net';
import type { Duplex } from 'node:stream';
import { DsecError } from '@dsec/protocol';
import type { ExitInfo, FileStat } from '@dsec/protocol';
import { Attachment } from './attachment.js';
import { agentError, parseExit, parseStat, signalNumber } from './replies.js';
import { encodeFrame, F, FrameReader, MAX_IO_BYTES, T } from './wire.js';
import type { Field, Frame } from './wire.js';

/** Default flow-control window per output stream. */
export const DEFAULT_WINDOW_BYTES = 262_144;
/** Default time to wait for a connection to the agent. */
export const DEFAULT_CONNECT_TIMEOUT_MS = 5_000;
/** Paths per XATTRS request (chronus takes at most 256). */
const XATTRS_PATHS_PER_REQUEST = 256;
/** errno E2BIG: an XATTRS reply that filled its frame. */
const E2BIG = 7;

/** What the agent says about itself. */
export interface AgentInfo {
  version: string;
  pid: number;
  uptimeMs: number;
  processes: number;
  outputCapBytes: number;
}

/** How a process ended, as the agent reports it (edge adds whether it was an OOM kill). */
export type AgentExit = Omit<ExitInfo, 'oomKilled'> & { proc: number; pid: number };

/** A process in the agent's table. */
export interface AgentProcess {
  proc: number;
  pid: number;
  argv: string[];
  running: boolean;
  stdoutBytes: number;
  stderrBytes: number;
  exit?: AgentExit;
}

/** What to run. */
export interface SpawnOptions {
  argv?: string[];
  /** Run through `/bin/sh -c`. */
  shell?: string;
  env?: Record<string, string>;
  cwd?: string;
  uid?: number;
  gid?: number;
  /** Keep stdin open as a pipe (else /dev/null). */
  stdin?: boolean;
  pty?: { rows: number; cols: number };
  /** SIGKILL the process group after this long. */
  timeoutMs?: number;
  windowBytes?: number;
}

/** One chunk of output or a reported loss. */
export type OutputEvent =
  | { kind: 'data'; stream: 'stdout' | 'stderr'; offset: number; data: Buffer }
  | { kind: 'gap'; stream: 'stdout' | 'stderr'; offset: number; bytes: number };

interface AttachMeta {
  proc: number;
  windowBytes: number;
  from: { stdout: number; stderr: number };
  attachment?: Attachment;
}

type Pending = { resolve: (f: Frame) => void; reject: (e: Error) => void; what: string; path?: string };

/** One connection to a sandbox's chronus agent. */
export class ChronusClient {
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  private readonly attachments = new Map<number, Attachment>();
  private readonly attachMeta = new Map<number, AttachMeta>();
  private readonly reader = new FrameReader();
  private closedError: Error | undefined;

  /**
   * `onProtocolError` hears of frames that break the wire protocol (a malformed or oversized
   * frame, a field of the wrong size): the agent is not the chronus edge started, or something
   * forged its side of the socket. The connection is closed either way.
   */
  constructor(
    private readonly socket: Duplex,
    private readonly onProtocolError?: (message: string) => void,
  ) {
    socket.on('data', (chunk: Buffer) => this.onData(chunk));
    // A reset or broken connection is the agent gone, as a close is: callers retry or report it,
    // never a bare socket error (which the API would answer with a 500).
    socket.on('error', (err) => this.shutdown(new DsecError('UNAVAILABLE', `connection to the sandbox agent failed: ${err.message}`)));
    socket.on('close', () => this.shutdown(new DsecError('UNAVAILABLE', 'connection to the sandbox agent closed')));
  }

  /** Connects to an agent's unix socket. */
  static connect(path: string, opts: { timeoutMs?: number; signal?: AbortSignal; onProtocolError?: (message: string) => void } = {}): Promise<ChronusClient> {
    return new Promise((resolve, reject) => {
      const sock = net.createConnection({ path });
      const timer = setTimeout(() => fail(new DsecError('TIMEOUT', `connecting to agent at ${path} timed out`)), opts.timeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS);
      const onAbort = (): void => fail(new DsecError('TIMEOUT', 'connect aborted'));
      opts.signal?.addEventListener('abort', onAbort, { once: true });
      const cleanup = (): void => {
        clearTimeout(timer);
        opts.signal?.removeEventListener('abort', onAbort);
        sock.removeListener('error', fail);
      };
      function fail(err: Error): void {
        cleanup();
        sock.destroy();
        reject(err instanceof DsecError ? err : new DsecError('UNAVAILABLE', `sandbox agent unreachable: ${err.message}`));
      }
      sock.once('error', fail);
      sock.once('connect', () => {
        cleanup();
        resolve(new ChronusClient(sock, opts.onProtocolError));
      });
    });
  }

  /** True until the connection is lost or closed. */
  get connected(): boolean {
    return this.closedError === undefined;
  }

  /** Closes the connection; running processes are not affected. */
  close(): void {
    this.socket.destroy();
    this.shutdown(new DsecError('UNAVAILABLE', 'connection closed'));
  }

  /** @internal Sends a frame with no reply expected. */
  send(type: number, id: number, fields: readonly Field[]): void {
    if (this.closedError) return;
    this.socket.write(encodeFrame(type, id, fields));
  }

  /** @internal Sends a request and resolves with its reply (ERROR rejects). */
  request(type: number, fields: readonly Field[], what: string, id = this.allocId()): Promise<Frame> {
    if (this.closedError) return Promise.reject(this.closedError);
    const pathField = fields.find(([t]) => t === F.PATH)?.[1];
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject, what, ...(typeof pathField === 'string' ? { path: pathField } : {}) });
      this.socket.write(encodeFrame(type, id, fields));
    });
  }

  /** @internal */
  forget(id: number): void {
    this.attachments.delete(id);
  }

  /** Agent version and counters. */
  async ping(): Promise<AgentInfo> {
    const f = (await this.request(T.PING, [], 'ping')).fields;
    return {
      version: f.str(F.VERSION) ?? '',
      pid: f.num(F.PID) ?? 0,
      uptimeMs: f.num(F.UPTIME_MS) ?? 0,
      processes: f.num(F.NPROCS) ?? 0,
      outputCapBytes: f.num(F.OUTPUT_CAP) ?? 0,
    };
  }

  /** Starts a process and attaches to its output from offset 0. */
  async spawn(opts: SpawnOptions): Promise<Attachment> {
    const fields: Field[] = [];
    if (opts.shell !== undefined) fields.push([F.SHELL, opts.shell]);
    for (const a of opts.argv ?? []) fields.push([F.ARGV, a]);
    for (const [k, v] of Object.entries(opts.env ?? {})) fields.push([F.ENV, `${k}=${v}`]);
    if (opts.cwd !== undefined) fields.push([F.CWD, opts.cwd]);
    if (opts.uid !== undefined) fields.push([F.UID, opts.uid]);
    if (opts.gid !== undefined) fields.push([F.GID, opts.gid]);
    if (opts.stdin) fields.push([F.STDIN, true]);
    if (opts.pty) fields.push([F.PTY, true], [F.ROWS, opts.pty.rows], [F.COLS, opts.pty.cols]);
    if (opts.timeoutMs !== undefined) fields.push([F.TIMEOUT_MS, opts.timeoutMs]);
    const windowBytes = opts.windowBytes ?? DEFAULT_WINDOW_BYTES;
    fields.push([F.ATTACH, true], [F.WINDOW, windowBytes]);
    return this.attachWith(T.EXEC, fields, windowBytes, { stdout: 0, stderr: 0 }, 'exec');
  }

  /** Attaches to a process from the given offsets (reattach after a reconnect). */
  attach(proc: number, from: { stdout?: number; stderr?: number } = {}, windowBytes = DEFAULT_WINDOW_BYTES): Promise<Attachment> {
    const start = { stdout: from.stdout ?? 0, stderr: from.stderr ?? 0 };
    const fields: Field[] = [[F.PROC, proc], [F.FROM_STDOUT, start.stdout], [F.FROM_STDERR, start.stderr], [F.WINDOW, windowBytes]];
    return this.attachWith(T.ATTACH, fields, windowBytes, start, 'attach');
  }

  private async attachWith(type: number, fields: Field[], windowBytes: number, from: { stdout: number; stderr: number }, what: string): Promise<Attachment> {
    const id = this.allocId();
    const proc = type === T.ATTACH ? (fields[0]?.[1] as number) : 0;
    const meta: AttachMeta = { proc, windowBytes, from };
    this.attachMeta.set(id, meta);
    try {
      await this.request(type, fields, what, id);
    } finally {
      this.attachMeta.delete(id);
    }
    if (!meta.attachment) throw new DsecError('INTERNAL', `${what}: agent reply opened no attachment`);
    return meta.attachment;
  }

  /** Waits for a process to exit (without attaching to its output). */
  async wait(proc: number, signal?: AbortSignal): Promise<AgentExit> {
    const id = this.allocId();
    const onAbort = (): void => {
      const p = this.pending.get(id);
      this.pending.delete(id);
      p?.reject(new DsecError('TIMEOUT', 'wait aborted'));
    };
    signal?.addEventListener('abort', onAbort, { once: true });
    try {
      return parseExit((await this.request(T.WAIT, [[F.PROC, proc]], 'wait', id)).fields);
    } finally {
      signal?.removeEventListener('abort', onAbort);
    }
  }

  /** Writes to a process's stdin in 1 MiB frames (one in flight), closing it after when `eof`. */
  async writeStdin(proc: number, data: Uint8Array | string, eof = false): Promise<void> {
    const buf = typeof data === 'string' ? Buffer.from(data) : Buffer.from(data.buffer, data.byteOffset, data.byteLength);
    let off = 0;
    do {
      const chunk = buf.subarray(off, off + MAX_IO_BYTES);
      off += chunk.length;
      const fields: Field[] = [[F.PROC, proc], [F.DATA, chunk]];
      if (eof && off >= buf.length) fields.push([F.EOF, true]);
      await this.request(T.STDIN, fields, 'stdin');
    } while (off < buf.length);
  }

  /** Sends a signal to a process (or its group). */
  async signal(proc: number, sig: string | number, group = true): Promise<void> {
    const fields: Field[] = [[F.PROC, proc], [F.SIGNAL, signalNumber(sig)]];
    if (group) fields.push([F.GROUP, true]);
    await this.request(T.SIGNAL, fields, 'signal');
  }

  /** Resizes a process's terminal. */
  async resize(proc: number, rows: number, cols: number): Promise<void> {
    await this.request(T.RESIZE, [[F.PROC, proc], [F.ROWS, rows], [F.COLS, cols]], 'resize');
  }

  /** Forgets an exited process and frees its output. */
  async release(proc: number): Promise<void> {
    await this.request(T.RELEASE, [[F.PROC, proc]], 'release');
  }

  /**
   * Kills every process of the sandbox but the agent (which must be its PID 1) and forgets every
   * process record; resolves to the sockets still listed in its network namespace.
   */
  async reset(): Promise<{ sockets: number }> {
    const f = (await this.request(T.RESET, [], 'reset')).fields;
    return { sockets: f.num(F.COUNT) ?? 0 };
  }

  /** Running and retained exited processes. */
  async list(): Promise<AgentProcess[]> {
    const f = (await this.request(T.LIST, [], 'list')).fields;
    return f.nested(F.PROCENTRY).map((e) => {
      const p: AgentProcess = {
        proc: e.num(F.PROC) ?? 0,
        pid: e.num(F.PID) ?? 0,
        argv: e.all(F.ARGV).map((b) => b.toString('utf8')),
        running: e.num(F.STATE) !== 2,
        stdoutBytes: e.num(F.STDOUT_END) ?? 0,
        stderrBytes: e.num(F.STDERR_END) ?? 0,
      };
      if (!p.running) p.exit = parseExit(e);
      return p;
    });
  }

  /** Metadata of one path. */
  async stat(path: string, opts: { followSymlinks?: boolean } = {}): Promise<FileStat> {
    const fields: Field[] = [[F.PATH, path]];
    if (opts.followSymlinks === false) fields.push([F.NOFOLLOW, true]);
    const f = (await this.request(T.STAT, fields, `stat ${path}`)).fields;
    return parseStat(f, path.split('/').filter(Boolean).pop() ?? '/');
  }

  /** Reads up to `length` bytes (at most 1 MiB) at `offset`. */
  async readChunk(path: string, offset: number, length: number): Promise<{ data: Buffer; size: number; eof: boolean }> {
    const f = (await this.request(T.READ, [[F.PATH, path], [F.OFFSET, offset], [F.LENGTH, Math.min(length, MAX_IO_BYTES)]], `read ${path}`)).fields;
    return { data: f.bytes(F.DATA) ?? Buffer.alloc(0), size: f.num(F.SIZE) ?? 0, eof: f.has(F.EOF) };
  }

  /** Reads a byte range (whole file by default) in 1 MiB chunks, refusing more than `maxBytes`; `signal` stops it between chunks. */
  async readFile(path: string, opts: { offset?: number; length?: number; maxBytes?: number; signal?: AbortSignal | undefined } = {}): Promise<Buffer> {
    const chunks: Buffer[] = [];
    let offset = opts.offset ?? 0;
    let left = opts.length ?? Number.MAX_SAFE_INTEGER;
    let total = 0;
    while (left > 0) {
      opts.signal?.throwIfAborted();
      const { data, eof } = await this.readChunk(path, offset, Math.min(left, MAX_IO_BYTES));
      chunks.push(data);
      total += data.length;
      if (opts.maxBytes !== undefined && total > opts.maxBytes) {
        throw new DsecError('PAYLOAD_TOO_LARGE', `${path} is larger than ${opts.maxBytes} bytes`, { path });
      }
      offset += data.length;
      left -= data.length;
      if (eof || data.length === 0) break;
    }
    return Buffer.concat(chunks);
  }

  /** Writes a whole file (created or truncated), in 1 MiB frames; `signal` stops it between frames (those written stay). */
  async writeFile(
    path: string,
    data: Uint8Array | string,
    opts: { mode?: number; uid?: number; gid?: number; append?: boolean; signal?: AbortSignal | undefined } = {},
  ): Promise<void> {
    const buf = typeof data === 'string' ? Buffer.from(data) : Buffer.from(data.buffer, data.byteOffset, data.byteLength);
    let offset = 0;
    do {
      opts.signal?.throwIfAborted();
      const chunk = buf.subarray(offset, offset + MAX_IO_BYTES);
      const first = offset === 0;
      const flags = 1 | (first && !opts.append ? 2 : 0) | (!first || opts.append ? 4 : 0);
      const fields: Field[] = [[F.PATH, path], [F.OPEN_FLAGS, flags], [F.MODE, opts.mode ?? 0o644], [F.DATA, chunk]];
      if (opts.uid !== undefined) fields.push([F.UID, opts.uid]);
      if (opts.gid !== undefined) fields.push([F.GID, opts.gid]);
      await this.request(T.WRITE, fields, `write ${path}`);
      offset += chunk.length;
    } while (offset < buf.length);
  }

  /** Lists a directory (in as many requests as its size needs), refusing more than `maxEntries`. */
  async listDir(path: string, maxEntries = 100_000): Promise<FileStat[]> {
    const out: FileStat[] = [];
    let offset = 0;
    for (;;) {
      const f = (await this.request(T.LISTDIR, [[F.PATH, path], [F.OFFSET, offset]], `list ${path}`)).fields;
      const entries = f.nested(F.ENTRY);
      for (const e of entries) out.push(parseStat(e, e.str(F.NAME) ?? ''));
      if (out.length > maxEntries) throw new DsecError('PAYLOAD_TOO_LARGE', `${path} has more than ${maxEntries} entries`, { path });
      const next = f.num(F.OFFSET);
      if (f.has(F.EOF) || entries.length === 0 || next === undefined || next <= offset) return out;
      offset = next;
    }
  }

  /** Creates a directory (with parents when asked). */
  async mkdir(path: string, opts: { parents?: boolean; mode?: number; uid?: number; gid?: number } = {}): Promise<void> {
    const fields: Field[] = [[F.PATH, path], [F.MODE, opts.mode ?? 0o755]];
    if (opts.parents) fields.push([F.PARENTS, true]);
    if (opts.uid !== undefined) fields.push([F.UID, opts.uid]);
    if (opts.gid !== undefined) fields.push([F.GID, opts.gid]);
    await this.request(T.MKDIR, fields, `mkdir ${path}`);
  }

  /** Removes a file or (with recursive) a directory tree, never following symlinks. */
  async remove(path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    const fields: Field[] = [[F.PATH, path]];
    if (opts.recursive) fields.push([F.RECURSIVE, true]);
    await this.request(T.REMOVE, fields, `remove ${path}`);
  }

  /** Renames a path. */
  async rename(from: string, to: string): Promise<void> {
    await this.request(T.RENAME, [[F.PATH, from], [F.PATH2, to]], `rename ${from}`);
  }

  /** Size and free space of the file system holding `path`. */
  async statfs(path: string): Promise<{ totalBytes: number; freeBytes: number; files: number; freeFiles: number }> {
    const f = (await this.request(T.STATFS, [[F.PATH, path]], `statfs ${path}`)).fields;
    return { totalBytes: f.num(F.BYTES_TOTAL) ?? 0, freeBytes: f.num(F.BYTES_FREE) ?? 0, files: f.num(F.FILES_TOTAL) ?? 0, freeFiles: f.num(F.FILES_FREE) ?? 0 };
  }

  /**
   * Extended attributes under `prefix` (in the `user.` namespace) of each path, names without
   * the prefix, in the order given; null for a path that cannot be read (gone, no xattr support).
   * With `replace` (one path only), first removes every attribute under the prefix and sets those.
   */
  async xattrs(paths: string[], prefix: string, opts: { replace?: Record<string, string> } = {}): Promise<Array<Record<string, string> | null>> {
    const out: Array<Record<string, string> | null> = [];
    for (let at = 0; at < paths.length; at += XATTRS_PATHS_PER_REQUEST) {
      const fields: Field[] = [[F.PREFIX, prefix], ...paths.slice(at, at + XATTRS_PATHS_PER_REQUEST).map((p): Field => [F.PATH, p])];
      for (const [name, value] of Object.entries(opts.replace ?? {})) fields.push([F.XATTR, [[F.NAME, name], [F.DATA, Buffer.from(value)]]]);
      if (opts.replace) fields.push([F.REPLACE, true]);
      const f = (await this.request(T.XATTRS, fields, `xattrs ${paths[at] ?? ''}`)).fields;
      for (const e of f.nested(F.ENTRY)) {
        // E2BIG: the reply filled up; what fitted is kept.
        if (e.has(F.ERRNO) && e.num(F.ERRNO) !== E2BIG) {
          out.push(null);
          continue;
        }
        const attrs: Record<string, string> = {};
        for (const x of e.nested(F.XATTR)) attrs[x.str(F.NAME) ?? ''] = x.str(F.DATA) ?? '';
        out.push(attrs);
      }
    }
    return out;
  }

  /** Creates a symbolic link at `path` pointing to `target` (stored as given). */
  async symlink(path: string, target: string): Promise<void> {
    await this.request(T.SYMLINK, [[F.PATH, path], [F.PATH2, target]], `symlink ${path}`);
  }

  private allocId(): number {
    const id = this.nextId;
    this.nextId = this.nextId >= 0xfffffff0 ? 1 : this.nextId + 1;
    return id;
  }

  private onData(chunk: Buffer): void {
    let frames: Frame[];
    try {
      frames = this.reader.push(chunk);
    } catch (err) {
      this.protocolError(err);
      return;
    }
    for (const frame of frames) {
      try {
        this.onFrame(frame);
      } catch (err) {
        // A field of the wrong size (Fields.num) in a reply or an event.
        this.protocolError(err);
        return;
      }
    }
  }

  private protocolError(err: unknown): void {
    if (this.closedError) return;
    const message = `protocol error from sandbox agent: ${(err as Error).message}`;
    this.socket.destroy();
    this.shutdown(new DsecError('BACKEND_FAILED', message));
    try {
      this.onProtocolError?.(message);
    } catch {
      // the listener's failure is its own
    }
  }

  private onFrame(frame: Frame): void {
    const pending = this.pending.get(frame.id);
    if (pending) {
      this.pending.delete(frame.id);
      if (frame.type === T.ERROR) {
        pending.reject(agentError(frame.fields, pending.what, pending.path));
        return;
      }
      // An EXEC or ATTACH reply opens an attachment before any of its events are dispatched.
      if (frame.type === T.STARTED || (frame.type === T.OK && pending.what === 'attach')) {
        this.openAttachment(frame);
      }
      pending.resolve(frame);
      return;
    }
    this.attachments.get(frame.id)?.handle(frame);
  }

  private openAttachment(frame: Frame): void {
    const meta = this.attachMeta.get(frame.id);
    if (!meta) return;
    const proc = frame.fields.num(F.PROC) ?? meta.proc;
    meta.attachment = new Attachment(this, frame.id, proc, frame.fields.num(F.PID) ?? 0, meta.windowBytes, meta.from);
    this.attachments.set(frame.id, meta.attachment);
  }

  private shutdown(err: Error): void {
    if (this.closedError) return;
    this.closedError = err;
    for (const p of this.pending.values()) p.reject(err);
    this.pending.clear();
    for (const a of this.attachments.values()) a.fail(err);
    this.attachments.clear();
  }
}
