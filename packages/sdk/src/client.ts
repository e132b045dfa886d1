// DsecClient: connection settings plus the project-wide APIs (layers, keys, projects, nodes).
import { ApplyNetworkRequestSchema, invalidArgument } from '@dsec/protocol';
import { CallsApi } from './calls.js';
import { send } from './http.js';
import type { HttpReply, HttpRequestOptions, HttpStreamReply, HttpTarget } from './http.js';
import { KeysApi, ProjectsApi } from './iam.js';
import { NodesApi } from './nodes.js';
import { LayersApi } from './layers.js';
import { OwnerSession, OwnersApi } from './owners.js';
import { PoolsApi } from './pools.js';
import type { ApplyNetworkRequest, ApplyNetworkResult, OwnerCreateOptions } from './types.js';
import { validate } from './validate.js';

/** API URL used when neither the options nor `DSEC_API_URL` give one. */
export const DEFAULT_API_URL = 'http://127.0.0.1:7878';
/** Deadline of one API call unless the call says otherwise. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 30_000;

/** How to reach the API. */
export interface DsecClientOptions {
  /** Base URL of the API; default `$DSEC_API_URL`, else {@link DEFAULT_API_URL}. */
  apiUrl?: string;
  /** API key (`dsec_...`); default `$DSEC_API_KEY`. */
  apiKey?: string;
  /** Deadline of each API call in ms (0: none); default {@link DEFAULT_REQUEST_TIMEOUT_MS}. */
  requestTimeoutMs?: number;
  /**
   * Own the sandboxes this client creates through an owner session that the client heartbeats
   * by itself (`true`, or the session's `{graceMs, name}`). If the process dies, its sandboxes
   * are paused after the grace period and kept; a client that connects to them again takes
   * them over and resumes them. `close()` ends the session. Default: no session.
   */
  owner?: boolean | OwnerCreateOptions;
}

/** Options every call takes. */
export interface CallOptions {
  /** Aborts the call; combined with the request timeout. */
  signal?: AbortSignal | undefined;
  /** Overrides the client's request timeout for this call (ms, 0: none). */
  requestTimeoutMs?: number | undefined;
}

/** Internal request shape: the timeout is filled in from the client when missing. */
export type ClientRequest = Omit<HttpRequestOptions, 'timeoutMs'> & { timeoutMs?: number };

/** A connection to one dsec API. Cheap to create: all clients share keep-alive connections. */
export class DsecClient {
  /** Base URL of the API. */
  readonly apiUrl: string;
  /** Default deadline of each call in ms. */
  readonly requestTimeoutMs: number;
  /** Image layers: upload, build from Debian packages, list, remove. */
  readonly layers: LayersApi;
  /** API keys of the caller's project and its sub-projects. */
  readonly keys: KeysApi;
  /** The caller's project and its sub-projects. */
  readonly projects: ProjectsApi;
  /** Stateless function calls: `calls.run({runtime: 'python3', code})`. */
  readonly calls: CallsApi;
  /** Warm pools: sandboxes kept ready for creates that match them. */
  readonly pools: PoolsApi;
  /** Nodes: capacity and state; join tokens, cordon, drain and removal (admin). */
  readonly nodes: NodesApi;
  /** Owner sessions (the low-level API). */
  readonly owners: OwnersApi;
  /** This client's own owner session (set with the `owner` option). */
  readonly ownerSession: OwnerSession | undefined;
  readonly #target: HttpTarget;

  constructor(opts: DsecClientOptions = {}) {
    const apiUrl = opts.apiUrl ?? process.env.DSEC_API_URL ?? DEFAULT_API_URL;
    let url: URL;
    try {
      url = new URL(apiUrl);
    } catch {
      throw invalidArgument('apiUrl', `not a URL: ${apiUrl}`);
    }
    if (url.protocol !== 'http:' && url.protocol !== 'https:') throw invalidArgument('apiUrl', 'must be http: or https:');
    const timeout = opts.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
    if (!Number.isFinite(timeout) || timeout < 0) throw invalidArgument('requestTimeoutMs', 'must be >= 0');
    this.apiUrl = url.toString().replace(/\/$/, '');
    this.requestTimeoutMs = timeout;
    this.#target = { apiUrl: url, apiKey: opts.apiKey ?? process.env.DSEC_API_KEY ?? undefined };
    this.layers = new LayersApi(this);
    this.keys = new KeysApi(this);
    this.projects = new ProjectsApi(this);
    this.calls = new CallsApi(this);
    this.owners = new OwnersApi(this);
    this.ownerSession = opts.owner ? new OwnerSession(this.owners, opts.owner === true ? {} : opts.owner) : undefined;
    this.pools = new PoolsApi(this);
    this.nodes = new NodesApi(this);
  }

  /** Ends this client's owner session, if it has one (its sandboxes then get their `onOwnerLost` action). */
  async close(opts: CallOptions = {}): Promise<void> {
    await this.ownerSession?.close(opts);
  }

  /** True when the API answers `/healthz`. */
  async health(opts: CallOptions = {}): Promise<boolean> {
    const reply = await this.json<{ status?: string }>({ method: 'GET', path: '/healthz' }, opts);
    return reply.status === 'ok';
  }

  /**
   * Replaces or patches the network policy of every sandbox carrying the selector's labels (a
   * whole training job between stages). Each sandbox changes atomically; failures are listed.
   */
  async applyNetwork(req: ApplyNetworkRequest, opts: CallOptions = {}): Promise<ApplyNetworkResult> {
    const body = validate(ApplyNetworkRequestSchema, req);
    return this.json<ApplyNetworkResult>({ method: 'POST', path: '/v1/network:apply', body }, opts);
  }

  /** Sends a request and returns the reply with its body read. */
  async request(req: ClientRequest, opts: CallOptions = {}): Promise<HttpReply> {
    return send(this.#target, { ...req, ...this.#deadline(req, opts) });
  }

  /** Sends a request and returns the reply with its body unread. */
  async stream(req: ClientRequest, opts: CallOptions = {}): Promise<HttpStreamReply> {
    return send(this.#target, { ...req, ...this.#deadline(req, opts), stream: true });
  }

  /** Sends a request and parses the JSON reply. */
  async json<T>(req: ClientRequest, opts: CallOptions = {}): Promise<T> {
    const reply = await this.request(req, opts);
    return JSON.parse(reply.body.toString('utf8')) as T;
  }

  /** Target for transports that do not go through {@link send} (WebSocket). */
  get target(): Readonly<HttpTarget> {
    return this.#target;
  }

  #deadline(req: ClientRequest, opts: CallOptions): { timeoutMs: number; signal?: AbortSignal } {
    const timeoutMs = req.timeoutMs ?? opts.requestTimeoutMs ?? this.requestTimeoutMs;
    const signal = req.signal ?? opts.signal;
    return signal ? { timeoutMs, signal } : { timeoutMs };
  }
}

/** How static helpers such as `Sandbox.create` find their client. */
export type ConnectionOptions = DsecClientOptions & { client?: DsecClient };

/** The given client, or a new one from the options. */
export function clientFrom(opts: ConnectionOptions = {}): DsecClient {
  if (opts.client) return opts.client;
  const { client: _ignored, ...rest } = opts;
  return new DsecClient(rest);
}
