// A local npm registry for tests and benchmarks of egress (the proxy, the npm preset, the npm
// mirror): serves packuments and tarballs over HTTP or HTTPS on an address the caller picks,
// counts the connections and requests it gets, and can serve a directory of static files (a
// "dumb HTTP" git repository). The contents are either generated (a deterministic tree of
// hundreds of small packages whose `npm test` checks that every one was installed) or a real
// tree captured once from the public registry by the benchmark (bench/scenarios/install.ts).
// No test or benchmark sends load to a public registry through it.
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { createReadStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import http from 'node:http';
import https from 'node:https';
import type net from 'node:net';
import path from 'node:path';
import { gunzipSync, gzipSync } from 'node:zlib';

/** Where packuments point their tarballs: replaced by the registry's public URL when served. */
export const REGISTRY_BASE_PLACEHOLDER = '{{registry}}';

/** What a registry serves. */
export interface NpmRegistryContents {
  /** Package name -> packument (full document), tarball URLs starting with {@link REGISTRY_BASE_PLACEHOLDER}. */
  packuments: Map<string, unknown>;
  /** URL path (`/name/-/name-1.0.0.tgz`) -> the tarball's bytes, or the path of a file holding them. */
  tarballs: Map<string, Buffer | string>;
}

/** Options of {@link startNpmRegistry}. */
export interface NpmRegistryOptions {
  /** Address to listen on. Default 127.0.0.1. */
  host?: string;
  /** Port; 0 picks one. Default 0. */
  port?: number;
  /** Serve HTTPS with this key and certificate. Default plain HTTP. */
  tls?: { key: string; cert: string };
  /** The base URL clients use (`https://registry.npmjs.org`): tarball URLs in packuments point there. Default the listening URL. */
  publicUrl?: string;
  /** Static files under a path prefix (`/git/` -> a directory). */
  staticFiles?: { prefix: string; dir: string };
}

/** A running registry. */
export interface NpmRegistry {
  /** The listening URL (`https://127.5.6.7:443`). */
  url: string;
  /** TCP connections accepted so far. */
  readonly connections: number;
  /** Requests answered so far, and per path. */
  readonly requests: number;
  hits: Map<string, number>;
  /** Clears the counters. */
  resetCounters(): void;
  close(): Promise<void>;
}

/** Starts a registry serving `contents`. */
export async function startNpmRegistry(contents: NpmRegistryContents, opts: NpmRegistryOptions = {}): Promise<NpmRegistry> {
  const host = opts.host ?? '127.0.0.1';
  const scheme = opts.tls ? 'https' : 'http';
  const serialized = new Map<string, string>();
  let publicUrl = '';
  const counters = { connections: 0, requests: 0 };
  const hits = new Map<string, number>();
  const handler = (req: http.IncomingMessage, res: http.ServerResponse): void => {
    counters.requests++;
    const p = decodeURIComponent((req.url ?? '/').split('?')[0]!);
    hits.set(p, (hits.get(p) ?? 0) + 1);
    const tarball = contents.tarballs.get(p);
    if (tarball !== undefined) return sendTarball(res, tarball);
    if (opts.staticFiles && p.startsWith(opts.staticFiles.prefix)) return sendStatic(res, opts.staticFiles.dir, p.slice(opts.staticFiles.prefix.length));
    const name = p.slice(1);
    let body = serialized.get(name);
    if (body === undefined && contents.packuments.has(name)) {
      body = JSON.stringify(contents.packuments.get(name)).split(REGISTRY_BASE_PLACEHOLDER).join(publicUrl);
      serialized.set(name, body);
    }
    if (body === undefined) {
      res.writeHead(404, { 'content-type': 'application/json' });
      return void res.end('{"error":"Not found"}');
    }
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
    res.end(req.method === 'HEAD' ? undefined : body);
  };
  const server = opts.tls
    ? https.createServer({ key: opts.tls.key, cert: opts.tls.cert, keepAliveTimeout: 30_000 }, handler)
    : http.createServer({ keepAliveTimeout: 30_000 }, handler);
  const sockets = new Set<net.Socket>();
  server.on(opts.tls ? 'secureConnection' : 'connection', () => counters.connections++);
  server.on('connection', (s: net.Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  server.listen(opts.port ?? 0, host);
  await Promise.race([once(server, 'listening'), once(server, 'error').then(([err]) => Promise.reject(err as Error))]);
  const port = (server.address() as net.AddressInfo).port;
  const url = `${scheme}://${host}:${port}`;
  publicUrl = (opts.publicUrl ?? url).replace(/\/$/, '');
  return {
    url,
    get connections() {
      return counters.connections;
    },
    get requests() {
      return counters.requests;
    },
    hits,
    resetCounters() {
      counters.connections = 0;
      counters.requests = 0;
      hits.clear();
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

function sendTarball(res: http.ServerResponse, tarball: Buffer | string): void {
  if (Buffer.isBuffer(tarball)) {
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': tarball.length });
    return void res.end(tarball);
  }
  void stat(tarball).then(
    (st) => {
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': st.size });
      createReadStream(tarball)
        .on('error', () => res.destroy())
        .pipe(res);
    },
    () => res.writeHead(404).end(),
  );
}

function sendStatic(res: http.ServerResponse, dir: string, rel: string): void {
  const file = path.join(dir, path.normalize(`/${rel}`));
  void stat(file).then(
    (st) => {
      if (!st.isFile()) return void res.writeHead(404).end();
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': st.size });
      createReadStream(file)
        .on('error', () => res.destroy())
        .pipe(res);
    },
    () => res.writeHead(404).end(),
  );
}

/** A gzipped tar of `files` (paths below `prefix`, `package/` as npm packs them). */
export function npmTarball(files: Record<string, string>, prefix = 'package/'): Buffer {
  const blocks: Buffer[] = [];
  for (const [name, content] of Object.entries(files)) {
    const data = Buffer.from(content);
    const h = Buffer.alloc(512);
    h.write(`${prefix}${name}`, 0, 100);
    h.write('0000644\0', 100);
    h.write('0000000\0', 108);
    h.write('0000000\0', 116);
    h.write(data.length.toString(8).padStart(11, '0') + '\0', 124);
    h.write('14000000000\0', 136);
    h.write('        ', 148);
    h.write('0', 156);
    h.write('ustar\0', 257);
    h.write('00', 263);
    let sum = 0;
    for (const b of h) sum += b;
    h.write(sum.toString(8).padStart(6, '0') + '\0 ', 148);
    blocks.push(h, data, Buffer.alloc((512 - (data.length % 512)) % 512));
  }
  blocks.push(Buffer.alloc(1024));
  return gzipSync(Buffer.concat(blocks));
}

/** A generated project and the registry contents it installs from. */
export interface GeneratedTree {
  contents: NpmRegistryContents;
  /** The project's package.json (dependencies on the tree's roots, `npm test` checks them all). */
  packageJson: string;
  /** The project's test.js. */
  testJs: string;
  /** Packages in the tree. */
  count: number;
}

/**
 * A deterministic tree of `count` packages (`dsec-fixture-000`...): each depends on up to three
 * later ones, the project on every package nobody depends on; each package records itself when
 * required, and the project's `npm test` fails unless all `count` were installed and load.
 */
export function generatePackageTree(count: number, published = '2024-01-02T03:04:05.000Z'): GeneratedTree {
  const name = (i: number): string => `dsec-fixture-${String(i).padStart(3, '0')}`;
  let seed = 0x2545f491;
  const rand = (n: number): number => {
    seed = (seed * 1103515245 + 12345) >>> 0;
    return seed % n;
  };
  const deps: number[][] = [];
  const depended = new Set<number>();
  for (let i = 0; i < count; i++) {
    const mine = new Set<number>();
    const want = rand(4);
    for (let k = 0; k < want && i + 1 < count; k++) mine.add(i + 1 + rand(Math.min(40, count - i - 1)));
    deps.push([...mine].sort((a, b) => a - b));
    for (const d of mine) depended.add(d);
  }
  const contents: NpmRegistryContents = { packuments: new Map(), tarballs: new Map() };
  for (let i = 0; i < count; i++) {
    const n = name(i);
    const dependencies = Object.fromEntries(deps[i]!.map((d) => [name(d), '^1.0.0']));
    const pkg = { name: n, version: '1.0.0', main: 'index.js', dependencies };
    const index = [
      `globalThis.dsecFixtureSeen = globalThis.dsecFixtureSeen || new Set();`,
      `globalThis.dsecFixtureSeen.add(${JSON.stringify(n)});`,
      ...deps[i]!.map((d) => `require(${JSON.stringify(name(d))});`),
      `module.exports = ${JSON.stringify(n)};`,
      '',
    ].join('\n');
    const tgz = npmTarball({ 'package.json': JSON.stringify(pkg, null, 2), 'index.js': index });
    const file = `/${n}/-/${n}-1.0.0.tgz`;
    contents.tarballs.set(file, tgz);
    contents.packuments.set(n, {
      _id: n,
      name: n,
      'dist-tags': { latest: '1.0.0' },
      versions: {
        '1.0.0': {
          ...pkg,
          _id: `${n}@1.0.0`,
          dist: {
            tarball: `${REGISTRY_BASE_PLACEHOLDER}${file}`,
            shasum: createHash('sha1').update(tgz).digest('hex'),
            integrity: `sha512-${createHash('sha512').update(tgz).digest('base64')}`,
          },
        },
      },
      time: { created: published, modified: published, '1.0.0': published },
    });
  }
  const roots = Array.from({ length: count }, (_, i) => i).filter((i) => !depended.has(i));
  const packageJson = JSON.stringify(
    {
      name: 'dsec-egress-project',
      version: '1.0.0',
      private: true,
      scripts: { test: 'node test.js' },
      dependencies: Object.fromEntries(roots.map((i) => [name(i), '^1.0.0'])),
    },
    null,
    2,
  );
  const testJs = [
    `const roots = Object.keys(require('./package.json').dependencies);`,
    `for (const r of roots) require(r);`,
    `const seen = globalThis.dsecFixtureSeen ? globalThis.dsecFixtureSeen.size : 0;`,
    `if (seen !== ${count}) { console.error('loaded ' + seen + ' of ${count} packages'); process.exit(1); }`,
    `console.log('all ${count} packages load');`,
    '',
  ].join('\n');
  return { contents, packageJson, testJs, count };
}

/** The `package.json` of a package tarball (the one in its top directory, whatever that is named). */
export function tarballManifest(tgz: Buffer): Record<string, unknown> {
  const tar = gunzipSync(tgz);
  let longName: string | undefined;
  for (let off = 0; off + 512 <= tar.length;) {
    const h = tar.subarray(off, off + 512);
    if (h.every((b) => b === 0)) break;
    const field = (start: number, len: number): string =>
      h
        .subarray(start, start + len)
        .toString('utf8')
        .replace(/\0.*$/s, '');
    const size = parseInt(field(124, 12).trim() || '0', 8);
    const type = field(156, 1);
    const body = tar.subarray(off + 512, off + 512 + size);
    off += 512 + Math.ceil(size / 512) * 512;
    if (type === 'x') {
      const m = /\d+ path=([^\n]*)\n/.exec(body.toString('utf8'));
      if (m) longName = m[1];
      continue;
    }
    if (type === 'L') {
      longName = body.toString('utf8').replace(/\0.*$/s, '');
      continue;
    }
    const prefix = field(345, 155);
    const name = longName ?? (prefix ? `${prefix}/${field(0, 100)}` : field(0, 100));
    longName = undefined;
    if ((type === '0' || type === '') && /^[^/]+\/package\.json$/.test(name)) return JSON.parse(body.toString('utf8')) as Record<string, unknown>;
  }
  throw new Error('no package.json in the tarball');
}

/** Manifest fields an install reads from a packument's version entry. */
const MANIFEST_FIELDS = [
  'name',
  'version',
  'dependencies',
  'optionalDependencies',
  'peerDependencies',
  'peerDependenciesMeta',
  'bundleDependencies',
  'bin',
  'directories',
  'engines',
  'os',
  'cpu',
  'scripts',
  'deprecated',
  'license',
] as const;

/**
 * Registry contents for a set of package tarballs on disk: one packument per name listing the
 * versions given (manifests from the tarballs, `dist` with the tarball's integrity), each
 * tarball served at `/<name>/-/<base>-<version>.tgz`.
 */
export async function contentsFromTarballs(files: ReadonlyArray<{ file: string }>, published = '2024-01-02T03:04:05.000Z'): Promise<NpmRegistryContents> {
  const { readFile } = await import('node:fs/promises');
  const contents: NpmRegistryContents = { packuments: new Map(), tarballs: new Map() };
  const byName = new Map<string, Map<string, Record<string, unknown>>>();
  for (const { file } of files) {
    const tgz = await readFile(file);
    const m = tarballManifest(tgz);
    const name = String(m.name);
    const version = String(m.version);
    const base = name.includes('/') ? name.split('/')[1]! : name;
    const urlPath = `/${name}/-/${base}-${version}.tgz`;
    contents.tarballs.set(urlPath, file);
    const entry: Record<string, unknown> = { _id: `${name}@${version}` };
    for (const f of MANIFEST_FIELDS) if (m[f] !== undefined) entry[f] = m[f];
    const scripts = m.scripts as Record<string, string> | undefined;
    if (scripts && (scripts.install || scripts.preinstall || scripts.postinstall)) entry.hasInstallScript = true;
    entry.dist = {
      tarball: `${REGISTRY_BASE_PLACEHOLDER}${urlPath}`,
      shasum: createHash('sha1').update(tgz).digest('hex'),
      integrity: `sha512-${createHash('sha512').update(tgz).digest('base64')}`,
    };
    let versions = byName.get(name);
    if (!versions) byName.set(name, (versions = new Map<string, Record<string, unknown>>()));
    versions.set(version, entry);
  }
  for (const [name, versions] of byName) {
    const list = [...versions.keys()];
    const latest =
      list
        .filter((v) => !v.includes('-'))
        .sort(compareVersions)
        .at(-1) ?? list.sort(compareVersions).at(-1)!;
    contents.packuments.set(name, {
      _id: name,
      name,
      'dist-tags': { latest },
      versions: Object.fromEntries(versions),
      time: { created: published, modified: published, ...Object.fromEntries(list.map((v) => [v, published])) },
    });
  }
  return contents;
}

function compareVersions(a: string, b: string): number {
  const pa = a.split(/[.-]/).map((x) => Number(x));
  const pb = b.split(/[.-]/).map((x) => Number(x));
  for (let i = 0; i < 3; i++) if ((pa[i] ?? 0) !== (pb[i] ?? 0)) return (pa[i] ?? 0) - (pb[i] ?? 0);
  return 0;
}
