// The egress proxy: one set of listeners per node through which every byte a sandbox sends out of
// the node passes. Three ports:
// - explicit: HTTP forward proxying (absolute-form requests) and CONNECT tunnels;
// - transparent HTTP: connections to port 80 redirected here; the destination is the Host header
//   of each request;
// - transparent TLS: connections to port 443 redirected here; the destination is the SNI of the
//   ClientHello, read without terminating TLS (the handshake runs end to end).
// The caller is identified by its source address; its policy decides each destination, the proxy
// resolves names itself and dials only addresses it checked.
import { once } from 'node:events';
import { createReadStream } from 'node:fs';
import http from 'node:http';
import type { IncomingMessage, ServerResponse } from 'node:http';
import net from 'node:net';
import type { Socket } from 'node:net';
import { Readable } from 'node:stream';
import type { EventSink } from '@dsec/protocol';
import { formatDestination, isIpLiteralLike, isRestrictedAddress, normalizeAddress, normalizeHost, parseAuthority } from './address.js';
import type { Destination } from './address.js';
import { endToEndHeaders, headBytes, upgradeHead } from './headers.js';
import { DEFAULT_BYTES_PER_SECOND, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_SANDBOX, Throttle, TokenBucket } from './limits.js';
import type { SandboxLimits } from './limits.js';
import type { MirrorAdapter } from './mirror/adapter.js';
import { NpmMirrorAdapter } from './mirror/npm.js';
import { MirrorService } from './mirror/service.js';
import type { MirrorMatch, MirrorResponse, MirrorServiceOptions } from './mirror/service.js';
import type { MirrorCacheStats } from './mirror/cache.js';
import { EgressMonitor } from './monitor.js';
import type { EgressMonitorOptions, EgressReason, EgressRecord, EgressStats, EgressVia } from './monitor.js';
import type { EgressPolicyView, SandboxResolver } from './policy.js';
import { HostResolver } from './resolver.js';
import type { HostResolverOptions } from './resolver.js';
import { readClientHello, tlsAlert } from './sni.js';

/** Time allowed to connect to an upstream address. */
export const DEFAULT_CONNECT_TIMEOUT_MS = 10_000;
/** A proxied connection with no traffic either way for this long is closed. */
export const DEFAULT_IDLE_TIMEOUT_MS = 5 * 60_000;

/** Listening ports of the proxy (0 when asking for: any free port). */
export interface EgressProxyPorts {
  /** HTTP forward proxy and CONNECT. */
  explicit: number;
  /** Transparent HTTP (port 80 redirected here). */
  http: number;
  /** Transparent TLS (port 443 redirected here). */
  tls: number;
}

/** Options of {@link startEgressProxy}. */
export interface EgressProxyOptions extends HostResolverOptions {
  /** Maps a connection's source address to its sandbox and policy. */
  sandboxes: SandboxResolver;
  /** Address to listen on. Default `0.0.0.0`. */
  listenAddress?: string;
  /** Ports to listen on. Default 0 each (any free port; see the handle's `ports`). */
  ports?: Partial<EgressProxyPorts>;
  /** Destination ports of transparently intercepted connections (the redirect loses them). Default http 80, tls 443. */
  transparentPorts?: { http?: number; tls?: number };
  /** Default per-sandbox limits (a policy's own limits win). Defaults: 128 connections, 32 MiB/s per direction, 1 s of burst. */
  limits?: Partial<SandboxLimits>;
  /** Concurrent connections for the whole proxy. Default {@link DEFAULT_MAX_CONNECTIONS}. */
  maxConnections?: number;
  /** Upstream connect timeout in ms. Default {@link DEFAULT_CONNECT_TIMEOUT_MS}. */
  connectTimeoutMs?: number;
  /** Idle timeout of a proxied connection in ms. Default {@link DEFAULT_IDLE_TIMEOUT_MS}. */
  idleTimeoutMs?: number;
  /** Where watcher events go (`egress.denied`, `egress.port-scan`); edge passes its `raise`. */
  events?: EventSink;
  /** Connection log size and port-scan thresholds. */
  monitor?: Omit<EgressMonitorOptions, 'events'>;
  /** Package mirrors (cache under the edge home). Absent: a policy's mirror routes are refused. */
  mirrors?: MirrorServiceOptions;
}

/** A running egress proxy. */
export interface EgressProxyHandle {
  /** The ports it listens on. */
  readonly ports: EgressProxyPorts;
  /** The address it listens on. */
  readonly address: string;
  /** Re-checks every open connection of the sandbox against its current policy; closes the denied ones. */
  policyChanged(sandboxId: string): void;
  /** Bytes and connections of a sandbox. */
  stats(sandboxId: string): EgressStats;
  /** Drops a sandbox's counters once it is gone; returns their last values. */
  forget(sandboxId: string): EgressStats;
  /** The most recent connection attempts, oldest first. */
  log(filter?: { sandboxId?: string; limit?: number }): EgressRecord[];
  /** Subscribes to every decision; returns the unsubscribe function. */
  onDecision(listener: (r: EgressRecord) => void): () => void;
  /** Mirror cache counters (undefined without mirrors). */
  mirrorStats(): MirrorCacheStats | undefined;
  /** Stops listening and closes every proxied connection. */
  close(): Promise<void>;
}

type Judgement = { ok: true; rule: string; mirror?: MirrorMatch } | { ok: false; reason: EgressReason; rule?: string; detail?: string };

/** An open proxied connection (or forwarded request), re-checked when its policy changes. */
interface Active {
  sandboxId: string;
  source: string;
  via: EgressVia;
  dest: Destination;
  address?: string;
  mirrored: boolean;
  record: EgressRecord;
  kill(): void;
}

type DialResult = { socket: Socket; address: string } | { refused: 'unresolvable' | 'restricted-address'; detail: string } | { failed: string; address: string };

const noop = (): void => {};

function connectTcp(address: string, port: number, timeoutMs: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host: address, port });
    const timer = setTimeout(() => {
      s.destroy();
      reject(new Error(`connect to ${address}:${port} timed out`));
    }, timeoutMs);
    const onError = (err: Error): void => {
      clearTimeout(timer);
      reject(err);
    };
    s.once('error', onError);
    s.once('connect', () => {
      clearTimeout(timer);
      s.off('error', onError);
      s.on('error', noop); // the splice that takes it over reacts to 'close'
      resolve(s);
    });
  });
}

/** Matches the absolute-form target of a plain-HTTP proxy request. */
const ABSOLUTE_HTTP = /^http:\/\/([^/?#]*)(.*)$/i;

class EgressProxy implements EgressProxyHandle {
  readonly ports: EgressProxyPorts = { explicit: 0, http: 0, tls: 0 };
  readonly address: string;
  private readonly monitor: EgressMonitor;
  private readonly resolver: HostResolver;
  private readonly explicit: http.Server;
  private readonly transparentHttp: http.Server;
  private readonly transparentTls: net.Server;
  private readonly sockets = new Set<Socket>();
  private readonly active = new Map<string, Set<Active>>();
  private readonly buckets = new Map<string, { in: TokenBucket; out: TokenBucket; rate: number; burst: number }>();
  private readonly limits: SandboxLimits;
  private readonly maxConnections: number;
  private readonly connectTimeoutMs: number;
  private readonly idleTimeoutMs: number;
  private readonly httpPort: number;
  private readonly tlsPort: number;
  private readonly adapters: MirrorAdapter[];
  private closing = false;

  constructor(
    private readonly opts: EgressProxyOptions,
    private readonly mirrors: MirrorService | undefined,
  ) {
    this.address = opts.listenAddress ?? '0.0.0.0';
    this.monitor = new EgressMonitor({ ...opts.monitor, ...(opts.events ? { events: opts.events } : {}) });
    this.resolver = new HostResolver(opts);
    const bytesPerSecond = opts.limits?.bytesPerSecond ?? DEFAULT_BYTES_PER_SECOND;
    this.limits = { maxConnections: opts.limits?.maxConnections ?? DEFAULT_MAX_CONNECTIONS_PER_SANDBOX, bytesPerSecond, burstBytes: opts.limits?.burstBytes ?? bytesPerSecond };
    this.maxConnections = opts.maxConnections ?? DEFAULT_MAX_CONNECTIONS;
    this.connectTimeoutMs = opts.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS;
    this.idleTimeoutMs = opts.idleTimeoutMs ?? DEFAULT_IDLE_TIMEOUT_MS;
    this.httpPort = opts.transparentPorts?.http ?? 80;
    this.tlsPort = opts.transparentPorts?.tls ?? 443;
    this.adapters = opts.mirrors?.adapters ? [...opts.mirrors.adapters] : [new NpmMirrorAdapter()];

    const httpServer = (via: 'forward' | 'transparent-http'): http.Server => {
      const s = http.createServer({ requestTimeout: 0, headersTimeout: 30_000, keepAliveTimeout: 30_000 });
      s.timeout = this.idleTimeoutMs;
      s.on('connection', (socket: Socket) => this.admit(socket, via));
      s.on('request', (req: IncomingMessage, res: ServerResponse) => this.onRequest(via, req, res));
      s.on('upgrade', (req: IncomingMessage, socket: Socket, head: Buffer) => this.onUpgrade(via, req, socket, head));
      s.on('clientError', (_err, socket: Socket) => {
        if (socket.writable) socket.end('HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n');
        else socket.destroy();
      });
      return s;
    };
    this.explicit = httpServer('forward');
    this.explicit.on('connect', (req: IncomingMessage, socket: Socket, head: Buffer) => this.onConnect(req, socket, head));
    this.transparentHttp = httpServer('transparent-http');
    this.transparentTls = net.createServer({ allowHalfOpen: true }, (socket) => void this.onTls(socket));
  }

  async listen(): Promise<void> {
    const servers: Array<[keyof EgressProxyPorts, net.Server]> = [
      ['explicit', this.explicit],
      ['http', this.transparentHttp],
      ['tls', this.transparentTls],
    ];
    for (const [name, server] of servers) {
      server.listen(this.opts.ports?.[name] ?? 0, this.address);
      await once(server, 'listening');
      this.ports[name] = (server.address() as net.AddressInfo).port;
    }
  }

  // ---- the handle ----

  stats(sandboxId: string): EgressStats {
    return this.monitor.stats(sandboxId);
  }

  forget(sandboxId: string): EgressStats {
    this.buckets.delete(sandboxId);
    return this.monitor.forget(sandboxId);
  }

  log(filter?: { sandboxId?: string; limit?: number }): EgressRecord[] {
    return this.monitor.entries(filter);
  }

  onDecision(listener: (r: EgressRecord) => void): () => void {
    return this.monitor.onDecision(listener);
  }

  mirrorStats(): MirrorCacheStats | undefined {
    return this.mirrors?.stats();
  }

  policyChanged(sandboxId: string): void {
    for (const a of [...(this.active.get(sandboxId) ?? [])]) {
      const view = this.opts.sandboxes.bySourceAddress(a.source);
      const j = this.recheck(a, view);
      if (j.ok) {
        if (view) this.bucketsOf(view); // new limits apply at once
        continue;
      }
      this.monitor.decide({
        sandboxId,
        source: a.source,
        via: a.via,
        host: a.dest.host,
        port: a.dest.port,
        ...(a.address ? { address: a.address } : {}),
        ...(j.rule ? { rule: j.rule } : {}),
        verdict: 'deny',
        reason: 'policy-changed',
        detail: `now denied: ${j.reason}${j.detail ? ` (${j.detail})` : ''}`,
      });
      a.kill();
    }
  }

  async close(): Promise<void> {
    this.closing = true;
    const closed = [this.explicit, this.transparentHttp, this.transparentTls].map((s) => new Promise<void>((r) => s.close(() => r())));
    for (const set of this.active.values()) for (const a of set) a.kill();
    for (const s of this.sockets) s.destroy();
    this.explicit.closeAllConnections();
    this.transparentHttp.closeAllConnections();
    await Promise.all(closed);
  }

  // ---- decisions ----

  private limitsOf(view: EgressPolicyView): SandboxLimits {
    const rate = view.limits?.bytesPerSecond ?? this.limits.bytesPerSecond;
    return {
      maxConnections: view.limits?.maxConnections ?? this.limits.maxConnections,
      bytesPerSecond: rate,
      burstBytes: view.limits?.bytesPerSecond !== undefined ? Math.min(this.limits.burstBytes, rate) : this.limits.burstBytes,
    };
  }

  private bucketsOf(view: EgressPolicyView): { in: TokenBucket; out: TokenBucket } {
    const { bytesPerSecond: rate, burstBytes: burst } = this.limitsOf(view);
    let b = this.buckets.get(view.sandboxId);
    if (!b) {
      b = { in: new TokenBucket(rate, burst), out: new TokenBucket(rate, burst), rate, burst };
      this.buckets.set(view.sandboxId, b);
    } else if (b.rate !== rate || b.burst !== burst) {
      b.in.configure(rate, burst);
      b.out.configure(rate, burst);
      b.rate = rate;
      b.burst = burst;
    }
    return b;
  }

  private matchMirror(view: EgressPolicyView, host: string): MirrorMatch | undefined {
    for (const route of view.mirrors ?? []) {
      const adapter = this.adapters.find((a) => a.preset === route.preset);
      if (adapter?.hosts.includes(host)) return { route, adapter };
    }
    return undefined;
  }

  /** The policy's verdict on a destination, before any name is resolved. */
  private judge(view: EgressPolicyView, via: EgressVia, dest: Destination): Judgement {
    if (view.mode === 'none') return { ok: false, reason: 'policy', rule: 'mode:none' };
    const mirror = this.matchMirror(view, dest.host);
    if (mirror) {
      const rule = `mirror:${mirror.route.preset}`;
      // A mirror can only answer plain HTTP: TLS to the public name would reach the real registry
      // past the mirror (and its freeze), so it is refused.
      if (via === 'connect' || via === 'transparent-tls') return { ok: false, reason: 'mirror-requires-http', rule, detail: `use http://${dest.host}/` };
      if (!this.mirrors?.originAllowed(mirror.route.url)) return { ok: false, reason: 'mirror-not-configured', rule, detail: mirror.route.url };
      return { ok: true, rule, mirror };
    }
    if (isIpLiteralLike(dest.host)) {
      if (net.isIP(dest.host) && view.addressAllowed(dest.host)) return { ok: true, rule: `address:${dest.host}` };
      return { ok: false, reason: 'ip-literal' };
    }
    const d = view.allows(dest.host, dest.port);
    if (!d.allowed) return { ok: false, reason: 'policy', ...(d.rule ? { rule: d.rule } : {}) };
    return { ok: true, rule: d.rule ?? `host:${dest.host}` };
  }

  private addressOk(view: EgressPolicyView, ip: string): boolean {
    return !isRestrictedAddress(ip) || view.addressAllowed(ip);
  }

  private recheck(a: Active, view: EgressPolicyView | undefined): Judgement {
    if (!view || view.sandboxId !== a.sandboxId) return { ok: false, reason: 'unknown-source' };
    const j = this.judge(view, a.via === 'mirror' ? 'forward' : a.via, a.dest);
    if (!j.ok) return j;
    if (a.mirrored !== (j.mirror !== undefined)) return { ok: false, reason: 'policy', detail: 'mirror route changed' };
    if (a.address && !this.addressOk(view, a.address)) return { ok: false, reason: 'restricted-address', detail: a.address };
    return j;
  }

  /** Resolves `dest`, keeps the addresses the policy admits, connects to the first that answers. */
  private async dial(view: EgressPolicyView, dest: Destination): Promise<DialResult> {
    let addresses: string[];
    try {
      addresses = await this.resolver.resolve(dest.host);
    } catch (err) {
      return { refused: 'unresolvable', detail: (err as Error).message };
    }
    const usable = addresses.filter((a) => this.addressOk(view, a));
    if (usable.length === 0) return { refused: 'restricted-address', detail: `${dest.host} resolves to ${addresses.join(', ')}` };
    let failure = '';
    for (const address of usable) {
      try {
        return { socket: await connectTcp(address, dest.port, this.connectTimeoutMs), address };
      } catch (err) {
        failure = (err as Error).message;
      }
    }
    return { failed: failure, address: usable[0]! };
  }

  private deny(base: { sandboxId?: string; source: string; via: EgressVia; dest: Destination }, reason: EgressReason, rule?: string, detail?: string, address?: string): EgressRecord {
    return this.monitor.decide({
      ...(base.sandboxId !== undefined ? { sandboxId: base.sandboxId } : {}),
      source: base.source,
      via: base.via,
      host: base.dest.host,
      port: base.dest.port,
      ...(address ? { address } : {}),
      ...(rule ? { rule } : {}),
      verdict: 'deny',
      reason,
      ...(detail ? { detail } : {}),
    });
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
      this.monitor.closed(a.record);
    };
  }

  // ---- connections ----

  /** Counts a new client connection against the limits; closes it when over. */
  private admit(socket: Socket, via: EgressVia): boolean {
    socket.on('error', noop);
    const source = normalizeAddress(socket.remoteAddress ?? '');
    if (this.closing) {
      socket.destroy();
      return false;
    }
    const view = this.opts.sandboxes.bySourceAddress(source);
    const over = (detail: string): false => {
      this.deny({ ...(view ? { sandboxId: view.sandboxId } : {}), source, via, dest: { host: '*', port: 0 } }, 'connection-limit', undefined, detail);
      socket.destroy();
      return false;
    };
    if (this.sockets.size >= this.maxConnections) return over(`node limit of ${this.maxConnections} connections`);
    if (view) {
      const max = this.limitsOf(view).maxConnections;
      if (this.monitor.stats(view.sandboxId).connections >= max) return over(`sandbox limit of ${max} connections`);
      const id = view.sandboxId;
      this.monitor.connectionDelta(id, 1);
      socket.once('close', () => this.monitor.connectionDelta(id, -1));
    }
    this.sockets.add(socket);
    socket.once('close', () => this.sockets.delete(socket));
    return true;
  }

  private onRequest(via: 'forward' | 'transparent-http', req: IncomingMessage, res: ServerResponse): void {
    const source = normalizeAddress(req.socket.remoteAddress ?? '');
    const target = this.httpTarget(via, req);
    if ('error' in target) {
      this.refuseHttp(res, this.deny({ source, via, dest: { host: '*', port: 0 } }, 'bad-request', undefined, target.error), 400);
      return;
    }
    this.forward(via, req, res, source, target).catch((err: unknown) => {
      if (!res.headersSent) res.writeHead(502, { 'content-type': 'text/plain' }).end(`dsec egress: ${(err as Error).message}\n`);
      else res.destroy();
    });
  }

  /** The destination and origin-form path of a plain-HTTP request. */
  private httpTarget(via: 'forward' | 'transparent-http', req: IncomingMessage): { dest: Destination; path: string; authority: string } | { error: string } {
    const url = req.url ?? '';
    const abs = ABSOLUTE_HTTP.exec(url);
    let authority: string;
    let path: string;
    if (abs) {
      authority = abs[1]!;
      path = abs[2] || '/';
      if (!path.startsWith('/')) path = '/' + path;
    } else if (via === 'forward') {
      return { error: /^https:/i.test(url) ? 'https URLs go through CONNECT' : 'a proxy request needs an absolute http:// URL' };
    } else {
      const host = req.headers.host;
      if (!host) return { error: 'no Host header' };
      if (!url.startsWith('/')) return { error: `unsupported request target ${url.slice(0, 100)}` };
      authority = host;
      path = url;
    }
    if (authority.includes('@')) return { error: 'credentials in the URL are not forwarded' };
    const dest = parseAuthority(authority, via === 'forward' ? 80 : this.httpPort);
    if (!dest) return { error: `invalid host ${authority.slice(0, 300)}` };
    return { dest, path, authority: dest.port === 80 ? (net.isIP(dest.host) === 6 ? `[${dest.host}]` : dest.host) : formatDestination(dest) };
  }

  private refuseHttp(res: ServerResponse, record: EgressRecord, status = 403): void {
    const body = `dsec egress: ${record.host}:${record.port} ${status === 403 ? 'denied' : 'refused'} (${record.reason ?? 'policy'}${record.detail ? `: ${record.detail}` : ''})\n`;
    res.writeHead(status, { 'content-type': 'text/plain; charset=utf-8', 'content-length': Buffer.byteLength(body), 'x-dsec-egress': `denied; reason=${record.reason ?? 'policy'}` });
    res.end(body);
  }

  private async forward(via: 'forward' | 'transparent-http', req: IncomingMessage, res: ServerResponse, source: string, target: { dest: Destination; path: string; authority: string }): Promise<void> {
    const { dest, path } = target;
    const view = this.opts.sandboxes.bySourceAddress(source);
    if (!view) return this.refuseHttp(res, this.deny({ source, via, dest }, 'unknown-source'));
    const base = { sandboxId: view.sandboxId, source, via, dest };
    const j = this.judge(view, via, dest);
    if (!j.ok) return this.refuseHttp(res, this.deny(base, j.reason, j.rule, j.detail), j.reason === 'mirror-not-configured' ? 502 : 403);
    if (j.mirror) return this.serveMirror(req, res, view, base, j.mirror, j.rule, path);

    const dialed = await this.dial(view, dest);
    if ('refused' in dialed) return this.refuseHttp(res, this.deny(base, dialed.refused, j.rule, dialed.detail));
    const record = this.monitor.decide({ ...base, host: dest.host, port: dest.port, address: dialed.address, rule: j.rule, verdict: 'allow', ...('failed' in dialed ? { detail: dialed.failed } : {}) });
    if ('failed' in dialed) {
      this.monitor.closed(record);
      res.writeHead(502, { 'content-type': 'text/plain; charset=utf-8' }).end(`dsec egress: ${formatDestination(dest)}: ${dialed.failed}\n`);
      return;
    }
    const upstream = dialed.socket;
    const buckets = this.bucketsOf(view);
    const out = new Throttle(buckets.out, (n) => this.monitor.addBytes(record, 'out', n));
    const inn = new Throttle(buckets.in, (n) => this.monitor.addBytes(record, 'in', n));
    const kill = (): void => {
      upstream.destroy();
      out.destroy();
      inn.destroy();
      res.destroy();
    };
    const untrack = this.track({ sandboxId: view.sandboxId, source, via, dest, address: dialed.address, mirrored: false, record, kill });
    res.once('close', () => {
      untrack();
      if (!res.writableFinished) kill();
      else upstream.destroy();
    });
    upstream.setTimeout(this.idleTimeoutMs, kill);

    const headers = endToEndHeaders(req.headers);
    headers.host = target.authority;
    headers.connection = 'close';
    this.monitor.addBytes(record, 'out', headBytes(`${req.method} ${path} HTTP/1.1`, req.rawHeaders));
    const upReq = http.request({ method: req.method, path, headers, setHost: false, createConnection: () => upstream });
    upReq.on('error', (err) => {
      if (!res.headersSent) res.writeHead(502, { 'content-type': 'text/plain; charset=utf-8' }).end(`dsec egress: ${formatDestination(dest)}: ${err.message}\n`);
      else kill();
    });
    upReq.on('response', (upRes) => {
      this.monitor.addBytes(record, 'in', headBytes(`HTTP/1.1 ${upRes.statusCode} ${upRes.statusMessage}`, upRes.rawHeaders));
      res.writeHead(upRes.statusCode ?? 502, upRes.statusMessage, endToEndHeaders(upRes.headers));
      upRes.on('error', kill);
      upRes.pipe(inn).pipe(res);
    });
    req.pipe(out).pipe(upReq);
  }

  private async serveMirror(req: IncomingMessage, res: ServerResponse, view: EgressPolicyView, base: { sandboxId: string; source: string; via: EgressVia; dest: Destination }, m: MirrorMatch, rule: string, path: string): Promise<void> {
    const publicBase = `http://${base.dest.port === 80 ? base.dest.host : formatDestination(base.dest)}/`;
    const answer: MirrorResponse = await this.mirrors!.serve(m, req.method ?? 'GET', base.dest.host, publicBase, path);
    req.resume(); // a GET body, if any, is not used
    const record = this.monitor.decide({
      ...base,
      via: 'mirror',
      host: base.dest.host,
      port: base.dest.port,
      rule,
      verdict: answer.hidden ? 'deny' : 'allow',
      ...(answer.hidden ? { reason: 'mirror-hidden' as const } : {}),
      detail: `${req.method} ${path.slice(0, 200)}: ${answer.status} ${answer.detail}`,
    });
    const inn = new Throttle(this.bucketsOf(view).in, (n) => this.monitor.addBytes(record, 'in', n));
    const headers: Record<string, string | number> = { ...answer.headers, 'x-dsec-mirror': m.route.cutoff ? `${m.route.preset}; cutoff=${m.route.cutoff}` : m.route.preset };
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
    const untrack = this.track({ sandboxId: base.sandboxId, source: base.source, via: base.via, dest: base.dest, mirrored: true, record, kill });
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
    const reply = (status: string, body: string): void => {
      if (socket.writable) socket.end(`HTTP/1.1 ${status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
      else socket.destroy();
    };
    if (!dest) {
      const r = this.deny({ source, via: 'connect', dest: { host: '*', port: 0 } }, 'bad-request', undefined, `CONNECT target ${(req.url ?? '').slice(0, 300)}`);
      return reply('400 Bad Request', `dsec egress: ${r.detail}\n`);
    }
    void this.tunnel('connect', socket, source, dest, head, {
      allowed: () => socket.write('HTTP/1.1 200 Connection Established\r\n\r\n'),
      denied: (r) => reply('403 Forbidden', `dsec egress: ${formatDestination(dest)} denied (${r.reason}${r.detail ? `: ${r.detail}` : ''})\n`),
      failed: (detail) => reply('502 Bad Gateway', `dsec egress: ${formatDestination(dest)}: ${detail}\n`),
    });
  }

  private onUpgrade(via: 'forward' | 'transparent-http', req: IncomingMessage, socket: Socket, head: Buffer): void {
    const source = normalizeAddress(socket.remoteAddress ?? '');
    const target = this.httpTarget(via, req);
    const reply = (status: string, body: string): void => {
      if (socket.writable) socket.end(`HTTP/1.1 ${status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
      else socket.destroy();
    };
    if ('error' in target) {
      this.deny({ source, via, dest: { host: '*', port: 0 } }, 'bad-request', undefined, target.error);
      return reply('400 Bad Request', `dsec egress: ${target.error}\n`);
    }
    const view = this.opts.sandboxes.bySourceAddress(source);
    if (view && this.matchMirror(view, target.dest.host)) {
      this.deny({ sandboxId: view.sandboxId, source, via, dest: target.dest }, 'bad-request', undefined, 'a mirror does not upgrade connections');
      return reply('400 Bad Request', 'dsec egress: a mirror does not upgrade connections\n');
    }
    const first = Buffer.concat([upgradeHead(req, target.path, target.authority), head]);
    void this.tunnel(via, socket, source, target.dest, first, {
      allowed: noop,
      denied: (r) => reply('403 Forbidden', `dsec egress: ${formatDestination(target.dest)} denied (${r.reason}${r.detail ? `: ${r.detail}` : ''})\n`),
      failed: (detail) => reply('502 Bad Gateway', `dsec egress: ${formatDestination(target.dest)}: ${detail}\n`),
    });
  }

  private async onTls(socket: Socket): Promise<void> {
    if (!this.admit(socket, 'transparent-tls')) return;
    const source = normalizeAddress(socket.remoteAddress ?? '');
    const { buffered, parse } = await readClientHello(socket);
    if (socket.destroyed) return;
    const anyDest = { host: '*', port: this.tlsPort };
    const refuse = (alert: Parameters<typeof tlsAlert>[0]): void => {
      socket.end(tlsAlert(alert));
      setTimeout(() => socket.destroy(), 1_000).unref();
    };
    if (parse.state !== 'done') {
      this.deny({ source, via: 'transparent-tls', dest: anyDest }, 'bad-request', undefined, parse.state === 'invalid' ? parse.reason : 'incomplete ClientHello');
      socket.destroy();
      return;
    }
    const view = this.opts.sandboxes.bySourceAddress(source);
    const sandbox = view ? { sandboxId: view.sandboxId } : {};
    if (parse.serverName === undefined) {
      this.deny({ ...sandbox, source, via: 'transparent-tls', dest: anyDest }, 'no-sni', undefined, 'the ClientHello names no server');
      return refuse('unrecognized_name');
    }
    const host = normalizeHost(parse.serverName);
    if (host === undefined) {
      this.deny({ ...sandbox, source, via: 'transparent-tls', dest: anyDest }, 'bad-request', undefined, `invalid server name ${JSON.stringify(parse.serverName.slice(0, 300))}`);
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
    respond: { allowed(): void; denied(r: EgressRecord): void; failed(detail: string): void },
  ): Promise<void> {
    const view = this.opts.sandboxes.bySourceAddress(source);
    if (!view) return respond.denied(this.deny({ source, via, dest }, 'unknown-source'));
    const base = { sandboxId: view.sandboxId, source, via, dest };
    const j = this.judge(view, via, dest);
    if (!j.ok) return respond.denied(this.deny(base, j.reason, j.rule, j.detail));
    const dialed = await this.dial(view, dest);
    if ('refused' in dialed) return respond.denied(this.deny(base, dialed.refused, j.rule, dialed.detail));
    const record = this.monitor.decide({ ...base, host: dest.host, port: dest.port, address: dialed.address, rule: j.rule, verdict: 'allow', ...('failed' in dialed ? { detail: dialed.failed } : {}) });
    if ('failed' in dialed) {
      this.monitor.closed(record);
      return respond.failed(dialed.failed);
    }
    const upstream = dialed.socket;
    if (client.destroyed) {
      upstream.destroy();
      this.monitor.closed(record);
      return;
    }
    respond.allowed();
    const buckets = this.bucketsOf(view);
    const out = new Throttle(buckets.out, (n) => this.monitor.addBytes(record, 'out', n));
    const inn = new Throttle(buckets.in, (n) => this.monitor.addBytes(record, 'in', n));
    const kill = (): void => {
      client.destroy();
      upstream.destroy();
      out.destroy();
      inn.destroy();
    };
    const untrack = this.track({ sandboxId: view.sandboxId, source, via, dest, address: dialed.address, mirrored: false, record, kill });
    client.once('close', () => {
      untrack();
      kill();
    });
    upstream.once('error', kill);
    out.once('error', kill);
    inn.once('error', kill);
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
  const mirrors = opts.mirrors ? await MirrorService.open(opts.mirrors) : undefined;
  const proxy = new EgressProxy(opts, mirrors);
  try {
    await proxy.listen();
  } catch (err) {
    await proxy.close();
    throw err;
  }
  return proxy;
}
