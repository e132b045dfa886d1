// Sandbox: create, find and remove sandboxes; run commands in them; reach their files.
import {
  CreateSandboxBatchRequestSchema,
  CreateSandboxRequestSchema,
  DEFAULT_ADMISSION_WAIT_MS,
  DiffQuerySchema,
  DsecError,
  ExecRequestSchema,
  ForkRequestSchema,
  IDEMPOTENCY_KEY_HEADER,
  IdempotencyKeySchema,
  LeaseSchema,
  ListSandboxesQuerySchema,
  NetworkLogQuerySchema,
  NetworkPolicyPatchSchema,
  NetworkPolicySchema,
  ReplayRequestSchema,
  ResumeRequestSchema,
  SnapshotRequestSchema,
  TrajectoryQuerySchema,
  UpdateSandboxRequestSchema,
  VerifyRequestSchema,
  WsExecRequestSchema,
  invalidArgument,
} from '@dsec/protocol';
import type { BatchEvent, DiffEntry, DiffResult, ExecEvent, ExecRequest, ForkResult, ReplayEvent, ReplayRequest, ReplayResult, ReplayStep, Trajectory, TrajectoryStep, VerifyResult } from '@dsec/protocol';
import { clientFrom } from './client.js';
import type { CallOptions, ConnectionOptions, DsecClient } from './client.js';
import { CommandExitError } from './errors.js';
import { ExecHandle } from './exec-handle.js';
import type { EventSource, OutputCallbacks, OutputOffsets, ProcessControl } from './exec-handle.js';
import { Files } from './files.js';
import { streamedError } from './layers.js';
import { readNdjson } from './ndjson.js';
import type { EgressLogEntry, ExecResult, ExitInfo, LayerInfo, LeaseOptions, NetworkPolicy, NetworkPolicyPatch, Page, PauseResult, ProcessInfo, SandboxBatchRequest, SandboxCreateOptions, SandboxInfo, SandboxListOptions, SandboxNetworkInfo, SandboxStats } from './types.js';
import { validate } from './validate.js';
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

/** Options of `sandbox.exec`. */
export interface ExecOptions extends CommandOptions {
  /** Written to stdin, then stdin is closed. */
  stdin?: string | Uint8Array;
  /** Kill the command after this long (ms); default {@link DEFAULT_EXEC_TIMEOUT_MS}, 0 for none. */
  timeoutMs?: number;
  /** Throw a {@link CommandExitError} unless the command exits 0. */
  check?: boolean;
}

/** Options of `sandbox.spawn`. */
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

/** Options of `Sandbox.create` beyond the sandbox's spec. */
export interface CreateOptions extends CallOptions {
  /**
   * Makes the create idempotent (`Idempotency-Key`): a retry with the same key and spec gets the
   * same sandbox, even while the first request is still creating it. Keys live 24 h per project.
   */
  idempotencyKey?: string | undefined;
}

/** Options of `Sandbox.createBatch`. */
export interface BatchCreateOptions extends CallOptions {
  /** Makes the batch idempotent: a retry creates only the items that were not created. */
  idempotencyKey?: string | undefined;
  /** Called with each item as it finishes (in completion order). */
  onItem?: ((item: BatchItem) => void) | undefined;
}

/** One item of a batch: its sandbox, or the error that kept it from being created. */
export interface BatchItem {
  /** Position in the request (0 to count-1). */
  index: number;
  sandbox?: Sandbox;
  error?: DsecError;
}

/** What `Sandbox.createBatch` returns: one item per requested sandbox, in request order. */
export interface BatchCreateResult {
  items: BatchItem[];
  created: number;
  failed: number;
  /** The created sandboxes, in request order. */
  sandboxes: Sandbox[];
}

/** Options of `sandbox.attach`. */
export interface AttachOptions extends OutputCallbacks {
  /** Stdout byte offset to read on from (default 0: all that the agent still holds). */
  fromStdout?: number;
  /** Stderr byte offset to read on from (default 0). */
  fromStderr?: number;
  signal?: AbortSignal;
}

/** Options of `sandbox.snapshot`. */
export interface SnapshotOptions extends CallOptions {
  /** `name` or `name:tag` for the snapshot layer in the sandbox's project. */
  name?: string;
}

/** Options of `sandbox.fork`. */
export interface ForkOptions extends CallOptions {
  /** Added to (and overriding) the source sandbox's labels. */
  labels?: Record<string, string>;
  /** Lifetime of each new sandbox (ms). */
  timeoutMs?: number;
}

/** What `sandbox.fork` returns: the snapshot and the new sandboxes, ready to use. */
export interface ForkOutcome {
  snapshot: LayerInfo;
  sandboxes: Sandbox[];
}

/** Options of `sandbox.trajectory`. */
export interface TrajectoryOptions extends CallOptions {
  /** Steps with a seq above this. */
  after?: number;
  /** Page size (1-1000). */
  limit?: number;
  /** false: leave the bounded copies of output and content out (digests stay). Default true. */
  content?: boolean;
}

/** Options of `sandbox.replay`. */
export interface ReplayOptions extends Omit<ReplayRequest, 'upTo'>, CallOptions {
  /** Replay steps up to and including this seq. */
  upTo?: number;
  /** Called with each step's verdict as it is known (the reply is then streamed). */
  onStep?: (step: ReplayStep) => void;
}

/** What `sandbox.replay` returns: the verdicts and the new sandbox, ready to use. */
export type ReplayOutcome = Omit<ReplayResult, 'sandbox'> & { sandbox: Sandbox };

/** Options of `sandbox.diff`. */
export interface DiffOptions {
  /** Only entries at or below these paths (absolute, normalised). */
  paths?: string[];
  /** sha256 of added and changed files (default true). */
  hash?: boolean;
  /** Page size (default 1,000, at most 10,000). */
  limit?: number;
  /** `nextCursor` of the previous page. */
  cursor?: string;
}

/** A listing that fetches pages as it is iterated. */
export class SandboxPaginator implements AsyncIterable<SandboxInfo> {
  constructor(
    private readonly client: DsecClient,
    private readonly opts: SandboxListOptions,
  ) {}

  /** Every sandbox of every page. */
  async toArray(): Promise<SandboxInfo[]> {
    const all: SandboxInfo[] = [];
    for await (const s of this) all.push(s);
    return all;
  }

  async *[Symbol.asyncIterator](): AsyncIterator<SandboxInfo> {
    let cursor: string | undefined;
    do {
      const page = await Sandbox.listPage({ ...this.opts, ...(cursor ? { cursor } : {}) }, { client: this.client });
      yield* page.items;
      cursor = page.nextCursor ?? undefined;
    } while (cursor);
  }
}

function idempotencyHeaders(key: string | undefined): Record<string, string> | undefined {
  return key === undefined ? undefined : { [IDEMPOTENCY_KEY_HEADER]: validate(IdempotencyKeySchema, key, 'idempotencyKey') };
}

function checkSandboxId(id: string): string {
  if (typeof id !== 'string' || !/^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/.test(id)) throw invalidArgument('id', 'not a sandbox id');
  return id;
}

function checkPid(pid: number): number {
  if (!Number.isSafeInteger(pid) || pid < 0) throw invalidArgument('pid', 'not a process handle');
  return pid;
}

function commandFields(cmd: string | readonly string[]): { cmd: string } | { argv: string[] } {
  if (typeof cmd === 'string') return { cmd };
  if (Array.isArray(cmd)) return { argv: [...cmd] };
  throw invalidArgument('cmd', 'must be a string or an array of strings');
}

function describe(cmd: string | readonly string[]): string {
  return typeof cmd === 'string' ? cmd : cmd.join(' ');
}

/** Strips undefined values (the schemas are strict and exactOptionalPropertyTypes is on). */
function defined<T extends object>(o: T): T {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as T;
}

/** A sandbox: a disposable, isolated Linux computer. */
export class Sandbox {
  /** Sandbox id (`<node>-<hex>`). */
  readonly id: string;
  /** The client this sandbox talks through. */
  readonly client: DsecClient;
  /** Files inside the sandbox. */
  readonly files: Files;
  /** The sandbox as last returned by the API (create, connect or info). */
  lastInfo: SandboxInfo | undefined;

  private constructor(client: DsecClient, id: string, info?: SandboxInfo) {
    this.client = client;
    this.id = id;
    this.files = new Files(client, id);
    this.lastInfo = info;
  }

  /**
   * Creates a sandbox and returns once it is running (claimed from a warm pool of the project
   * when one matches). With `admission: {wait: true}` it waits for quota or capacity instead of
   * failing with QUOTA_EXCEEDED or CAPACITY_EXHAUSTED; that wait is added to the request timeout.
   * A client with an owner session (the `owner` option) makes it the sandbox's owner unless
   * `owner` is given.
   */
  static async create(opts: SandboxCreateOptions & CreateOptions, conn: ConnectionOptions = {}): Promise<Sandbox> {
    const { signal, requestTimeoutMs, idempotencyKey, ...spec } = opts;
    const client = clientFrom(conn);
    const owner = spec.owner ?? (client.ownerSession ? await client.ownerSession.id(defined({ signal, requestTimeoutMs })) : undefined);
    const body = validate(CreateSandboxRequestSchema, defined({ ...spec, owner }));
    const waitMs = body.admission?.wait ? (body.admission.timeoutMs ?? DEFAULT_ADMISSION_WAIT_MS) : 0;
    const timeoutMs = requestTimeoutMs ?? (waitMs > 0 && client.requestTimeoutMs > 0 ? client.requestTimeoutMs + waitMs : undefined);
    const info = await client.json<SandboxInfo>(
      { method: 'POST', path: '/v1/sandboxes', body, headers: idempotencyHeaders(idempotencyKey), ...(timeoutMs !== undefined ? { timeoutMs } : {}) },
      defined({ signal }),
    );
    return new Sandbox(client, info.id, info);
  }

  /**
   * Creates `count` sandboxes of one spec, or one per entry of `items` (up to 10,000), in one
   * request. Each item succeeds or fails on its own (a bad spec, the quota); `onItem` sees them
   * as they finish. The request timeout covers the batch's acceptance, not its creates.
   */
  static async createBatch(request: SandboxBatchRequest, opts: BatchCreateOptions = {}, conn: ConnectionOptions = {}): Promise<BatchCreateResult> {
    const client = clientFrom(conn);
    let body = validate(CreateSandboxBatchRequestSchema, request);
    if (client.ownerSession) {
      // This client's owner session owns the batch's sandboxes too, unless they name one.
      const owner = await client.ownerSession.id(defined({ signal: opts.signal, requestTimeoutMs: opts.requestTimeoutMs }));
      body = { ...body, ...(body.spec ? { spec: { owner, ...body.spec } } : {}), ...(body.items ? { items: body.items.map((it) => (it && typeof it === 'object' ? { owner, ...it } : it)) } : {}) };
    }
    const reply = await client.stream(
      { method: 'POST', path: '/v1/sandboxes:batch', body, accept: 'application/x-ndjson', headers: idempotencyHeaders(opts.idempotencyKey) },
      defined({ signal: opts.signal, requestTimeoutMs: opts.requestTimeoutMs }),
    );
    const count = body.items?.length ?? body.count ?? 0;
    const items: BatchItem[] = new Array<BatchItem>(count);
    let summary: { created: number; failed: number } | undefined;
    try {
      for await (const ev of readNdjson<BatchEvent>(reply.body)) {
        if (ev.type === 'error') throw streamedError(ev.error);
        if (ev.type === 'summary') {
          summary = ev;
          continue;
        }
        const item: BatchItem = { index: ev.index };
        if (ev.sandbox) item.sandbox = new Sandbox(client, ev.sandbox.id, ev.sandbox);
        if (ev.error) item.error = streamedError(ev.error);
        items[ev.index] = item;
        opts.onItem?.(item);
      }
    } finally {
      reply.body.destroy();
    }
    if (!summary) throw new DsecError('UNAVAILABLE', 'batch: the stream ended before its summary');
    return { items, created: summary.created, failed: summary.failed, sandboxes: items.flatMap((i) => (i?.sandbox ? [i.sandbox] : [])) };
  }

  /**
   * Finds an existing sandbox by id (SANDBOX_NOT_FOUND when it does not exist). A client with
   * an owner session takes the sandbox over (`claim: false` to only look): after a crash, the
   * new process's client connects and the sandbox is its own again, resumed if its old
   * owner's disappearance had paused it.
   */
  static async connect(id: string, conn: ConnectionOptions & CallOptions & { claim?: boolean } = {}): Promise<Sandbox> {
    const client = clientFrom(conn);
    const sandbox = new Sandbox(client, checkSandboxId(id));
    const call = defined({ signal: conn.signal, requestTimeoutMs: conn.requestTimeoutMs });
    if (client.ownerSession && conn.claim !== false) await sandbox.setOwner(await client.ownerSession.id(call), call);
    else await sandbox.info(call);
    return sandbox;
  }

  /** Connects to every sandbox with these labels (and state), as {@link Sandbox.connect} does. */
  static async find(opts: SandboxListOptions, conn: ConnectionOptions & { claim?: boolean } = {}): Promise<Sandbox[]> {
    const client = clientFrom(conn);
    const out: Sandbox[] = [];
    for await (const info of Sandbox.list(opts, { client })) {
      const sandbox = new Sandbox(client, info.id, info);
      if (client.ownerSession && conn.claim !== false) await sandbox.setOwner(await client.ownerSession.id(defined({ signal: opts.signal })), defined({ signal: opts.signal }));
      out.push(sandbox);
    }
    return out;
  }

  /**
   * A handle to a sandbox by id, without asking the API (for a sandbox that may be gone, such
   * as one whose trajectory is to be read or replayed).
   */
  static fromId(id: string, conn: ConnectionOptions = {}): Sandbox {
    return new Sandbox(clientFrom(conn), checkSandboxId(id));
  }

  /** Destroys a sandbox by id without fetching it first. */
  static async kill(id: string, conn: ConnectionOptions & CallOptions = {}): Promise<void> {
    const client = clientFrom(conn);
    await new Sandbox(client, checkSandboxId(id)).kill(defined({ signal: conn.signal, requestTimeoutMs: conn.requestTimeoutMs }));
  }

  /**
   * Lists sandboxes, fetching pages as the result is iterated
   * (`for await (const s of Sandbox.list(...))`, or `.toArray()`). `limit` is the page size.
   */
  static list(opts: SandboxListOptions = {}, conn: ConnectionOptions = {}): SandboxPaginator {
    const client = clientFrom(conn);
    Sandbox.#listQuery(opts);
    return new SandboxPaginator(client, opts);
  }

  /** Fetches one page of a sandbox listing. */
  static async listPage(opts: SandboxListOptions & { cursor?: string } = {}, conn: ConnectionOptions = {}): Promise<Page<SandboxInfo>> {
    const client = clientFrom(conn);
    const query = Sandbox.#listQuery(opts);
    return client.json<Page<SandboxInfo>>({ method: 'GET', path: '/v1/sandboxes', query }, defined({ signal: opts.signal }));
  }

  static #listQuery(opts: SandboxListOptions & { cursor?: string }): Record<string, string | number | string[] | undefined> {
    const label = opts.labels ? Object.entries(opts.labels).map(([k, v]) => `${k}=${v}`) : undefined;
    const q = validate(ListSandboxesQuerySchema, defined({ label, state: opts.state, limit: opts.limit, cursor: opts.cursor }), 'query');
    return { label: q.label, state: q.state, limit: q.limit, cursor: q.cursor };
  }

  #route(suffix = ''): string {
    return `/v1/sandboxes/${encodeURIComponent(this.id)}${suffix}`;
  }

  /** Fetches the sandbox's current description. */
  async info(opts: CallOptions = {}): Promise<SandboxInfo> {
    this.lastInfo = await this.client.json<SandboxInfo>({ method: 'GET', path: this.#route() }, opts);
    return this.lastInfo;
  }

  /** Resource use read from the sandbox's cgroups and writable layer. */
  async stats(opts: CallOptions = {}): Promise<SandboxStats> {
    return this.client.json<SandboxStats>({ method: 'GET', path: this.#route('/stats') }, opts);
  }

  /**
   * One page of what the sandbox added, changed and deleted against its image layers (read by
   * the node from the writable layer, with sha256 of file contents). Pass `nextCursor` back as
   * `cursor` for the next page, or iterate {@link diffEntries}.
   */
  async diff(opts: DiffOptions & CallOptions = {}): Promise<DiffResult> {
    const { signal, requestTimeoutMs, ...rest } = opts;
    const q = validate(DiffQuerySchema, defined({ path: rest.paths, hash: rest.hash === undefined ? undefined : String(rest.hash), limit: rest.limit, cursor: rest.cursor }), 'query');
    return this.client.json<DiffResult>({ method: 'GET', path: this.#route('/diff'), query: { path: q.path, hash: q.hash, limit: q.limit, cursor: q.cursor } }, defined({ signal, requestTimeoutMs }));
  }

  /** Every entry of the diff, fetching pages as it is iterated. */
  async *diffEntries(opts: Omit<DiffOptions, 'cursor'> & CallOptions = {}): AsyncGenerator<DiffEntry> {
    let cursor: string | undefined;
    do {
      const page = await this.diff({ ...opts, ...(cursor ? { cursor } : {}) });
      yield* page.entries;
      cursor = page.nextCursor ?? undefined;
    } while (cursor);
  }

  /**
   * Integrity check for graders: whether each path holds a regular file with the given sha256
   * (read on the node, never through programs inside the sandbox; symlinks are not followed).
   */
  async verify(expected: Record<string, string>, opts: CallOptions = {}): Promise<VerifyResult> {
    const body = validate(VerifyRequestSchema, { expected });
    return this.client.json<VerifyResult>({ method: 'POST', path: this.#route('/verify'), body }, opts);
  }

  /** The sandbox's network: its policy, addresses, traffic and attempt counters. */
  async network(opts: CallOptions = {}): Promise<SandboxNetworkInfo> {
    return this.client.json<SandboxNetworkInfo>({ method: 'GET', path: this.#route('/network') }, opts);
  }

  /**
   * Replaces the sandbox's network policy. It applies to new connections when this returns;
   * open connections it no longer allows are closed. On failure the old policy stays in force.
   */
  async setNetwork(policy: NetworkPolicy, opts: CallOptions = {}): Promise<SandboxNetworkInfo> {
    const body = validate(NetworkPolicySchema, policy, 'network');
    return this.client.json<SandboxNetworkInfo>({ method: 'PUT', path: this.#route('/network'), body }, opts);
  }

  /** Changes part of the sandbox's network policy (`{presets: {add: ['pypi']}}`). */
  async patchNetwork(patch: NetworkPolicyPatch, opts: CallOptions = {}): Promise<SandboxNetworkInfo> {
    const body = validate(NetworkPolicyPatchSchema, patch, 'network');
    return this.client.json<SandboxNetworkInfo>({ method: 'PATCH', path: this.#route('/network'), body }, opts);
  }

  /** The sandbox's latest egress attempts (allowed and denied), oldest first. */
  async networkLog(opts: CallOptions & { limit?: number } = {}): Promise<EgressLogEntry[]> {
    const { limit, ...call } = opts;
    const q = validate(NetworkLogQuerySchema, defined({ limit }), 'query');
    return (await this.client.json<{ items: EgressLogEntry[] }>({ method: 'GET', path: this.#route('/network/log'), query: { limit: q.limit } }, call)).items;
  }

  /** Destroys the sandbox and everything in it. */
  async kill(opts: CallOptions = {}): Promise<void> {
    await this.client.request({ method: 'DELETE', path: this.#route() }, opts);
  }

  /**
   * Pauses the sandbox: every process is frozen and its memory made reclaimable; processes,
   * open files and the file system are kept exactly. Requests resume it again (unless its
   * lease says `autoResume: false`), as does {@link Sandbox.resume}.
   */
  async pause(opts: CallOptions = {}): Promise<PauseResult> {
    const reply = await this.client.json<PauseResult>({ method: 'POST', path: this.#route('/pause') }, opts);
    this.lastInfo = reply.sandbox;
    return reply;
  }

  /** Resumes a paused sandbox (`prefetch: false` skips reading swapped-out memory back first). */
  async resume(opts: CallOptions & { prefetch?: boolean } = {}): Promise<PauseResult> {
    const { prefetch, ...call } = opts;
    const body = validate(ResumeRequestSchema, defined({ prefetch }));
    const reply = await this.client.json<PauseResult>({ method: 'POST', path: this.#route('/resume'), body }, call);
    this.lastInfo = reply.sandbox;
    return reply;
  }

  /** Changes the lease: the fields given replace the current ones. */
  async setLease(lease: LeaseOptions, opts: CallOptions = {}): Promise<SandboxInfo> {
    const body = validate(UpdateSandboxRequestSchema, { lease: validate(LeaseSchema, lease, 'lease') });
    this.lastInfo = await this.client.json<SandboxInfo>({ method: 'PATCH', path: this.#route(), body }, opts);
    return this.lastInfo;
  }

  /** Hands the sandbox to an owner session (null: none); resumes it if its old owner's loss paused it. */
  async setOwner(owner: string | null, opts: CallOptions = {}): Promise<SandboxInfo> {
    const body = validate(UpdateSandboxRequestSchema, { owner });
    this.lastInfo = await this.client.json<SandboxInfo>({ method: 'PATCH', path: this.#route(), body }, opts);
    return this.lastInfo;
  }

  /**
   * Runs a command to completion. A string runs under `/bin/sh -c`; an array is an argv.
   * A non-zero exit is a result, unless `check` is set. With `onStdout`/`onStderr` the output is
   * streamed to them as it comes.
   */
  async exec(cmd: string | readonly string[], opts: ExecOptions = {}): Promise<ExecResult> {
    const timeoutMs = opts.timeoutMs ?? DEFAULT_EXEC_TIMEOUT_MS;
    if (!Number.isInteger(timeoutMs) || timeoutMs < 0) throw invalidArgument('timeoutMs', 'must be an integer >= 0');
    const stdin = opts.stdin;
    const body = execBody(cmd, opts, stdin, timeoutMs > 0 ? timeoutMs : undefined);
    // The server ends the command at timeoutMs; allow it the request timeout on top to answer.
    const deadlineMs = timeoutMs > 0 ? timeoutMs + this.client.requestTimeoutMs : 0;
    let result: ExecResult;
    if (opts.onStdout || opts.onStderr) {
      const handle = await this.#spawnNdjson(body, opts, deadlineMs);
      result = await collect(handle);
    } else {
      result = await this.client.json<ExecResult>({ method: 'POST', path: this.#route('/exec'), body, timeoutMs: deadlineMs }, defined({ signal: opts.signal }));
    }
    if (opts.check && result.exitCode !== 0) throw new CommandExitError(result, describe(cmd));
    return result;
  }

  /**
   * Starts a command and returns at once with a handle to it. With `stdin: true` or `pty` it runs
   * over the WebSocket route (interactive); otherwise over an ndjson stream that reattaches by
   * itself if the connection drops.
   */
  async spawn(cmd: string | readonly string[], opts: SpawnOptions = {}): Promise<ExecHandle> {
    const timeoutMs = opts.timeoutMs;
    if (opts.stdin === true || opts.pty) {
      const request = validate(WsExecRequestSchema, defined({ ...commandFields(cmd), cwd: opts.cwd, env: opts.env, timeoutMs, pty: opts.pty, uid: opts.uid, gid: opts.gid }));
      const ws = await openWsExec(this.client, this.id, request, { signal: opts.signal, timeoutMs: opts.requestTimeoutMs ?? this.client.requestTimeoutMs });
      return new ExecHandle({ sandboxId: this.id, pid: ws.pid, source: ws.source, control: ws.control, callbacks: opts });
    }
    const stdin = opts.stdin === false ? undefined : opts.stdin;
    const body = execBody(cmd, opts, stdin, timeoutMs);
    return this.#spawnNdjson(body, opts, opts.requestTimeoutMs ?? this.client.requestTimeoutMs, true);
  }

  async #spawnNdjson(body: object, opts: OutputCallbacks & { signal?: AbortSignal }, timeoutMs: number, headersOnly = false): Promise<ExecHandle> {
    const reply = await this.client.stream(
      { method: 'POST', path: this.#route('/exec'), body, accept: 'application/x-ndjson', timeoutMs: headersOnly ? timeoutMs : 0 },
      defined({ signal: opts.signal }),
    );
    // For exec, the deadline covers the whole run: end the stream when it passes.
    const timer = !headersOnly && timeoutMs > 0 ? setTimeout(() => reply.body.destroy(new DsecError('TIMEOUT', `exec: no exit within ${timeoutMs} ms`)), timeoutMs) : undefined;
    reply.body.once('close', () => clearTimeout(timer));
    const source = ndjsonSource(reply.body);
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
      throw new DsecError('CONFLICT', `process ${ev.pid}: stdin is closed; spawn with stdin: true to write to it`, { sandboxId: this.id, pid: ev.pid });
    };
    control.closeStdin = async () => undefined;
    return new ExecHandle({ sandboxId: this.id, pid: ev.pid, source, control, callbacks: opts });
  }

  /** Control of a process through the REST routes (stdin, signal, reattach). */
  #restControl(pid: number, signal: AbortSignal | undefined, noReconnect = false): ProcessControl {
    const route = this.#route(`/processes/${pid}`);
    const call = defined({ signal });
    const control: ProcessControl = {
      writeStdin: async (data) => {
        await this.client.request({ method: 'POST', path: `${route}/stdin`, body: data }, call);
      },
      closeStdin: async () => {
        await this.client.request({ method: 'POST', path: `${route}/stdin`, query: { eof: 'true' }, body: Buffer.alloc(0) }, call);
      },
      signal: async (name) => {
        await this.client.request({ method: 'POST', path: `${route}/signal`, body: { signal: name } }, call);
      },
    };
    if (!noReconnect) control.reconnect = (offsets) => this.#outputSource(pid, offsets, signal);
    return control;
  }

  async #outputSource(pid: number, offsets: OutputOffsets, signal: AbortSignal | undefined): Promise<EventSource> {
    const reply = await this.client.stream(
      { method: 'GET', path: this.#route(`/processes/${pid}/output`), query: { from: offsets.stdout, fromStderr: offsets.stderr }, accept: 'application/x-ndjson' },
      defined({ signal }),
    );
    return ndjsonSource(reply.body);
  }

  /**
   * Packs the sandbox's writable layer into a new snapshot layer (the sandbox is frozen while
   * it is read). `Sandbox.create({snapshot: layer.digest})` starts sandboxes from it.
   */
  async snapshot(opts: SnapshotOptions = {}): Promise<LayerInfo> {
    const { signal, requestTimeoutMs, ...rest } = opts;
    const body = validate(SnapshotRequestSchema, defined(rest));
    return this.client.json<LayerInfo>({ method: 'POST', path: this.#route('/snapshot'), body }, defined({ signal, requestTimeoutMs }));
  }

  /** One snapshot, then `count` independent sandboxes from it (all or none). */
  async fork(count: number, opts: ForkOptions = {}): Promise<ForkOutcome> {
    const { signal, requestTimeoutMs, ...rest } = opts;
    const body = validate(ForkRequestSchema, defined({ count, ...rest }));
    const reply = await this.client.json<ForkResult>({ method: 'POST', path: this.#route('/fork'), body }, defined({ signal, requestTimeoutMs: requestTimeoutMs ?? 0 }));
    return { snapshot: reply.snapshot, sandboxes: reply.sandboxes.map((info) => new Sandbox(this.client, info.id, info)) };
  }

  /** One page of the sandbox's trajectory (it outlives the sandbox). */
  async trajectoryPage(opts: TrajectoryOptions = {}): Promise<Trajectory> {
    const query = validate(TrajectoryQuerySchema, defined({ after: opts.after, limit: opts.limit, content: opts.content === undefined ? undefined : String(opts.content) }), 'query');
    return this.client.json<Trajectory>({ method: 'GET', path: this.#route('/trajectory'), query: { after: query.after, limit: query.limit, content: query.content } }, defined({ signal: opts.signal, requestTimeoutMs: opts.requestTimeoutMs }));
  }

  /** Every recorded step (commands and file changes) in order, fetched a page at a time. */
  async *trajectory(opts: TrajectoryOptions = {}): AsyncGenerator<TrajectoryStep> {
    let after = opts.after;
    for (;;) {
      const page = await this.trajectoryPage({ ...opts, ...(after !== undefined ? { after } : {}) });
      yield* page.items;
      if (page.nextCursor === null) return;
      after = Number(page.nextCursor);
    }
  }

  /**
   * Creates a fresh sandbox from this one's layers (or from a snapshot of it) and re-runs the
   * recorded steps in order, with a verdict for each (`same`, `exit-differs`, `output-differs`,
   * `not-replayable`). Works after this sandbox is gone (its node died), while its trajectory
   * is kept.
   */
  async replay(opts: ReplayOptions = {}): Promise<ReplayOutcome> {
    const { signal, requestTimeoutMs, onStep, ...rest } = opts;
    const body = validate(ReplayRequestSchema, defined(rest));
    const call = defined({ signal, requestTimeoutMs: requestTimeoutMs ?? 0 });
    let result: ReplayResult | undefined;
    if (!onStep) {
      result = await this.client.json<ReplayResult>({ method: 'POST', path: this.#route('/replay'), body }, call);
    } else {
      const reply = await this.client.stream({ method: 'POST', path: this.#route('/replay'), body, accept: 'application/x-ndjson' }, call);
      for await (const ev of readNdjson<ReplayEvent>(reply.body)) {
        if (ev.type === 'step') onStep(ev.step);
        else if (ev.type === 'done') result = ev.result;
        else if (ev.type === 'error') throw streamedError(ev.error);
      }
      if (!result) throw new DsecError('UNAVAILABLE', 'replay: the stream ended without a result');
    }
    return { ...result, sandbox: new Sandbox(this.client, result.sandbox.id, result.sandbox) };
  }

  /** Processes the sandbox's agent knows, running and exited. */
  async processes(opts: CallOptions = {}): Promise<ProcessInfo[]> {
    return (await this.client.json<{ items: ProcessInfo[] }>({ method: 'GET', path: this.#route('/processes') }, opts)).items;
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
    return new ExecHandle({ sandboxId: this.id, pid, source, control: this.#restControl(pid, opts.signal), callbacks: opts, offsets });
  }
}

/** An ndjson reply as an event source whose first events can be read ahead. */
function ndjsonSource(body: NodeJS.ReadableStream & { destroy(err?: Error): void }): EventSource & { iterator: AsyncIterator<ExecEvent> } {
  const iterator = readNdjson<ExecEvent>(body)[Symbol.asyncIterator]();
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
