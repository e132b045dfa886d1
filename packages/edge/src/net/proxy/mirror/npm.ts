// The npm registry as a mirror: packuments (`/<name>`, `/@scope%2fname`) are metadata, tarballs
// (`/<name>/-/<base>-<version>.tgz`) are artifacts. Frozen, a packument loses every version whose
// `time[version]` is after the cutoff (or missing), its dist-tags are repaired, and tarballs of
// hidden versions are refused.
import { NETWORK_PRESETS } from '@dsec/protocol';
import type { MirrorAdapter, MirrorContext, MirrorRequest, MirrorTransform } from './adapter.js';

const NAME_PART = /^[a-z0-9~._-][a-z0-9~._-]*$/i;
const SCOPE_PART = /^@[a-z0-9~-][a-z0-9~._-]*$/i;
const MAX_NAME_LENGTH = 214;

/** A decoded path segment that is plain text: no separator, no dot segment, no control or escape character. */
function isPlainSegment(s: string): boolean {
  return s !== '.' && s !== '..' && /^[A-Za-z0-9@._~+-]{1,214}$/.test(s);
}

/** A parsed npm package name. */
interface NpmName {
  scope?: string;
  base: string;
}

function parseName(segments: string[]): NpmName | undefined {
  let name: NpmName;
  if (segments[0]?.startsWith('@')) {
    if (segments.length !== 2 || !SCOPE_PART.test(segments[0]) || !NAME_PART.test(segments[1]!)) return undefined;
    name = { scope: segments[0], base: segments[1]! };
  } else {
    if (segments.length !== 1 || !NAME_PART.test(segments[0] ?? '')) return undefined;
    name = { base: segments[0]! };
  }
  if (fullName(name).length > MAX_NAME_LENGTH || name.base.startsWith('.') || name.base.startsWith('_')) return undefined;
  return name;
}

function fullName(n: NpmName): string {
  return n.scope ? `${n.scope}/${n.base}` : n.base;
}

/** The packument path as registries expect it: `@scope%2fname`, or `name`. */
function packumentPath(n: NpmName): string {
  return n.scope ? `${encodeURIComponent(n.scope)}%2f${encodeURIComponent(n.base)}` : encodeURIComponent(n.base);
}

function isPrerelease(version: string): boolean {
  return version.includes('-');
}

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);

/** The npm adapter. */
export class NpmMirrorAdapter implements MirrorAdapter {
  readonly preset = 'npm';
  readonly hosts: readonly string[] = NETWORK_PRESETS.npm;
  readonly defaultUpstream = 'https://registry.npmjs.org/';

  upstreamBase(url: string): string {
    return url.endsWith('/') ? url : url + '/';
  }

  classify(_host: string, rawPath: string): MirrorRequest | undefined {
    // Upstream paths are built only from validated segments: nothing of the raw path is
    // passed on, so no spelling (extra slashes, encoded separators, backslashes, dot segments,
    // an absolute URL or userinfo) can move the fetch off the mirror's upstream.
    const q = rawPath.indexOf('?');
    const pathname = q >= 0 ? rawPath.slice(0, q) : rawPath;
    const query = q >= 0 ? rawPath.slice(q) : '';
    if (!pathname.startsWith('/') || pathname.startsWith('//') || pathname.length > 1024) return undefined;
    if (!/^[A-Za-z0-9@%._~+/-]*$/.test(pathname)) return undefined;
    const raw = pathname.slice(1).split('/');
    if (raw.some((s) => s === '')) return undefined;
    let segments: string[];
    try {
      // `@scope%2fname` is one segment on the wire: the one place an encoded slash is allowed.
      segments = raw.flatMap((s, i) => {
        const scoped = i === 0 && /^@[^%]+%2f[^%]+$/i.test(s);
        const decoded = decodeURIComponent(s);
        if (!scoped && decoded.includes('/')) throw new Error('an encoded separator');
        return scoped ? decoded.split('/') : [decoded];
      });
    } catch {
      return undefined;
    }
    if (segments.length === 0 || !segments.every(isPlainSegment)) return undefined;
    if (segments[0] === '-') {
      // Registry endpoints (/-/ping, /-/v1/search, /-/npm/v1/...). Search results list current
      // versions, so a frozen mirror refuses them; ping is harmless.
      if (query !== '' && !/^\?[A-Za-z0-9._~%=&+:,*-]*$/.test(query)) return undefined;
      const ping = segments.length === 2 && segments[1] === 'ping';
      return { kind: 'other', upstreamPath: segments.map(encodeURIComponent).join('/') + query, cache: 'none', servedWhenFrozen: ping };
    }
    const dash = segments.indexOf('-');
    if (dash >= 0) {
      // Tarball: <name>/-/<base>-<version>.tgz
      const name = parseName(segments.slice(0, dash));
      const file = segments[dash + 1];
      if (!name || segments.length !== dash + 2 || !file?.endsWith('.tgz') || !file.startsWith(`${name.base}-`)) return undefined;
      const version = file.slice(name.base.length + 1, -'.tgz'.length);
      if (version === '' || !/^[0-9A-Za-z.+-]+$/.test(version)) return undefined;
      return {
        kind: 'artifact',
        upstreamPath: `${fullName(name).split('/').map(encodeURIComponent).join('/')}/-/${encodeURIComponent(file)}`,
        metadata: this.packumentRequest(name),
        artifactId: version,
        cache: 'immutable',
      };
    }
    const name = parseName(segments);
    if (name) {
      return this.packumentRequest(name);
    }
    // /<name>/<version-or-tag>: a single version document; refused when frozen (a tag may name a
    // hidden version), passed through otherwise.
    const nameOf = parseName(segments.slice(0, -1));
    const version = segments[segments.length - 1] ?? '';
    if (!nameOf || !/^[0-9A-Za-z.+_-]+$/.test(version)) return undefined;
    return { kind: 'other', upstreamPath: `${packumentPath(nameOf)}/${encodeURIComponent(version)}`, accept: 'application/json', cache: 'none' };
  }

  private packumentRequest(name: NpmName): MirrorRequest {
    // Always the full packument: the abbreviated one has no per-version publish times.
    return { kind: 'metadata', upstreamPath: packumentPath(name), accept: 'application/json', cache: 'metadata' };
  }

  transformMetadata(doc: Buffer, _req: MirrorRequest, ctx: MirrorContext): MirrorTransform | undefined {
    const packument: unknown = JSON.parse(doc.toString('utf8'));
    if (!isObject(packument)) throw new Error('packument is not a JSON object');
    const versions = isObject(packument.versions) ? packument.versions : {};
    const time = isObject(packument.time) ? packument.time : {};
    const published = (v: string): number => (typeof time[v] === 'string' ? Date.parse(time[v]) : NaN);

    if (ctx.cutoff) {
      const cutoff = ctx.cutoff.getTime();
      for (const v of Object.keys(versions)) {
        const t = published(v);
        // No publish time: cannot prove it is old enough, so it is hidden.
        if (!(t <= cutoff)) {
          delete versions[v];
          delete time[v];
        }
      }
      // Times of versions that no longer exist (unpublished) say nothing useful; drop later ones.
      for (const k of Object.keys(time)) {
        if (k === 'created' || k === 'modified') continue;
        if (!(k in versions)) delete time[k];
      }
      const remaining = Object.keys(versions);
      if (remaining.length === 0) return undefined;
      const byTime = remaining.sort((a, b) => published(a) - published(b));
      const tags = isObject(packument['dist-tags']) ? packument['dist-tags'] : {};
      for (const [tag, v] of Object.entries(tags)) if (typeof v !== 'string' || !(v in versions)) delete tags[tag];
      if (!('latest' in tags)) {
        const stable = byTime.filter((v) => !isPrerelease(v));
        const pool = stable.length ? stable : byTime;
        tags.latest = pool[pool.length - 1]!;
      }
      packument['dist-tags'] = tags;
      const newest = byTime[byTime.length - 1]!;
      time.modified = time[newest];
      packument.time = time;
      delete packument._rev;
    }

    // Tarball URLs point back at the public name over plain HTTP, so they come through the proxy
    // (and the freeze) again.
    for (const v of Object.values(versions)) {
      if (!isObject(v) || !isObject(v.dist) || typeof v.dist.tarball !== 'string') continue;
      v.dist.tarball = this.rewriteTarball(v.dist.tarball, ctx);
    }
    packument.versions = versions;
    return { body: Buffer.from(JSON.stringify(packument)), contentType: 'application/json', artifacts: new Set(Object.keys(versions)) };
  }

  private rewriteTarball(tarball: string, ctx: MirrorContext): string {
    if (tarball.startsWith(ctx.upstreamBase)) return ctx.publicBase + tarball.slice(ctx.upstreamBase.length);
    let url: URL;
    try {
      url = new URL(tarball);
    } catch {
      return tarball;
    }
    if (this.hosts.includes(url.hostname)) return ctx.publicBase + url.pathname.slice(1);
    return tarball;
  }
}
