// The node port: where edges on other machines join and hold their sessions. HTTP/2 inside
// mutual TLS with the cluster CA. Without a client certificate only the CA and the join (a
// single-use token plus a CSR) are served; a session needs a certificate of a member node that
// was not removed, and an edge wire version this control plane speaks. Each session is one
// HTTP/2 stream of length-prefixed edge wire frames; the control plane is the wire client and
// puts the session's EdgeClient into the node registry. A session that ends makes the node
// `unreachable`; one that does not come back within the lost grace makes it `lost`.
import { X509Certificate } from 'node:crypto';
import http2 from 'node:http2';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import type { TLSSocket } from 'node:tls';
import {
  DEFAULT_JOIN_TOKEN_TTL_MS,
  DEFAULT_NODE_LOST_AFTER_MS,
  DEFAULT_NODE_UNREACHABLE_AFTER_MS,
  DsecError,
  EDGE_WIRE_VERSION,
  EDGE_WIRE_VERSION_HEADER,
  NODE_HEARTBEAT_HEADER,
  NODE_JOIN_PATHS,
  NODE_LOST_AFTER_HEADER,
  NODE_SESSION_HTTP2,
  NODE_UNREACHABLE_AFTER_HEADER,
  NodeJoinRequestSchema,
  SANDBOX_ROW_EVENT_KINDS,
  WireEdgeClient,
  framedTransport,
  parseJoinToken,
  parseOrThrow,
} from '@dsec/protocol';
import type { EventSink, JoinToken, RaisedEvent, Transport } from '@dsec/protocol';
import { parseAddr } from '../control-plane.js';
import type { NodeRegistry } from '../nodes.js';
import { unreachableEdge } from '../nodes.js';
import type { NodeMembership, NodeService } from '../services/nodes.js';
import { ClusterCa } from './ca.js';
import type { CertTools } from './ca.js';

/** Options of {@link NodePort.start}. */
export interface NodePortOptions {
  /** `host:port` to listen on (port 0 picks one). */
  host: string;
  port: number;
  /** Directory of the cluster CA (made on first start). */
  caDir: string;
  /** What the CA signs with. */
  certTools: CertTools;
  nodes: NodeRegistry;
  nodeAdmin: NodeService;
  /** Where the nodes' events and the node.* events go. */
  raise: EventSink;
  log: (line: string) => void;
  /** Silence after which a session is dropped (node `unreachable`). Default {@link DEFAULT_NODE_UNREACHABLE_AFTER_MS}. */
  unreachableAfterMs?: number;
  /** Time `unreachable` before `lost`. Default {@link DEFAULT_NODE_LOST_AFTER_MS}. */
  lostAfterMs?: number;
}

/** Largest join request body. */
const MAX_JOIN_BYTES = 64 * 1024;

/** The listening node port. */
export class NodePort implements NodeMembership {
  private readonly sessions = new Map<string, WireEdgeClient>();
  private readonly lostTimers = new Map<string, ReturnType<typeof setTimeout>>();
  /** Nodes removed while this process runs: their ending sessions raise nothing. */
  private readonly revoked = new Set<string>();
  private readonly unreachableAfterMs: number;
  private readonly lostAfterMs: number;
  private closed = false;
  /** Open HTTP/2 connections (ended on close: the server's own close waits for them). */
  private readonly connections = new Set<http2.ServerHttp2Session>();

  private constructor(
    private readonly o: NodePortOptions,
    private readonly ca: ClusterCa,
    private readonly server: http2.Http2SecureServer,
    /** `https://host:port` of the node port. */
    readonly url: string,
  ) {
    this.unreachableAfterMs = o.unreachableAfterMs ?? DEFAULT_NODE_UNREACHABLE_AFTER_MS;
    this.lostAfterMs = o.lostAfterMs ?? DEFAULT_NODE_LOST_AFTER_MS;
  }

  /** Opens the CA, listens, and registers every member node as unreachable until its session opens. */
  static async start(o: NodePortOptions): Promise<NodePort> {
    const ca = await ClusterCa.open(o.caDir, o.certTools);
    const server = http2.createSecureServer({
      key: ca.serverKeyPem,
      cert: ca.serverCertPem,
      ca: ca.caPem,
      requestCert: true,
      // Checked per request: the CA and the join are served without a client certificate.
      rejectUnauthorized: false,
      minVersion: 'TLSv1.3',
      maxSessionMemory: NODE_SESSION_HTTP2.maxSessionMemoryMB,
      settings: { initialWindowSize: NODE_SESSION_HTTP2.initialWindowSize },
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(o.port, o.host, () => {
        server.off('error', reject);
        resolve();
      });
    });
    const a = server.address() as AddressInfo;
    const port = new NodePort(o, ca, server, `https://${o.host.includes(':') ? `[${o.host}]` : o.host}:${a.port}`);
    server.on('stream', (stream, headers) => port.onStream(stream, headers));
    server.on('session', (s) => {
      port.connections.add(s);
      s.once('connect', () => s.setLocalWindowSize(NODE_SESSION_HTTP2.connectionWindowSize));
      s.once('close', () => port.connections.delete(s));
    });
    server.on('sessionError', () => undefined);
    server.on('tlsClientError', () => undefined);
    for (const row of await o.nodeAdmin.store.nodes()) {
      if (row.revoked_at !== null || o.nodes.get(row.name)) continue;
      const n = o.nodes.attach(unreachableEdge(row.name, { cpu: 0, memoryMiB: 0, sandboxes: 0, backends: [] }), {
        address: null,
        version: null,
        joinedAt: row.joined_at,
        cordoned: row.cordoned === 1,
      });
      o.nodes.detach(n.name, n.client);
      port.startLostTimer(row.name);
    }
    return port;
  }

  /** A join token `dsecjoin.<id>.<secret>.<CA sha256>`, single use. */
  async issueToken(ttlMs = DEFAULT_JOIN_TOKEN_TTL_MS): Promise<JoinToken> {
    await this.o.nodeAdmin.store.pruneTokens(new Date().toISOString());
    const t = await this.o.nodeAdmin.store.issueToken(ttlMs);
    return { id: t.id, token: `dsecjoin.${t.id}.${t.secret}.${this.ca.caSha256}`, expiresAt: t.expiresAt };
  }

  /** Revokes node `name` and ends its session. */
  async revoke(name: string): Promise<void> {
    await this.o.nodeAdmin.store.revoke(name);
    this.revoked.add(name);
    clearTimeout(this.lostTimers.get(name));
    this.lostTimers.delete(name);
    const s = this.sessions.get(name);
    this.sessions.delete(name);
    s?.close();
  }

  /** Stops listening and ends every session (the nodes keep their sandboxes). */
  async close(): Promise<void> {
    this.closed = true;
    for (const t of this.lostTimers.values()) clearTimeout(t);
    this.lostTimers.clear();
    for (const s of this.sessions.values()) s.close();
    this.sessions.clear();
    const stopped = new Promise<void>((resolve) => this.server.close(() => resolve()));
    for (const c of this.connections) c.destroy();
    await stopped;
  }

  private onStream(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders): void {
    stream.on('error', () => undefined);
    const path = headers[':path'];
    const method = headers[':method'];
    const handle = async (): Promise<void> => {
      if (method === 'GET' && path === NODE_JOIN_PATHS.ca) return this.answer(stream, 200, this.ca.caPem, 'application/x-pem-file');
      if (method === 'POST' && path === NODE_JOIN_PATHS.join) return this.join(stream);
      if (method === 'POST' && path === NODE_JOIN_PATHS.session) return this.session(stream, headers);
      throw new DsecError('NOT_FOUND', `no ${String(method)} ${String(path)} on the node port`);
    };
    handle().catch((err: unknown) => {
      const e = err instanceof DsecError ? err : new DsecError('INTERNAL', 'internal error');
      if (!(err instanceof DsecError)) this.o.log(`node port: ${String(path)}: ${(err as Error).message}`);
      this.answer(stream, e.status, JSON.stringify(e.toJSON()), 'application/json');
    });
  }

  private answer(stream: http2.ServerHttp2Stream, status: number, body: string, type: string): void {
    if (stream.destroyed || stream.headersSent) return;
    stream.respond({ ':status': status, 'content-type': type });
    stream.end(body);
  }

  private async join(stream: http2.ServerHttp2Stream): Promise<void> {
    const text = await readBody(stream);
    let body: unknown;
    try {
      body = JSON.parse(text) as unknown;
    } catch {
      throw new DsecError('INVALID_ARGUMENT', 'the join request is not JSON');
    }
    const req = parseOrThrow(NodeJoinRequestSchema, body);
    const token = parseJoinToken(req.token);
    const store = this.o.nodeAdmin.store;
    if (this.o.nodes.get(req.name) && !this.o.nodes.get(req.name)?.remote)
      throw new DsecError('CONFLICT', `node name ${req.name} is taken by the control plane's own edge`);
    const before = await store.node(req.name);
    if (before && before.revoked_at === null)
      throw new DsecError('CONFLICT', `node ${req.name} is already a member; remove it first (dsec nodes rm ${req.name})`);
    await store.useToken(token.id, token.secret, req.name);
    const cert = await this.ca.signNode(req.csr, req.name);
    await store.join(req.name, new X509Certificate(cert).fingerprint256);
    this.o.log(`node port: node ${req.name} joined`);
    this.answer(stream, 200, JSON.stringify({ name: req.name, cert, ca: this.ca.caPem }), 'application/json');
  }

  private async session(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders): Promise<void> {
    const socket = stream.session?.socket as TLSSocket | undefined;
    if (!socket?.authorized) throw new DsecError('UNAUTHENTICATED', 'a node session needs a client certificate of the cluster CA');
    const peer = socket.getPeerCertificate();
    const name = typeof peer.subject?.CN === 'string' ? peer.subject.CN : '';
    const row = name ? await this.o.nodeAdmin.store.node(name) : undefined;
    if (!row || row.revoked_at !== null || row.cert_fingerprint !== peer.fingerprint256) {
      throw new DsecError('PERMISSION_DENIED', `node ${name || '?'} is not a member of this cluster (removed, or never joined)`);
    }
    const version = Number(headers[EDGE_WIRE_VERSION_HEADER]);
    if (version !== EDGE_WIRE_VERSION) {
      throw new DsecError(
        'INVALID_ARGUMENT',
        `this control plane speaks edge wire version ${EDGE_WIRE_VERSION}; node ${name} speaks ${Number.isFinite(version) ? version : 'none'}: run the same dsec release on both`,
        { field: 'version' },
      );
    }
    if (this.closed) throw new DsecError('UNAVAILABLE', 'the control plane is stopping');
    const heartbeatMs = Math.max(100, Math.min(5000, Math.floor(this.unreachableAfterMs / 3)));
    stream.respond({
      ':status': 200,
      'content-type': 'application/octet-stream',
      [NODE_LOST_AFTER_HEADER]: String(this.lostAfterMs),
      [NODE_UNREACHABLE_AFTER_HEADER]: String(this.unreachableAfterMs),
      [NODE_HEARTBEAT_HEADER]: String(heartbeatMs),
    });
    const transport = framedTransport(stream);
    let heardAt = Date.now();
    const heard: Transport = {
      send: (f, parts) => transport.send(f, parts),
      onFrame: (r) =>
        transport.onFrame((f, parts) => {
          heardAt = Date.now();
          r(f, parts);
        }),
      onClose: (l) => transport.onClose(l),
      close: (e) => transport.close(e),
    };
    const client = await WireEdgeClient.connect(heard, { silenceTimeoutMs: this.unreachableAfterMs, log: this.o.log });
    if (client.nodeName !== name) {
      client.close();
      throw new DsecError('PERMISSION_DENIED', `the edge says it is ${client.nodeName}, its certificate ${name}`);
    }
    this.revoked.delete(name);
    const previous = this.sessions.get(name);
    this.sessions.set(name, client);
    previous?.close();
    clearTimeout(this.lostTimers.get(name));
    this.lostTimers.delete(name);
    const before = this.o.nodes.get(name)?.state;
    const entry = this.o.nodes.attach(client, {
      address: socket.remoteAddress ?? null,
      version,
      joinedAt: row.joined_at,
      cordoned: row.cordoned === 1,
      lastHeardAt: () => heardAt,
    });
    // A node's events carry the name of its certificate, whatever the node wrote in them; the
    // events that follow sandbox rows are the control plane's alone.
    const unsubscribe = client.onEvent((ev) => {
      if (!SANDBOX_ROW_EVENT_KINDS.includes(ev.kind)) this.o.raise({ ...ev, node: name });
    });
    transport.onClose(() => {
      unsubscribe();
      if (this.sessions.get(name) === client) this.sessions.delete(name);
      if (!this.o.nodes.detach(name, client) || this.closed || this.revoked.has(name)) return;
      this.nodeEvent('node.unreachable', 'warning', name, `node ${name} is unreachable (its session ended); lost in ${this.lostAfterMs} ms unless it returns`);
      this.startLostTimer(name);
    });
    this.o.log(`node port: node ${name} connected from ${entry.address ?? '?'}`);
    if (before !== 'ready') this.nodeEvent('node.ready', 'info', name, `node ${name} is ready${before ? ` (it was ${before})` : ''}`);
    const r = await this.o.nodeAdmin.reconcile(entry).catch((err: unknown) => {
      this.o.log(`node port: reconciling ${name}: ${(err as Error).message}`);
      return { destroyed: [] as string[] };
    });
    if (r.destroyed.length)
      this.o.log(`node port: node ${name}: destroyed ${r.destroyed.length} sandbox(es) the store no longer has there (${r.destroyed.join(', ')})`);
  }

  private startLostTimer(name: string): void {
    clearTimeout(this.lostTimers.get(name));
    const t = setTimeout(() => {
      this.lostTimers.delete(name);
      if (this.closed || !this.o.nodes.markLost(name)) return;
      this.nodeEvent('node.lost', 'critical', name, `node ${name} is lost (unreachable for ${this.lostAfterMs} ms); its sandboxes are lost`);
      void this.o.nodeAdmin.nodeLost(name, 'lost').catch((err: unknown) => this.o.log(`node port: node ${name} lost: ${(err as Error).message}`));
    }, this.lostAfterMs);
    t.unref();
    this.lostTimers.set(name, t);
  }

  private nodeEvent(kind: RaisedEvent['kind'], severity: RaisedEvent['severity'], name: string, message: string): void {
    this.o.log(`node port: ${message}`);
    this.o.raise({ kind, severity, node: name, message, data: { node: name } });
  }
}

function readBody(stream: http2.ServerHttp2Stream): Promise<string> {
  return new Promise((resolve, reject) => {
    const parts: Buffer[] = [];
    let n = 0;
    stream.on('data', (c: Buffer) => {
      n += c.length;
      if (n > MAX_JOIN_BYTES) reject(new DsecError('PAYLOAD_TOO_LARGE', `the join request is over ${MAX_JOIN_BYTES} bytes`));
      else parts.push(c);
    });
    stream.once('end', () => resolve(Buffer.concat(parts).toString('utf8')));
    stream.once('error', reject);
  });
}

/** The `cluster` settings of `dsec up` and `dsec apiserver`. */
export interface ClusterOptions {
  nodeAddr?: string;
  unreachableAfterMs?: number;
  lostAfterMs?: number;
}

/**
 * Starts the node port that `cluster.nodeAddr` asks for (none without it), its CA under
 * `<home>/cluster`, and makes it the platform's node membership. A node's events go to the event
 * stream and to the node service (a microVM whose QEMU died there: its row becomes lost).
 */
export async function startNodePort(
  cluster: ClusterOptions | undefined,
  o: Pick<NodePortOptions, 'certTools' | 'nodes' | 'nodeAdmin' | 'log'> & { home: string; ingest: EventSink },
): Promise<NodePort | undefined> {
  if (!cluster?.nodeAddr) return undefined;
  const at = parseAddr(cluster.nodeAddr);
  const port = await NodePort.start({
    host: at.host,
    port: at.port,
    caDir: path.join(o.home, 'cluster'),
    certTools: o.certTools,
    nodes: o.nodes,
    nodeAdmin: o.nodeAdmin,
    raise: (ev) => {
      o.ingest(ev);
      o.nodeAdmin.nodeEvent(ev);
    },
    log: o.log,
    ...(cluster.unreachableAfterMs !== undefined ? { unreachableAfterMs: cluster.unreachableAfterMs } : {}),
    ...(cluster.lostAfterMs !== undefined ? { lostAfterMs: cluster.lostAfterMs } : {}),
  });
  o.nodeAdmin.membership = port;
  return port;
}
