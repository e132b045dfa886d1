// DsecClient: connection settings plus the project-wide APIs (layers, keys, projects, nodes).
import { ApplyNetworkRequestSchema, DsecError, IDEMPOTENCY_KEY_HEADER, invalidArgument } from '@dsec/protocol';
import { CallsApi } from './calls.js';
import { isBodyStream, send } from './http.js';
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
  /**
   * Base URL of the API, or several (an array, or comma-separated): replicas of one API, tried in
   * turn when one cannot be reached or answers 503. Default `$DSEC_API_URL` (comma-separated
   * too), else {@link DEFAULT_API_URL}.
   */
  apiUrl?: string | readonly string[];
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
  /** Base URL of the API (the first of {@link apiUrls}). */
  readonly apiUrl: string;
  /** Every API URL this client fails over between, in order. */
  readonly apiUrls: readonly string[];
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
  readonly #targets: HttpTarget[];
  /** Index of the URL that answered last: calls start there. */
  #current = 0;

  constructor(opts: DsecClientOptions = {}) {
    const given = opts.apiUrl ?? process.env.DSEC_API_URL ?? DEFAULT_API_URL;
    const list = (typeof given === 'string' ? given.split(',') : [...given]).map((u) => u.trim()).filter(Boolean);
    if (list.length === 0) throw invalidArgument('apiUrl', 'no URL given');
    const urls = list.map((apiUrl) => {
      let url: URL;
      try {
        url = new URL(apiUrl);
      } catch {
        throw invalidArgument('apiUrl', `not a URL: ${apiUrl}`);
      }
      if (url.protocol !== 'http:' && url.protocol !== 'https:') throw invalidArgument('apiUrl', 'must be http: or https:');
      return url;
    });
    const timeout = opts.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
    if (!Number.isFinite(timeout) || timeout < 0) throw invalidArgument('requestTimeoutMs', 'must be >= 0');
    this.apiUrls = urls.map((u) => u.toString().replace(/\/$/, ''));
    this.apiUrl = this.apiUrls[0]!;
    this.requestTimeoutMs = timeout;
    const apiKey = opts.apiKey ?? process.env.DSEC_API_KEY ?? undefined;
    this.#targets = urls.map((apiUrl) => ({ apiUrl, apiKey }));
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
    return this.#failover(req, (target) => send(target, { ...req, ...this.#deadline(req, opts) }));
  }

  /** Sends a request and returns the reply with its body unread. */
  async stream(req: ClientRequest, opts: CallOptions = {}): Promise<HttpStreamReply> {
    return this.#failover(req, (target) => send(target, { ...req, ...this.#deadline(req, opts), stream: true }));
  }

  /**
   * Sends through the URL that answered last and, when it cannot be reached or answers 503,
   * through the next ones: always when the request never reached a server (refused, no route);
   * after a reset or a 503 only when repeating it is harmless (GET, PUT, DELETE, or an
   * `Idempotency-Key`). A streamed request body cannot be sent twice: it never fails over.
   */
  async #failover<T>(req: ClientRequest, attempt: (target: HttpTarget) => Promise<T>): Promise<T> {
    const n = this.#targets.length;
    const start = this.#current;
    const repeatable = req.method === 'GET' || req.method === 'PUT' || req.method === 'DELETE' || hasIdempotencyKey(req.headers);
    const replayable = !isBodyStream(req.body);
    for (let i = 0; ; i++) {
      const at = (start + i) % n;
      try {
        const reply = await attempt(this.#targets[at]!);
        this.#current = at;
        return reply;
      } catch (err) {
        if (i + 1 >= n || !replayable || req.signal?.aborted || !worthFailingOver(err, repeatable)) throw err;
      }
    }
  }

  /** Sends a request and parses the JSON reply. */
  async json<T>(req: ClientRequest, opts: CallOptions = {}): Promise<T> {
    const reply = await this.request(req, opts);
    return JSON.parse(reply.body.toString('utf8')) as T;
  }

  /** Target for transports that do not go through {@link send} (WebSocket): the URL that answered last. */
  get target(): Readonly<HttpTarget> {
    return this.#targets[this.#current]!;
  }

  #deadline(req: ClientRequest, opts: CallOptions): { timeoutMs: number; signal?: AbortSignal } {
    const timeoutMs = req.timeoutMs ?? opts.requestTimeoutMs ?? this.requestTimeoutMs;
    const signal = req.signal ?? opts.signal;
    return signal ? { timeoutMs, signal } : { timeoutMs };
  }
}

/** Errors of a request that never reached a server: any request may go to the next URL. */
const NEVER_SENT = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EHOSTUNREACH', 'ENETUNREACH', 'EAI_AGAIN', 'EADDRNOTAVAIL']);

function hasIdempotencyKey(headers: Record<string, string> | undefined): boolean {
  if (!headers) return false;
  const name = IDEMPOTENCY_KEY_HEADER.toLowerCase();
  return Object.keys(headers).some((h) => h.toLowerCase() === name);
}

/** Whether a failed request goes on to the next API URL. */
function worthFailingOver(err: unknown, repeatable: boolean): boolean {
  if (!(err instanceof DsecError)) return false;
  const errno = typeof err.details.errno === 'string' ? err.details.errno : undefined;
  if (errno !== undefined && NEVER_SENT.has(errno)) return true;
  if (!repeatable) return false;
  // A reset or an unavailable replica (its store unreachable, shutting down).
  return err.code === 'UNAVAILABLE' || err.status === 503;
}

/** How static helpers such as `Sandbox.create` find their client. */
export type ConnectionOptions = DsecClientOptions & { client?: DsecClient };

/** The given client, or a new one from the options. */
export function clientFrom(opts: ConnectionOptions = {}): DsecClient {
  if (opts.client) return opts.client;
  const { client: _ignored, ...rest } = opts;
  return new DsecClient(rest);
}
