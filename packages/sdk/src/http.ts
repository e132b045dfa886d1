// The one place where HTTP happens: keep-alive requests, deadlines combined with the caller's
// signal, and every non-2xx reply or network failure turned into a DsecError.
import http from 'node:http';
import https from 'node:https';
import { Readable } from 'node:stream';
import { DsecError, ERROR_STATUS } from '@dsec/protocol';
import type { ErrorCode, ErrorDetails } from '@dsec/protocol';

/** Shared keep-alive agents: every client in the process reuses the same connections. */
const HTTP_AGENT = new http.Agent({ keepAlive: true, maxSockets: 256 });
const HTTPS_AGENT = new https.Agent({ keepAlive: true, maxSockets: 256 });

/** Query values; arrays repeat the key (`label=a=1&label=b=2`), undefined is left out. */
export type QueryValues = Record<string, string | number | boolean | readonly string[] | undefined>;

/** What to send. A plain object body is sent as JSON. */
export interface HttpRequestOptions {
  method: 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';
  path: string;
  query?: QueryValues | undefined;
  body?: Buffer | string | Readable | AsyncIterable<Uint8Array> | object | undefined;
  contentType?: string;
  accept?: string;
  /** Extra request headers (such as `Idempotency-Key`). */
  headers?: Record<string, string> | undefined;
  /** Caller's signal; it also covers a streamed reply body. */
  signal?: AbortSignal | undefined;
  /**
   * Deadline for the whole exchange, body included (ms). With `stream: true` it covers only the
   * wait for the reply headers. 0 means none.
   */
  timeoutMs: number;
  /** Hand the reply body back unread (for ndjson, tar and downloads). */
  stream?: boolean;
  /** Called with the bytes written so far of a streamed request body. */
  onUploadProgress?: ((bytesSent: number) => void) | undefined;
}

/** A reply whose body has been read. */
export interface HttpReply {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

/** A reply whose body is still a stream. */
export interface HttpStreamReply {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: http.IncomingMessage;
}

/** Where to send requests and with which key. */
export interface HttpTarget {
  apiUrl: URL;
  apiKey: string | undefined;
}

/** Builds `path?query` with repeated keys for arrays. */
export function buildPath(path: string, query: QueryValues | undefined): string {
  if (!query) return path;
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(query)) {
    if (value === undefined) continue;
    if (Array.isArray(value)) for (const v of value as readonly string[]) params.append(key, v);
    else params.append(key, String(value));
  }
  const qs = params.toString();
  return qs ? `${path}?${qs}` : path;
}

/** True for a body that is a stream (it can be sent only once). */
export function isBodyStream(body: unknown): body is Readable | AsyncIterable<Uint8Array> {
  return body instanceof Readable || (typeof body === 'object' && body !== null && Symbol.asyncIterator in body);
}

/** Sends one request; resolves when the reply headers arrive (2xx) or rejects with a DsecError. */
export async function send(target: HttpTarget, opts: HttpRequestOptions & { stream: true }): Promise<HttpStreamReply>;
export async function send(target: HttpTarget, opts: HttpRequestOptions): Promise<HttpReply>;
export async function send(target: HttpTarget, opts: HttpRequestOptions): Promise<HttpReply | HttpStreamReply> {
  try {
    return await sendOnce(target, opts);
  } catch (err) {
    // A kept-alive socket the server closed while idle fails at once; repeat reads once.
    if (opts.method === 'GET' && err instanceof DsecError && err.details.staleSocket === true) return sendOnce(target, opts);
    throw err;
  }
}

async function sendOnce(target: HttpTarget, opts: HttpRequestOptions): Promise<HttpReply | HttpStreamReply> {
  opts.signal?.throwIfAborted();
  const what = `${opts.method} ${opts.path}`;
  const headers: Record<string, string> = { ...opts.headers, accept: opts.accept ?? 'application/json' };
  if (target.apiKey) headers.authorization = `Bearer ${target.apiKey}`;
  let payload: Buffer | undefined;
  let bodyStream: Readable | undefined;
  const body = opts.body;
  if (body === undefined) {
    if (opts.method === 'POST' || opts.method === 'PUT' || opts.method === 'PATCH') payload = Buffer.alloc(0);
  } else if (Buffer.isBuffer(body) || body instanceof Uint8Array) {
    payload = Buffer.from(body.buffer, body.byteOffset, body.byteLength);
    headers['content-type'] = opts.contentType ?? 'application/octet-stream';
  } else if (typeof body === 'string') {
    payload = Buffer.from(body);
    headers['content-type'] = opts.contentType ?? 'text/plain; charset=utf-8';
  } else if (isBodyStream(body)) {
    bodyStream = body instanceof Readable ? body : Readable.from(body);
    headers['content-type'] = opts.contentType ?? 'application/octet-stream';
  } else {
    payload = Buffer.from(JSON.stringify(body));
    headers['content-type'] = 'application/json';
  }
  if (payload) headers['content-length'] = String(payload.length);

  const url = target.apiUrl;
  const isHttps = url.protocol === 'https:';
  const basePath = url.pathname.replace(/\/$/, '');
  const reqOpts: http.RequestOptions = {
    method: opts.method,
    host: url.hostname.replace(/^\[|\]$/g, ''),
    port: url.port || (isHttps ? 443 : 80),
    path: basePath + buildPath(opts.path, opts.query),
    headers,
    agent: isHttps ? HTTPS_AGENT : HTTP_AGENT,
  };

  // The deadline covers the whole exchange, or only the wait for headers of a streamed reply;
  // the caller's signal covers everything, the streamed body included.
  const req = (isHttps ? https : http).request(reqOpts);
  let timedOut = false;
  const timer =
    opts.timeoutMs > 0
      ? setTimeout(() => {
          timedOut = true;
          req.destroy(new DsecError('TIMEOUT', `${what}: no reply within ${opts.timeoutMs} ms`, { timeoutMs: opts.timeoutMs }));
        }, opts.timeoutMs)
      : undefined;
  const onAbort = (): void => {
    req.destroy(opts.signal?.reason instanceof Error ? opts.signal.reason : new Error('aborted'));
  };
  opts.signal?.addEventListener('abort', onAbort, { once: true });
  const cleanup = (): void => {
    clearTimeout(timer);
    opts.signal?.removeEventListener('abort', onAbort);
  };
  const failure = (err: unknown): unknown => {
    if (opts.signal?.aborted) return opts.signal.reason;
    if (timedOut || err instanceof DsecError) return err;
    return networkError(err, url);
  };

  let res: http.IncomingMessage;
  try {
    res = await new Promise<http.IncomingMessage>((resolve, reject) => {
      req.on('response', resolve);
      req.on('error', reject);
      if (bodyStream) {
        let sent = 0;
        const onProgress = opts.onUploadProgress;
        if (onProgress) {
          bodyStream.on('data', (chunk: Buffer) => {
            sent += chunk.length;
            onProgress(sent);
          });
        }
        bodyStream.on('error', (err) => req.destroy(err));
        bodyStream.pipe(req);
      } else {
        req.end(payload);
      }
    });
  } catch (err) {
    cleanup();
    bodyStream?.destroy();
    const e = failure(err);
    const errno = (err as NodeJS.ErrnoException).code;
    if (req.reusedSocket && (errno === 'ECONNRESET' || errno === 'EPIPE') && e instanceof DsecError) e.details.staleSocket = true;
    throw e;
  }

  try {
    if (res.statusCode === undefined || res.statusCode < 200 || res.statusCode >= 300) {
      const raw = await readAll(res).catch(() => Buffer.alloc(0));
      throw errorFromReply(res.statusCode ?? 0, raw, res.headers);
    }
    if (opts.stream) {
      clearTimeout(timer);
      res.once('close', cleanup);
      return { status: res.statusCode, headers: res.headers, body: res };
    }
    return { status: res.statusCode, headers: res.headers, body: await readAll(res) };
  } catch (err) {
    throw failure(err);
  } finally {
    if (!opts.stream || res.destroyed || res.readableEnded) cleanup();
  }
}

/**
 * Reads a whole body. On its events rather than an async iterator: the iterator's machinery was
 * a visible share of a small request's client time (issue 15). A stream that closes before its
 * end (the connection reset) rejects, as the iterator did.
 */
export function readAll(stream: NodeJS.ReadableStream): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let ended = false;
    stream.on('data', (chunk: Buffer | string) => void chunks.push(typeof chunk === 'string' ? Buffer.from(chunk) : chunk));
    stream.once('end', () => {
      ended = true;
      resolve(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks));
    });
    stream.once('error', reject);
    stream.once('close', () => {
      if (!ended) reject(Object.assign(new Error('the reply ended before its body did'), { code: 'ERR_STREAM_PREMATURE_CLOSE' }));
    });
  });
}

/** A failure below HTTP (refused, reset, DNS) as `UNAVAILABLE`. */
export function networkError(err: unknown, url: URL): DsecError {
  if (err instanceof DsecError) return err;
  const e = err as NodeJS.ErrnoException;
  return new DsecError(
    'UNAVAILABLE',
    `cannot reach ${url.origin}: ${e?.code ?? ''} ${e?.message ?? String(err)}`.replace(/\s+/g, ' ').trim(),
    e?.code ? { errno: e.code } : {},
    { cause: err },
  );
}

const STATUS_FALLBACK: Record<number, ErrorCode> = {
  400: 'INVALID_ARGUMENT',
  401: 'UNAUTHENTICATED',
  403: 'PERMISSION_DENIED',
  404: 'NOT_FOUND',
  409: 'CONFLICT',
  413: 'PAYLOAD_TOO_LARGE',
  422: 'LAYER_INVALID',
  429: 'RATE_LIMITED',
  502: 'BACKEND_FAILED',
  503: 'UNAVAILABLE',
  504: 'TIMEOUT',
};

/** Turns an error reply (`{error: {code, message, ...}}`) into a DsecError. */
export function errorFromReply(status: number, raw: Buffer, headers: http.IncomingHttpHeaders = {}): DsecError {
  let code: ErrorCode = STATUS_FALLBACK[status] ?? 'INTERNAL';
  let message = `HTTP ${status}`;
  let details: ErrorDetails = {};
  try {
    const parsed = JSON.parse(raw.toString('utf8')) as { error?: { code?: unknown; message?: unknown } & ErrorDetails };
    if (parsed.error && typeof parsed.error === 'object') {
      const { code: c, message: m, ...rest } = parsed.error;
      if (typeof c === 'string' && c in ERROR_STATUS) code = c as ErrorCode;
      if (typeof m === 'string') message = m;
      details = rest;
    }
  } catch {
    const text = raw.toString('utf8').trim();
    if (text) message = `HTTP ${status}: ${text.slice(0, 200)}`;
  }
  const retryAfter = headers['retry-after'];
  if (details.retryAfterMs === undefined && typeof retryAfter === 'string' && /^\d+$/.test(retryAfter)) {
    details.retryAfterMs = Number(retryAfter) * 1000;
  }
  const err = new DsecError(code, message, details);
  // The server's status wins when its code is unknown to this SDK version.
  if (err.status !== status && status !== 0) Object.defineProperty(err, 'status', { value: status });
  return err;
}
