// SWE-ReX's remote runtime protocol (SWE-agent/SWE-ReX `server.py`, the server its
// `RemoteRuntime` talks to), per sandbox at `/v1/sandboxes/{id}/swerex/`: a `RemoteRuntime(host=
// "<dsec>/v1/sandboxes/<id>/swerex", auth_token=<dsec key>)` works unchanged. The key comes in
// `X-API-Key` (or `Authorization`); `X-Request-ID` makes a retried POST answer what the first
// one did. Failures of the runtime are HTTP 511 `{"swerexception": {message, class_path,
// traceback, extra_info}}`, which the client raises again as `class_path`; other failures are
// the API's usual 4xx/5xx. Sessions live in this apiserver process (docs/integrations.md).
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import type { Context } from 'hono';
import { z } from 'zod';
import type { ExecSpec } from '@dsec/protocol';
import type { AuthRequest, Authenticator, Principal } from '../auth.js';
import { router } from '../http/env.js';
import type { RouterDeps } from '../http/env.js';
import { DsecError, parseOrThrow } from '@dsec/protocol';
import type { Services } from '../services/index.js';
import type { CommandTarget } from '../services/commands.js';
import { ansiQuote, BashSession, MAX_INLINE_COMMAND, promptOf, SessionGone, SessionTimeout } from './swerex-session.js';
import { readZip } from './zip.js';
import { limitedBody, readJson, requestHeader } from '../http/validate.js';

/** Largest upload (the multipart body is read whole). */
export const SWEREX_MAX_UPLOAD_BYTES = 256 * 1_048_576;
/** How long a shell may take to print its first prompt (SWE-ReX's `startup_timeout` is often 1 s: too short for a spawn). */
const MIN_STARTUP_MS = 10_000;
/** Default time limit of a session command and of `execute` (pexpect's default). */
const DEFAULT_TIMEOUT_S = 30;
/** Each interrupt try waits at least this long for the prompt. */
const MIN_INTERRUPT_WAIT_MS = 1_000;
/** Responses kept per sandbox for retried requests (`X-Request-ID`). */
const REPLAYS_PER_SANDBOX = 32;
/** Sandboxes whose responses are kept (least recently first seen dropped). */
const REPLAY_SANDBOXES = 4096;

const SWEREX_PATH = /^\/v1\/sandboxes\/[^/]+\/swerex\//;

// ---- SWE-ReX's request models (unknown fields are ignored, as pydantic does) ----

export const CreateSessionSchema = z.object({
  session: z.string().min(1).max(256).default('default'),
  session_type: z.literal('bash').default('bash'),
  startup_source: z.array(z.string().max(4096)).max(64).default([]),
  startup_timeout: z.number().positive().max(600).default(1),
});

export const BashActionSchema = z.object({
  action_type: z.literal('bash').default('bash'),
  command: z.string().max(16 * 1_048_576),
  session: z.string().min(1).max(256).default('default'),
  timeout: z.number().positive().max(86_400).nullable().default(null),
  is_interactive_command: z.boolean().default(false),
  is_interactive_quit: z.boolean().default(false),
  check: z.enum(['silent', 'raise', 'ignore']).default('raise'),
  error_msg: z.string().max(65_536).default(''),
  expect: z.array(z.string().max(4096)).max(64).default([]),
});

export const BashInterruptSchema = z.object({
  action_type: z.literal('bash_interrupt'),
  session: z.string().min(1).max(256).default('default'),
  timeout: z.number().positive().max(600).default(0.2),
  n_retry: z.number().int().min(1).max(20).default(3),
  expect: z.array(z.string().max(4096)).max(64).default([]),
});

export const ActionSchema = z.union([BashInterruptSchema, BashActionSchema]);

export const CloseSessionSchema = z.object({
  session: z.string().min(1).max(256).default('default'),
  session_type: z.literal('bash').default('bash'),
});

export const CommandSchema = z.object({
  command: z.union([z.string().min(1).max(1_048_576), z.array(z.string().max(1_048_576)).min(1).max(65_536)]),
  timeout: z.number().positive().max(86_400).nullable().default(null),
  shell: z.boolean().default(false),
  check: z.boolean().default(false),
  error_msg: z.string().max(65_536).default(''),
  env: z.record(z.string(), z.string()).nullable().default(null),
  cwd: z.string().startsWith('/', 'must be absolute').max(4096).nullable().default(null),
  merge_output_streams: z.boolean().default(false),
});

export const ReadFileSchema = z.object({
  path: z.string().min(1).max(4096),
  encoding: z.string().max(64).nullable().default(null),
  errors: z.string().max(64).nullable().default(null),
});

export const WriteFileSchema = z.object({ content: z.string().max(256 * 1_048_576), path: z.string().min(1).max(4096) });

/** A failure the SWE-ReX client raises again as `class_path`. */
export class SwerexException extends Error {
  constructor(
    readonly classPath: string,
    message: string,
    readonly extraInfo: Record<string, unknown> = {},
  ) {
    super(message);
  }

  /** The 511 body. */
  toJSON(): { swerexception: { message: string; class_path: string; traceback: string; extra_info: Record<string, unknown> } } {
    return { swerexception: { message: this.message, class_path: this.classPath, traceback: '', extra_info: this.extraInfo } };
  }
}

const ex = (name: string, message: string, extra?: Record<string, unknown>): SwerexException =>
  new SwerexException(`swerex.exceptions.${name}`, message, extra);

/** A Python repr of a string (in messages, as SWE-ReX's use `!r`). */
function pyRepr(s: string): string {
  return `'${s.replace(/\\/g, '\\\\').replace(/'/g, "\\'").replace(/\n/g, '\\n')}'`;
}

function regexes(expect: string[], field: string): RegExp[] {
  return expect.map((e, i) => {
    try {
      return new RegExp(e);
    } catch {
      throw new DsecError('INVALID_ARGUMENT', `${field}.${i}: not a regular expression`, { field: `${field}.${i}` });
    }
  });
}

/** A response kept for a retried request. */
interface Replay {
  status: number;
  body: unknown;
}

/** The SWE-ReX runtimes of sandboxes: their bash sessions, and what answers retried requests. */
export class SwerexService {
  private readonly sessions = new Map<string, Map<string, BashSession>>();
  private readonly replays = new Map<string, Map<string, Promise<Replay>>>();

  constructor(
    private readonly services: Pick<Services, 'lifecycle' | 'commands' | 'files' | 'slots'>,
    auth: Authenticator,
  ) {
    // The key in `X-API-Key` on SWE-ReX paths (what its client sends).
    auth.addCredentialHook((req: AuthRequest) => {
      const key = req.header('x-api-key');
      if (!SWEREX_PATH.test(req.path) || req.header('authorization') !== undefined || key === undefined) return undefined;
      return auth.keyPrincipal(key);
    });
  }

  async target(p: Principal, id: string): Promise<CommandTarget & { node: string }> {
    const { row, edge } = await this.services.lifecycle.route(p, id, 'member');
    return { sandboxId: row.id, edge, node: row.node };
  }

  /** Answers a request once per `X-Request-ID` (a retry gets the first answer, even while it is running). */
  async once(sandboxId: string, requestId: string | undefined, run: () => Promise<Replay>): Promise<Replay> {
    if (!requestId) return run();
    let kept = this.replays.get(sandboxId);
    if (!kept) {
      kept = new Map<string, Promise<Replay>>();
      this.replays.set(sandboxId, kept);
      while (this.replays.size > REPLAY_SANDBOXES) this.replays.delete(this.replays.keys().next().value!);
    }
    const hit = kept.get(requestId);
    if (hit) return hit;
    const p = run();
    kept.set(requestId, p);
    while (kept.size > REPLAYS_PER_SANDBOX) kept.delete(kept.keys().next().value!);
    return p;
  }

  private session(sandboxId: string, name: string): BashSession {
    const s = this.sessions.get(sandboxId)?.get(name);
    if (!s || !s.alive) {
      if (s) this.sessions.get(sandboxId)?.delete(name);
      throw ex('SessionDoesNotExistError', `session ${pyRepr(name)} does not exist`);
    }
    return s;
  }

  async createSession(t: CommandTarget, body: z.output<typeof CreateSessionSchema>): Promise<Record<string, unknown>> {
    let mine = this.sessions.get(t.sandboxId);
    if (!mine) {
      mine = new Map<string, BashSession>();
      this.sessions.set(t.sandboxId, mine);
    }
    const sessions = mine;
    const existing = mine.get(body.session);
    if (existing?.alive) throw ex('SessionExistsError', `session ${pyRepr(body.session)} already exists`);
    const nonce = randomBytes(8).toString('hex');
    const spec: ExecSpec = {
      argv: ['/bin/sh', '-c', 'stty -echo -onlcr 2>/dev/null; exec bash --noprofile --norc --noediting -i'],
      env: { TERM: 'dumb', PS1: promptOf(nonce), PS2: '', PS0: '', PROMPT_COMMAND: '', HISTFILE: '/dev/null' },
      pty: { rows: 50, cols: 250 },
    };
    const cmd = await this.services.commands.spawn(t, spec, 'stream');
    // A shell that ends (exit, the sandbox destroyed) leaves the table.
    const s: BashSession = new BashSession(cmd, nonce, () => {
      if (sessions.get(body.session) === s) sessions.delete(body.session);
      if (sessions.size === 0 && this.sessions.get(t.sandboxId) === sessions) this.sessions.delete(t.sandboxId);
    });
    mine.set(body.session, s);
    try {
      const wait = Math.max(MIN_STARTUP_MS, body.startup_timeout * 1000);
      const timeout = (err: unknown): never => {
        throw err instanceof SessionTimeout
          ? ex('CommandTimeoutError', `timeout after ${wait / 1000} seconds while starting session ${pyRepr(body.session)}`)
          : err;
      };
      // The first prompt says the terminal no longer echoes; then the startup files (which may
      // set their own prompt: it is set again after them).
      let output = (await s.waitFor([], wait).catch(timeout)).before;
      const sources = body.startup_source.map((f) => `source ${ansiQuote(f)}; `).join('');
      s.owed = 1;
      await s.send(`${sources}PS1='${promptOf(nonce)}'; PS2=''; PS0=''\n`);
      output += (await s.waitFor([], wait).catch(timeout)).before;
      return { output, session_type: 'bash' };
    } catch (err) {
      mine.delete(body.session);
      await s.close();
      if (err instanceof SessionGone)
        throw new DsecError('CONFLICT', 'the sandbox has no bash to run a session (SWE-ReX sessions need /bin/sh, bash and stty)');
      throw err;
    }
  }

  async runInSession(t: CommandTarget, action: z.output<typeof ActionSchema>): Promise<Record<string, unknown>> {
    const s = this.session(t.sandboxId, action.session);
    return s.serial(async () => {
      if (action.action_type === 'bash_interrupt') return this.interrupt(s, action);
      const timeoutS = action.timeout ?? DEFAULT_TIMEOUT_S;
      const expect = regexes(action.expect, 'expect');
      const interactive = action.is_interactive_command || action.is_interactive_quit;
      if (interactive) await s.send(`${action.command}\n`);
      else {
        s.owed++;
        await s.send(await this.commandLine(t, s, action.command));
      }
      let m;
      try {
        m = await s.waitFor(action.is_interactive_quit ? [] : expect, timeoutS * 1000);
      } catch (err) {
        if (err instanceof SessionTimeout)
          throw ex('CommandTimeoutError', `timeout after ${timeoutS} seconds while running command ${pyRepr(action.command)}`, { timeout: timeoutS });
        if (err instanceof SessionGone) throw ex('SessionDoesNotExistError', `session ${pyRepr(action.session)} has exited`);
        throw err;
      }
      const expectString = m.index >= 0 ? (action.expect[m.index] ?? '') : '';
      let output = m.before;
      const syntax = `__DSEC_SYNTAX_${s.nonce}__`;
      if (!interactive && output.startsWith(syntax)) {
        const stderr = output.slice(syntax.length);
        throw ex(
          'BashIncorrectSyntaxError',
          `Error (exit code 2) while checking bash command \n${pyRepr(action.command)}\n---- Stderr ----\n${stderr}\n---- Stdout ----\n`,
          {
            bash_stdout: '',
            bash_stderr: stderr,
          },
        );
      }
      if (interactive) return { output, exit_code: 0, failure_reason: '', expect_string: expectString, session_type: 'bash' };
      const exitCode = m.index === -1 ? m.exitCode : 0;
      if (action.check === 'raise' && exitCode !== 0) {
        let msg = `Command ${pyRepr(action.command)} failed with exit code ${exitCode}. Here is the output:\n${pyRepr(output)}`;
        if (action.error_msg) msg = `${action.error_msg}: ${msg}`;
        throw ex('NonZeroExitCodeError', msg);
      }
      output = output.replace(new RegExp(`__DSEC_PS1_${s.nonce}_\\d+__`, 'g'), '');
      return { output, exit_code: action.check === 'ignore' ? null : exitCode, failure_reason: '', expect_string: expectString, session_type: 'bash' };
    });
  }

  /** The line that runs `command` in the session: checked with `bash -n`, then eval'ed in the shell itself. */
  private async commandLine(t: CommandTarget, s: BashSession, command: string): Promise<string> {
    let load: string;
    if (command.length <= MAX_INLINE_COMMAND) load = `__dsec_c=${ansiQuote(command)}`;
    else {
      // A pty line holds 4095 bytes: a longer command goes through a file.
      const file = `/tmp/.dsec-swerex-${s.nonce}`;
      await t.edge.writeFile(t.sandboxId, file, Buffer.from(command + '\n'));
      load = `__dsec_c=$(<${file}); rm -f ${file}`;
    }
    const syntax = `__DSEC_SYNTAX_${s.nonce}__`;
    return `${load}; if __dsec_e=$("$BASH" -n -c "$__dsec_c" 2>&1); then eval "$__dsec_c"; else printf '%s%s' '${syntax}' "$__dsec_e"; fi\n`;
  }

  private async interrupt(s: BashSession, action: z.output<typeof BashInterruptSchema>): Promise<Record<string, unknown>> {
    const expect = regexes(action.expect, 'expect');
    let output = '';
    for (let i = 0; i < action.n_retry; i++) {
      await s.send('\x03');
      try {
        const m = await s.waitFor(expect, Math.max(MIN_INTERRUPT_WAIT_MS, action.timeout * 1000));
        output += m.before;
        s.owed = 0;
        await new Promise((r) => setTimeout(r, 100));
        output += s.drain();
        return { output: output.trim(), exit_code: 0, failure_reason: '', expect_string: m.index >= 0 ? action.expect[m.index] : '', session_type: 'bash' };
      } catch (err) {
        if (!(err instanceof SessionTimeout)) throw err;
      }
    }
    throw ex('CommandTimeoutError', 'Failed to interrupt session');
  }

  async closeSession(sandboxId: string, name: string): Promise<Record<string, unknown>> {
    const s = this.session(sandboxId, name);
    this.sessions.get(sandboxId)?.delete(name);
    await s.close();
    return { session_type: 'bash' };
  }

  /** Closes every session of the sandbox (SWE-ReX's `close`: the sandbox itself stays). */
  async closeAll(sandboxId: string): Promise<void> {
    const mine = this.sessions.get(sandboxId);
    this.sessions.delete(sandboxId);
    this.replays.delete(sandboxId);
    for (const s of mine?.values() ?? []) await s.close();
  }

  async execute(p: Principal, t: CommandTarget & { node: string }, c: z.output<typeof CommandSchema>): Promise<Record<string, unknown>> {
    let argv: string[];
    if (Array.isArray(c.command)) argv = c.shell ? ['/bin/sh', '-c', c.command.join(' ')] : c.command;
    else argv = c.shell ? ['/bin/sh', '-c', c.command] : c.command.trim().split(/\s+/);
    if (c.merge_output_streams) argv = ['/bin/sh', '-c', 'exec "$@" 2>&1', 'sh', ...argv];
    const timeoutS = c.timeout ?? DEFAULT_TIMEOUT_S;
    const spec: ExecSpec = { argv, timeoutMs: Math.max(1, Math.round(timeoutS * 1000)), ...(c.env ? { env: c.env } : {}), ...(c.cwd ? { cwd: c.cwd } : {}) };
    const release = this.services.slots.acquire('exec', p.tenantId, t.node);
    let result;
    try {
      ({ result } = await this.services.commands.exec(t, spec));
    } finally {
      release();
    }
    if (result.timedOut) throw ex('CommandTimeoutError', `Timeout (${timeoutS}s) exceeded while running command`, { timeout: timeoutS });
    if (c.check && result.exitCode !== 0) {
      let msg = `Command ${pyRepr(Array.isArray(c.command) ? c.command.join(' ') : c.command)} failed with exit code ${result.exitCode}. Stdout:\n${pyRepr(result.stdout)}\nStderr:\n${pyRepr(result.stderr)}`;
      if (c.error_msg) msg = `${c.error_msg}: ${msg}`;
      throw ex('NonZeroExitCodeError', msg);
    }
    return { stdout: result.stdout, stderr: result.stderr, exit_code: result.exitCode };
  }

  async readFile(t: CommandTarget, r: z.output<typeof ReadFileSchema>): Promise<Record<string, unknown>> {
    const data = await this.services.files.read(t, r.path).catch((err: unknown) => {
      if (err instanceof DsecError && err.code === 'FILE_NOT_FOUND')
        throw new SwerexException('builtins.FileNotFoundError', `[Errno 2] No such file or directory: ${pyRepr(r.path)}`);
      if (err instanceof DsecError && /directory/i.test(err.message))
        throw new SwerexException('builtins.IsADirectoryError', `[Errno 21] Is a directory: ${pyRepr(r.path)}`);
      throw err;
    });
    const encoding = (r.encoding ?? 'utf-8').toLowerCase().replace('_', '-');
    const enc: BufferEncoding =
      encoding === 'latin-1' || encoding === 'latin1' || encoding === 'iso-8859-1' ? 'latin1' : encoding === 'ascii' ? 'ascii' : 'utf8';
    return { content: Buffer.from(data).toString(enc) };
  }

  async writeFile(t: CommandTarget, r: z.output<typeof WriteFileSchema>): Promise<Record<string, unknown>> {
    await this.services.files.mkdir(t, path.posix.dirname(path.posix.resolve('/', r.path)));
    await this.services.files.write(t, r.path, oneChunk(Buffer.from(r.content)), { limitBytes: 256 * 1_048_576 });
    return {};
  }

  async upload(t: CommandTarget, file: Buffer, targetPath: string, unzip: boolean): Promise<Record<string, unknown>> {
    const target = path.posix.resolve('/', targetPath);
    if (!unzip) {
      await this.services.files.mkdir(t, path.posix.dirname(target));
      await this.services.files.write(t, target, oneChunk(file), { limitBytes: SWEREX_MAX_UPLOAD_BYTES });
      return {};
    }
    await this.services.files.mkdir(t, target);
    // Entries are inflated one at a time (each dropped once written), off the event loop.
    for (const e of readZip(file, 4 * SWEREX_MAX_UPLOAD_BYTES, SWEREX_MAX_UPLOAD_BYTES)) {
      const dest = path.posix.join(target, e.name);
      if (e.dir) {
        await this.services.files.mkdir(t, dest);
        continue;
      }
      await this.services.files.mkdir(t, path.posix.dirname(dest));
      await this.services.files.write(t, dest, oneChunk(await e.read()), {
        limitBytes: 4 * SWEREX_MAX_UPLOAD_BYTES,
        ...(e.mode !== undefined ? { mode: e.mode } : {}),
      });
    }
    return {};
  }
}

async function* oneChunk(data: Buffer): AsyncGenerator<Uint8Array> {
  yield data;
}

/** A JSON body parsed with a SWE-ReX model (a missing body is `{}`; at most MAX_JSON_BYTES, chunked or not). */
export async function swerexModel<S extends z.ZodType>(c: Context, schema: S): Promise<z.output<S>> {
  return parseOrThrow(schema, await readJson(c), '');
}

/** The multipart upload body, refused past SWEREX_MAX_UPLOAD_BYTES whether or not a length was sent. */
export async function swerexUploadForm(c: Context): Promise<FormData> {
  const chunks: Buffer[] = [];
  for await (const chunk of limitedBody(c, SWEREX_MAX_UPLOAD_BYTES, 'uploads')) chunks.push(chunk);
  const whole = new Response(Buffer.concat(chunks), { headers: { 'content-type': requestHeader(c, 'content-type') ?? '' } });
  // undici's parser, as envd's uploads (e2b/envd.ts): the body is bounded above.
  // eslint-disable-next-line @typescript-eslint/no-deprecated
  return whole.formData().catch(() => {
    throw new DsecError('INVALID_ARGUMENT', 'body: not a multipart form', { field: 'body' });
  });
}

/** The SWE-ReX routes (mounted under /v1). */
export function swerexRoutes({ services }: RouterDeps) {
  const swerex = services.swerex;
  const base = '/sandboxes/:id/swerex';
  /** Runs a handler: its result as JSON, a SWE-ReX failure as 511, once per X-Request-ID. */
  const handle = (run: (c: Context, p: Principal, t: CommandTarget & { node: string }) => Promise<unknown>) => async (c: Context) => {
    const p = c.get('principal') as Principal;
    const t = await swerex.target(p, c.req.param('id') ?? '');
    const reply = await swerex.once(t.sandboxId, c.req.method === 'POST' ? requestHeader(c, 'x-request-id') : undefined, async () => {
      try {
        return { status: 200, body: await run(c, p, t) };
      } catch (err) {
        if (err instanceof SwerexException) return { status: 511, body: err.toJSON() };
        throw err;
      }
    });
    return c.json(reply.body as object, reply.status as 200);
  };
  return router()
    .get(
      `${base}/`,
      handle(async () => ({ message: 'hello world' })),
    )
    .get(
      `${base}/is_alive`,
      handle(async () => ({ is_alive: true, message: '' })),
    )
    .post(
      `${base}/create_session`,
      handle(async (c, _p, t) => swerex.createSession(t, await swerexModel(c, CreateSessionSchema))),
    )
    .post(
      `${base}/run_in_session`,
      handle(async (c, _p, t) => swerex.runInSession(t, await swerexModel(c, ActionSchema))),
    )
    .post(
      `${base}/close_session`,
      handle(async (c, _p, t) => swerex.closeSession(t.sandboxId, (await swerexModel(c, CloseSessionSchema)).session)),
    )
    .post(
      `${base}/execute`,
      handle(async (c, p, t) => swerex.execute(p, t, await swerexModel(c, CommandSchema))),
    )
    .post(
      `${base}/read_file`,
      handle(async (c, _p, t) => swerex.readFile(t, await swerexModel(c, ReadFileSchema))),
    )
    .post(
      `${base}/write_file`,
      handle(async (c, _p, t) => swerex.writeFile(t, await swerexModel(c, WriteFileSchema))),
    )
    .post(
      `${base}/upload`,
      handle(async (c, _p, t) => {
        const form = await swerexUploadForm(c);
        const file = form.get('file');
        const target = form.get('target_path');
        if (file === null || typeof file === 'string') throw new DsecError('INVALID_ARGUMENT', 'file: missing (a multipart file field)', { field: 'file' });
        if (typeof target !== 'string' || target === '') throw new DsecError('INVALID_ARGUMENT', 'target_path: missing', { field: 'target_path' });
        const unzipField = form.get('unzip');
        const unzip = typeof unzipField === 'string' && ['true', '1', 'yes', 'on'].includes(unzipField.toLowerCase());
        return swerex.upload(t, Buffer.from(await file.arrayBuffer()), target, unzip);
      }),
    )
    .post(
      `${base}/close`,
      handle(async (_c, _p, t) => {
        await swerex.closeAll(t.sandboxId);
        return {};
      }),
    );
}
