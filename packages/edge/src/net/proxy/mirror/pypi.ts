// The Python Package Index as a mirror: a project's simple page (`/simple/<project>/`, fetched
// upstream as PEP 691 JSON) is metadata, its files (`/packages/...`, on files.pythonhosted.org for
// the public index, on the upstream's own origin for a single-origin mirror such as devpi) are
// artifacts named by their file name, cached by the SHA-256 the page gives (and checked against
// it). Frozen, a page loses every file whose PEP 700 `upload-time` is after the cutoff (or
// missing), its `versions` follow, and files it no longer lists are refused.
import { NETWORK_PRESETS } from '@dsec/protocol';
import type { MirrorAdapter, MirrorContext, MirrorRequest, MirrorTransform } from './adapter.js';

/** The JSON form of the simple API (PEP 691). */
export const PYPI_SIMPLE_JSON = 'application/vnd.pypi.simple.v1+json';
/** The public index and file hosts. */
const INDEX_HOST = 'pypi.org';
const FILES_HOST = 'files.pythonhosted.org';
const FILES_ORIGIN = `https://${FILES_HOST}`;

/** PEP 503 normalisation of a project name. */
export function normalizeProject(name: string): string {
  return name.replace(/[-_.]+/g, '-').toLowerCase();
}

const PROJECT_RE = /^[A-Za-z0-9]([A-Za-z0-9._-]{0,198}[A-Za-z0-9])?$/;
/** A decoded path segment of a file URL: plain text, no separator or dot segment. */
const FILE_SEGMENT_RE = /^[A-Za-z0-9._+!~-]{1,255}$/;
const ARCHIVE_RE = /\.(whl|tar\.gz|zip|tar\.bz2|tar\.xz|tgz|tar|egg)$/;

/**
 * The project and version a distribution file names: a wheel's first two dash-separated fields;
 * an sdist's name up to the first `-` followed by a digit (legacy sdists keep dashes in the name).
 */
export function parseDistributionFile(filename: string): { project: string; version: string } | undefined {
  const ext = ARCHIVE_RE.exec(filename)?.[1];
  if (!ext) return undefined;
  const stem = filename.slice(0, -(ext.length + 1));
  if (ext === 'whl' || ext === 'egg') {
    const parts = stem.split('-');
    if (parts.length < 2 || !parts[0] || !parts[1]) return undefined;
    return { project: normalizeProject(parts[0]), version: parts[1] };
  }
  const m = /^(.+?)-(v?\d.*)$/.exec(stem);
  if (!m) return undefined;
  return { project: normalizeProject(m[1]!), version: m[2]! };
}

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);
/** A `{sha256: hex}` hash object's SHA-256, when well formed. */
const sha256Of = (hashes: unknown): string | undefined =>
  isObject(hashes) && typeof hashes.sha256 === 'string' && /^[0-9a-f]{64}$/.test(hashes.sha256) ? hashes.sha256 : undefined;

/** The PyPI adapter. */
export class PypiMirrorAdapter implements MirrorAdapter {
  readonly preset = 'pypi';
  readonly hosts: readonly string[] = NETWORK_PRESETS.pypi;
  readonly defaultUpstream = `https://${INDEX_HOST}/`;

  upstreamBase(url: string, _cutoff: Date | undefined, host: string): string {
    const base = url.endsWith('/') ? url : url + '/';
    // The public index keeps its files on another origin; any other upstream serves its own.
    if (host === FILES_HOST && new URL(base).origin === new URL(this.defaultUpstream).origin) return `${FILES_ORIGIN}/`;
    return base;
  }

  classify(host: string, rawPath: string): MirrorRequest | undefined {
    // Upstream paths are built only from validated, re-encoded segments.
    if (rawPath.includes('?') || !rawPath.startsWith('/') || rawPath.startsWith('//') || rawPath.length > 2048) return undefined;
    if (!/^[A-Za-z0-9%._~+!/-]*$/.test(rawPath)) return undefined;
    let segments: string[];
    try {
      segments = rawPath.slice(1).split('/').map(decodeURIComponent);
    } catch {
      return undefined;
    }
    if (segments.length > 1 && segments[segments.length - 1] === '') segments.pop(); // a trailing slash
    if (segments.some((s) => s === '' || s === '.' || s === '..' || !FILE_SEGMENT_RE.test(s))) return undefined;
    if (segments[0] === 'packages' && segments.length >= 2) return this.file(host, segments);
    if (host === FILES_HOST) return undefined;
    if (segments[0] === 'simple') {
      // The list of every project names no release: harmless when frozen.
      if (segments.length === 1) return { kind: 'other', upstreamPath: 'simple/', accept: PYPI_SIMPLE_JSON, cache: 'metadata', servedWhenFrozen: true };
      if (segments.length === 2 && PROJECT_RE.test(segments[1]!)) return this.page(normalizeProject(segments[1]!));
      return undefined;
    }
    // The JSON API (/pypi/<project>/json, /pypi/<project>/<version>/json) lists releases the
    // freeze cannot filter one by one: passed through unfrozen, refused frozen.
    if (segments[0] === 'pypi' && segments.length >= 3 && segments.length <= 4 && segments[segments.length - 1] === 'json' && PROJECT_RE.test(segments[1]!)) {
      return { kind: 'other', upstreamPath: segments.map(encodeURIComponent).join('/'), accept: 'application/json', cache: 'none' };
    }
    return undefined;
  }

  private page(project: string): MirrorRequest {
    return { kind: 'metadata', upstreamPath: `simple/${project}/`, accept: PYPI_SIMPLE_JSON, cache: 'metadata', host: INDEX_HOST };
  }

  /** A distribution file, or its PEP 658 metadata (`<file>.metadata`), checked against its project's page. */
  private file(host: string, segments: string[]): MirrorRequest | undefined {
    const name = segments[segments.length - 1]!;
    const filename = name.endsWith('.metadata') ? name.slice(0, -'.metadata'.length) : name;
    const dist = parseDistributionFile(filename);
    if (!dist) return undefined;
    return {
      kind: 'artifact',
      upstreamPath: segments.map(encodeURIComponent).join('/'),
      metadata: this.page(dist.project),
      artifactId: filename,
      digestId: name,
      cache: 'immutable',
      host,
    };
  }

  transformMetadata(doc: Buffer, req: MirrorRequest, ctx: MirrorContext): MirrorTransform | undefined {
    let page: unknown;
    try {
      page = JSON.parse(doc.toString('utf8'));
    } catch {
      throw new Error(`${req.upstreamPath}: the upstream did not answer the JSON simple API (PEP 691)`);
    }
    if (!isObject(page) || !Array.isArray(page.files)) throw new Error(`${req.upstreamPath}: not a PEP 691 project page`);
    let files = page.files.filter(isObject);
    if (ctx.cutoff) {
      const cutoff = ctx.cutoff.getTime();
      // No upload time: cannot prove it is old enough, so it is hidden.
      files = files.filter((f) => typeof f['upload-time'] === 'string' && Date.parse(f['upload-time']) <= cutoff);
      if (files.length === 0) return undefined;
      if (Array.isArray(page.versions)) {
        const seen = new Set(files.map((f) => (typeof f.filename === 'string' ? parseDistributionFile(f.filename)?.version : undefined)));
        page.versions = page.versions.filter((v) => typeof v === 'string' && seen.has(v));
      }
    }
    const pageUrl = new URL(req.upstreamPath, ctx.upstreamBase);
    for (const f of files) if (typeof f.url === 'string') f.url = this.rewriteFileUrl(f.url, pageUrl, ctx);
    page.files = files;
    const artifacts = new Set(files.map((f) => f.filename).filter((n): n is string => typeof n === 'string'));
    // Files are cached by their SHA-256 and checked against it: the file's own, and its PEP 658
    // metadata file's (`core-metadata`, formerly `dist-info-metadata`, when it is a hash object).
    const digests = new Map<string, string>();
    for (const f of files) {
      if (typeof f.filename !== 'string') continue;
      const own = sha256Of(f.hashes);
      if (own) digests.set(f.filename, own);
      const meta = sha256Of(f['core-metadata'] ?? f['dist-info-metadata']);
      if (meta) digests.set(`${f.filename}.metadata`, meta);
    }
    return { body: Buffer.from(JSON.stringify(page)), contentType: PYPI_SIMPLE_JSON, artifacts, digests };
  }

  /** File URLs point back at a public name over plain HTTP, so they come through the proxy (and the freeze) again. */
  private rewriteFileUrl(raw: string, pageUrl: URL, ctx: MirrorContext): string {
    let url: URL;
    try {
      url = new URL(raw, pageUrl);
    } catch {
      return raw;
    }
    if (url.href.startsWith(ctx.upstreamBase)) return ctx.publicBase + url.href.slice(ctx.upstreamBase.length);
    if (url.origin === FILES_ORIGIN || url.hostname === FILES_HOST) return `http://${FILES_HOST}${url.pathname}${url.hash}`;
    return url.href;
  }
}
