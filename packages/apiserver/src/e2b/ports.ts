// Per-sandbox host names, E2B's `<port>-<sandboxID>.<domain>` (`sandbox.getHost(port)`): a
// request whose Host has that form goes to that port inside the sandbox. Port 49983 is envd
// (the data plane, routed by the host name instead of the `E2b-Sandbox-Id` header); any other
// port is proxied, HTTP and WebSocket upgrades alike, through a relay process the sandbox's agent
// runs (`bash` connecting to 127.0.0.1:<port>, its stdin and stdout carrying the bytes): the same
// EdgeClient stream as any command, so it works on every backend, local or remote, and in
// sandboxes without a network. Access as E2B's: public unless the sandbox was created with
// `network.allowPublicTraffic: false`, then only with its traffic access token
// (`e2b-traffic-access-token`). Bounded (connections per sandbox, a lifetime per connection),
// rate-limited (a budget of their own per sandbox and per source, never the tenant's API rate or
// exec slots: the traffic needs no key; failed look-ups per source) and audited.
import { request as httpRequest } from 'node:http';
import type { IncomingHttpHeaders, IncomingMessage } from 'node:http';
import { Duplex, Readable } from 'node:stream';
import { connect as tlsConnect } from 'node:tls';
import type { Context, MiddlewareHandler } from 'hono';
import { DsecError } from '@dsec/protocol';
import type { EdgeClient, ProcessStream } from '@dsec/protocol';
import type { Env } from '../http/env.js';
import type { Principal } from '../auth.js';
import type { Services } from '../services/index.js';
import type { WatchService } from '../watch.js';
import { AddressBuckets } from './envd.js';
import { E2bError, e2bErrorResponse } from './errors.js';
import { HTTPS_PORTS_LABEL, MASK_HOST_LABEL, TOKEN_LABEL, TRAFFIC_TOKEN_LABEL, sandboxPrincipal, tokenMatches } from './sandboxes.js';
import { requestHeader, requestSignal } from '../http/validate.js';

/** envd's port: host names with it are the data plane, not a proxied port. */
export const ENVD_PORT = 49983;
/** The header that carries a sandbox's traffic access token (E2B's name). */
export const TRAFFIC_TOKEN_HEADER = 'e2b-traffic-access-token';
/** Proxied connections open at once per sandbox. */
export const MAX_CONNECTIONS_PER_SANDBOX = 64;
/** Longest a proxied connection (a request and its response, or a WebSocket) lives. */
export const MAX_CONNECTION_MS = 3_600_000;
/** Proxied requests (and upgrades) per second, and in a burst, to one sandbox's ports from all sources. */
export const PORT_RATE_PER_SANDBOX = { perSecond: 100, burst: 200 };
/** Proxied requests per second, and in a burst, from one client address to any sandbox's ports. */
export const PORT_RATE_PER_SOURCE = { perSecond: 50, burst: 100 };
/** Hop-by-hop headers, never forwarded (RFC 9110 7.6.1). */
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'te', 'trailer', 'upgrade', 'proxy-authorization']);

/** The port and sandbox a Host header names under `domain`, or undefined. */
export function hostTarget(host: string | undefined, domain: string | null | undefined): { port: number; sandboxId: string } | undefined {
  if (!host || !domain) return undefined;
  const d = domain.toLowerCase();
  // The domain may carry a port (`dsec.test:7070`); a domain without one matches on any port.
  const h = d.includes(':') ? host.toLowerCase() : host.toLowerCase().replace(/:[0-9]{1,5}$/, '');
  const suffix = `.${d}`;
  if (!h.endsWith(suffix)) return undefined;
  const m = /^([0-9]{1,5})-([a-z0-9-]{1,128})$/.exec(h.slice(0, -suffix.length));
  if (!m) return undefined;
  const port = Number(m[1]);
  if (port < 1 || port > 65535) return undefined;
  return { port, sandboxId: m[2]! };
}

/**
 * The relay run in the sandbox: connects to 127.0.0.1:$0, copies stdin to it and it to stdout;
 * ends when the port closes. Stdin is kept as fd 4 first: bash gives a background command
 * /dev/null as its default stdin.
 */
export const RELAY = 'exec 3<>/dev/tcp/127.0.0.1/$0 || exit 111; exec 4<&0; cat <&4 >&3 & cat <&3; kill $! 2>/dev/null; exit 0';

/** A connection to a port in a sandbox, as a Node stream over the relay process (exported for its unit test). */
export class RelaySocket extends Duplex {
  constructor(private readonly proc: ProcessStream) {
    super();
    void this.pump();
  }
  private async pump(): Promise<void> {
    try {
      for await (const ev of this.proc)
        if (ev.kind === 'data' && ev.stream === 'stdout' && !this.push(Buffer.from(ev.data))) await new Promise((r) => this.once('drain-read', r));
      const exit = await this.proc.exited.catch(() => undefined);
      // E2B's proxy answers 502 for a port nothing listens on (forward() maps errors to 502).
      if (exit && exit.exitCode === 111) this.destroy(new Error('nothing listens on that port in the sandbox'));
      else this.push(null);
    } catch (err) {
      this.destroy(err as Error);
    }
  }
  override _read(): void {
    this.emit('drain-read');
  }
  override _write(chunk: Buffer, _enc: BufferEncoding, done: (err?: Error | null) => void): void {
    this.proc.write(chunk).then(() => done(), done);
  }
  override _destroy(err: Error | null, done: (err?: Error | null) => void): void {
    this.proc.kill().catch(() => undefined);
    done(err);
  }
  // Node's HTTP client calls these on sockets; a relay has nothing to tune.
  setKeepAlive(): this {
    return this;
  }
  setNoDelay(): this {
    return this;
  }
  setTimeout(): this {
    return this;
  }
  ref(): this {
    return this;
  }
  unref(): this {
    return this;
  }
}

/** What a proxied connection acts on. */
interface PortTarget {
  p: Principal;
  edge: EdgeClient;
  sandboxId: string;
  port: number;
  /** The Host the port's server is sent (`network.maskRequestHost`, `${PORT}` replaced); the client's when absent. */
  host?: string;
  /** The port serves HTTPS (`network.httpsPorts`): the proxy speaks TLS to it, certificates unchecked, as E2B's. */
  tls: boolean;
}

/**
 * TLS over a relay, for a port that serves HTTPS (`network.httpsPorts`). As E2B's proxy, the
 * port's certificate is not verified (self-signed ones work): the relay is the sandbox's own
 * loopback. `host` (the mask, if any) is sent as the server name.
 */
export function overTls(relay: Duplex, host?: string): Duplex {
  const name = host?.replace(/:[0-9]+$/, '');
  const secure = tlsConnect({ socket: relay, rejectUnauthorized: false, ...(name && !/^[0-9.]+$/.test(name) ? { servername: name } : {}) });
  secure.once('close', () => relay.destroy());
  // The relay's failure (nothing listens there) is the TLS connection's, seen by its user.
  relay.once('error', (err) => secure.destroy(err));
  return secure;
}

/**
 * The first bytes the port answers (null when it closed without a byte). Until then an upgrade
 * can still be answered 502, as E2B's proxy answers a port nothing listens on.
 */
export function firstChunk(s: Duplex): Promise<Buffer | null> {
  return new Promise((resolve, reject) => {
    const off = (): void => {
      s.off('data', onData);
      s.off('end', onEnd);
      s.off('error', onError);
      s.off('close', onEnd);
    };
    const onData = (b: Buffer): void => {
      off();
      s.pause();
      resolve(b);
    };
    const onEnd = (): void => {
      off();
      resolve(null);
    };
    const onError = (err: Error): void => {
      off();
      reject(err);
    };
    s.on('data', onData);
    s.once('end', onEnd);
    s.once('close', onEnd);
    s.once('error', onError);
  });
}

/** Request rates of a PortBudget: tokens per second and burst. */
export interface PortBudgetOptions {
  perSandbox?: { perSecond: number; burst: number };
  perSource?: { perSecond: number; burst: number };
}

/**
 * What port traffic may spend, apart from the tenant's budget (the traffic needs no key, so it
 * must not spend the tenant's API rate or exec slots): a request rate per sandbox and per client
 * address, and connections open at once per sandbox.
 */
export class PortBudget {
  private readonly open = new Map<string, number>();
  private readonly perSandbox: AddressBuckets;
  private readonly perSource: AddressBuckets;

  /** Rates default to PORT_RATE_PER_SANDBOX and PORT_RATE_PER_SOURCE. */
  constructor(options: PortBudgetOptions = {}) {
    this.perSandbox = new AddressBuckets(options.perSandbox ?? PORT_RATE_PER_SANDBOX);
    this.perSource = new AddressBuckets(options.perSource ?? PORT_RATE_PER_SOURCE);
  }

  /** Takes one request of the sandbox's and the source's rate; RATE_LIMITED (taking nothing) when either is spent. */
  takeRequest(sandboxId: string, source: string): void {
    if (!this.perSource.has(source)) throw new DsecError('RATE_LIMITED', 'too many port requests from this address', { retryAfterMs: 1000 });
    if (!this.perSandbox.has(sandboxId)) throw new DsecError('RATE_LIMITED', `too many port requests to sandbox ${sandboxId}`, { retryAfterMs: 1000 });
    this.perSource.take(source);
    this.perSandbox.take(sandboxId);
  }

  /** Opens one of the sandbox's connections; returns its release (once only). LIMIT_EXCEEDED (counting nothing) at the cap. */
  openConnection(sandboxId: string): () => void {
    const n = this.open.get(sandboxId) ?? 0;
    if (n >= MAX_CONNECTIONS_PER_SANDBOX)
      throw new DsecError('LIMIT_EXCEEDED', `at most ${MAX_CONNECTIONS_PER_SANDBOX} proxied connections per sandbox`, { retryAfterMs: 1000 });
    this.open.set(sandboxId, n + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const left = (this.open.get(sandboxId) ?? 1) - 1;
      if (left <= 0) this.open.delete(sandboxId);
      else this.open.set(sandboxId, left);
    };
  }

  /** Connections open now to the sandbox's ports. */
  openConnections(sandboxId: string): number {
    return this.open.get(sandboxId) ?? 0;
  }
}

/** Port routing by host name. */
export class SandboxPorts {
  private readonly budget = new PortBudget();
  private readonly failedLookups = new AddressBuckets();

  constructor(
    private readonly services: Services,
    private readonly domain: string | null,
    private readonly log: (line: string) => void,
    private readonly watch?: WatchService,
  ) {}

  /** Hono middleware: host-named port traffic is proxied here; envd's port and every other request go on. */
  middleware(): MiddlewareHandler<Env> {
    return async (c, next) => {
      const m = hostTarget(requestHeader(c, 'host'), this.domain);
      if (!m || m.port === ENVD_PORT) return next();
      const start = performance.now();
      let res: Response;
      let p: Principal | undefined;
      try {
        const t = await this.target(m, (n) => requestHeader(c, n), c.get('clientAddress'));
        p = t.p;
        res = await this.forward(c, t);
      } catch (err) {
        res = e2bErrorResponse(err, this.log);
      }
      this.audit(p, c.req.method, m, res.status, performance.now() - start);
      return res;
    };
  }

  /** Handles a WebSocket (or other) upgrade to a host-named port; false when the Host is not one. */
  upgrade(req: IncomingMessage, socket: Duplex, head: Buffer, clientAddress: string): boolean {
    const m = hostTarget(req.headers.host, this.domain);
    if (!m || m.port === ENVD_PORT) return false;
    const header = (n: string): string | undefined => {
      const v = req.headers[n];
      return Array.isArray(v) ? v[0] : v;
    };
    let principal: Principal | undefined;
    this.target(m, header, clientAddress)
      .then(async (t) => {
        principal = t.p;
        const relay = await this.connect(t);
        const gone = (): void => void relay.destroy();
        socket.once('close', gone);
        let raw = `${req.method ?? 'GET'} ${req.url ?? '/'} HTTP/1.1\r\n`;
        for (let i = 0; i + 1 < req.rawHeaders.length; i += 2) {
          const name = req.rawHeaders[i]!.toLowerCase();
          if (name === TRAFFIC_TOKEN_HEADER || (name === 'host' && t.host !== undefined)) continue;
          raw += `${req.rawHeaders[i]!}: ${req.rawHeaders[i + 1]!}\r\n`;
        }
        if (t.host !== undefined) raw += `Host: ${t.host}\r\n`;
        relay.write(`${raw}\r\n`);
        if (head.length > 0) relay.write(head);
        // Nothing is sent back until the port answers, so a closed port is still a 502.
        const first = await firstChunk(relay).catch((err: unknown) => {
          throw new E2bError(502, `port ${t.port} of sandbox ${t.sandboxId}: ${(err as Error).message}`);
        });
        socket.off('close', gone);
        if (first === null) {
          relay.destroy();
          throw new E2bError(502, `port ${t.port} of sandbox ${t.sandboxId} closed the connection without an answer`);
        }
        socket.write(first);
        relay.pipe(socket).on('error', () => relay.destroy());
        socket.pipe(relay).on('error', () => socket.destroy());
        socket.on('close', () => relay.destroy());
        relay.on('close', () => socket.destroy());
        this.audit(t.p, req.method ?? 'GET', m, 101, 0);
      })
      .catch((err: unknown) => {
        const res = e2bErrorResponse(err, this.log);
        this.audit(principal, req.method ?? 'GET', m, res.status, 0);
        if (socket.destroyed) return;
        void res
          .text()
          .then((body) =>
            socket.end(
              `HTTP/1.1 ${res.status} E2B\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
            ),
          );
      });
    return true;
  }

  /** The sandbox of a host name, authorised: E2B sandboxes only; the traffic token when it has one. */
  private async target(m: { port: number; sandboxId: string }, header: (name: string) => string | undefined, source: string): Promise<PortTarget> {
    if (!this.failedLookups.has(source)) throw new DsecError('RATE_LIMITED', 'too many failed sandbox look-ups from this address', { retryAfterMs: 1000 });
    const fail = (err: Error): Error => {
      this.failedLookups.take(source);
      return err;
    };
    const notRunning = (why: string): E2bError => new E2bError(502, `sandbox ${m.sandboxId} ${why}`, undefined, { sandboxId: m.sandboxId, port: m.port });
    const row = await this.services.lifecycle.rowById(m.sandboxId);
    if (!row || row.labels[TOKEN_LABEL] === undefined) throw fail(notRunning('not found'));
    const traffic = row.labels[TRAFFIC_TOKEN_LABEL];
    if (traffic !== undefined && !tokenMatches(traffic, header(TRAFFIC_TOKEN_HEADER)))
      throw fail(new E2bError(403, `missing or wrong ${TRAFFIC_TOKEN_HEADER}`));
    this.budget.takeRequest(row.id, source);
    const p = sandboxPrincipal(row, await this.services.iam.tenantOf(row.project_id));
    try {
      const { row: running, edge } = await this.services.lifecycle.route(p, m.sandboxId, 'member');
      const mask = row.labels[MASK_HOST_LABEL];
      const tls = (row.labels[HTTPS_PORTS_LABEL] ?? '').split(',').includes(String(m.port));
      return { p, edge, sandboxId: running.id, port: m.port, tls, ...(mask !== undefined ? { host: mask.replaceAll('${PORT}', String(m.port)) } : {}) };
    } catch (err) {
      if (err instanceof DsecError && (err.code === 'SANDBOX_NOT_FOUND' || err.code === 'SANDBOX_NOT_RUNNING')) throw notRunning(err.message);
      throw err;
    }
  }

  /** A connection to the target's port: its relay, inside TLS for an HTTPS port. */
  private async connect(t: PortTarget): Promise<Duplex> {
    const relay = await this.relay(t);
    if (!t.tls) return relay;
    return overTls(relay, t.host);
  }

  /** A relay to the target's port (one of the sandbox's bounded connections, released when it closes). */
  private async relay(t: PortTarget): Promise<RelaySocket> {
    const release = this.budget.openConnection(t.sandboxId);
    try {
      const proc = await t.edge.spawn(t.sandboxId, {
        argv: ['bash', '-c', RELAY, String(t.port)],
        uid: 65534,
        gid: 65534,
        keepStdinOpen: true,
        timeoutMs: MAX_CONNECTION_MS,
      });
      // Open connections count as the sandbox's activity.
      const unhold = this.services.activity.hold(t.sandboxId);
      const socket = new RelaySocket(proc);
      socket.once('close', () => {
        unhold();
        release();
      });
      return socket;
    } catch (err) {
      release();
      throw err;
    }
  }

  /** One HTTP request through a relay (a connection of its own, closed after the response). */
  private async forward(c: Context<Env>, t: PortTarget): Promise<Response> {
    const relay = await this.connect(t);
    const headers: IncomingHttpHeaders = {};
    for (const [k, v] of c.req.raw.headers) if (!HOP_BY_HOP.has(k) && k !== TRAFFIC_TOKEN_HEADER) headers[k] = v;
    headers.connection = 'close';
    if (t.host !== undefined) headers.host = t.host;
    const url = new URL(c.req.url);
    const body = c.req.raw.body;
    return new Promise<Response>((resolve, reject) => {
      const req = httpRequest({ createConnection: () => relay, method: c.req.method, path: `${url.pathname}${url.search}`, headers }, (res) => {
        const out = new Headers();
        for (const [k, v] of Object.entries(res.headers)) {
          if (HOP_BY_HOP.has(k) || v === undefined) continue;
          for (const one of Array.isArray(v) ? v : [v]) out.append(k, one);
        }
        res.once('end', () => relay.destroy());
        res.once('error', () => relay.destroy());
        const status = res.statusCode ?? 502;
        const empty = c.req.method === 'HEAD' || status === 204 || status === 304;
        resolve(new Response(empty ? null : (Readable.toWeb(res) as ReadableStream<Uint8Array>), { status, headers: out }));
      });
      req.once('error', (err) => {
        relay.destroy();
        // Whatever ends the relay mid-request (nothing listens there, the relay exited while its
        // input was written: EPIPE) is the port's failure, as E2B's proxy says it: 502.
        reject(new E2bError(502, `port ${t.port} of sandbox ${t.sandboxId}: ${err.message}`));
      });
      requestSignal(c).addEventListener('abort', () => relay.destroy(), { once: true });
      if (body) Readable.fromWeb(body as never).pipe(req);
      else req.end();
    });
  }

  private audit(p: Principal | undefined, method: string, m: { port: number; sandboxId: string }, status: number, durationMs: number): void {
    if (!this.watch) return;
    this.watch.audit.record({
      at: new Date().toISOString(),
      keyId: p?.keyId ?? null,
      projectId: p?.projectId ?? null,
      method,
      route: `<port>-<sandboxID>.<domain>`,
      sandboxId: p ? m.sandboxId : null,
      status,
      durationMs: Math.round(durationMs * 1000) / 1000,
      command: `port ${m.port}`,
      exitCode: null,
    });
  }
}
