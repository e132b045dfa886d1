// The node's mirror cache: upstream responses kept on local disk, one download serving every
// sandbox. Identical requests in flight are coalesced into one upstream fetch; the total size is
// bounded, least recently used objects going first.
import { createHash, randomBytes } from 'node:crypto';
import { mkdir, open, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import https from 'node:https';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import { Transform } from 'node:stream';

/** Default bound on the cache's size on disk. */
export const DEFAULT_MIRROR_CACHE_BYTES = 4 * 1024 ** 3;
/** Default bound on one cached object (a larger upstream answer fails with 502). */
export const DEFAULT_MIRROR_OBJECT_BYTES = 512 * 1024 ** 2;
/** Default time an upstream fetch may take end to end. */
export const DEFAULT_MIRROR_FETCH_TIMEOUT_MS = 120_000;
/** Bytes of a non-200 upstream body that are passed on. */
const MAX_ERROR_BODY_BYTES = 64 * 1024;
/** Same-origin redirects followed upstream. */
const MAX_REDIRECTS = 3;

/** Options of {@link MirrorCache}. */
export interface MirrorCacheOptions {
  /** Directory of the cache (created). */
  dir: string;
  /** Size bound in bytes. Default {@link DEFAULT_MIRROR_CACHE_BYTES}. */
  maxBytes?: number;
  /** Largest object in bytes. Default {@link DEFAULT_MIRROR_OBJECT_BYTES}. */
  maxObjectBytes?: number;
  /** Upstream fetch timeout in ms. Default {@link DEFAULT_MIRROR_FETCH_TIMEOUT_MS}. */
  fetchTimeoutMs?: number;
  /** The keep-alive agent for an upstream URL (the node's outbound.ts). Default: a connection per fetch. */
  agentFor?: UpstreamAgents;
}

/** Picks the agent an upstream fetch goes through. */
export type UpstreamAgents = (url: URL) => http.Agent;

/** An upstream answer: a cached file (status 200) or a small error body. */
export interface MirrorObject {
  status: number;
  contentType?: string;
  size: number;
  /** When it was fetched from upstream (ms since the epoch). */
  fetchedAt: number;
  /** The cached body (status 200). */
  file?: string;
  /** The body of a non-200 answer (not cached). */
  body?: Buffer;
  /** How this request was served. */
  source: 'cache' | 'upstream' | 'coalesced';
}

interface IndexEntry {
  key: string;
  url: string;
  contentType?: string;
  size: number;
  fetchedAt: number;
  lastUsed: number;
}

/** Counters of the cache. */
export interface MirrorCacheStats {
  objects: number;
  bytes: number;
  hits: number;
  /** Requests that went upstream. */
  upstreamFetches: number;
  /** Requests that joined a fetch already in flight. */
  coalesced: number;
  evictions: number;
}

/** The mirror cache of one node. */
export class MirrorCache {
  private readonly index = new Map<string, IndexEntry>();
  private readonly inflight = new Map<string, Promise<MirrorObject>>();
  private bytes = 0;
  private readonly counters = { hits: 0, upstreamFetches: 0, coalesced: 0, evictions: 0 };
  private readonly maxBytes: number;
  private readonly maxObjectBytes: number;
  private readonly fetchTimeoutMs: number;

  private constructor(
    private readonly dir: string,
    opts: MirrorCacheOptions,
  ) {
    this.maxBytes = opts.maxBytes ?? DEFAULT_MIRROR_CACHE_BYTES;
    this.maxObjectBytes = Math.min(opts.maxObjectBytes ?? DEFAULT_MIRROR_OBJECT_BYTES, this.maxBytes);
    this.fetchTimeoutMs = opts.fetchTimeoutMs ?? DEFAULT_MIRROR_FETCH_TIMEOUT_MS;
    this.agentFor = opts.agentFor;
  }

  private readonly agentFor: UpstreamAgents | undefined;

  /** Opens (or creates) the cache in `opts.dir`, finding the objects a previous run left. */
  static async open(opts: MirrorCacheOptions): Promise<MirrorCache> {
    const cache = new MirrorCache(opts.dir, opts);
    await mkdir(opts.dir, { recursive: true, mode: 0o700 });
    for (const name of await readdir(opts.dir)) {
      const file = path.join(opts.dir, name);
      if (name.includes('.tmp-')) {
        await rm(file, { force: true });
        continue;
      }
      if (!name.endsWith('.json')) continue;
      try {
        const entry = JSON.parse(await readFile(file, 'utf8')) as IndexEntry;
        if (typeof entry.key !== 'string' || typeof entry.size !== 'number') throw new Error('bad entry');
        cache.index.set(entry.key, entry);
        cache.bytes += entry.size;
      } catch {
        await rm(file, { force: true });
      }
    }
    await cache.evict();
    return cache;
  }

  /** Counters since the cache was opened (objects and bytes: now). */
  stats(): MirrorCacheStats {
    return { objects: this.index.size, bytes: this.bytes, ...this.counters };
  }

  private keyOf(url: string, accept: string | undefined): string {
    return createHash('sha256')
      .update(`${url}\n${accept ?? ''}`)
      .digest('hex');
  }

  private bodyPath(key: string): string {
    return path.join(this.dir, `${key}.body`);
  }

  /**
   * The object at `url`: from disk when `fresh(fetchedAt)` says the copy is good, else fetched
   * once upstream however many callers ask at the same time. When the refresh of a stale copy
   * fails (upstream down), the stale copy is served.
   */
  async get(url: string, opts: { accept?: string; fresh: (fetchedAt: number) => boolean; sha256?: string }): Promise<MirrorObject> {
    // An object whose SHA-256 the metadata gives is stored by it (content-addressed: the same
    // file reached through any URL is one object) and checked against it when fetched.
    const key = opts.sha256 ? `sha256-${opts.sha256}` : this.keyOf(url, opts.accept);
    const entry = this.index.get(key);
    if (entry && opts.fresh(entry.fetchedAt)) return this.hit(entry);
    const running = this.inflight.get(key);
    if (running) {
      this.counters.coalesced++;
      return { ...(await running), source: 'coalesced' };
    }
    const p = this.fetch(key, url, opts.accept, opts.sha256)
      .catch((err: unknown) => {
        const stale = this.index.get(key);
        if (stale) return this.hit(stale);
        throw err;
      })
      .finally(() => this.inflight.delete(key));
    this.inflight.set(key, p);
    return p;
  }

  private hit(entry: IndexEntry): MirrorObject {
    entry.lastUsed = Date.now();
    this.counters.hits++;
    return {
      status: 200,
      ...(entry.contentType ? { contentType: entry.contentType } : {}),
      size: entry.size,
      fetchedAt: entry.fetchedAt,
      file: this.bodyPath(entry.key),
      source: 'cache',
    };
  }

  private async fetch(key: string, url: string, accept: string | undefined, sha256?: string): Promise<MirrorObject> {
    this.counters.upstreamFetches++;
    const signal = AbortSignal.timeout(this.fetchTimeoutMs);
    const res = await upstreamGet(new URL(url), accept, signal, this.agentFor);
    const fetchedAt = Date.now();
    const contentType = typeof res.headers['content-type'] === 'string' ? res.headers['content-type'] : undefined;
    const ct = contentType ? { contentType } : {};
    if (res.statusCode !== 200) {
      const chunks: Buffer[] = [];
      let n = 0;
      for await (const c of res as AsyncIterable<Buffer>) {
        if (n < MAX_ERROR_BODY_BYTES) chunks.push(c.subarray(0, MAX_ERROR_BODY_BYTES - n));
        n += c.length;
      }
      const body = Buffer.concat(chunks);
      return { status: res.statusCode ?? 502, ...ct, size: body.length, fetchedAt, body, source: 'upstream' };
    }
    const declared = Number(res.headers['content-length']);
    if (Number.isFinite(declared) && declared > this.maxObjectBytes) {
      res.destroy();
      throw new Error(`${url}: ${declared} bytes is over the object limit of ${this.maxObjectBytes}`);
    }
    const tmp = path.join(this.dir, `${key}.tmp-${randomBytes(6).toString('hex')}`);
    let size = 0;
    const limit = this.maxObjectBytes;
    const hash = sha256 ? createHash('sha256') : undefined;
    const counter = new Transform({
      transform(chunk: Buffer, _enc, done) {
        size += chunk.length;
        hash?.update(chunk);
        if (size > limit) done(new Error(`${url}: over the object limit of ${limit} bytes`));
        else done(null, chunk);
      },
    });
    // The file is created before the copy starts: a write stream that opens it itself may still
    // be opening it when a refused body's error has already removed the temporary name.
    const out = await open(tmp, 'wx', 0o600);
    try {
      await pipeline(res, counter, out.createWriteStream(), { signal });
      const got = hash?.digest('hex');
      if (got !== undefined && got !== sha256) throw new Error(`${url}: its SHA-256 is ${got}, the metadata says ${sha256}`);
    } catch (err) {
      await out.close().catch(() => undefined);
      await rm(tmp, { force: true });
      throw err;
    }
    const file = this.bodyPath(key);
    const old = this.index.get(key);
    if (old) this.bytes -= old.size;
    await rename(tmp, file);
    const entry: IndexEntry = { key, url, ...ct, size, fetchedAt, lastUsed: fetchedAt };
    await writeFile(path.join(this.dir, `${key}.json`), JSON.stringify(entry), { mode: 0o600 });
    this.index.set(key, entry);
    this.bytes += size;
    await this.evict(key);
    return { status: 200, ...ct, size, fetchedAt, file, source: 'upstream' };
  }

  /** Removes least recently used objects until the cache fits (never `keep`). */
  private async evict(keep?: string): Promise<void> {
    if (this.bytes <= this.maxBytes) return;
    const byAge = [...this.index.values()].sort((a, b) => a.lastUsed - b.lastUsed);
    for (const e of byAge) {
      if (this.bytes <= this.maxBytes) break;
      if (e.key === keep) continue;
      this.index.delete(e.key);
      this.bytes -= e.size;
      this.counters.evictions++;
      // An open reader keeps its file until it is done (unlinked files stay readable).
      await rm(this.bodyPath(e.key), { force: true });
      await rm(path.join(this.dir, `${e.key}.json`), { force: true });
    }
  }
}

/** GET from a mirror, following same-origin redirects only. */
export function upstreamGet(
  url: URL,
  accept: string | undefined,
  signal: AbortSignal,
  agentFor?: UpstreamAgents,
  redirects = 0,
): Promise<http.IncomingMessage> {
  const mod = url.protocol === 'https:' ? https : http;
  return new Promise((resolve, reject) => {
    const req = mod.get(
      url,
      { headers: { 'user-agent': 'dsec-egress-mirror', ...(accept ? { accept } : {}) }, signal, agent: agentFor?.(url) ?? false },
      (res) => {
        const location = res.headers.location;
        if (res.statusCode !== undefined && [301, 302, 303, 307, 308].includes(res.statusCode) && location) {
          res.resume();
          const next = new URL(location, url);
          if (next.origin !== url.origin || redirects >= MAX_REDIRECTS) return reject(new Error(`${url.href}: redirect to ${next.href} not followed`));
          upstreamGet(next, accept, signal, agentFor, redirects + 1).then(resolve, reject);
          return;
        }
        resolve(res);
      },
    );
    req.on('error', reject);
  });
}
