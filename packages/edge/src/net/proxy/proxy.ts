// The egress proxy: one set of listeners per node through which every byte a sandbox sends out of
// the node passes. Three ports:
// - explicit: HTTP forward proxying (absolute-form requests) and CONNECT tunnels;
// - transparent HTTP: connections to port 80 redirected here; the destination is the Host header
//   of each request;
// - transparent TLS: connections to port 443 redirected here; the destination is the SNI of the
//   ClientHello, read without terminating TLS (the handshake runs end to end).
// The caller is identified by its source address; its policy decides each destination, the proxy
// resolves names itself and dials only addresses it checked. This file holds the listeners and the
// splicing; the verdict is judge.ts, the dial upstream.ts, the refusal texts replies.ts.
import { once } from 'node:events';
import { createReadStream } from 'node:fs';
import http from 'node:http';
import type { IncomingMessage, ServerResponse } from 'node:http';
import net from 'node:net';
import type { Socket } from 'node:net';
import { Readable } from 'node:stream';
import type {
  EgressPolicyView,
  EgressProxyHandle as NetEgressProxyHandle,
  EgressProxyLimits,
  EgressProxyOptions as NetEgressProxyOptions,
  EgressProxyPorts,
  EgressStats,
  EgressVia,
} from '../types.js';
import { formatDestination, httpTarget, normalizeAddress, normalizeHost, parseAuthority } from './address.js';
import type { Destination, HttpTarget } from './address.js';
import { ConnectionLog } from './connections.js';
import type { ConnectionRecord, EgressReason } from './connections.js';
import { endToEndHeaders, headBytes, upgradeHead } from './headers.js';
import { ConnectionGate, DEFAULT_MAX_CONNECTIONS } from './gate.js';
import type { GateLimit } from './gate.js';
import { DEFAULT_BYTES_PER_SECOND, Throttle, TokenBucket } from './limits.js';
import type { MirrorCacheStats } from './mirror/cache.js';
import { defaultMirrorAdapters, matchMirror, MirrorService } from './mirror/service.js';
import type { MirrorMatch, MirrorResponse, MirrorServiceOptions } from './mirror/service.js';
import { judge, recheck } from './judge.js';
import type { Judgement, MirrorRoutes } from './judge.js';
import { plainReply, refusalText, refuseHttp } from './replies.js';
import { readClientHello, tlsAlert } from './sni.js';
import { dialUpstream } from './upstream.js';
import { Outbound } from './outbound.js';
import type { OutboundOptions } from './outbound.js';

/** The explicit proxy's port when none is given (the usual one for HTTP proxies). */
export const DEFAULT_EXPLICIT_PORT = 3128;
/** Time allowed to connect to an upstream address. */
export const DEFAULT_CONNECT_TIMEOUT_MS = 10_000;
/** A proxied connection with no traffic either way for this long is closed. */
export const DEFAULT_IDLE_TIMEOUT_MS = 5 * 60_000;

/** Options of {@link startEgressProxy}: the node's contract, plus what the proxy adds. */
export interface EgressProxyOptions extends NetEgressProxyOptions {
  /** Destination ports of transparently intercepted connections (the redirect loses them). Default http 80, tls 443. */
  transparentPorts?: { http?: number; tls?: number };
  /**
   * Per-sandbox limits. Defaults: 512 connections (a wait of up to 15 s for a slot), 32 MiB/s
   * each direction with a burst of one second's worth, 10 s to connect, 5 min idle.
   */
  limits?: Partial<EgressProxyLimits & { burstBytes: number }>;
  /** Concurrent connections for the whole proxy. Default {@link DEFAULT_MAX_CONNECTIONS}. */
  maxConnections?: number;
  /** Egress through an operator's proxy and the mirrors' keep-alive agents (outbound.ts). Default: direct. */
  outbound?: Omit<OutboundOptions, 'resolver'>;
  /** Connections kept in the recent list (`recent()`). Default 10,000. */
  recentConnections?: number;
  /** Package mirrors (cache under the edge home). Absent: a policy's mirrors are refused. */
  mirrors?: MirrorServiceOptions;
}

/** A running egress proxy. */
export interface EgressProxyHandle extends NetEgressProxyHandle {
  /** Recent connections with their bytes (open ones too), oldest first. */
  recent(filter?: { sandboxId?: string; limit?: number }): ConnectionRecord[];
  /** Mirror cache counters (undefined without mirrors). */
  mirrorStats(): MirrorCacheStats | undefined;
  /** Connection accounting: open and waiting, node-wide (per sandbox: `stats(id).connections`). */
  gateStats(): { open: number; waiting: number; maxPerSandbox: number; maxTotal: number };
}

/** A sandbox gets at most one `egress.throttled` event per this interval (the waits between are counted in the next). */
export const THROTTLED_EVENT_INTERVAL_MS = 10_000;

/** An open proxied connection (or forwarded request), re-checked when its policy changes. */
interface Active {
  sandboxId: string;
  source: string;
  via: EgressVia;
  dest: Destination;
  address?: string;
  mirrored: boolean;
  record: ConnectionRecord;
  kill(): void;
}

/** Who asked, how, for where: the fields every decision shares. */
interface Attempt {
  sandboxId?: string;
  source: string;
  via: EgressVia;
  dest: Destination;
}

const noop = (): void => {};

/** Where an unknown destination is logged (a refusal before any destination was read). */
const NOWHERE: Destination = { host: '*', port: 0 };

class EgressProxy implements EgressProxyHandle {
  readonly ports: EgressProxyPorts = { http: 0, transparentHttp: 0, transparentTls: 0 };
  readonly address: string;
  private readonly log: ConnectionLog;
  private readonly explicit: http.Server;
  private readonly transparentHttp: http.Server;
  private readonly transparentTls: net.Server;
  /** The listening sockets: each counts a connection in the gate, then hands it to its server. */
  private readonly fronts: Array<[keyof EgressProxyPorts, net.Server]>;
  private readonly gate: ConnectionGate;
  private readonly throttled = new Map<string, { lastEventAt: number; waitsSince: number }>();
  private readonly sockets = new Set<Socket>();
  private readonly accepted = new Set<Socket>();
  private readonly socketsBySandbox = new Map<string, Set<Socket>>();
  private readonly active = new Map<string, Set<Active>>();
  private readonly buckets = new Map<string, { in: TokenBucket; out: TokenBucket }>();
  private readonly bytesPerSecond: number;
  private readonly burstBytes: number;
  private readonly connectTimeoutMs: number;
  private readonly idleTimeoutMs: number;
  private readonly httpPort: number;
  private readonly tlsPort: number;
  private readonly routes: MirrorRoutes;
  private closing = false;

  constructor(
    private readonly opts: EgressProxyOptions,
    private readonly mirrors: MirrorService | undefined,
    private readonly outbound: Outbound,
  ) {
    this.address = opts.address;
    this.log = new ConnectionLog(opts.log, opts.recentConnections);
    this.bytesPerSecond = opts.limits?.bytesPerSecond ?? DEFAULT_BYTES_PER_SECOND;
    this.burstBytes = opts.limits?.burstBytes ?? this.bytesPerSecond;
    this.gate = new ConnectionGate({
      ...(opts.limits?.maxConnections !== undefined ? { maxPerSandbox: opts.limits.maxConnections } : {}),
      maxTotal: opts.maxConnections ?? DEFAULT_MAX_CONNECTIONS,
      ...(opts.limits?.queueTimeoutMs !== undefined ? { queueTimeoutMs: opts.limits.queueTimeoutMs } : {}),
      onQueued: (key, limit) => this.onQueued(key, limit),
    });
    this.connectTimeoutMs = opts.limits?.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS;
    this.idleTimeoutMs = opts.limits?.idleTimeoutMs ?? DEFAULT_IDLE_TIMEOUT_MS;
    this.httpPort = opts.transparentPorts?.http ?? 80;
    this.tlsPort = opts.transparentPorts?.tls ?? 443;
    this.routes = { adapters: opts.mirrors?.adapters ?? defaultMirrorAdapters(), mirrors };

    const httpServer = (via: 'http' | 'transparent-http'): http.Server => {
      const s = http.createServer({ requestTimeout: 0, headersTimeout: 30_000, keepAliveTimeout: 30_000 });
      s.timeout = this.idleTimeoutMs;
      s.on('request', (req: IncomingMessage, res: ServerResponse) => this.onRequest(via, req, res));
      s.on('upgrade', (req: IncomingMessage, socket: Socket, head: Buffer) => this.onUpgrade(via, req, socket, head));
      s.on('clientError', (_err, socket: Socket) => plainReply(socket, '400 Bad Request', ''));
      return s;
    };
    this.explicit = httpServer('http');
    this.explicit.on('connect', (req: IncomingMessage, socket: Socket, head: Buffer) => this.onConnect(req, socket, head));
    this.transparentHttp = httpServer('transparent-http');
    this.transparentTls = net.createServer({ allowHalfOpen: true });
    this.transparentTls.on('connection', (socket: Socket) => void this.onTls(socket));
    // allowHalfOpen as http.Server has it: a client's FIN must not end a tunnel's other direction.
    const front = (via: EgressVia, server: net.Server): net.Server =>
      net.createServer({ allowHalfOpen: true }, (socket) => void this.accept(socket, via, server));
    this.fronts = [
      ['http', front('http', this.explicit)],
      ['transparentHttp', front('transparent-http', this.transparentHttp)],
      ['transparentTls', front('transparent-tls', this.transparentTls)],
    ];
  }

  async listen(): Promise<void> {
    const wanted = {
      http: this.opts.ports?.http ?? DEFAULT_EXPLICIT_PORT,
      transparentHttp: this.opts.ports?.transparentHttp ?? 0,
      transparentTls: this.opts.ports?.transparentTls ?? 0,
    };
    for (const [name, server] of this.fronts) {
      if (name === 'mirror') continue;
      server.listen(wanted[name], this.address);
      await Promise.race([once(server, 'listening'), once(server, 'error').then(([err]) => Promise.reject(err as Error))]);
      this.ports[name] = (server.address() as net.AddressInfo).port;
    }
    // An http.Server starts tracking its connections (headersTimeout, requestTimeout, idle
    // keep-alive sockets) on its 'listening' event; these two get their sockets from the fronts.
    this.explicit.emit('listening');
    this.transparentHttp.emit('listening');
  }

  // ---- the handle ----

  stats(sandboxId: string): EgressStats {
    return this.log.stats(sandboxId);
  }

  recent(filter?: { sandboxId?: string; limit?: number }): ConnectionRecord[] {
    return this.log.recent(filter);
  }

  mirrorStats(): MirrorCacheStats | undefined {
    return this.mirrors?.stats();
  }

  gateStats(): { open: number; waiting: number; maxPerSandbox: number; maxTotal: number } {
    return { open: this.gate.totalOpen, waiting: this.gate.waiting, maxPerSandbox: this.gate.maxPerSandbox, maxTotal: this.gate.maxTotal };
  }

  policyChanged(sandboxId: string): void {
    for (const a of [...(this.active.get(sandboxId) ?? [])]) {
      const view = this.opts.sandboxes.bySourceAddress(a.source);
      const j = recheck(this.routes, a, view);
      if (j.ok) continue;
      this.closeActive(a, 'policy-changed', j.rule, `now denied: ${j.reason}${j.detail ? ` (${j.detail})` : ''}`);
    }
  }

  forget(sandboxId: string): void {
    for (const a of [...(this.active.get(sandboxId) ?? [])]) this.closeActive(a, 'sandbox-gone');
    for (const s of this.socketsBySandbox.get(sandboxId) ?? []) s.destroy();
    this.socketsBySandbox.delete(sandboxId);
    this.buckets.delete(sandboxId);
    this.throttled.delete(sandboxId);
    this.log.forget(sandboxId);
  }

  async close(): Promise<void> {
    this.closing = true;
    this.gate.close();
    const closed = this.fronts.map(([, s]) => new Promise<void>((r) => (s.listening ? s.close(() => r()) : r())));
    for (const set of this.active.values()) for (const a of set) a.kill();
    for (const s of this.sockets) s.destroy();
    for (const s of this.accepted) s.destroy();
    this.explicit.closeAllConnections();
    this.transparentHttp.closeAllConnections();
    // Not listening themselves: close() only stops their connection tracking.
    this.explicit.close();
    this.transparentHttp.close();
    await Promise.all(closed);
    this.outbound.close();
  }

  private closeActive(a: Active, reason: EgressReason, rule?: string, detail?: string): void {
    this.decide({ sandboxId: a.sandboxId, source: a.source, via: a.via, dest: a.dest }, 'denied', {
      reason,
      ...(rule ? { rule } : {}),
      ...(detail ? { detail } : {}),
      ...(a.address ? { address: a.address } : {}),
    });
    a.kill();
  }

  // ---- decisions ----

  private decide(
    at: Attempt,
    verdict: 'allowed' | 'denied',
    extra: { reason?: EgressReason; rule?: string; detail?: string; address?: string } = {},
  ): ConnectionRecord {
    return this.log.decide({
      ...(at.sandboxId !== undefined ? { sandboxId: at.sandboxId } : {}),
      source: at.source,
      via: at.via,
      host: at.dest.host,
      port: at.dest.port,
      verdict,
      ...extra,
    });
  }

  private bucketsOf(sandboxId: string): { in: TokenBucket; out: TokenBucket } {
    let b = this.buckets.get(sandboxId);
    if (!b)
      this.buckets.set(
        sandboxId,
        (b = { in: new TokenBucket(this.bytesPerSecond, this.burstBytes), out: new TokenBucket(this.bytesPerSecond, this.burstBytes) }),
      );
    return b;
  }

  /** Decides and dials for an attempt; the record is logged either way. */
  private async open(
    view: EgressPolicyView,
    at: Attempt & { sandboxId: string },
    j: Judgement & { ok: true },
  ): Promise<{ record: ConnectionRecord; socket?: Socket; failed?: string }> {
    const dialed = await dialUpstream(this.opts.resolver, view, at.dest, this.connectTimeoutMs, (address, port, timeoutMs) =>
      this.outbound.connect(address, port, timeoutMs),
    );
    if ('refused' in dialed) return { record: this.decide(at, 'denied', { reason: dialed.refused, rule: j.rule, detail: dialed.detail }) };
    if ('failed' in dialed) {
      const record = this.decide(at, 'allowed', { rule: j.rule, address: dialed.address, detail: dialed.failed });
      this.log.closed(record);
      return { record, failed: dialed.failed };
    }
    return { record: this.decide(at, 'allowed', { rule: j.rule, address: dialed.address }), socket: dialed.socket };
  }

  private track(a: Active): () => void {
    let set = this.active.get(a.sandboxId);
    if (!set) this.active.set(a.sandboxId, (set = new Set()));
    set.add(a);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      set.delete(a);
      if (set.size === 0 && this.active.get(a.sandboxId) === set) this.active.delete(a.sandboxId);
      this.log.closed(a.record);
    };
  }

  // ---- connections ----

  /**
   * Counts a new client connection in the gate (waiting in its queue when over a limit), then
   * hands it to the port's server. Counted from here until the socket closes, whatever the path.
   */
  private async accept(socket: Socket, via: EgressVia, server: net.Server): Promise<void> {
    socket.on('error', noop);
    if (this.closing) return void socket.destroy();
    // Every accepted socket, waiting or refused ones too, is ended by close().
    this.accepted.add(socket);
    socket.once('close', () => this.accepted.delete(socket));
    const source = normalizeAddress(socket.remoteAddress ?? '');
    const view = this.opts.sandboxes.bySourceAddress(source);
    const id = view?.sandboxId;
    const pass = await this.gate.admit(id, (abandon) => socket.once('close', abandon));
    if ('refused' in pass) {
      if (socket.destroyed || pass.refused === 'closed') return void socket.destroy();
      const r = this.decide({ ...(id !== undefined ? { sandboxId: id } : {}), source, via, dest: NOWHERE }, 'denied', {
        reason: 'connection-limit',
        detail: pass.detail,
      });
      if (via === 'transparent-tls') socket.end(tlsAlert('internal_error'));
      else plainReply(socket, '503 Service Unavailable', refusalText(r), 'connection-limit');
      setTimeout(() => socket.destroy(), 1_000).unref();
      return;
    }
    if (socket.destroyed || this.closing) {
      pass.release();
      return void socket.destroy();
    }
    socket.once('close', () => pass.release());
    this.sockets.add(socket);
    socket.once('close', () => this.sockets.delete(socket));
    if (id !== undefined) {
      this.log.connectionDelta(id, 1);
      let set = this.socketsBySandbox.get(id);
      if (!set) this.socketsBySandbox.set(id, (set = new Set()));
      set.add(socket);
      socket.once('close', () => {
        this.log.connectionDelta(id, -1);
        const s = this.socketsBySandbox.get(id);
        s?.delete(socket);
        if (s?.size === 0) this.socketsBySandbox.delete(id);
      });
    }
    server.emit('connection', socket);
  }

  /** A connection had to wait for a slot: at most one `egress.throttled` per sandbox per interval. */
  private onQueued(sandboxId: string | undefined, limit: GateLimit): void {
    if (sandboxId === undefined) return;
    const now = performance.now();
    let t = this.throttled.get(sandboxId);
    if (!t) this.throttled.set(sandboxId, (t = { lastEventAt: -Infinity, waitsSince: 0 }));
    t.waitsSince++;
    if (now - t.lastEventAt < THROTTLED_EVENT_INTERVAL_MS) return;
    const max = limit === 'sandbox' ? this.gate.maxPerSandbox : this.gate.maxTotal;
    const waits = t.waitsSince;
    t.lastEventAt = now;
    t.waitsSince = 0;
    try {
      this.opts.raise({
        kind: 'egress.throttled',
        severity: 'info',
        sandboxId,
        message: `egress connections wait for a slot: ${limit} limit of ${max} connections (up to ${Math.round(this.gate.queueTimeoutMs / 1000)} s, then refused)`,
        data: {
          limit,
          maxConnections: max,
          open: limit === 'sandbox' ? this.gate.openOf(sandboxId) : this.gate.totalOpen,
          waiting: this.gate.waitingOf(sandboxId) + 1,
          waits,
          queueTimeoutMs: this.gate.queueTimeoutMs,
        },
      });
    } catch {
      // an event sink must not throw; if it does, the connection still waits its turn
    }
  }

  private onRequest(via: 'http' | 'transparent-http', req: IncomingMessage, res: ServerResponse): void {
    const source = normalizeAddress(req.socket.remoteAddress ?? '');
    const target = httpTarget(via, req, this.httpPort);
    if ('error' in target) {
      const view = this.opts.sandboxes.bySourceAddress(source);
      refuseHttp(
        res,
        this.decide({ ...(view ? { sandboxId: view.sandboxId } : {}), source, via, dest: NOWHERE }, 'denied', { reason: 'bad-request', detail: target.error }),
        400,
      );
      return;
    }
    this.forward(via, req, res, source, target).catch((err: unknown) => {
      if (!res.headersSent) res.writeHead(502, { 'content-type': 'text/plain; charset=utf-8' }).end(`dsec egress: ${(err as Error).message}\n`);
      else res.destroy();
    });
  }

  private async forward(via: 'http' | 'transparent-http', req: IncomingMessage, res: ServerResponse, source: string, target: HttpTarget): Promise<void> {
    const { dest, path } = target;
    const view = this.opts.sandboxes.bySourceAddress(source);
    if (!view) return refuseHttp(res, this.decide({ source, via, dest }, 'denied', { reason: 'unknown-source' }));
    const at = { sandboxId: view.sandboxId, source, via, dest };
    const j = judge(this.routes, view, via, dest);
    if (!j.ok)
      return refuseHttp(
        res,
        this.decide(at, 'denied', { reason: j.reason, ...(j.rule ? { rule: j.rule } : {}), ...(j.detail ? { detail: j.detail } : {}) }),
        j.reason === 'mirror-not-configured' ? 502 : 403,
      );
    if (j.mirror) return this.serveMirror(req, res, at, j.mirror, j.rule, path);

    const opened = await this.open(view, at, j);
    if (!opened.socket) {
      if (opened.failed === undefined) return refuseHttp(res, opened.record);
      res.writeHead(502, { 'content-type': 'text/plain; charset=utf-8' }).end(`dsec egress: ${formatDestination(dest)}: ${opened.failed}\n`);
      return;
    }
    const { record, socket: upstream } = opened;
    if (res.destroyed) {
      // The client left while the name was resolved and dialled.
      upstream.destroy();
      this.log.closed(record);
      return;
    }
    const buckets = this.bucketsOf(view.sandboxId);
    const out = new Throttle(buckets.out, (n) => this.log.addBytes(record, 'out', n));
    const inn = new Throttle(buckets.in, (n) => this.log.addBytes(record, 'in', n));
    const kill = (): void => {
      upstream.destroy();
      out.destroy();
      inn.destroy();
      res.destroy();
    };
    const untrack = this.track({ ...at, address: record.address!, mirrored: false, record, kill });
    res.once('close', () => {
      untrack();
      if (!res.writableFinished) kill();
      else upstream.destroy();
    });
    upstream.setTimeout(this.idleTimeoutMs, kill);

    const headers = endToEndHeaders(req.headers);
    headers.host = target.authority;
    headers.connection = 'close';
    this.log.addBytes(record, 'out', headBytes(`${req.method} ${path} HTTP/1.1`, req.rawHeaders));
    const upReq = http.request({ method: req.method, path, headers, setHost: false, createConnection: () => upstream });
    upReq.on('error', (err) => {
      if (!res.headersSent)
        res.writeHead(502, { 'content-type': 'text/plain; charset=utf-8' }).end(`dsec egress: ${formatDestination(dest)}: ${err.message}\n`);
      else kill();
    });
    upReq.on('response', (upRes) => {
      this.log.addBytes(record, 'in', headBytes(`HTTP/1.1 ${upRes.statusCode} ${upRes.statusMessage}`, upRes.rawHeaders));
      res.writeHead(upRes.statusCode ?? 502, upRes.statusMessage, endToEndHeaders(upRes.headers));
      upRes.on('error', kill);
      upRes.pipe(inn).pipe(res);
    });
    req.pipe(out).pipe(upReq);
  }

  private async serveMirror(
    req: IncomingMessage,
    res: ServerResponse,
    at: Attempt & { sandboxId: string },
    m: MirrorMatch,
    rule: string,
    path: string,
  ): Promise<void> {
    const publicBase = `http://${at.dest.port === 80 ? at.dest.host : formatDestination(at.dest)}/`;
    const answer: MirrorResponse = await this.mirrors!.serve(m, req.method ?? 'GET', at.dest.host, publicBase, path);
    req.resume(); // a request body, if any, is not used
    const denial = answer.refused ?? (answer.hidden ? ('mirror-hidden' as const) : undefined);
    const record = this.decide({ ...at, via: 'mirror' }, denial ? 'denied' : 'allowed', {
      rule,
      ...(denial ? { reason: denial } : {}),
      detail: `${req.method} ${path.slice(0, 200)}: ${answer.status} ${answer.detail}`,
    });
    if (res.destroyed) {
      if (answer.body instanceof Readable) answer.body.destroy();
      this.log.closed(record);
      return;
    }
    const inn = new Throttle(this.bucketsOf(at.sandboxId).in, (n) => this.log.addBytes(record, 'in', n));
    const headers: Record<string, string | number> = {
      ...answer.headers,
      'x-dsec-mirror': m.mirror.freeze ? `${m.preset}; freeze=${m.mirror.freeze}` : m.preset,
    };
    let body: Readable | undefined;
    if (Buffer.isBuffer(answer.body)) {
      headers['content-length'] = answer.body.length;
      body = Readable.from([answer.body]);
    } else if (answer.body instanceof Readable) {
      body = answer.body;
    } else if (answer.body) {
      headers['content-length'] = answer.body.size;
      body = createReadStream(answer.body.file);
    }
    const kill = (): void => {
      body?.destroy();
      inn.destroy();
      res.destroy();
    };
    const untrack = this.track({ ...at, via: 'mirror', mirrored: true, record, kill });
    res.once('close', () => {
      untrack();
      if (!res.writableFinished) kill();
    });
    res.writeHead(answer.status, headers);
    if (req.method === 'HEAD' || !body) {
      body?.destroy();
      res.end();
      return;
    }
    body.on('error', kill);
    body.pipe(inn).pipe(res);
  }

  private onConnect(req: IncomingMessage, socket: Socket, head: Buffer): void {
    const source = normalizeAddress(socket.remoteAddress ?? '');
    const dest = parseAuthority(req.url ?? '');
    if (!dest) {
      const view = this.opts.sandboxes.bySourceAddress(source);
      const r = this.decide({ ...(view ? { sandboxId: view.sandboxId } : {}), source, via: 'connect', dest: NOWHERE }, 'denied', {
        reason: 'bad-request',
        detail: `CONNECT target ${(req.url ?? '').slice(0, 300)}`,
      });
      return plainReply(socket, '400 Bad Request', `dsec egress: ${r.detail}\n`);
    }
    void this.tunnel('connect', socket, source, dest, head, {
      allowed: () => socket.write('HTTP/1.1 200 Connection Established\r\n\r\n'),
      denied: (r) => plainReply(socket, '403 Forbidden', refusalText(r), r.reason),
      failed: (detail) => plainReply(socket, '502 Bad Gateway', `dsec egress: ${formatDestination(dest)}: ${detail}\n`),
    });
  }

  private onUpgrade(via: 'http' | 'transparent-http', req: IncomingMessage, socket: Socket, head: Buffer): void {
    const source = normalizeAddress(socket.remoteAddress ?? '');
    const view = this.opts.sandboxes.bySourceAddress(source);
    const target = httpTarget(via, req, this.httpPort);
    const refuse = (error: string, dest: Destination): void => {
      this.decide({ ...(view ? { sandboxId: view.sandboxId } : {}), source, via, dest }, 'denied', { reason: 'bad-request', detail: error });
      plainReply(socket, '400 Bad Request', `dsec egress: ${error}\n`);
    };
    if ('error' in target) return refuse(target.error, NOWHERE);
    if (view && matchMirror(this.routes.adapters, view.mirrors, target.dest.host)) return refuse('a package mirror does not upgrade connections', target.dest);
    const first = Buffer.concat([upgradeHead(req, target.path, target.authority), head]);
    void this.tunnel(via, socket, source, target.dest, first, {
      allowed: noop,
      denied: (r) => plainReply(socket, '403 Forbidden', refusalText(r), r.reason),
      failed: (detail) => plainReply(socket, '502 Bad Gateway', `dsec egress: ${formatDestination(target.dest)}: ${detail}\n`),
    });
  }

  private async onTls(socket: Socket): Promise<void> {
    const source = normalizeAddress(socket.remoteAddress ?? '');
    const { buffered, parse } = await readClientHello(socket);
    if (socket.destroyed) return;
    const view = this.opts.sandboxes.bySourceAddress(source);
    const at: Attempt = { ...(view ? { sandboxId: view.sandboxId } : {}), source, via: 'transparent-tls', dest: { host: '*', port: this.tlsPort } };
    const refuse = (alert: Parameters<typeof tlsAlert>[0]): void => {
      socket.end(tlsAlert(alert));
      setTimeout(() => socket.destroy(), 1_000).unref();
    };
    if (parse.state !== 'done') {
      this.decide(at, 'denied', { reason: 'bad-request', detail: parse.state === 'invalid' ? parse.reason : 'incomplete ClientHello' });
      socket.destroy();
      return;
    }
    if (parse.serverName === undefined) {
      this.decide(at, 'denied', { reason: 'no-sni', detail: 'the ClientHello names no server' });
      return refuse('unrecognized_name');
    }
    const host = normalizeHost(parse.serverName);
    if (host === undefined) {
      this.decide(at, 'denied', { reason: 'bad-request', detail: `invalid server name ${JSON.stringify(parse.serverName.slice(0, 300))}` });
      return refuse('unrecognized_name');
    }
    await this.tunnel('transparent-tls', socket, source, { host, port: this.tlsPort }, buffered, {
      allowed: noop,
      denied: () => refuse('access_denied'),
      failed: () => refuse('internal_error'),
    });
  }

  /** Decides, dials and splices a tunnel (CONNECT, TLS, Upgrade); `head` goes upstream first. */
  private async tunnel(
    via: EgressVia,
    client: Socket,
    source: string,
    dest: Destination,
    head: Buffer,
    respond: { allowed(): void; denied(r: ConnectionRecord): void; failed(detail: string): void },
  ): Promise<void> {
    const view = this.opts.sandboxes.bySourceAddress(source);
    if (!view) return respond.denied(this.decide({ source, via, dest }, 'denied', { reason: 'unknown-source' }));
    const at = { sandboxId: view.sandboxId, source, via, dest };
    const j = judge(this.routes, view, via, dest);
    if (!j.ok)
      return respond.denied(this.decide(at, 'denied', { reason: j.reason, ...(j.rule ? { rule: j.rule } : {}), ...(j.detail ? { detail: j.detail } : {}) }));
    const opened = await this.open(view, at, j);
    if (!opened.socket) return opened.failed === undefined ? respond.denied(opened.record) : respond.failed(opened.failed);
    const { record, socket: upstream } = opened;
    if (client.destroyed) {
      upstream.destroy();
      this.log.closed(record);
      return;
    }
    respond.allowed();
    const buckets = this.bucketsOf(view.sandboxId);
    const out = new Throttle(buckets.out, (n) => this.log.addBytes(record, 'out', n));
    const inn = new Throttle(buckets.in, (n) => this.log.addBytes(record, 'in', n));
    const kill = (): void => {
      client.destroy();
      upstream.destroy();
      out.destroy();
      inn.destroy();
    };
    const untrack = this.track({ ...at, address: record.address!, mirrored: false, record, kill });
    client.once('close', () => {
      untrack();
      kill();
    });
    upstream.once('error', kill);
    client.setTimeout(this.idleTimeoutMs, kill);
    upstream.setTimeout(this.idleTimeoutMs, kill);
    if (head.length > 0) out.write(head);
    client.pipe(out).pipe(upstream);
    upstream.pipe(inn).pipe(client);
    client.resume();
  }
}

/** Starts the node's egress proxy. */
export async function startEgressProxy(opts: EgressProxyOptions): Promise<EgressProxyHandle> {
  const outbound = new Outbound({ ...opts.outbound, resolver: opts.resolver });
  const mirrors = opts.mirrors ? await MirrorService.open({ ...opts.mirrors, agentFor: (url) => outbound.agentFor(url) }) : undefined;
  const proxy = new EgressProxy(opts, mirrors, outbound);
  try {
    await proxy.listen();
  } catch (err) {
    await proxy.close();
    throw err;
  }
  return proxy;
}
