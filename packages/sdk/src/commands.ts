// sandbox.commands: run commands to completion, start them with a handle, find them again.
import { DsecError, ExecRequestSchema, WsExecRequestSchema, invalidArgument } from '@dsec/protocol';
import { EXEC_FRAMES_MEDIA_TYPE, readExecFrames } from '@dsec/protocol';
import type { ExecEvent, ExecRequest, ExecStreamEvent } from '@dsec/protocol';
import type { CallOptions } from './client.js';
import { CommandExitError } from './errors.js';
import { ExecHandle } from './exec-handle.js';
import type { EventSource, OutputCallbacks, OutputOffsets, ProcessControl } from './exec-handle.js';
import { streamedError } from './layers.js';
import { readNdjson } from './ndjson.js';
import type { SandboxScope } from './scope.js';
import type { ExecResult, ExitInfo, ProcessInfo } from './types.js';
import { checkPid, defined, validate } from './validate.js';
import { openWsExec } from './ws-exec.js';

/** Command timeout of `exec` when the options give none (ms). */
export const DEFAULT_EXEC_TIMEOUT_MS = 60_000;
/** Most output `exec` collects per stream in streaming mode, as the server does without it. */
export const MAX_COLLECTED_OUTPUT_BYTES = 16 * 1024 * 1024;

/** Options shared by exec and spawn. */
export interface CommandOptions extends OutputCallbacks {
  /** Working directory (absolute); default the sandbox's. */
  cwd?: string;
  /** Extra environment variables. */
  env?: Record<string, string>;
  uid?: number;
  gid?: number;
  /** Aborts the call; the process itself is left running (kill it, or let timeoutMs end it). */
  signal?: AbortSignal;
}

/** Options of `sandbox.exec` (`sandbox.commands.run`). */
export interface ExecOptions extends CommandOptions {
  /** Written to stdin, then stdin is closed. */
  stdin?: string | Uint8Array;
  /** Kill the command after this long (ms); default {@link DEFAULT_EXEC_TIMEOUT_MS}, 0 for none. */
  timeoutMs?: number;
  /** Throw a {@link CommandExitError} unless the command exits 0. */
  check?: boolean;
}

/** Options of `sandbox.spawn` (`sandbox.commands.spawn`). */
export interface SpawnOptions extends CommandOptions {
  /**
   * `true`: keep stdin open for `writeStdin` (uses the WebSocket route); a string or bytes:
   * written, then stdin is closed.
   */
  stdin?: boolean | string | Uint8Array;
  /** Run under a terminal of this size (uses the WebSocket route; stdout carries its output). */
  pty?: { rows: number; cols: number };
  /** Kill the process after this long (ms); default none. */
  timeoutMs?: number;
  /** Deadline for the process to start (ms); default the client's request timeout. */
  requestTimeoutMs?: number;
}

/** Options of `sandbox.attach` (`sandbox.commands.attach`). */
export interface AttachOptions extends OutputCallbacks {
  /** Stdout byte offset to read on from (default 0: all that the agent still holds). */
  fromStdout?: number;
  /** Stderr byte offset to read on from (default 0). */
  fromStderr?: number;
  signal?: AbortSignal;
}

/** The commands and processes of one sandbox. */
export class Commands {
  readonly #scope: SandboxScope;

  constructor(scope: SandboxScope) {
    this.#scope = scope;
  }

  /**
   * Runs a command to completion. A string runs under `/bin/sh -c`; an array is an argv.
   * A non-zero exit is a result, unless `check` is set. With `onStdout`/`onStderr` the output is
   * streamed to them as it comes.
   */
  async run(cmd: string | readonly string[], opts: ExecOptions = {}): Promise<ExecResult> {
    const { client } = this.#scope;
    const timeoutMs = opts.timeoutMs ?? DEFAULT_EXEC_TIMEOUT_MS;
    if (!Number.isInteger(timeoutMs) || timeoutMs < 0) throw invalidArgument('timeoutMs', 'must be an integer >= 0');
    const body = execBody(cmd, opts, opts.stdin, timeoutMs > 0 ? timeoutMs : undefined);
    // The server ends the command at timeoutMs; allow it the request timeout on top to answer.
    const deadlineMs = timeoutMs > 0 ? timeoutMs + client.requestTimeoutMs : 0;
    let result: ExecResult;
    if (opts.onStdout || opts.onStderr) {
      const handle = await this.#spawnNdjson(body, opts, deadlineMs);
      result = await collect(handle);
    } else {
      result = await client.json<ExecResult>(
        { method: 'POST', path: this.#scope.route('/exec'), body, timeoutMs: deadlineMs },
        defined({ signal: opts.signal }),
      );
    }
    if (opts.check && result.exitCode !== 0) throw new CommandExitError(result, describe(cmd), this.#scope.id);
    return result;
  }

  /**
   * Starts a command and returns at once with a handle to it. With `stdin: true` or `pty` it runs
   * over the WebSocket route (interactive); otherwise over an ndjson stream that reattaches by
   * itself if the connection drops.
   */
  async spawn(cmd: string | readonly string[], opts: SpawnOptions = {}): Promise<ExecHandle> {
    const { client, id } = this.#scope;
    const timeoutMs = opts.timeoutMs;
    if (opts.stdin === true || opts.pty) {
      const request = validate(
        WsExecRequestSchema,
        defined({ ...commandFields(cmd), cwd: opts.cwd, env: opts.env, timeoutMs, pty: opts.pty, uid: opts.uid, gid: opts.gid }),
      );
      const ws = await openWsExec(client, id, request, { signal: opts.signal, timeoutMs: opts.requestTimeoutMs ?? client.requestTimeoutMs });
      return new ExecHandle({ sandboxId: id, pid: ws.pid, source: ws.source, control: ws.control, callbacks: opts });
    }
    const stdin = opts.stdin === false ? undefined : opts.stdin;
    const body = execBody(cmd, opts, stdin, timeoutMs);
    return this.#spawnNdjson(body, opts, opts.requestTimeoutMs ?? client.requestTimeoutMs, true);
  }

  /**
   * Attaches to a process again (after a client restart or a `disconnect()`), reading its output
   * from the given offsets: pass the `offsets` of the old handle to miss and repeat nothing.
   */
  async attach(pid: number, opts: AttachOptions = {}): Promise<ExecHandle> {
    checkPid(pid);
    const offsets = { stdout: opts.fromStdout ?? 0, stderr: opts.fromStderr ?? 0 };
    if (!Number.isSafeInteger(offsets.stdout) || offsets.stdout < 0) throw invalidArgument('fromStdout', 'must be an integer >= 0');
    if (!Number.isSafeInteger(offsets.stderr) || offsets.stderr < 0) throw invalidArgument('fromStderr', 'must be an integer >= 0');
    const source = await this.#outputSource(pid, offsets, opts.signal);
    return new ExecHandle({ sandboxId: this.#scope.id, pid, source, control: this.#restControl(pid, opts.signal), callbacks: opts, offsets });
  }

  /** Processes the sandbox's agent knows, running and exited. */
  async list(opts: CallOptions = {}): Promise<ProcessInfo[]> {
    return (await this.#scope.client.json<{ items: ProcessInfo[] }>({ method: 'GET', path: this.#scope.route('/processes') }, opts)).items;
  }

  async #spawnNdjson(body: object, opts: OutputCallbacks & { signal?: AbortSignal }, timeoutMs: number, headersOnly = false): Promise<ExecHandle> {
    const { client, id } = this.#scope;
    const reply = await client.stream(
      { method: 'POST', path: this.#scope.route('/exec'), body, accept: EXEC_STREAM_ACCEPT, timeoutMs: headersOnly ? timeoutMs : 0 },
      defined({ signal: opts.signal }),
    );
    // For exec, the deadline covers the whole run: end the stream when it passes.
    const timer =
      !headersOnly && timeoutMs > 0
        ? setTimeout(() => reply.body.destroy(new DsecError('TIMEOUT', `exec: no exit within ${timeoutMs} ms`)), timeoutMs)
        : undefined;
    reply.body.once('close', () => clearTimeout(timer));
    const source = streamSource(reply);
    const first = await source.iterator.next().catch((err: unknown) => {
      reply.body.destroy();
      throw opts.signal?.aborted ? opts.signal.reason : err;
    });
    if (first.done) throw new DsecError('UNAVAILABLE', 'exec: the stream ended before the start event');
    const ev = first.value;
    if (ev.type === 'error') throw streamedError(ev.error);
    if (ev.type !== 'start') throw new DsecError('INTERNAL', `exec: expected a start event, got ${ev.type}`);
    const control = this.#restControl(ev.pid, opts.signal, !headersOnly);
    // The ndjson form closes stdin once the request's stdin (if any) is written.
    control.writeStdin = async () => {
      throw new DsecError('CONFLICT', `process ${ev.pid}: stdin is closed; spawn with stdin: true to write to it`, { sandboxId: id, pid: ev.pid });
    };
    control.closeStdin = async () => undefined;
    return new ExecHandle({ sandboxId: id, pid: ev.pid, source, control, callbacks: opts });
  }

  /** Control of a process through the REST routes (stdin, signal, reattach). */
  #restControl(pid: number, signal: AbortSignal | undefined, noReconnect = false): ProcessControl {
    const { client } = this.#scope;
    const route = this.#scope.route(`/processes/${pid}`);
    const call = defined({ signal });
    const control: ProcessControl = {
      writeStdin: async (data) => {
        await client.request({ method: 'POST', path: `${route}/stdin`, body: data }, call);
      },
      closeStdin: async () => {
        await client.request({ method: 'POST', path: `${route}/stdin`, query: { eof: 'true' }, body: Buffer.alloc(0) }, call);
      },
      signal: async (name) => {
        await client.request({ method: 'POST', path: `${route}/signal`, body: { signal: name } }, call);
      },
    };
    if (!noReconnect) control.reconnect = (offsets) => this.#outputSource(pid, offsets, signal);
    return control;
  }

  async #outputSource(pid: number, offsets: OutputOffsets, signal: AbortSignal | undefined): Promise<EventSource> {
    const reply = await this.#scope.client.stream(
      {
        method: 'GET',
        path: this.#scope.route(`/processes/${pid}/output`),
        query: { from: offsets.stdout, fromStderr: offsets.stderr },
        accept: EXEC_STREAM_ACCEPT,
      },
      defined({ signal }),
    );
    return streamSource(reply);
  }
}

function commandFields(cmd: string | readonly string[]): { cmd: string } | { argv: string[] } {
  if (typeof cmd === 'string') return { cmd };
  if (Array.isArray(cmd)) return { argv: Array.from(cmd as readonly string[]) };
  throw invalidArgument('cmd', 'must be a string or an array of strings');
}

function describe(cmd: string | readonly string[]): string {
  return typeof cmd === 'string' ? cmd : cmd.join(' ');
}

/**
 * What a streamed exec asks for: binary frames (output bytes as they are), else ndjson (a server
 * that predates the frames answers ndjson; the reply's Content-Type says which came).
 */
const EXEC_STREAM_ACCEPT = `${EXEC_FRAMES_MEDIA_TYPE}, application/x-ndjson`;

/** A streamed exec reply (binary frames or ndjson) as an event source whose first events can be read ahead. */
function streamSource(reply: {
  headers: Record<string, string | string[] | undefined>;
  body: NodeJS.ReadableStream & { destroy(err?: Error): void };
}): EventSource & { iterator: AsyncIterator<ExecEvent | ExecStreamEvent> } {
  const type = reply.headers['content-type'];
  const body = reply.body;
  const iterator = (String(type ?? '').includes(EXEC_FRAMES_MEDIA_TYPE) ? readExecFrames(body as AsyncIterable<Buffer>) : readNdjson<ExecEvent>(body))[
    Symbol.asyncIterator
  ]();
  return {
    iterator,
    events: { [Symbol.asyncIterator]: () => iterator },
    close: () => body.destroy(),
  };
}

/** Runs a handle to its exit, collecting output as `exec` returns it. */
async function collect(handle: ExecHandle): Promise<ExecResult> {
  const chunks = { stdout: [] as Buffer[], stderr: [] as Buffer[] };
  const sizes = { stdout: 0, stderr: 0 };
  let truncated = false;
  for await (const ev of handle) {
    const room = MAX_COLLECTED_OUTPUT_BYTES - sizes[ev.stream];
    if (room <= 0) {
      truncated = true;
      continue;
    }
    const data = ev.data.length > room ? ((truncated = true), ev.data.subarray(0, room)) : ev.data;
    chunks[ev.stream].push(data);
    sizes[ev.stream] += data.length;
  }
  const exit: ExitInfo = await handle.wait();
  if (handle.lostBytes.stdout > 0 || handle.lostBytes.stderr > 0) truncated = true;
  return { ...exit, pid: handle.pid, stdout: Buffer.concat(chunks.stdout).toString('utf8'), stderr: Buffer.concat(chunks.stderr).toString('utf8'), truncated };
}

/** The validated body of an exec request (JSON and ndjson forms). */
function execBody(
  cmd: string | readonly string[],
  opts: { cwd?: string | undefined; env?: Record<string, string> | undefined; uid?: number | undefined; gid?: number | undefined },
  stdin: string | Uint8Array | undefined,
  timeoutMs: number | undefined,
): ExecRequest {
  return validate(
    ExecRequestSchema,
    defined({
      ...commandFields(cmd),
      cwd: opts.cwd,
      env: opts.env,
      uid: opts.uid,
      gid: opts.gid,
      stdin: typeof stdin === 'string' ? stdin : undefined,
      stdinBase64: stdin instanceof Uint8Array ? Buffer.from(stdin.buffer, stdin.byteOffset, stdin.byteLength).toString('base64') : undefined,
      timeoutMs,
    }),
  );
}
