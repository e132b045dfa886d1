// envd, the in-sandbox agent of E2B, served by the apiserver for every sandbox: requests are
// routed by the `E2b-Sandbox-Id` header (or, for signed `/files` URLs, by the signature) and
// authorised by the sandbox's access token; the work goes through the dsec services.
import { createHash } from 'node:crypto';
import path from 'node:path';
import { gzipSync, createGunzip } from 'node:zlib';
import { Readable } from 'node:stream';
import type { Context } from 'hono';
import { DsecError, invalidArgument } from '@dsec/protocol';
import { commandSummary } from '@dsec/watcher';
import type { ExecSpec, ExecStreamEvent, FileStat } from '@dsec/protocol';
import type { Principal } from '../auth.js';
import type { Services } from '../services/index.js';
import type { CommandTarget } from '../services/commands.js';
import type { SandboxRow } from '../services/common.js';
import { limitedBody, MAX_UPLOAD_BYTES, requestHeader, requestSignal } from '../http/validate.js';
import { CutStream, deadlineMs, keepaliveMs } from './connect.js';
import { ConnectError, E2bError } from './errors.js';
import { NO_TOKEN, TOKEN_LABEL, sandboxPrincipal, tokenMatches } from './sandboxes.js';
import { ENVD_PORT, hostTarget } from './ports.js';
import { fileMetadataOf, metadataFromHeaders, replaceFileMetadata } from './file-metadata.js';
import { SandboxUsers, resolvePath } from './users.js';
import type { SandboxUser } from './users.js';

/** A sandbox a data-plane request acts on. */
export interface EnvdTarget extends CommandTarget {
  p: Principal;
  node: string;
  row: SandboxRow;
}

/** A process started through envd: its dsec id and how it was started (for List). */
interface Started {
  pid: number;
  osPid: number;
  config: { cmd: string; args: string[]; envs: Record<string, string>; cwd?: string };
  tag?: string;
}

/** Unauthenticated (signature-only) requests a client address may make per second, and in a burst. */
const SIGNED_RATE = { perSecond: 20, burst: 50 };
const WATCH_POLL_MS = 250;
const MAX_WATCH_ENTRIES = 20_000;
const MAX_WATCHERS = 64;
/** Most bytes of a multipart upload (parsed whole); raw uploads stream up to MAX_UPLOAD_BYTES. */
const MAX_MULTIPART_BYTES = 256 * 1024 * 1024;

const FILE_TYPE: Record<string, string> = { file: 'FILE_TYPE_FILE', dir: 'FILE_TYPE_DIRECTORY', symlink: 'FILE_TYPE_SYMLINK' };

function permissions(type: string, mode: number): string {
  const t = type === 'dir' ? 'd' : type === 'symlink' ? 'l' : '-';
  let s = t;
  for (let i = 8; i >= 0; i--) s += mode & (1 << i) ? 'rwx'.charAt((8 - i) % 3) : '-';
  return s;
}

function str(v: unknown, field: string, optional = false): string | undefined {
  if (v === undefined || v === null) {
    if (optional) return undefined;
    throw invalidArgument(field, 'required');
  }
  if (typeof v !== 'string') throw invalidArgument(field, 'not a string');
  return v;
}

function obj(v: unknown, field: string): Record<string, unknown> {
  if (v === undefined || v === null) return {};
  if (typeof v !== 'object' || Array.isArray(v)) throw invalidArgument(field, 'not an object');
  return v as Record<string, unknown>;
}

function uint(v: unknown, field: string): number {
  const n = typeof v === 'string' ? Number(v) : v;
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 0 || n > 4_294_967_295) throw invalidArgument(field, 'not an unsigned integer');
  return n;
}

function bytes(v: unknown, field: string): Buffer {
  if (typeof v !== 'string' || !/^[A-Za-z0-9+/_-]*={0,2}$/.test(v)) throw invalidArgument(field, 'not base64');
  return Buffer.from(v, 'base64');
}

/** A per-address token bucket for requests that carry no token (signed URLs, failed look-ups; ports.ts too). */
export class AddressBuckets {
  private readonly buckets = new Map<string, { tokens: number; at: number }>();
  /** `rate`: tokens per second and burst (default: the signed-URL rate, 20/s and 50). */
  constructor(private readonly rate: { perSecond: number; burst: number } = SIGNED_RATE) {}
  take(addr: string): boolean {
    const now = Date.now();
    if (this.buckets.size > 50_000) this.buckets.clear();
    const b = this.buckets.get(addr) ?? { tokens: this.rate.burst, at: now };
    b.tokens = Math.min(this.rate.burst, b.tokens + ((now - b.at) / 1000) * this.rate.perSecond);
    b.at = now;
    this.buckets.set(addr, b);
    if (b.tokens < 1) return false;
    b.tokens -= 1;
    return true;
  }
  /** True when `addr` has a request left (nothing taken). */
  has(addr: string): boolean {
    const b = this.buckets.get(addr);
    return b === undefined || Math.min(this.rate.burst, b.tokens + ((Date.now() - b.at) / 1000) * this.rate.perSecond) >= 1;
  }
}

/** How often per-sandbox state is checked against the sandboxes that still exist. */
const SWEEP_MS = 30_000;
/** A watcher nobody polled for this long is dropped (clients poll every second or so). */
const WATCHER_IDLE_MS = 5 * 60_000;
/** Rows in these states are ending or gone: their envd state is forgotten. */
const ENDED_STATES = new Set(['stopping', 'failed', 'lost']);

/** The signature of a `/files` URL (E2B's `getSignature`). */
export function fileSignature(filePath: string, op: 'read' | 'write', username: string, token: string, expiration?: number): string {
  const raw = expiration === undefined ? `${filePath}:${op}:${username}:${token}` : `${filePath}:${op}:${username}:${token}:${expiration}`;
  return 'v1_' + createHash('sha256').update(raw).digest('base64').replace(/=+$/, '');
}

/** envd for every sandbox. */
export class Envd {
  readonly users: SandboxUsers;
  /** Access tokens of the E2B sandboxes this process has seen (the signed-URL index). */
  private readonly tokens = new Map<string, string>();
  private readonly started = new Map<string, Map<number, Started>>();
  private readonly watchers = new Map<string, { sandboxId: string; dir: string; recursive: boolean; last: Map<string, FileStat>; at: number }>();
  private readonly signedRate = new AddressBuckets();
  /** Failed look-ups (unknown sandbox, wrong token or signature) by client address. */
  private readonly failedLookups = new AddressBuckets();
  private watcherSeq = 0;
  private readonly sweeper: NodeJS.Timeout;

  constructor(
    private readonly services: Services,
    private readonly log: (line: string) => void,
    private readonly domain: string | null = null,
  ) {
    this.users = new SandboxUsers(services.files);
    this.sweeper = setInterval(() => void this.sweep().catch((err: unknown) => this.log(`e2b: envd sweep: ${String(err)}`)), SWEEP_MS);
    this.sweeper.unref();
  }

  /** Stops the sweep. */
  close(): void {
    clearInterval(this.sweeper);
  }

  /**
   * Forgets the sandboxes that ended by any path (timeout, /v1 delete, another replica, loss),
   * and watchers idle past {@link WATCHER_IDLE_MS}.
   */
  async sweep(now = Date.now()): Promise<void> {
    for (const [id, w] of this.watchers) if (now - w.at > WATCHER_IDLE_MS) this.watchers.delete(id);
    const ids = new Set([...this.tokens.keys(), ...this.started.keys(), ...this.users.ids(), ...[...this.watchers.values()].map((w) => w.sandboxId)]);
    for (const id of ids) {
      const row = await this.services.lifecycle.rowById(id);
      if (!row || ENDED_STATES.has(row.state)) this.forget(id);
    }
  }

  /** How many sandboxes and watchers this process holds state for (tests). */
  held(): { sandboxes: number; watchers: number } {
    const ids = new Set([...this.tokens.keys(), ...this.started.keys(), ...this.users.ids()]);
    return { sandboxes: ids.size, watchers: this.watchers.size };
  }

  /** Records a sandbox's token (create, connect): signed URLs of it resolve from now on. */
  remember(id: string, token: string | null | undefined): void {
    if (token && token !== NO_TOKEN) this.tokens.set(id, token);
  }

  /** Forgets a sandbox (killed, expired, gone): its token, processes, users and watchers. */
  forget(id: string): void {
    this.tokens.delete(id);
    this.started.delete(id);
    this.users.forget(id);
    for (const [wid, w] of this.watchers) if (w.sandboxId === id) this.watchers.delete(wid);
  }

  private notRunning(id: string, why: string): E2bError {
    return new E2bError(502, `sandbox ${id} ${why}`, undefined, { sandboxId: id });
  }

  /**
   * The sandbox of a request and its authorisation: the `X-Access-Token` of an E2B sandbox
   * created `secure` (or, for `/files`, a valid signature). Unknown, killed or paused (without
   * autoResume): 502, as E2B's proxy answers.
   */
  async target(c: Context, signed?: { op: 'read' | 'write' }): Promise<EnvdTarget> {
    // Behind a per-sandbox host name (`49983-<id>.<domain>`, ports.ts) the Host names the sandbox.
    const byHost = hostTarget(requestHeader(c, 'host'), this.domain);
    let id = requestHeader(c, 'e2b-sandbox-id') ?? (byHost?.port === ENVD_PORT ? byHost.sandboxId : undefined);
    const signature = signed ? c.req.query('signature') : undefined;
    if (id === undefined && signature !== undefined) {
      // Signed URLs come without headers: the signature names the sandbox through its token.
      // Rate-limited per client address before any hashing.
      if (!this.signedRate.take(c.get('clientAddress') as string))
        throw new DsecError('RATE_LIMITED', 'too many signed requests from this address', { retryAfterMs: 1000 });
      id = this.bySignature(c, signed!.op);
      if (id === undefined) throw new E2bError(401, 'invalid signature');
    }
    if (id === undefined || id.length === 0 || id.length > 128) throw this.notRunning(String(id ?? ''), 'not found (no E2b-Sandbox-Id header)');
    // Look-ups are not authenticated yet: a source whose look-ups keep failing (unknown ids,
    // wrong tokens) is refused before the store is asked.
    const source = c.get('clientAddress') as string;
    if (!this.failedLookups.has(source))
      throw new DsecError('RATE_LIMITED', 'too many failed sandbox look-ups from this address', { retryAfterMs: Math.ceil(1000 / SIGNED_RATE.perSecond) });
    const failed = (err: Error): Error => {
      this.failedLookups.take(source);
      return err;
    };
    const row = await this.services.lifecycle.rowById(id);
    if (!row) throw failed(this.notRunning(id, 'not found'));
    const token = row.labels[TOKEN_LABEL];
    if (token === undefined) throw failed(new E2bError(401, `sandbox ${id} was not created through the E2B API`));
    if (token !== NO_TOKEN) {
      if (!tokenMatches(token, requestHeader(c, 'x-access-token')) && !(signed && this.signatureValid(c, signed.op, token))) {
        if (signature !== undefined) throw failed(new E2bError(401, 'invalid or expired signature'));
        throw failed(new E2bError(401, 'missing or wrong X-Access-Token'));
      }
      if (!ENDED_STATES.has(row.state)) this.tokens.set(id, token);
    }
    const p = sandboxPrincipal(row, await this.services.iam.tenantOf(row.project_id));
    // From here the call is the sandbox's: audited (index.ts) and counted in its tenant's rate.
    c.set('principal', p);
    await this.services.iam.rateLimited(p);
    try {
      const { row: running, edge } = await this.services.lifecycle.route(p, id, 'member');
      return { p, sandboxId: running.id, edge, node: running.node, row };
    } catch (err) {
      if (err instanceof DsecError && (err.code === 'SANDBOX_NOT_FOUND' || err.code === 'SANDBOX_NOT_RUNNING')) throw this.notRunning(id, err.message);
      throw err;
    }
  }

  private signatureValid(c: Context, op: 'read' | 'write', token: string): boolean {
    const sig = c.req.query('signature');
    if (sig === undefined) return false;
    const expRaw = c.req.query('signature_expiration');
    let exp: number | undefined;
    if (expRaw !== undefined) {
      exp = Number(expRaw);
      if (!Number.isInteger(exp) || exp < Date.now() / 1000) return false;
    }
    const expected = fileSignature(c.req.query('path') ?? '', op, c.req.query('username') ?? '', token, exp);
    return tokenMatches(expected, sig);
  }

  /** The sandbox whose token makes the request's signature valid, among the ones this process knows. */
  private bySignature(c: Context, op: 'read' | 'write'): string | undefined {
    for (const [id, token] of this.tokens) if (this.signatureValid(c, op, token)) return id;
    return undefined;
  }

  /** The user a request names (`Authorization: Basic base64(user:)`, or `username`). */
  async userOf(c: Context, t: EnvdTarget, fromQuery = false): Promise<SandboxUser> {
    let name: string | undefined;
    if (fromQuery) name = c.req.query('username') || undefined;
    else {
      const m = /^Basic\s+(\S+)$/i.exec(requestHeader(c, 'authorization') ?? '');
      if (m) name = Buffer.from(m[1]!, 'base64').toString('utf8').split(':')[0] || undefined;
    }
    return this.users.user(t, name);
  }

  /** `EntryInfo` of a path; its file metadata is read unless given. */
  async entry(t: EnvdTarget, abs: string, st?: FileStat, metadata?: Record<string, string>): Promise<Record<string, unknown>> {
    const s = st ?? (await this.services.files.stat(t, abs));
    const meta = metadata ?? (await fileMetadataOf(this.services, t, [abs]))[0] ?? {};
    const { owner, group } = await this.users.names(t, s.uid, s.gid);
    const mode = s.mode & 0o777;
    const out: Record<string, unknown> = {
      name: path.posix.basename(abs) || '/',
      type: FILE_TYPE[s.type] ?? 'FILE_TYPE_UNSPECIFIED',
      path: abs,
      size: String(s.size),
      mode,
      permissions: permissions(s.type, mode),
      owner,
      group,
      modifiedTime: new Date(s.mtimeMs).toISOString(),
    };
    if (s.type === 'symlink' && s.linkTarget !== undefined) out.symlinkTarget = path.posix.resolve(path.posix.dirname(abs), s.linkTarget);
    if (Object.keys(meta).length > 0) out.metadata = meta;
    return out;
  }

  /** Gives a new path to the user (envd runs as root and chowns what it makes for the user). */
  private async chown(t: EnvdTarget, user: SandboxUser, paths: string[]): Promise<void> {
    if (user.uid === 0 || paths.length === 0) return;
    const r = await this.services.commands.exec(t, { argv: ['chown', '-h', `${user.uid}:${user.gid}`, '--', ...paths], uid: 0, gid: 0 });
    if (r.result.exitCode !== 0) this.log(`e2b: chown in ${t.sandboxId} failed: ${r.result.stderr.slice(0, 200)}`);
  }

  /** Directories above `abs` that do not exist yet (top first). */
  private async missingParents(t: EnvdTarget, abs: string): Promise<string[]> {
    const out: string[] = [];
    let dir = path.posix.dirname(abs);
    while (dir !== '/') {
      const st = await this.services.files.stat(t, dir).catch(() => undefined);
      if (st) break;
      out.unshift(dir);
      dir = path.posix.dirname(dir);
    }
    return out;
  }

  // ---- /files ----

  /** GET /files */
  async download(c: Context): Promise<Response> {
    const t = await this.target(c, { op: 'read' });
    const user = await this.userOf(c, t, true);
    const abs = resolvePath(c.req.query('path'), user);
    const st = await this.services.files.stat(t, abs).catch((err: unknown) => {
      if (err instanceof DsecError && err.code === 'FILE_NOT_FOUND') throw new E2bError(404, `path ${abs} does not exist`);
      throw err;
    });
    if (st.type === 'dir') throw new E2bError(400, `path ${abs} is a directory`);
    const data = Buffer.from(await this.services.slots.run('transfer', t.p.tenantId, t.node, () => this.services.files.read(t, abs, {}, requestSignal(c))));
    const headers: Record<string, string> = { 'content-type': 'application/octet-stream' };
    if (/\bgzip\b/.test(requestHeader(c, 'accept-encoding') ?? '') && data.length > 0) {
      const z = gzipSync(data);
      return new Response(z, { status: 200, headers: { ...headers, 'content-encoding': 'gzip', 'content-length': String(z.length) } });
    }
    return new Response(data, { status: 200, headers: { ...headers, 'content-length': String(data.length) } });
  }

  /** POST /files: multipart (each `file` part) or a raw body (`path` required, gzip decoded). */
  async upload(c: Context): Promise<Response> {
    const t = await this.target(c, { op: 'write' });
    const user = await this.userOf(c, t, true);
    const metadata = metadataFromHeaders(c.req.header());
    if (Number(requestHeader(c, 'content-length') ?? 0) > MAX_UPLOAD_BYTES)
      throw new DsecError('PAYLOAD_TOO_LARGE', `uploads are limited to ${MAX_UPLOAD_BYTES} bytes`);
    const type = (requestHeader(c, 'content-type') ?? '').split(';')[0]!.trim();
    const queryPath = c.req.query('path');
    const written: Array<Record<string, unknown>> = [];
    const write = async (abs: string, body: AsyncIterable<Uint8Array>): Promise<void> => {
      const parents = await this.missingParents(t, abs);
      if (parents.length > 0) await this.services.files.mkdir(t, parents[parents.length - 1]!);
      await this.services.slots.run('transfer', t.p.tenantId, t.node, () =>
        this.services.files.write(t, abs, body, { limitBytes: MAX_UPLOAD_BYTES, mode: 0o644 }, requestSignal(c)),
      );
      await this.chown(t, user, [...parents, abs]);
      await replaceFileMetadata(this.services, t, abs, metadata);
      written.push({ path: abs, name: path.posix.basename(abs), type: 'file', ...(Object.keys(metadata).length > 0 ? { metadata } : {}) });
    };
    if (type === 'multipart/form-data') {
      // Multipart bodies are parsed whole (bounded); large files go raw (octet-stream, streamed).
      const chunks: Buffer[] = [];
      for await (const chunk of limitedBody(c, MAX_MULTIPART_BYTES, 'multipart uploads')) chunks.push(chunk);
      const whole = new Response(Buffer.concat(chunks), { headers: { 'content-type': requestHeader(c, 'content-type') ?? '' } });
      // undici's parser: bounded above, and the only multipart parser among the dependencies.
      // eslint-disable-next-line @typescript-eslint/no-deprecated
      const form = await whole.formData().catch(() => {
        throw invalidArgument('body', 'not multipart/form-data');
      });
      const parts = form.getAll('file');
      if (parts.length === 0) throw invalidArgument('file', 'no part named file');
      for (const part of parts) {
        const isFile = typeof part !== 'string';
        const name = queryPath ?? (isFile ? part.name : undefined);
        if (!name) throw invalidArgument('path', 'required when the part has no filename');
        const abs = resolvePath(name, user);
        const data = isFile ? new Uint8Array(await part.arrayBuffer()) : Buffer.from(part);
        await write(
          abs,
          (async function* () {
            yield data;
          })(),
        );
      }
    } else {
      if (!queryPath) throw invalidArgument('path', 'required for a raw upload');
      let body: AsyncIterable<Uint8Array> = limitedBody(c, MAX_UPLOAD_BYTES, 'uploads');
      if ((requestHeader(c, 'content-encoding') ?? '').trim() === 'gzip') body = Readable.from(body).pipe(createGunzip());
      await write(resolvePath(queryPath, user), body);
    }
    return new Response(JSON.stringify(written), { status: 200, headers: { 'content-type': 'application/json' } });
  }

  // ---- process.Process ----

  private startedOf(id: string): Map<number, Started> {
    let m = this.started.get(id);
    if (!m) this.started.set(id, (m = new Map<number, Started>()));
    return m;
  }

  /** dsec's process id of an E2B selector (`pid`: the pid in the sandbox, or `tag`). */
  private async dsecPid(t: EnvdTarget, selector: Record<string, unknown>): Promise<{ pid: number; osPid: number }> {
    const mine = this.startedOf(t.sandboxId);
    if (selector.tag !== undefined) {
      const tag = str(selector.tag, 'process.tag');
      for (const s of mine.values()) if (s.tag === tag) return { pid: s.pid, osPid: s.osPid };
      throw new ConnectError('not_found', `process with tag ${tag} not found`);
    }
    const osPid = uint(selector.pid, 'process.pid');
    const known = mine.get(osPid);
    const procs = await this.services.commands.processes(t);
    const live = procs.find((p) => p.osPid === osPid && p.state === 'running' && (!known || known.pid === p.pid));
    if (live) return { pid: live.pid, osPid };
    if (known) return { pid: known.pid, osPid };
    throw new ConnectError('not_found', `process with pid ${osPid} not found`);
  }

  /**
   * Adds keepalive messages to a stream of messages while it is idle; ends at once when the
   * request is aborted (its reader went), without waiting for the next message.
   */
  private async *withKeepalive(events: AsyncGenerator<object>, everyMs: number, keepalive: object, signal: AbortSignal): AsyncGenerator<object> {
    const it = events[Symbol.asyncIterator]();
    let pending = it.next();
    const aborted = new Promise<'aborted'>((resolve) => {
      if (signal.aborted) resolve('aborted');
      else signal.addEventListener('abort', () => resolve('aborted'), { once: true });
    });
    try {
      for (;;) {
        let timer: NodeJS.Timeout | undefined;
        const tick = new Promise<'tick'>((resolve) => (timer = setTimeout(() => resolve('tick'), everyMs).unref()));
        const r = await Promise.race([pending, tick, aborted]);
        clearTimeout(timer);
        if (r === 'aborted') return;
        if (r === 'tick') {
          yield keepalive;
          continue;
        }
        if (r.done) return;
        pending = it.next();
        yield r.value;
      }
    } finally {
      // A read still pending when the reader goes must not reject unobserved, nor be waited for.
      pending.catch(() => undefined);
      void it.return?.(undefined).catch(() => undefined);
    }
  }

  /** Process events as envd's (`start` first, `data`, `end`), cut when the sandbox goes. */
  private async *processEvents(t: EnvdTarget, events: AsyncGenerator<ExecStreamEvent>, osPidOf: number, pty: boolean): AsyncGenerator<object> {
    for await (const ev of events) {
      if (ev.type === 'start') yield { event: { start: { pid: ev.osPid } } };
      else if (ev.type === 'output') {
        const data = Buffer.from(ev.data.buffer, ev.data.byteOffset, ev.data.byteLength).toString('base64');
        yield { event: { data: { [pty ? 'pty' : ev.stream]: data } } };
      } else if (ev.type === 'exit') {
        const status =
          ev.exitCode !== null
            ? `exit status ${ev.exitCode}`
            : `signal: ${(ev.signal ?? 'killed').replace(/^SIG/, '').toLowerCase().replace('kill', 'killed').replace('term', 'terminated')}`;
        const end: Record<string, unknown> = { exitCode: ev.exitCode ?? -1, exited: ev.exitCode !== null, status };
        if (ev.timedOut) end.error = 'context deadline exceeded';
        yield { event: { end } };
        this.startedOf(t.sandboxId).delete(osPidOf);
        if (ev.timedOut) throw new ConnectError('deadline_exceeded', 'the call deadline passed; the process was killed');
        return;
      } else if (ev.type === 'error') {
        // The sandbox was killed (or its node lost): cut the transport, as a dying VM does.
        const row = await this.services.lifecycle.rowById(t.sandboxId).catch(() => undefined);
        if (!row || row.state !== 'running') throw new CutStream(`sandbox ${t.sandboxId} is gone`);
        throw new DsecError(ev.error.code as 'INTERNAL', ev.error.message);
      }
    }
  }

  /** process.Process/Start */
  async start(c: Context, t: EnvdTarget, req: Record<string, unknown>): Promise<AsyncGenerator<object>> {
    const user = await this.userOf(c, t);
    const proc = obj(req.process, 'process');
    const cmd = str(proc.cmd, 'process.cmd')!;
    if (cmd === '') throw invalidArgument('process.cmd', 'empty');
    const args = proc.args === undefined ? [] : proc.args;
    if (!Array.isArray(args) || args.some((a) => typeof a !== 'string')) throw invalidArgument('process.args', 'not a list of strings');
    const envs = obj(proc.envs, 'process.envs') as Record<string, string>;
    for (const [k, v] of Object.entries(envs)) if (typeof v !== 'string') throw invalidArgument(`process.envs.${k}`, 'not a string');
    const cwdRaw = str(proc.cwd, 'process.cwd', true);
    const cwd = cwdRaw === undefined || cwdRaw === '' ? undefined : resolvePath(cwdRaw, user, 'process.cwd');
    const ptyReq = req.pty === undefined || req.pty === null ? undefined : obj(obj(req.pty, 'pty').size, 'pty.size');
    const tag = str(req.tag, 'tag', true);
    const home = await this.services.files.stat(t, user.home).catch(() => undefined);
    const timeoutMs = deadlineMs(c);
    const spec: ExecSpec = {
      argv: [cmd, ...(args as string[])],
      env: { HOME: user.home, USER: user.name, LOGNAME: user.name, ...envs },
      uid: user.uid,
      gid: user.gid,
      ...(cwd ? { cwd } : home?.type === 'dir' ? { cwd: user.home } : {}),
      ...(timeoutMs !== undefined ? { timeoutMs: Math.min(timeoutMs, 86_400_000) } : {}),
      ...(req.stdin === true || (ptyReq && req.stdin !== false) ? { keepStdinOpen: true } : {}),
      ...(ptyReq ? { pty: { rows: uint(ptyReq.rows, 'pty.size.rows') || 24, cols: uint(ptyReq.cols, 'pty.size.cols') || 80 } } : {}),
    };
    const release = this.services.slots.acquire('exec', t.p.tenantId, t.node);
    const run = await this.services.commands.spawn(t, spec, 'stream').catch((err: unknown) => {
      release();
      throw err;
    });
    void run.exitCode.finally(release);
    // Audited as /v1 exec is: the command, and its exit status once it ends.
    c.set('auditExec', { command: commandSummary(spec), exitCode: run });
    // A reader that goes leaves the process running (E2B's disconnect); it can reconnect.
    requestSignal(c).addEventListener('abort', () => void run.leave(), { once: true });
    const config = { cmd, args: args as string[], envs, ...(cwd ? { cwd } : {}) };
    this.startedOf(t.sandboxId).set(run.process.osPid, { pid: run.pid, osPid: run.process.osPid, config, ...(tag !== undefined ? { tag } : {}) });
    return this.withKeepalive(
      async function* (this: Envd): AsyncGenerator<object> {
        try {
          yield* this.processEvents(t, run.events(), run.process.osPid, !!ptyReq);
        } finally {
          void run.leave();
        }
      }.call(this),
      keepaliveMs(c),
      { event: { keepalive: {} } },
      requestSignal(c),
    );
  }

  /** process.Process/Connect */
  async connectProcess(c: Context, t: EnvdTarget, req: Record<string, unknown>): Promise<AsyncGenerator<object>> {
    const { pid, osPid } = await this.dsecPid(t, obj(req.process, 'process'));
    const info = (await this.services.commands.processes(t)).find((p) => p.pid === pid);
    const from = { stdout: info?.stdoutBytes ?? 0, stderr: info?.stderrBytes ?? 0 };
    const out = await this.services.commands.output(t, pid, from, requestSignal(c));
    requestSignal(c).addEventListener('abort', () => out.detach(), { once: true });
    return this.withKeepalive(
      async function* (this: Envd): AsyncGenerator<object> {
        try {
          yield { event: { start: { pid: osPid } } };
          yield* this.processEvents(t, out.events, osPid, false);
        } finally {
          out.detach();
        }
      }.call(this),
      keepaliveMs(c),
      { event: { keepalive: {} } },
      requestSignal(c),
    );
  }

  /** process.Process/<unary> */
  async processUnary(method: string, t: EnvdTarget, req: Record<string, unknown>): Promise<object> {
    const { commands } = this.services;
    switch (method) {
      case 'List': {
        const mine = this.startedOf(t.sandboxId);
        const processes = (await commands.processes(t))
          .filter((p) => p.state === 'running')
          .map((p) => {
            const s = mine.get(p.osPid);
            const config = s?.pid === p.pid ? s.config : { cmd: p.argv[0] ?? '', args: p.argv.slice(1), envs: {} };
            return { pid: p.osPid, config, ...(s?.tag !== undefined && s.pid === p.pid ? { tag: s.tag } : {}) };
          });
        return { processes };
      }
      case 'SendInput': {
        const { pid } = await this.dsecPid(t, obj(req.process, 'process'));
        const input = obj(req.input, 'input');
        const data = input.pty !== undefined ? bytes(input.pty, 'input.pty') : bytes(input.stdin ?? '', 'input.stdin');
        await commands.writeStdin(t, pid, data, false);
        return {};
      }
      case 'CloseStdin': {
        const { pid } = await this.dsecPid(t, obj(req.process, 'process'));
        await commands.writeStdin(t, pid, new Uint8Array(), true);
        return {};
      }
      case 'SendSignal': {
        const { pid } = await this.dsecPid(t, obj(req.process, 'process'));
        const sig = req.signal;
        const name = sig === 'SIGNAL_SIGTERM' || sig === 15 ? 'SIGTERM' : sig === 'SIGNAL_SIGKILL' || sig === 9 ? 'SIGKILL' : undefined;
        if (!name) throw invalidArgument('signal', 'SIGNAL_SIGKILL or SIGNAL_SIGTERM');
        await commands.signal(t, pid, name);
        return {};
      }
      case 'Update': {
        const { pid } = await this.dsecPid(t, obj(req.process, 'process'));
        const size = obj(obj(req.pty, 'pty').size, 'pty.size');
        await t.edge.resize(t.sandboxId, pid, uint(size.rows, 'pty.size.rows'), uint(size.cols, 'pty.size.cols'));
        return {};
      }
      default:
        throw new ConnectError('unimplemented', `process.Process/${method} is not served by dsec`);
    }
  }

  // ---- filesystem.Filesystem ----

  /** Entries below `dir` down to `depth` levels (lexical order, depth first). */
  private async walk(t: EnvdTarget, dir: string, depth: number, limit = MAX_WATCH_ENTRIES): Promise<Array<{ abs: string; st: FileStat }>> {
    const out: Array<{ abs: string; st: FileStat }> = [];
    const visit = async (d: string, level: number): Promise<void> => {
      const items = (await this.services.files.list(t, d)).sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
      for (const st of items) {
        if (out.length >= limit) throw new DsecError('PAYLOAD_TOO_LARGE', `${dir} has more than ${limit} entries`);
        const abs = path.posix.join(d, st.name);
        out.push({ abs, st });
        if (st.type === 'dir' && level < depth)
          await visit(abs, level + 1).catch((err: unknown) => {
            if (!(err instanceof DsecError && err.code === 'FILE_NOT_FOUND')) throw err;
          });
      }
    };
    await visit(dir, 1);
    return out;
  }

  private async statOrNotFound(t: EnvdTarget, abs: string): Promise<FileStat> {
    return this.services.files.stat(t, abs).catch((err: unknown) => {
      if (err instanceof DsecError && err.code === 'FILE_NOT_FOUND') throw new ConnectError('not_found', `path ${abs} does not exist`);
      throw err;
    });
  }

  /** filesystem.Filesystem/<unary> */
  async filesystemUnary(c: Context, method: string, t: EnvdTarget, req: Record<string, unknown>): Promise<object> {
    const user = await this.userOf(c, t);
    const { files } = this.services;
    switch (method) {
      case 'Stat': {
        const abs = resolvePath(str(req.path, 'path'), user);
        return { entry: await this.entry(t, abs, await this.statOrNotFound(t, abs)) };
      }
      case 'ListDir': {
        const abs = resolvePath(str(req.path, 'path', true), user);
        const depth = req.depth === undefined ? 1 : Math.max(1, uint(req.depth, 'depth'));
        const st = await this.statOrNotFound(t, abs);
        if (st.type !== 'dir') throw new ConnectError('invalid_argument', `path ${abs} is not a directory`);
        const walked = await this.walk(t, abs, depth);
        const metadata = await fileMetadataOf(
          this.services,
          t,
          walked.map((e) => e.abs),
        );
        const entries = [];
        for (const [i, e] of walked.entries()) entries.push(await this.entry(t, e.abs, e.st, metadata[i]));
        return { entries };
      }
      case 'MakeDir': {
        const abs = resolvePath(str(req.path, 'path'), user);
        if (await files.stat(t, abs).catch(() => undefined)) throw new ConnectError('already_exists', `path ${abs} already exists`);
        const parents = await this.missingParents(t, abs);
        await files.mkdir(t, abs);
        await this.chown(t, user, [...parents, abs]);
        return { entry: await this.entry(t, abs) };
      }
      case 'Move': {
        const from = resolvePath(str(req.source, 'source'), user, 'source');
        const to = resolvePath(str(req.destination, 'destination'), user, 'destination');
        await this.statOrNotFound(t, from);
        const parents = await this.missingParents(t, to);
        if (parents.length > 0) {
          await files.mkdir(t, parents[parents.length - 1]!);
          await this.chown(t, user, parents);
        }
        await files.rename(t, from, to);
        return { entry: await this.entry(t, to) };
      }
      case 'Remove': {
        const abs = resolvePath(str(req.path, 'path'), user);
        await files.remove(t, abs, true).catch((err: unknown) => {
          if (!(err instanceof DsecError && err.code === 'FILE_NOT_FOUND')) throw err;
        });
        return {};
      }
      case 'CreateWatcher': {
        const abs = resolvePath(str(req.path, 'path'), user);
        const st = await this.statOrNotFound(t, abs);
        if (st.type !== 'dir') throw new ConnectError('invalid_argument', `path ${abs} is not a directory`);
        if ([...this.watchers.values()].filter((w) => w.sandboxId === t.sandboxId).length >= MAX_WATCHERS)
          throw new ConnectError('resource_exhausted', `at most ${MAX_WATCHERS} watchers per sandbox`);
        const recursive = req.recursive === true;
        const id = `w${++this.watcherSeq}-${t.sandboxId}`;
        this.watchers.set(id, { sandboxId: t.sandboxId, dir: abs, recursive, last: await this.tree(t, abs, recursive), at: Date.now() });
        return { watcherId: id };
      }
      case 'GetWatcherEvents': {
        const w = this.watcherOf(t, req);
        const now = await this.tree(t, w.dir, w.recursive);
        const events = await this.changes(t, w.dir, w.last, now, req.includeEntry === true);
        w.last = now;
        w.at = Date.now();
        return { events };
      }
      case 'RemoveWatcher': {
        this.watcherOf(t, req);
        this.watchers.delete(str(req.watcherId, 'watcherId')!);
        return {};
      }
      default:
        throw new ConnectError('unimplemented', `filesystem.Filesystem/${method} is not served by dsec`);
    }
  }

  private watcherOf(
    t: EnvdTarget,
    req: Record<string, unknown>,
  ): { sandboxId: string; dir: string; recursive: boolean; last: Map<string, FileStat>; at: number } {
    const w = this.watchers.get(str(req.watcherId, 'watcherId')!);
    if (!w || w.sandboxId !== t.sandboxId) throw new ConnectError('not_found', 'watcher not found');
    return w;
  }

  /** The tree below `dir` by relative path (one level unless recursive). */
  private async tree(t: EnvdTarget, dir: string, recursive: boolean): Promise<Map<string, FileStat>> {
    const m = new Map<string, FileStat>();
    for (const e of await this.walk(t, dir, recursive ? 64 : 1)) m.set(path.posix.relative(dir, e.abs), e.st);
    return m;
  }

  /** Filesystem events between two trees. */
  private async changes(t: EnvdTarget, dir: string, before: Map<string, FileStat>, after: Map<string, FileStat>, withEntry: boolean): Promise<object[]> {
    const out: object[] = [];
    const ev = async (name: string, type: string, st?: FileStat): Promise<void> => {
      const e: Record<string, unknown> = { name, type };
      if (withEntry && st) e.entry = await this.entry(t, path.posix.join(dir, name), st);
      out.push(e);
    };
    for (const [name, st] of after) {
      const old = before.get(name);
      if (!old) {
        await ev(name, 'EVENT_TYPE_CREATE', st);
        if (st.type === 'file' && st.size > 0) await ev(name, 'EVENT_TYPE_WRITE', st);
      } else if (old.mtimeMs !== st.mtimeMs || old.size !== st.size) await ev(name, 'EVENT_TYPE_WRITE', st);
      else if (old.mode !== st.mode) await ev(name, 'EVENT_TYPE_CHMOD', st);
    }
    for (const name of before.keys()) if (!after.has(name)) await ev(name, 'EVENT_TYPE_REMOVE');
    return out;
  }

  /** filesystem.Filesystem/WatchDir: `start` first, then the changes it sees (polled). */
  async watchDir(c: Context, t: EnvdTarget, req: Record<string, unknown>): Promise<AsyncGenerator<object>> {
    const user = await this.userOf(c, t);
    const abs = resolvePath(str(req.path, 'path'), user);
    const st = await this.statOrNotFound(t, abs);
    if (st.type !== 'dir') throw new ConnectError('invalid_argument', `path ${abs} is not a directory`);
    const recursive = req.recursive === true;
    const withEntry = req.includeEntry === true;
    let last = await this.tree(t, abs, recursive);
    const signal = requestSignal(c);
    return this.withKeepalive(
      async function* (this: Envd): AsyncGenerator<object> {
        yield { start: {} };
        while (!signal.aborted) {
          await new Promise((r) => setTimeout(r, WATCH_POLL_MS).unref());
          const row = await this.services.lifecycle.rowById(t.sandboxId);
          if (!row || row.state !== 'running') throw new CutStream(`sandbox ${t.sandboxId} is gone`);
          const now = await this.tree(t, abs, recursive).catch((err: unknown) => {
            if (err instanceof DsecError && err.code === 'FILE_NOT_FOUND') return new Map<string, FileStat>();
            throw err;
          });
          for (const e of await this.changes(t, abs, last, now, withEntry)) yield { filesystem: e };
          last = now;
        }
      }.call(this),
      keepaliveMs(c),
      { keepalive: {} },
      requestSignal(c),
    );
  }
}
