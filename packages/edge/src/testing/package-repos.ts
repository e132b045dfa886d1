// Local package repositories for tests and benchmarks of the PyPI and Debian mirrors: a static
// file server with connection and request counters, a PEP 691 simple index of generated wheels
// and sdists (with PEP 700 upload times, so a freeze has something to cut), and a Debian
// repository of .deb files (made with dpkg-deb, indexed with dpkg-scanpackages, its Release
// signed with a key made here when gpg is on the host). Nothing here reaches the public network.
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { createReadStream } from 'node:fs';
import { chmod, copyFile, mkdir, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import http from 'node:http';
import type net from 'node:net';
import path from 'node:path';
import { promisify } from 'node:util';
import { gzipSync } from 'node:zlib';
import { npmTarball } from './npm-registry.js';

const run = promisify(execFile);

/** A running static server. */
export interface StaticRepo {
  /** The listening URL, no trailing slash (`http://127.0.0.1:40123`). */
  url: string;
  readonly connections: number;
  readonly requests: number;
  /** Requests per path. */
  hits: Map<string, number>;
  resetCounters(): void;
  close(): Promise<void>;
}

/** Content types by file suffix; a directory URL serves its `index.json`. */
const TYPES: Array<[RegExp, string]> = [
  [/\.json$/, 'application/vnd.pypi.simple.v1+json'],
  [/\.deb$/, 'application/vnd.debian.binary-package'],
  [/\.gz$/, 'application/gzip'],
];

/** Serves `dir` over plain HTTP (GET and HEAD), counting connections and requests. */
export async function startStaticRepo(dir: string, opts: { host?: string; port?: number } = {}): Promise<StaticRepo> {
  const counters = { connections: 0, requests: 0 };
  const hits = new Map<string, number>();
  const server = http.createServer({ keepAliveTimeout: 30_000 }, (req, res) => {
    counters.requests++;
    let p: string;
    try {
      p = decodeURIComponent((req.url ?? '/').split('?')[0]!);
    } catch {
      return void res.writeHead(400).end();
    }
    hits.set(p, (hits.get(p) ?? 0) + 1);
    const file = path.join(dir, path.normalize(`/${p}`), p.endsWith('/') ? 'index.json' : '');
    void stat(file).then(
      (st) => {
        if (!st.isFile()) return void res.writeHead(404).end();
        const type = TYPES.find(([re]) => re.test(file))?.[1] ?? 'application/octet-stream';
        res.writeHead(200, { 'content-type': type, 'content-length': st.size });
        if (req.method === 'HEAD') return void res.end();
        createReadStream(file)
          .on('error', () => res.destroy())
          .pipe(res);
      },
      () => res.writeHead(404).end(),
    );
  });
  const sockets = new Set<net.Socket>();
  server.on('connection', (s: net.Socket) => {
    counters.connections++;
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  server.listen(opts.port ?? 0, opts.host ?? '127.0.0.1');
  await Promise.race([once(server, 'listening'), once(server, 'error').then(([err]) => Promise.reject(err as Error))]);
  const port = (server.address() as net.AddressInfo).port;
  return {
    url: `http://${opts.host ?? '127.0.0.1'}:${port}`,
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

// ---- PyPI -----------------------------------------------------------------------------------

/** A generated Python distribution: module `<name with _>` whose `VALUE` is `<name> <version>`. */
export interface PyDistribution {
  name: string;
  version: string;
  /** `wheel` (a zip pip unpacks) or `sdist` (built in the sandbox with setuptools). */
  kind: 'wheel' | 'sdist';
  /** PEP 700 upload time (ISO); the freeze compares it. */
  uploadTime: string;
  /** Requirements (`Requires-Dist`). */
  requires?: string[];
}

const CRC_TABLE = Array.from({ length: 256 }, (_, n) => {
  let c = n;
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  return c >>> 0;
});

function crc32(buf: Buffer): number {
  let c = 0xffffffff;
  for (const b of buf) c = CRC_TABLE[(c ^ b) & 0xff]! ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

/** A zip archive of `files`, stored uncompressed (as a wheel may be). */
export function zipStored(files: Record<string, string | Buffer>): Buffer {
  const local: Buffer[] = [];
  const central: Buffer[] = [];
  let offset = 0;
  for (const [name, content] of Object.entries(files)) {
    const data = Buffer.isBuffer(content) ? content : Buffer.from(content);
    const fname = Buffer.from(name);
    const crc = crc32(data);
    const h = Buffer.alloc(30);
    h.writeUInt32LE(0x04034b50, 0);
    h.writeUInt16LE(20, 4);
    h.writeUInt16LE(0x0800, 6); // UTF-8 names
    h.writeUInt16LE(0, 8); // stored
    h.writeUInt16LE(0, 10);
    h.writeUInt16LE(0x21, 12); // 1980-01-01
    h.writeUInt32LE(crc, 14);
    h.writeUInt32LE(data.length, 18);
    h.writeUInt32LE(data.length, 22);
    h.writeUInt16LE(fname.length, 26);
    h.writeUInt16LE(0, 28);
    local.push(h, fname, data);
    const c = Buffer.alloc(46);
    c.writeUInt32LE(0x02014b50, 0);
    c.writeUInt16LE(0x031e, 4); // made by Unix
    c.writeUInt16LE(20, 6);
    c.writeUInt16LE(0x0800, 8);
    c.writeUInt16LE(0, 10);
    c.writeUInt16LE(0, 12);
    c.writeUInt16LE(0x21, 14);
    c.writeUInt32LE(crc, 16);
    c.writeUInt32LE(data.length, 20);
    c.writeUInt32LE(data.length, 24);
    c.writeUInt16LE(fname.length, 28);
    c.writeUInt32LE((0o100644 << 16) >>> 0, 38);
    c.writeUInt32LE(offset, 42);
    central.push(c, fname);
    offset += h.length + fname.length + data.length;
  }
  const cd = Buffer.concat(central);
  const end = Buffer.alloc(22);
  end.writeUInt32LE(0x06054b50, 0);
  end.writeUInt16LE(Object.keys(files).length, 8);
  end.writeUInt16LE(Object.keys(files).length, 10);
  end.writeUInt32LE(cd.length, 12);
  end.writeUInt32LE(offset, 16);
  return Buffer.concat([...local, cd, end]);
}

const moduleOf = (d: PyDistribution): string => d.name.replace(/[-.]/g, '_');
const b64sha = (b: Buffer): string => createHash('sha256').update(b).digest('base64url');

/** The distribution's file name and bytes. */
export function pyDistributionFile(d: PyDistribution): { filename: string; data: Buffer } {
  const mod = moduleOf(d);
  const code = `VALUE = ${JSON.stringify(`${d.name} ${d.version}`)}\n`;
  const requires = (d.requires ?? []).map((r) => `Requires-Dist: ${r}\n`).join('');
  const metadata = `Metadata-Version: 2.1\nName: ${d.name}\nVersion: ${d.version}\n${requires}`;
  if (d.kind === 'wheel') {
    const info = `${mod}-${d.version}.dist-info`;
    const files: Record<string, string> = {
      [`${mod}/__init__.py`]: code,
      [`${info}/METADATA`]: metadata,
      [`${info}/WHEEL`]: 'Wheel-Version: 1.0\nGenerator: dsec-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n',
    };
    const record = Object.entries(files).map(([n, c]) => `${n},sha256=${b64sha(Buffer.from(c))},${Buffer.byteLength(c)}`);
    files[`${info}/RECORD`] = [...record, `${info}/RECORD,,`, ''].join('\n');
    return { filename: `${mod}-${d.version}-py3-none-any.whl`, data: zipStored(files) };
  }
  const deps = (d.requires ?? []).map((r) => JSON.stringify(r)).join(', ');
  const base = `${mod}-${d.version}`;
  // An sdist's top directory is `<name>-<version>/`.
  const tar = npmTarball(
    {
      [`pyproject.toml`]: `[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n[project]\nname = "${d.name}"\nversion = "${d.version}"\ndependencies = [${deps}]\n\n[tool.setuptools]\npackages = ["${mod}"]\n`,
      [`${mod}/__init__.py`]: code,
      [`PKG-INFO`]: metadata,
    },
    `${base}/`,
  );
  return { filename: `${base}.tar.gz`, data: tar };
}

/**
 * Writes a PEP 691 simple index of `dists` under `dir`: `packages/<file>` and
 * `simple/<project>/index.json` (files with sha256, size and upload time; URLs relative).
 */
export async function writePypiIndex(dir: string, dists: readonly PyDistribution[]): Promise<void> {
  const projects = new Map<string, Array<Record<string, unknown>>>();
  await mkdir(path.join(dir, 'packages'), { recursive: true });
  for (const d of dists) {
    const { filename, data } = pyDistributionFile(d);
    await writeFile(path.join(dir, 'packages', filename), data);
    const project = d.name.replace(/[-_.]+/g, '-').toLowerCase();
    const files = projects.get(project) ?? [];
    files.push({
      filename,
      url: `../../packages/${filename}`,
      hashes: { sha256: createHash('sha256').update(data).digest('hex') },
      size: data.length,
      'upload-time': d.uploadTime,
    });
    projects.set(project, files);
  }
  for (const [project, files] of projects) {
    await mkdir(path.join(dir, 'simple', project), { recursive: true });
    const versions = [...new Set(dists.filter((d) => d.name.replace(/[-_.]+/g, '-').toLowerCase() === project).map((d) => d.version))];
    await writeFile(path.join(dir, 'simple', project, 'index.json'), JSON.stringify({ meta: { 'api-version': '1.1' }, name: project, versions, files }));
  }
  await writeFile(
    path.join(dir, 'simple', 'index.json'),
    JSON.stringify({ meta: { 'api-version': '1.1' }, projects: [...projects.keys()].map((name) => ({ name })) }),
  );
}

// ---- Debian ---------------------------------------------------------------------------------

/** A generated Debian package: `/usr/bin/<name>` prints `<name> <version>`. */
export interface DebPackage {
  name: string;
  version: string;
  depends?: string[];
}

/** Builds `<name>_<version>_all.deb` in `outDir` with dpkg-deb; returns its path. */
export async function buildDeb(outDir: string, p: DebPackage): Promise<string> {
  const root = path.join(outDir, `.build-${p.name}`);
  await mkdir(path.join(root, 'DEBIAN'), { recursive: true });
  await mkdir(path.join(root, 'usr/bin'), { recursive: true });
  const depends = p.depends?.length ? `Depends: ${p.depends.join(', ')}\n` : '';
  await writeFile(
    path.join(root, 'DEBIAN/control'),
    `Package: ${p.name}\nVersion: ${p.version}\nArchitecture: all\nMaintainer: dsec tests <tests@dsec.invalid>\n${depends}Description: generated for dsec's mirror tests\n`,
  );
  const bin = path.join(root, 'usr/bin', p.name);
  await writeFile(bin, `#!/bin/sh\necho "${p.name} ${p.version}"\n`);
  await chmod(bin, 0o755);
  const out = path.join(outDir, `${p.name}_${p.version}_all.deb`);
  await run('dpkg-deb', ['--root-owner-group', '-Zgzip', '--build', root, out]);
  await rm(root, { recursive: true, force: true });
  return out;
}

/** A signing key for a repository's Release (a GnuPG home of its own). */
export interface RepoKey {
  homedir: string;
  /** The public key as a binary keyring (for apt's `signed-by`). */
  keyring: Buffer;
  /** Stops the key's gpg-agent and removes the home. */
  close(): Promise<void>;
}

/** Makes an ed25519 signing key with gpg; undefined when gpg is not installed. */
export async function makeRepoKey(dir: string): Promise<RepoKey | undefined> {
  const homedir = path.join(dir, 'gnupg');
  await mkdir(homedir, { recursive: true, mode: 0o700 });
  const gpg = (args: string[]): Promise<{ stdout: string }> =>
    run('gpg', ['--batch', '--homedir', homedir, '--pinentry-mode', 'loopback', '--passphrase', '', ...args], {
      encoding: 'buffer' as BufferEncoding,
      maxBuffer: 1 << 20,
    });
  try {
    await gpg(['--quick-gen-key', 'dsec test repository <tests@dsec.invalid>', 'ed25519', 'sign', 'never']);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
  const { stdout } = await gpg(['--export']);
  return {
    homedir,
    keyring: Buffer.from(stdout),
    close: async () => {
      await run('gpgconf', ['--homedir', homedir, '--kill', 'gpg-agent']).catch(() => undefined);
      await rm(homedir, { recursive: true, force: true });
    },
  };
}

/**
 * Lays out a Debian repository under `<root>/debian/` (pool/main/<debs>, dists/<suite>/main/
 * binary-amd64/Packages and Packages.gz from dpkg-scanpackages, Release with their SHA256, and
 * InRelease + Release.gpg when a key is given).
 */
export async function writeDebianRepo(root: string, debs: readonly string[], opts: { suite: string; key?: RepoKey | undefined }): Promise<void> {
  const archive = path.join(root, 'debian');
  const pool = path.join(archive, 'pool/main');
  const bin = path.join(archive, 'dists', opts.suite, 'main/binary-amd64');
  await mkdir(pool, { recursive: true });
  await mkdir(bin, { recursive: true });
  for (const deb of debs) await copyFile(deb, path.join(pool, path.basename(deb)));
  const { stdout } = await run('dpkg-scanpackages', ['--multiversion', 'pool', '/dev/null'], { cwd: archive, maxBuffer: 64 << 20 });
  await writeFile(path.join(bin, 'Packages'), stdout);
  await writeFile(path.join(bin, 'Packages.gz'), gzipSync(Buffer.from(stdout)));
  const dist = path.join(archive, 'dists', opts.suite);
  const sums: string[] = [];
  for (const name of (await readdir(bin)).sort()) {
    const data = await readFile(path.join(bin, name));
    sums.push(` ${createHash('sha256').update(data).digest('hex')} ${String(data.length).padStart(8)} main/binary-amd64/${name}`);
  }
  const release = [
    'Origin: dsec-test',
    'Label: dsec-test',
    `Suite: ${opts.suite}`,
    `Codename: ${opts.suite}`,
    `Date: ${new Date().toUTCString()}`,
    'Architectures: amd64',
    'Components: main',
    'SHA256:',
    ...sums,
    '',
  ].join('\n');
  await writeFile(path.join(dist, 'Release'), release);
  if (opts.key) {
    const sign = (args: string[]): Promise<unknown> =>
      run('gpg', ['--batch', '--yes', '--homedir', opts.key!.homedir, '--pinentry-mode', 'loopback', '--passphrase', '', ...args]);
    await sign(['--clearsign', '-o', path.join(dist, 'InRelease'), path.join(dist, 'Release')]);
    await sign(['--armor', '--detach-sign', '-o', path.join(dist, 'Release.gpg'), path.join(dist, 'Release')]);
  }
}
