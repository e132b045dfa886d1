// Serves requests for mirrored registry names from the node's mirror cache, through the
// ecosystem's adapter (freeze, URL rewriting). The proxy decides who may ask; this decides what
// they get.
import { readFile } from 'node:fs/promises';
import type { Readable } from 'node:stream';
import type { Mirror, NetworkPreset } from '@dsec/protocol';
import type { MirrorAdapter, MirrorContext, MirrorRequest, MirrorTransform } from './adapter.js';
import { DEFAULT_MIRROR_FETCH_TIMEOUT_MS, MirrorCache, upstreamGet } from './cache.js';
import type { MirrorCacheOptions, MirrorCacheStats, MirrorObject, UpstreamAgents } from './cache.js';
import { DebianMirrorAdapter } from './debian.js';
import { NpmMirrorAdapter } from './npm.js';
import { PypiMirrorAdapter } from './pypi.js';

/** How long an unfrozen mirror's metadata is served from the cache before it is fetched again. */
export const DEFAULT_METADATA_TTL_MS = 5 * 60_000;
/** Largest metadata document parsed (npm's biggest packuments are tens of MiB). */
export const MAX_METADATA_BYTES = 128 * 1024 ** 2;
/** Memory for transformed metadata documents kept ready (per cutoff and public name). */
const TRANSFORM_MEMO_BYTES = 64 * 1024 ** 2;

/** Options of {@link MirrorService}. */
export interface MirrorServiceOptions extends Omit<MirrorCacheOptions, 'dir'> {
  /** Directory of the on-disk cache (under the edge home). */
  cacheDir: string;
  /**
   * Origins (`http://mirror.internal:4873`) a policy's mirror may name as its upstream, besides
   * each ecosystem's public registry. Any other upstream is refused: the node fetches it, so the
   * node's operator decides where from. Default: none (public registries only).
   */
  origins?: readonly string[];
  /** Metadata TTL for unfrozen mirrors in ms. Default {@link DEFAULT_METADATA_TTL_MS}. */
  metadataTtlMs?: number;
  /** Adapters by preset. Default: npm, PyPI, Debian. */
  adapters?: readonly MirrorAdapter[];
}

/** What the proxy sends back for a mirrored request. */
export interface MirrorResponse {
  status: number;
  headers: Record<string, string>;
  /** Body: bytes, a cached file, or an upstream stream (uncached passthrough). */
  body?: Buffer | { file: string; size: number } | Readable;
  /** Set when the answer hides something because of the freeze. */
  hidden?: boolean;
  /** For the log: how it was served, or why not. */
  detail: string;
  /** Set when the request was refused because its upstream URL would leave the mirror's upstream (an egress denial). */
  refused?: 'mirror-path';
}

/**
 * True when an origin-form path carries a spelling that moves a naively built URL elsewhere:
 * empty segments (`//host`), backslashes, encoded separators or dots, dot segments, a scheme,
 * userinfo, or anything that does not start with a single `/`.
 */
export function escapesBase(path: string): boolean {
  const q = path.indexOf('?');
  const pathname = q >= 0 ? path.slice(0, q) : path;
  if (!pathname.startsWith('/') || pathname.startsWith('//') || pathname.includes('//')) return true;
  // eslint-disable-next-line no-control-regex -- control characters are exactly what is refused
  if (/[\\@:#\s\x00-\x1f\x7f]|%(2f|5c|2e|00|40|3a|23)/i.test(pathname.replace(/^\/@[^/%]+%2f/i, '/'))) return true;
  if (/(^|\/)\.{1,2}(\/|$)/.test(pathname)) return true;
  try {
    return new URL(pathname, 'http://mirror.invalid/base/').origin !== 'http://mirror.invalid';
  } catch {
    return true;
  }
}

/**
 * The upstream URL of a request path (relative to the base), or undefined when it would leave
 * the base: another origin, userinfo, or a path outside the base's.
 */
export function upstreamUrl(base: string, relativePath: string): URL | undefined {
  let b: URL;
  let u: URL;
  try {
    b = new URL(base);
    u = new URL(relativePath, b);
  } catch {
    return undefined;
  }
  if (/^[a-z][a-z0-9+.-]*:|^[/\\]/i.test(relativePath)) return undefined;
  if (u.origin !== b.origin || u.username !== '' || u.password !== '' || !u.pathname.startsWith(b.pathname)) return undefined;
  return u;
}

/** A mirror of a policy matched to its adapter. */
export interface MirrorMatch {
  preset: NetworkPreset;
  mirror: Mirror;
  adapter: MirrorAdapter;
}

/** The adapters a node has unless told otherwise. */
export function defaultMirrorAdapters(): MirrorAdapter[] {
  return [new NpmMirrorAdapter(), new PypiMirrorAdapter(), new DebianMirrorAdapter()];
}

/** The mirror of `mirrors` (a policy's, by preset) that serves `host`, if any. */
export function matchMirror(
  adapters: readonly MirrorAdapter[],
  mirrors: Readonly<Partial<Record<NetworkPreset, Mirror>>>,
  host: string,
): MirrorMatch | undefined {
  for (const adapter of adapters) {
    const mirror = mirrors[adapter.preset];
    if (mirror && adapter.hosts.includes(host)) return { preset: adapter.preset, mirror, adapter };
  }
  return undefined;
}

/** Where a mirror fetches from: its upstream, or the ecosystem's public registry. */
export function upstreamOf(m: MirrorMatch): string {
  return m.mirror.upstream ?? m.adapter.defaultUpstream;
}

const text = (status: number, message: string, extra: Partial<MirrorResponse> = {}): MirrorResponse => ({
  status,
  headers: { 'content-type': 'text/plain; charset=utf-8' },
  body: Buffer.from(message + '\n'),
  detail: message,
  ...extra,
});

/** The node's package mirrors. */
export class MirrorService {
  private readonly origins: Set<string>;
  private readonly metadataTtlMs: number;
  private readonly fetchTimeoutMs: number;
  private readonly memo = new Map<string, { value: MirrorTransform | undefined; bytes: number }>();
  private memoBytes = 0;

  private constructor(
    readonly cache: MirrorCache,
    opts: MirrorServiceOptions,
  ) {
    this.origins = new Set((opts.origins ?? []).map((o) => new URL(o).origin));
    this.metadataTtlMs = opts.metadataTtlMs ?? DEFAULT_METADATA_TTL_MS;
    this.fetchTimeoutMs = opts.fetchTimeoutMs ?? DEFAULT_MIRROR_FETCH_TIMEOUT_MS;
    this.agentFor = opts.agentFor;
  }

  private readonly agentFor: UpstreamAgents | undefined;

  /** Opens the cache and the adapters. */
  static async open(opts: MirrorServiceOptions): Promise<MirrorService> {
    const cache = await MirrorCache.open({ ...opts, dir: opts.cacheDir });
    return new MirrorService(cache, opts);
  }

  /** Cache counters. */
  stats(): MirrorCacheStats {
    return this.cache.stats();
  }

  /** Whether the node may fetch the mirror's upstream (the public registry or a configured origin). */
  upstreamAllowed(m: MirrorMatch): boolean {
    try {
      const u = new URL(upstreamOf(m));
      if (u.protocol !== 'http:' && u.protocol !== 'https:') return false;
      return u.origin === new URL(m.adapter.defaultUpstream).origin || this.origins.has(u.origin);
    } catch {
      return false;
    }
  }

  /** Serves a GET or HEAD of `path` on the public name `publicBase` from the route's mirror. */
  async serve(m: MirrorMatch, method: string, host: string, publicBase: string, path: string): Promise<MirrorResponse> {
    if (method !== 'GET' && method !== 'HEAD')
      return text(405, `${method}: a package mirror is read-only`, { headers: { 'content-type': 'text/plain; charset=utf-8', allow: 'GET, HEAD' } });
    if (!this.upstreamAllowed(m)) return text(502, `mirror upstream ${upstreamOf(m)} is not configured on this node`);
    const cutoff = m.mirror.freeze !== undefined ? new Date(m.mirror.freeze) : undefined;
    if (cutoff && Number.isNaN(cutoff.getTime())) return text(502, `mirror freeze is not a date: ${m.mirror.freeze}`);
    const req = m.adapter.classify(host, path, cutoff);
    if (!req) {
      if (escapesBase(path)) return text(403, `${path.slice(0, 200)}: a path that could leave the mirror's upstream is refused`, { refused: 'mirror-path' });
      return text(404, `${path}: not served by the ${m.adapter.preset} mirror`);
    }
    const ctx: MirrorContext = { publicBase, upstreamBase: m.adapter.upstreamBase(upstreamOf(m), cutoff, req.host ?? host), ...(cutoff ? { cutoff } : {}) };
    const metaCtx: MirrorContext = req.metadata ? { ...ctx, upstreamBase: m.adapter.upstreamBase(upstreamOf(m), cutoff, req.metadata.host ?? host) } : ctx;
    // Whatever an adapter built, nothing is fetched from outside the configured upstream.
    for (const [r, c] of [
      [req, ctx],
      [req.metadata, metaCtx],
    ] as const) {
      if (r && !upstreamUrl(c.upstreamBase, r.upstreamPath)) {
        return text(403, `${path.slice(0, 200)}: resolves outside the mirror's upstream ${c.upstreamBase}`, { refused: 'mirror-path' });
      }
    }
    try {
      switch (req.kind) {
        case 'metadata':
          return await this.metadata(m.adapter, req, ctx);
        case 'artifact':
          return await this.artifact(m.adapter, req, ctx, metaCtx);
        case 'other':
          return await this.other(req, ctx);
      }
    } catch (err) {
      return text(502, `mirror: ${(err as Error).message}`);
    }
  }

  private fresh(req: Pick<MirrorRequest, 'cache'>, ctx: MirrorContext): (fetchedAt: number) => boolean {
    if (req.cache === 'immutable') return () => true;
    const cutoff = ctx.cutoff?.getTime();
    // A frozen document fetched after its cutoff already lists everything it ever will.
    return (fetchedAt) => (cutoff !== undefined && fetchedAt > cutoff) || Date.now() - fetchedAt < this.metadataTtlMs;
  }

  private async transformed(
    adapter: MirrorAdapter,
    req: MirrorRequest,
    ctx: MirrorContext,
  ): Promise<{ obj: MirrorObject; value: MirrorTransform | undefined }> {
    const url = (upstreamUrl(ctx.upstreamBase, req.upstreamPath) as URL).href;
    const obj = await this.cache.get(url, { ...(req.accept ? { accept: req.accept } : {}), fresh: this.fresh(req, ctx) });
    if (obj.status !== 200 || !obj.file) return { obj, value: undefined };
    if (obj.size > MAX_METADATA_BYTES) throw new Error(`${url}: metadata of ${obj.size} bytes is over the limit`);
    const key = `${url}\n${req.accept ?? ''}\n${obj.fetchedAt}\n${ctx.cutoff?.toISOString() ?? ''}\n${ctx.publicBase}`;
    const hit = this.memo.get(key);
    if (hit) {
      this.memo.delete(key);
      this.memo.set(key, hit);
      return { obj, value: hit.value };
    }
    const value = adapter.transformMetadata(await readFile(obj.file), req, ctx);
    const bytes = (value?.body.length ?? 0) + key.length;
    this.memo.set(key, { value, bytes });
    this.memoBytes += bytes;
    for (const [k, v] of this.memo) {
      if (this.memoBytes <= TRANSFORM_MEMO_BYTES) break;
      this.memo.delete(k);
      this.memoBytes -= v.bytes;
    }
    return { obj, value };
  }

  private upstreamError(obj: MirrorObject, what: string): MirrorResponse {
    if (obj.status === 404 || obj.status === 410) return text(404, `${what}: not found on the mirror`);
    return text(502, `${what}: mirror answered ${obj.status}`);
  }

  private async metadata(adapter: MirrorAdapter, req: MirrorRequest, ctx: MirrorContext): Promise<MirrorResponse> {
    const { obj, value } = await this.transformed(adapter, req, ctx);
    if (obj.status !== 200) return this.upstreamError(obj, req.upstreamPath);
    if (!value) return text(404, `${req.upstreamPath}: nothing published before ${ctx.cutoff?.toISOString()}`, { hidden: true });
    return { status: 200, headers: { 'content-type': value.contentType, 'cache-control': 'no-cache' }, body: value.body, detail: `metadata (${obj.source})` };
  }

  private async artifact(adapter: MirrorAdapter, req: MirrorRequest, ctx: MirrorContext, metaCtx: MirrorContext): Promise<MirrorResponse> {
    let sha256: string | undefined;
    if (ctx.cutoff || (req.digestId !== undefined && req.metadata)) {
      if (!req.metadata || req.artifactId === undefined) return text(404, `${req.upstreamPath}: no metadata to check it against`, { hidden: true });
      const { obj, value } = await this.transformed(adapter, req.metadata, metaCtx);
      if (obj.status !== 200) return this.upstreamError(obj, req.metadata.upstreamPath);
      if (ctx.cutoff && !value?.artifacts.has(req.artifactId)) {
        return text(404, `${req.upstreamPath}: published after the mirror's cutoff ${ctx.cutoff.toISOString()}`, { hidden: true });
      }
      if (req.digestId !== undefined) sha256 = value?.digests?.get(req.digestId);
    }
    const url = (upstreamUrl(ctx.upstreamBase, req.upstreamPath) as URL).href;
    const obj = await this.cache.get(url, { ...(req.accept ? { accept: req.accept } : {}), fresh: this.fresh(req, ctx), ...(sha256 ? { sha256 } : {}) });
    if (obj.status !== 200 || !obj.file) return this.upstreamError(obj, req.upstreamPath);
    return {
      status: 200,
      headers: { 'content-type': obj.contentType ?? 'application/octet-stream' },
      body: { file: obj.file, size: obj.size },
      detail: `artifact (${obj.source})`,
    };
  }

  private async other(req: MirrorRequest, ctx: MirrorContext): Promise<MirrorResponse> {
    if (ctx.cutoff && !req.servedWhenFrozen) return text(404, `${req.upstreamPath}: not served by a frozen mirror`, { hidden: true });
    const url = upstreamUrl(ctx.upstreamBase, req.upstreamPath) as URL;
    if (req.cache !== 'none') {
      const obj = await this.cache.get(url.href, { ...(req.accept ? { accept: req.accept } : {}), fresh: this.fresh(req, ctx) });
      if (obj.status !== 200 || !obj.file) return this.upstreamError(obj, req.upstreamPath);
      return {
        status: 200,
        headers: { 'content-type': obj.contentType ?? 'application/octet-stream' },
        body: { file: obj.file, size: obj.size },
        detail: `passthrough (${obj.source})`,
      };
    }
    const res = await upstreamGet(url, req.accept, AbortSignal.timeout(this.fetchTimeoutMs), this.agentFor);
    const headers: Record<string, string> = {};
    const ct = res.headers['content-type'];
    if (typeof ct === 'string') headers['content-type'] = ct;
    return { status: res.statusCode ?? 502, headers, body: res, detail: 'passthrough (uncached)' };
  }
}
