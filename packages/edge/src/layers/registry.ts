// A client of the OCI distribution API (the registry protocol that Docker's registry, Harbor,
// GHCR, ECR and zot all speak): blobs pushed and pulled by digest, manifests by tag or digest,
// and both ways of signing in that registries use (Basic, and Bearer tokens from the realm a
// 401 names). Every failure to reach the registry is UNAVAILABLE with a Retry-After hint, so a
// create that needs a layer the registry cannot give answers 503, not 500.
import { createHash } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import { Readable, Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { ReadableStream as WebReadableStream } from 'node:stream/web';
// The errors alone: the lazy server imports this module, and the schemas (zod) would double its start.
import { DsecError } from '@dsec/protocol/errors';

/** A registry and the credentials to use there. */
export interface RegistryEndpoint {
  /** `http://host:port` or `https://host`. */
  url: string;
  username?: string | undefined;
  password?: string | undefined;
}

/** A manifest as fetched: its bytes, media type and digest. */
export interface FetchedManifest {
  mediaType: string;
  body: Buffer;
  digest: string;
}

/** How long a registry is given to answer one request's headers, in ms. */
const REQUEST_TIMEOUT_MS = 30_000;
/**
 * Slowest transfer rate a blob upload or download is given time for (bytes per ms, 8 MiB/s): its
 * deadline is REQUEST_TIMEOUT_MS plus its size at this rate, so that a GiB-sized layer on a
 * cluster link is not cut off at 30 s.
 */
const MIN_TRANSFER_BYTES_PER_MS = (8 * 1024 * 1024) / 1000;

/** The deadline of a request that carries `bytes` of blob. */
function transferTimeoutMs(bytes: number): number {
  return REQUEST_TIMEOUT_MS + Math.ceil(bytes / MIN_TRANSFER_BYTES_PER_MS);
}
/** Retry hint of an unreachable registry. */
const RETRY_AFTER_MS = 5_000;
/** Largest manifest or token reply read into memory. */
const MAX_DOCUMENT_BYTES = 4 * 1024 * 1024;
const DIGEST_RE = /^sha256:[0-9a-f]{64}$/;

/** UNAVAILABLE naming the registry (503 with Retry-After at the API). */
function unavailable(url: string, why: string): DsecError {
  return new DsecError('UNAVAILABLE', `registry ${url}: ${why}`, { registry: url, retryAfterMs: RETRY_AFTER_MS });
}

/** One challenge of a `WWW-Authenticate` header. */
function parseChallenge(header: string): { scheme: string; params: Record<string, string> } {
  const space = header.indexOf(' ');
  const scheme = (space < 0 ? header : header.slice(0, space)).toLowerCase();
  const params: Record<string, string> = {};
  for (const m of header.slice(space + 1).matchAll(/([a-zA-Z_]+)="([^"]*)"/g)) params[m[1]!.toLowerCase()] = m[2]!;
  return { scheme, params };
}

/** Reads a body of at most `max` bytes. */
async function readLimited(res: Response, max: number, what: string, url: string): Promise<Buffer> {
  const declared = Number(res.headers.get('content-length') ?? '0');
  if (declared > max) throw unavailable(url, `${what} of ${declared} bytes is over the limit of ${max}`);
  const chunks: Buffer[] = [];
  let n = 0;
  for await (const chunk of res.body ?? []) {
    n += (chunk as Uint8Array).byteLength;
    if (n > max) throw unavailable(url, `${what} is over the limit of ${max} bytes`);
    chunks.push(Buffer.from(chunk as Uint8Array));
  }
  return Buffer.concat(chunks);
}

/** A client of one registry. */
export class RegistryClient {
  readonly url: string;
  /** `Authorization` header values by scope; Basic applies to every scope. */
  private readonly tokens = new Map<string, string>();
  private basic: string | undefined;

  constructor(private readonly endpoint: RegistryEndpoint) {
    this.url = endpoint.url.replace(/\/+$/, '');
  }

  /** The registry's host (and port), as image references name it. */
  get host(): string {
    return new URL(this.url).host;
  }

  /** Whether the repository holds the blob. */
  async hasBlob(repo: string, digest: string, signal?: AbortSignal): Promise<boolean> {
    const res = await this.request('HEAD', `/v2/${repo}/blobs/${digest}`, { scope: `repository:${repo}:pull`, signal });
    await res.body?.cancel();
    if (res.status === 404) return false;
    if (res.ok) return true;
    throw this.refusal(res, `HEAD blob ${digest}`);
  }

  /** Uploads the file at `path` as the blob `digest` (monolithic upload), unless it is there. */
  async pushBlob(repo: string, digest: string, path: string, size: number, signal?: AbortSignal): Promise<void> {
    if (await this.hasBlob(repo, digest, signal)) return;
    const scope = `repository:${repo}:pull,push`;
    const start = await this.request('POST', `/v2/${repo}/blobs/uploads/`, { scope, signal, headers: { 'content-length': '0' } });
    await start.body?.cancel();
    const location = start.headers.get('location');
    if (start.status !== 202 || location === null) throw this.refusal(start, `start upload of ${digest}`);
    const put = new URL(location, this.url);
    put.searchParams.set('digest', digest);
    const res = await this.request('PUT', put.pathname + put.search, {
      scope,
      signal,
      timeoutMs: transferTimeoutMs(size),
      headers: { 'content-type': 'application/octet-stream', 'content-length': String(size) },
      body: () => Readable.toWeb(createReadStream(path)) as ReadableStream<Uint8Array>,
    });
    await res.body?.cancel();
    if (res.status !== 201) throw this.refusal(res, `upload of ${digest}`);
  }

  /**
   * Downloads the blob `digest` to `dest`, checking its size (at most `maxBytes`) and digest on
   * the way: a registry that serves other bytes is refused and the file is not to be used.
   */
  async pullBlob(repo: string, digest: string, dest: string, maxBytes: number, signal?: AbortSignal): Promise<number> {
    if (!DIGEST_RE.test(digest)) throw new DsecError('LAYER_INVALID', `not a sha256 digest: ${digest}`, { digest });
    const res = await this.request('GET', `/v2/${repo}/blobs/${digest}`, { scope: `repository:${repo}:pull`, signal, timeoutMs: transferTimeoutMs(maxBytes) });
    if (!res.ok || res.body === null) {
      await res.body?.cancel();
      throw this.refusal(res, `blob ${digest}`);
    }
    const hash = createHash('sha256');
    let n = 0;
    const url = this.url;
    const check = new Transform({
      transform(chunk: Buffer, _enc, done) {
        n += chunk.length;
        if (n > maxBytes) return done(new DsecError('LAYER_INVALID', `blob ${digest} from ${url} is over ${maxBytes} bytes`, { digest }));
        hash.update(chunk);
        done(null, chunk);
      },
    });
    try {
      await pipeline(Readable.fromWeb(res.body as WebReadableStream<Uint8Array>), check, createWriteStream(dest), ...(signal ? [{ signal }] : []));
    } catch (err) {
      if (err instanceof DsecError || signal?.aborted) throw err;
      throw unavailable(this.url, `download of ${digest} broke off: ${(err as Error).message}`);
    }
    if (`sha256:${hash.digest('hex')}` !== digest)
      throw new DsecError('LAYER_INVALID', `blob from ${this.url} does not match its digest ${digest}`, { digest });
    return n;
  }

  /**
   * Bytes `[offset, offset + length)` of the blob `digest`, by HTTP range request (a lazily
   * loaded layer's chunk). The caller checks them against the chunk's own digest.
   */
  async blobRange(repo: string, digest: string, offset: number, length: number, signal?: AbortSignal): Promise<Buffer> {
    if (!DIGEST_RE.test(digest)) throw new DsecError('LAYER_INVALID', `not a sha256 digest: ${digest}`, { digest });
    const res = await this.request('GET', `/v2/${repo}/blobs/${digest}`, {
      scope: `repository:${repo}:pull`,
      signal,
      headers: { range: `bytes=${offset}-${offset + length - 1}` },
    });
    if (res.status !== 206) {
      await res.body?.cancel();
      if (res.ok) throw unavailable(this.url, `blob ${digest}: the registry does not answer range requests`);
      throw this.refusal(res, `blob ${digest} range ${offset}+${length}`);
    }
    let body: Buffer;
    try {
      body = await readLimited(res, length, `range of ${digest}`, this.url);
    } catch (err) {
      if (err instanceof DsecError || signal?.aborted) throw err;
      throw unavailable(this.url, `range of ${digest} broke off: ${(err as Error).message}`);
    }
    if (body.length !== length) throw unavailable(this.url, `range of ${digest}: ${body.length} bytes instead of ${length}`);
    return body;
  }

  /** Stores a manifest under `ref` (a tag); returns its digest. */
  async putManifest(repo: string, ref: string, mediaType: string, body: Buffer, signal?: AbortSignal): Promise<string> {
    const res = await this.request('PUT', `/v2/${repo}/manifests/${ref}`, {
      scope: `repository:${repo}:pull,push`,
      signal,
      headers: { 'content-type': mediaType, 'content-length': String(body.length) },
      body: () => body,
    });
    await res.body?.cancel();
    if (res.status !== 201) throw this.refusal(res, `manifest ${ref}`);
    return `sha256:${createHash('sha256').update(body).digest('hex')}`;
  }

  /** A manifest by tag or digest; undefined when the registry has none. */
  async manifest(repo: string, ref: string, accept: string[], signal?: AbortSignal): Promise<FetchedManifest | undefined> {
    const res = await this.request('GET', `/v2/${repo}/manifests/${ref}`, { scope: `repository:${repo}:pull`, signal, headers: { accept: accept.join(', ') } });
    if (res.status === 404) {
      await res.body?.cancel();
      return undefined;
    }
    if (!res.ok) {
      await res.body?.cancel();
      throw this.refusal(res, `manifest ${ref}`);
    }
    const body = await readLimited(res, MAX_DOCUMENT_BYTES, 'manifest', this.url);
    const digest = `sha256:${createHash('sha256').update(body).digest('hex')}`;
    if (ref.startsWith('sha256:') && ref !== digest) throw new DsecError('LAYER_INVALID', `manifest from ${this.url} does not match ${ref}`, { digest: ref });
    return { mediaType: (res.headers.get('content-type') ?? '').split(';')[0]!.trim(), body, digest };
  }

  /** The error for an answer that is not the one expected. */
  private refusal(res: Response, what: string): DsecError {
    if (res.status === 401 || res.status === 403) return unavailable(this.url, `${what}: credentials refused (${res.status})`);
    return unavailable(this.url, `${what}: HTTP ${res.status}`);
  }

  /**
   * One request, signed in: with the Authorization that worked before for its scope; on a 401,
   * with what the challenge asks (Basic, or a Bearer token from its realm), once.
   */
  private async request(
    method: string,
    path: string,
    opts: {
      scope: string;
      signal?: AbortSignal | undefined;
      headers?: Record<string, string>;
      body?: () => NonNullable<RequestInit['body']>;
      /** Deadline of the whole exchange, body included; default REQUEST_TIMEOUT_MS. */
      timeoutMs?: number;
    },
  ): Promise<Response> {
    const send = async (auth: string | undefined): Promise<Response> => {
      const headers: Record<string, string> = { ...opts.headers };
      if (auth !== undefined) headers.authorization = auth;
      const signals = [AbortSignal.timeout(opts.timeoutMs ?? REQUEST_TIMEOUT_MS), ...(opts.signal ? [opts.signal] : [])];
      const body = opts.body?.();
      try {
        const init: RequestInit & { duplex?: 'half' } = { method, headers, signal: AbortSignal.any(signals), redirect: 'follow' };
        if (body !== undefined) Object.assign(init, { body, duplex: 'half' });
        return await fetch(this.url + path, init);
      } catch (err) {
        if (opts.signal?.aborted) throw err;
        const cause = (err as { cause?: { code?: string; message?: string } }).cause;
        throw unavailable(this.url, cause?.code ?? cause?.message ?? (err as Error).message);
      }
    };
    const res = await send(this.tokens.get(opts.scope) ?? this.basic);
    if (res.status !== 401) return res;
    const challenge = parseChallenge(res.headers.get('www-authenticate') ?? '');
    await res.body?.cancel();
    const auth = await this.signIn(challenge, opts.scope, opts.signal);
    if (auth === undefined) return res;
    return send(auth);
  }

  /** The Authorization for a challenge; undefined when there are no credentials to answer it. */
  private async signIn(challenge: { scheme: string; params: Record<string, string> }, scope: string, signal?: AbortSignal): Promise<string | undefined> {
    const { username, password } = this.endpoint;
    const basic = username !== undefined ? `Basic ${Buffer.from(`${username}:${password ?? ''}`).toString('base64')}` : undefined;
    if (challenge.scheme === 'basic') {
      this.basic = basic;
      return basic;
    }
    if (challenge.scheme !== 'bearer' || challenge.params.realm === undefined) return undefined;
    const realm = new URL(challenge.params.realm);
    if (challenge.params.service !== undefined) realm.searchParams.set('service', challenge.params.service);
    realm.searchParams.set('scope', scope);
    let res: Response;
    try {
      res = await fetch(realm, {
        headers: basic ? { authorization: basic } : {},
        signal: AbortSignal.any([AbortSignal.timeout(REQUEST_TIMEOUT_MS), ...(signal ? [signal] : [])]),
      });
    } catch (err) {
      throw unavailable(this.url, `token service ${realm.origin}: ${(err as Error).message}`);
    }
    if (!res.ok) {
      await res.body?.cancel();
      throw unavailable(this.url, `token service refused the credentials (${res.status})`);
    }
    const reply = JSON.parse((await readLimited(res, MAX_DOCUMENT_BYTES, 'token', this.url)).toString('utf8')) as { token?: unknown; access_token?: unknown };
    const token = typeof reply.token === 'string' ? reply.token : typeof reply.access_token === 'string' ? reply.access_token : undefined;
    if (token === undefined) throw unavailable(this.url, 'token service answered no token');
    const auth = `Bearer ${token}`;
    this.tokens.set(scope, auth);
    return auth;
  }
}
