// How the node itself reaches the outside: directly, or through the operator's HTTP proxy
// (`node.network.upstreamProxy`, a CONNECT tunnel to the address the egress proxy checked, never
// to a name the corporate proxy would resolve again), and, for the package mirrors, over
// keep-alive agents so that a cold install does not pay a TCP and TLS handshake per package.
import { once } from 'node:events';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import type { Socket } from 'node:net';
import tls from 'node:tls';
import type { NameResolver } from '../types.js';

/** Sockets kept per mirror upstream origin (busy and idle together). */
export const MIRROR_SOCKETS_PER_ORIGIN = 32;
/** An idle keep-alive socket to a mirror upstream is closed after this long. */
export const MIRROR_IDLE_SOCKET_MS = 30_000;
/** Largest answer head an upstream proxy may send to a CONNECT. */
const MAX_CONNECT_REPLY_BYTES = 16 * 1024;

/** Options of {@link Outbound}. */
export interface OutboundOptions {
  /**
   * The operator's HTTP proxy for all egress (`http://[user:pass@]host:port`): the egress proxy
   * and the mirrors open a CONNECT tunnel through it to each checked address. Default: direct.
   */
  upstreamProxy?: string;
  /** Resolves the mirrors' upstream names (the node's `hosts`, then its resolvers). */
  resolver: NameResolver;
  /** PEM certificates the node trusts besides Node's own roots (the operator's CAs) for mirror fetches over TLS. */
  caCertificates?: string;
}

const noop = (): void => {};

/** Parses and checks an upstream proxy URL; throws with a message naming what is wrong. */
export function parseUpstreamProxy(url: string): { host: string; port: number; authorization?: string } {
  const u = new URL(url);
  if (u.protocol !== 'http:') throw new Error(`upstreamProxy: ${u.protocol} is not supported (http:// only)`);
  if (u.pathname !== '/' || u.search || u.hash) throw new Error('upstreamProxy: a proxy URL has no path');
  const host = u.hostname.replace(/^\[(.*)\]$/, '$1');
  const port = u.port ? Number(u.port) : 80;
  const auth = u.username ? `${decodeURIComponent(u.username)}:${decodeURIComponent(u.password)}` : undefined;
  return { host, port, ...(auth !== undefined ? { authorization: `Basic ${Buffer.from(auth).toString('base64')}` } : {}) };
}

/** Opens a TCP connection to `address:port`, failing after `timeoutMs`. */
export function connectTcp(address: string, port: number, timeoutMs: number): Promise<Socket> {
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
      s.on('error', noop); // whoever takes it over reacts to 'close'
      resolve(s);
    });
  });
}

/** Reads an HTTP answer head from `socket`; pushes back what follows it. */
async function readHead(socket: Socket, timeoutMs: number): Promise<string> {
  let buf = Buffer.alloc(0);
  const deadline = AbortSignal.timeout(timeoutMs);
  for (;;) {
    const end = buf.indexOf('\r\n\r\n');
    if (end >= 0) {
      const rest = buf.subarray(end + 4);
      if (rest.length > 0) socket.unshift(rest);
      return buf.subarray(0, end).toString('latin1');
    }
    if (buf.length > MAX_CONNECT_REPLY_BYTES) throw new Error('the upstream proxy sent an oversized answer');
    const [chunk] = (await Promise.race([
      once(socket, 'data'),
      once(socket, 'end').then(() => Promise.reject(new Error('the upstream proxy closed the connection'))),
      once(socket, 'close').then(() => Promise.reject(new Error('the upstream proxy closed the connection'))),
      once(deadline, 'abort').then(() => Promise.reject(new Error('the upstream proxy did not answer in time'))),
    ])) as [Buffer];
    buf = Buffer.concat([buf, chunk]);
  }
}

/** The node's way out. One per egress proxy; `close` ends the mirrors' idle sockets. */
export class Outbound {
  private readonly proxy: { host: string; port: number; authorization?: string } | undefined;
  private readonly httpAgent: http.Agent;
  private readonly httpsAgent: https.Agent;
  private readonly ca: string[] | undefined;

  constructor(private readonly opts: OutboundOptions) {
    this.proxy = opts.upstreamProxy ? parseUpstreamProxy(opts.upstreamProxy) : undefined;
    this.ca = opts.caCertificates ? [...tls.rootCertificates, opts.caCertificates] : undefined;
    const agentOptions = {
      keepAlive: true,
      maxSockets: MIRROR_SOCKETS_PER_ORIGIN,
      maxFreeSockets: MIRROR_SOCKETS_PER_ORIGIN,
      timeout: MIRROR_IDLE_SOCKET_MS,
      scheduling: 'lifo' as const,
    };
    this.httpAgent = new http.Agent(agentOptions);
    this.httpsAgent = new https.Agent(agentOptions);
    // Both agents dial through `connect` (the node's resolver, the operator's proxy); the https
    // one then runs TLS over the socket it got. Node's Agent takes an asynchronous createConnection.
    type Create = (
      options: { host?: string | null; port?: number | string | null; servername?: string },
      cb: (err: Error | null, socket?: Socket) => void,
    ) => undefined;
    const create =
      (secure: boolean): Create =>
      (options, cb) => {
        const host = options.host ?? 'localhost';
        const port = Number(options.port ?? (secure ? 443 : 80));
        this.dialName(host, port, 10_000).then(
          (raw) => {
            if (!secure) return cb(null, raw);
            const s = tls.connect({
              socket: raw,
              servername: options.servername ?? host,
              ...(this.ca ? { ca: this.ca } : {}),
              ALPNProtocols: ['http/1.1'],
            });
            s.on('error', noop);
            cb(null, s);
          },
          (err: unknown) => cb(err instanceof Error ? err : new Error(String(err))),
        );
        return undefined;
      };
    (this.httpAgent as unknown as { createConnection: Create }).createConnection = create(false);
    (this.httpsAgent as unknown as { createConnection: Create }).createConnection = create(true);
  }

  /** Whether egress goes through an operator's proxy. */
  get viaProxy(): boolean {
    return this.proxy !== undefined;
  }

  /** A connected socket to `address:port` (an address the caller checked): direct, or tunnelled through the operator's proxy. */
  async connect(address: string, port: number, timeoutMs: number): Promise<Socket> {
    if (!this.proxy) return connectTcp(address, port, timeoutMs);
    const socket = await connectTcp(this.proxy.host, this.proxy.port, timeoutMs);
    try {
      const authority = net.isIPv6(address) ? `[${address}]:${port}` : `${address}:${port}`;
      const auth = this.proxy.authorization ? `Proxy-Authorization: ${this.proxy.authorization}\r\n` : '';
      socket.write(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n${auth}\r\n`);
      const head = await readHead(socket, timeoutMs);
      const status = /^HTTP\/1\.[01] (\d{3})/.exec(head)?.[1];
      if (status !== '200') throw new Error(`the upstream proxy refused CONNECT ${authority}: ${head.split('\r\n')[0]?.slice(0, 200) ?? ''}`);
      return socket;
    } catch (err) {
      socket.destroy();
      throw err;
    }
  }

  /** Resolves `host` with the node's resolver and connects to the first address that answers. */
  private async dialName(host: string, port: number, timeoutMs: number): Promise<Socket> {
    const addresses = net.isIP(host) ? [host] : await this.opts.resolver.resolve4(host, AbortSignal.timeout(timeoutMs));
    if (addresses.length === 0) throw new Error(`${host} has no address`);
    let last: unknown;
    for (const a of addresses.slice(0, 4)) {
      try {
        return await this.connect(a, port, timeoutMs);
      } catch (err) {
        last = err;
      }
    }
    throw last as Error;
  }

  /** The keep-alive agent for a mirror fetch of `url`. */
  agentFor(url: URL): http.Agent {
    return url.protocol === 'https:' ? this.httpsAgent : this.httpAgent;
  }

  /** Ends the mirrors' kept sockets. */
  close(): void {
    this.httpAgent.destroy();
    this.httpsAgent.destroy();
  }
}
