// The node agent of `dsec edge --join`: an edge on its own machine that joins a control plane
// with a single-use token (its key stays here; the control plane signs its certificate), then
// keeps one session open to it: an HTTP/2 stream inside mutual TLS that carries the edge wire
// protocol (this side serves the edge; the control plane is the wire client). It reconnects
// when the session ends, and when it has been cut off for longer than the control plane's lost
// grace it pauses its sandboxes itself, so that one replayed elsewhere never runs twice.
import { X509Certificate } from 'node:crypto';
import { access, mkdir, readFile, rename, writeFile } from 'node:fs/promises';
import http2 from 'node:http2';
import path from 'node:path';
import tls from 'node:tls';
import type { TLSSocket } from 'node:tls';
import {
  CONTROL_PLANE_TLS_NAME,
  CUT_OFF_PAUSE_REASON,
  EDGE_WIRE_VERSION_HEADER,
  NODE_HEARTBEAT_HEADER,
  NODE_LOST_AFTER_HEADER,
  NODE_UNREACHABLE_AFTER_HEADER,
  DEFAULT_NODE_LOST_AFTER_MS,
  DEFAULT_NODE_UNREACHABLE_AFTER_MS,
  DsecError,
  EDGE_WIRE_VERSION,
  NODE_JOIN_PATHS,
  NODE_SESSION_HTTP2,
  NodeJoinResponseSchema,
  framedTransport,
  parseJoinToken,
  parseOrThrow,
  serveEdge,
} from '@dsec/protocol';
import type { EdgeClient, ErrorCode } from '@dsec/protocol';
import { certSha256, makeCsr, makeKey } from './tls.js';

/** Longest wait between two connection attempts. */
const MAX_RETRY_MS = 5000;

/** Where the node keeps its cluster credentials (under its home). */
export function credentialsDir(home: string): string {
  return path.join(home, 'cluster');
}

/** Options of {@link NodeAgent.start}. */
export interface NodeAgentOptions {
  /** The edge this node serves. */
  edge: EdgeClient;
  /** The control plane's node port, `https://host:port`. */
  url: string;
  /** The node's state directory: credentials go to `<home>/cluster/`. */
  home: string;
  /** The node's name (its certificate's common name). */
  name: string;
  /** A join token; needed only when the node holds no certificate yet. */
  token?: string;
  /** Where progress goes. */
  log?: (line: string) => void;
}

/** The node's credentials. */
interface Credentials {
  key: string;
  cert: string;
  ca: string;
}

/** A joined node's connection to its control plane. */
export class NodeAgent {
  private stopped = false;
  private session: http2.ClientHttp2Session | undefined;
  private lostAfterMs = DEFAULT_NODE_LOST_AFTER_MS;
  private unreachableAfterMs = DEFAULT_NODE_UNREACHABLE_AFTER_MS;
  private lastUpAt = Date.now();
  private frozen = false;
  /** A session is being served. */
  private up = false;
  private freezeTimer: ReturnType<typeof setInterval> | undefined;
  private wakeRetry: (() => void) | undefined;
  private readonly log: (line: string) => void;
  /** Resolves when the agent stops; rejects when the control plane refuses the node for good. */
  readonly done: Promise<void>;
  private firstSession!: { resolve(): void; reject(err: unknown): void };
  /** Resolves once the first session is up. */
  readonly ready: Promise<void>;

  private constructor(
    private readonly o: NodeAgentOptions,
    private readonly creds: Credentials,
  ) {
    this.log = o.log ?? (() => undefined);
    this.ready = new Promise<void>((resolve, reject) => (this.firstSession = { resolve, reject }));
    this.ready.catch(() => undefined);
    this.done = this.loop();
    this.done.catch(() => undefined);
  }

  /** Joins (when the node has no certificate yet) and starts the session loop. */
  static async start(o: NodeAgentOptions): Promise<NodeAgent> {
    const creds = (await loadCredentials(o.home)) ?? (await join(o));
    return new NodeAgent(o, creds);
  }

  /** Stops: ends the session (the sandboxes keep running) and the retries. */
  async close(): Promise<void> {
    this.stopped = true;
    clearInterval(this.freezeTimer);
    this.session?.destroy();
    this.wakeRetry?.();
    await this.done.catch(() => undefined);
  }

  private async loop(): Promise<void> {
    this.freezeTimer = setInterval(() => void this.freezeIfCutOff(), 1000);
    let retryMs = 250;
    while (!this.stopped) {
      try {
        await this.runSession();
        retryMs = 250;
      } catch (err) {
        if (err instanceof DsecError && ['PERMISSION_DENIED', 'UNAUTHENTICATED', 'INVALID_ARGUMENT'].includes(err.code)) {
          this.log(`edge: the control plane refused this node: ${err.message}`);
          this.firstSession.reject(err);
          clearInterval(this.freezeTimer);
          throw err;
        }
        if (!this.stopped) this.log(`edge: no session with ${this.o.url}: ${(err as Error).message}; retrying`);
      }
      if (this.stopped) break;
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, retryMs);
        this.wakeRetry = () => (clearTimeout(t), resolve());
      });
      // Retries stay well inside the lost grace, so a control plane that restarts finds its nodes back in time.
      retryMs = Math.min(MAX_RETRY_MS, Math.max(250, this.lostAfterMs / 4), retryMs * 2);
    }
    clearInterval(this.freezeTimer);
  }

  /** One session: connects, serves the edge until the connection ends. */
  private async runSession(): Promise<void> {
    const session = http2.connect(this.o.url, {
      key: this.creds.key,
      cert: this.creds.cert,
      ca: this.creds.ca,
      checkServerIdentity: (_host, cert) => tls.checkServerIdentity(CONTROL_PLANE_TLS_NAME, cert),
      maxSessionMemory: NODE_SESSION_HTTP2.maxSessionMemoryMB,
      settings: { initialWindowSize: NODE_SESSION_HTTP2.initialWindowSize },
    });
    this.session = session;
    session.on('error', () => undefined);
    session.once('connect', () => session.setLocalWindowSize(NODE_SESSION_HTTP2.connectionWindowSize));
    // A control plane that takes the connection but never answers is as good as none.
    const answerTimer = setTimeout(() => session.destroy(new Error(`no answer within ${this.unreachableAfterMs} ms`)), this.unreachableAfterMs);
    try {
      const req = session.request({ ':method': 'POST', ':path': NODE_JOIN_PATHS.session, [EDGE_WIRE_VERSION_HEADER]: String(EDGE_WIRE_VERSION) });
      const headers = await responseHeaders(req, session).finally(() => clearTimeout(answerTimer));
      const status = Number(headers[':status']);
      if (status !== 200) throw await errorOf(req, status);
      this.lostAfterMs = positive(headers[NODE_LOST_AFTER_HEADER]) ?? this.lostAfterMs;
      this.unreachableAfterMs = positive(headers[NODE_UNREACHABLE_AFTER_HEADER]) ?? this.unreachableAfterMs;
      const heartbeatMs = positive(headers[NODE_HEARTBEAT_HEADER]) ?? Math.max(200, Math.floor(this.unreachableAfterMs / 3));
      const transport = framedTransport(req);
      const served = serveEdge(this.o.edge, transport, { heartbeatMs, log: this.log });
      this.lastUpAt = Date.now();
      this.frozen = false;
      this.up = true;
      this.log(`edge: session with ${this.o.url} open (node ${this.o.name})`);
      this.firstSession.resolve();
      // The control plane may vanish without a word (a partition): HTTP/2 pings find out.
      const pinger = setInterval(() => {
        this.lastUpAt = Date.now();
        const sent = Date.now();
        const timer = setTimeout(() => session.destroy(new Error(`no ping answer for ${this.unreachableAfterMs} ms`)), this.unreachableAfterMs);
        const ok = session.ping((err) => {
          clearTimeout(timer);
          if (err) session.destroy(err);
          else if (Date.now() - sent > this.unreachableAfterMs) session.destroy(new Error('ping answered too late'));
        });
        if (!ok) clearTimeout(timer);
      }, heartbeatMs);
      session.on('close', () => transport.close());
      await served.closed;
      clearInterval(pinger);
      this.up = false;
      this.lastUpAt = Date.now();
      if (!this.stopped) this.log(`edge: session with ${this.o.url} ended`);
    } finally {
      clearTimeout(answerTimer);
      this.up = false;
      session.destroy();
      if (this.session === session) this.session = undefined;
    }
  }

  /** Cut off for longer than the lost grace: pauses every running sandbox (once per cut). */
  private async freezeIfCutOff(): Promise<void> {
    if (this.stopped || this.frozen || this.up || Date.now() - this.lastUpAt <= this.lostAfterMs) return;
    this.frozen = true;
    let n = 0;
    for (const s of await this.o.edge.list().catch(() => [])) {
      if (s.state !== 'running') continue;
      await this.o.edge.pause(s.id, { reason: CUT_OFF_PAUSE_REASON }).then(
        () => n++,
        (err: unknown) => this.log(`edge: freezing ${s.id}: ${(err as Error).message}`),
      );
    }
    this.log(`edge: cut off from ${this.o.url} for over ${this.lostAfterMs} ms: froze ${n} sandbox(es)`);
  }
}

function positive(v: string | string[] | undefined): number | undefined {
  const n = Number(Array.isArray(v) ? v[0] : v);
  return Number.isFinite(n) && n > 0 ? n : undefined;
}

/** The response headers of `req`, or the reason there are none. */
function responseHeaders(req: http2.ClientHttp2Stream, session: http2.ClientHttp2Session): Promise<http2.IncomingHttpHeaders> {
  return new Promise((resolve, reject) => {
    const fail = (err?: Error): void => reject(new DsecError('UNAVAILABLE', err?.message ?? 'the connection closed'));
    req.once('response', (h) => resolve(h));
    req.once('error', fail);
    req.once('close', () => fail());
    session.once('error', fail);
    session.once('close', () => fail());
  });
}

/** The DsecError of a refused request (its JSON body). */
async function errorOf(req: http2.ClientHttp2Stream, status: number): Promise<DsecError> {
  const text = await readBody(req).catch(() => '');
  try {
    const body = JSON.parse(text) as { error?: { code?: string; message?: string } };
    if (body.error?.code && body.error.message) return new DsecError(body.error.code as ErrorCode, body.error.message);
  } catch {
    // not JSON: fall through
  }
  return new DsecError(status >= 500 ? 'UNAVAILABLE' : 'INVALID_ARGUMENT', `the control plane answered ${status}`);
}

function readBody(req: http2.ClientHttp2Stream, max = 1 << 20): Promise<string> {
  return new Promise((resolve, reject) => {
    const parts: Buffer[] = [];
    let n = 0;
    req.on('data', (c: Buffer) => {
      n += c.length;
      if (n > max) req.destroy(new Error('answer too large'));
      else parts.push(c);
    });
    req.once('end', () => resolve(Buffer.concat(parts).toString('utf8')));
    req.once('error', reject);
  });
}

/** One request on a fresh connection; the body comes back as text with the status. */
async function request(
  url: string,
  tlsOpts: http2.SecureClientSessionOptions,
  method: string,
  p: string,
  body?: string,
  check?: (socket: TLSSocket) => void,
): Promise<{ status: number; text: string }> {
  const session = http2.connect(url, tlsOpts);
  session.on('error', () => undefined);
  try {
    await new Promise<void>((resolve, reject) => {
      session.once('connect', () => resolve());
      session.once('error', (err: Error) => reject(new DsecError('UNAVAILABLE', `cannot reach ${url}: ${err.message}`)));
    });
    check?.(session.socket as TLSSocket);
    const req = session.request({ ':method': method, ':path': p, ...(body !== undefined ? { 'content-type': 'application/json' } : {}) });
    req.end(body);
    const headers = await responseHeaders(req, session);
    return { status: Number(headers[':status']), text: await readBody(req) };
  } finally {
    session.destroy();
  }
}

async function loadCredentials(home: string): Promise<Credentials | undefined> {
  const dir = credentialsDir(home);
  try {
    await access(path.join(dir, 'node.crt'));
  } catch {
    return undefined;
  }
  const [key, cert, ca] = await Promise.all(['node.key', 'node.crt', 'ca.crt'].map((f) => readFile(path.join(dir, f), 'utf8')));
  return { key: key!, cert: cert!, ca: ca! };
}

/**
 * Joins with a token: fetches the cluster CA and trusts it only if it is the one the token names
 * (and signed the server's certificate), then sends a CSR of a key made here with the token.
 */
async function join(o: NodeAgentOptions): Promise<Credentials> {
  if (!o.token)
    throw new DsecError('INVALID_ARGUMENT', `this node has not joined yet (no certificate under ${credentialsDir(o.home)}): give --token`, { field: 'token' });
  const token = parseJoinToken(o.token);
  let serverCert: X509Certificate | undefined;
  const caAnswer = await request(o.url, { rejectUnauthorized: false }, 'GET', NODE_JOIN_PATHS.ca, undefined, (socket) => {
    serverCert = new X509Certificate(socket.getPeerCertificate().raw);
  });
  if (caAnswer.status !== 200) throw new DsecError('UNAVAILABLE', `${o.url}: the cluster CA is not served (${caAnswer.status})`);
  const ca = caAnswer.text;
  if (certSha256(ca) !== token.caSha256 || !serverCert?.verify(new X509Certificate(ca).publicKey)) {
    throw new DsecError('PERMISSION_DENIED', `${o.url} does not hold the cluster CA this token names: refusing to join`);
  }
  const dir = credentialsDir(o.home);
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const keyPath = path.join(dir, 'node.key');
  await makeKey(keyPath);
  const csr = await makeCsr(keyPath, o.name);
  const tlsOpts: http2.SecureClientSessionOptions = { ca, checkServerIdentity: (_h, cert) => tls.checkServerIdentity(CONTROL_PLANE_TLS_NAME, cert) };
  const answer = await request(o.url, tlsOpts, 'POST', NODE_JOIN_PATHS.join, JSON.stringify({ token: o.token.trim(), name: o.name, csr }));
  if (answer.status !== 200) {
    let err = new DsecError('UNAVAILABLE', `join refused (${answer.status})`);
    try {
      const b = JSON.parse(answer.text) as { error: { code: ErrorCode; message: string } };
      err = new DsecError(b.error.code, `join refused: ${String(b.error.message)}`);
    } catch {
      // keep the generic one
    }
    throw err;
  }
  const joined = parseOrThrow(NodeJoinResponseSchema, JSON.parse(answer.text) as unknown, 'join');
  await writeFile(path.join(dir, 'ca.crt'), joined.ca, { mode: 0o600 });
  await writeFile(path.join(dir, 'node.crt.tmp'), joined.cert, { mode: 0o600 });
  await rename(path.join(dir, 'node.crt.tmp'), path.join(dir, 'node.crt'));
  o.log?.(`edge: joined ${o.url} as node ${o.name}`);
  return { key: await readFile(keyPath, 'utf8'), cert: joined.cert, ca: joined.ca };
}
