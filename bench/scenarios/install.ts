// A real package install through the egress proxy: minimist 1.2.8's development dependencies,
// captured once from the npm registry into the bench's cache, served by the local registry
// fixture (@dsec/edge testing/npm-registry.ts, the egress test's too) from a network namespace
// behind a shaped link (a relay delaying data 10 ms each way = 20 ms RTT; tbf at 100 Mbit/s). `npm install` with empty
// caches on the host, in a sandbox with the npm preset, and through the npm mirror cold and warm;
// then without the lockfile (npm resolves every packument) on the host and with the preset. The apt
// part: a handful of real .debs downloaded once with `apt-get download`, indexed with
// dpkg-scanpackages into a signed local repository served by the same child behind the same link;
// `apt-get update && apt-get install` in the same Debian base on the host (a chroot into an
// overlay of the layer, host network) and in sandboxes with the debian preset and the debian
// mirror (cold, warm).
// Run it by name (`--only install`): it is not part of `--quick`.
import { execFile, spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { cp, mkdir, mkdtemp, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { startPlatform, ROOT_PROJECT_ID } from '@dsec/apiserver';
import type { Platform } from '@dsec/apiserver';
import { contentsFromTarballs, LayerStore, makeCertificateAuthority, makeRepoKey, nodeToolkitName, writeDebianRepo, writeNodeToolkitTree } from '@dsec/edge';
import type { RepoKey } from '@dsec/edge';
import { NetworkConfigSchema } from '@dsec/protocol';
import type { LayerInfo, NetworkPolicy } from '@dsec/protocol';
import { DsecClient, Sandbox } from '@dsec/sdk';
import { onCleanup } from '../lib/cleanup.js';
import { makeShapedLink, shapedLinkNames } from '../lib/shaped-link.js';
import type { ShapedLinkNames } from '../lib/shaped-link.js';
import { AGENT_BINARY } from '../lib/platform.js';
import type { PreloadedLayer } from '../lib/platform.js';
import type { Scenario, ScenarioContext } from '../lib/scenario.js';
import { nowMs, progress } from '../lib/stats.js';

const run = promisify(execFile);
const PROJECT = 'minimist@1.2.8';
const BASE_PACKAGES = ['ca-certificates', 'libstdc++6'];
const BASE_NAME = `install-debian-${createHash('sha256').update(BASE_PACKAGES.join(',')).digest('hex').slice(0, 12)}`;
const NODE_NAME = nodeToolkitName('install-node');
const INSTALL_TIMEOUT_MS = 600_000;
/** The registry's link: a relay in its namespace delays data this much each way (20 ms RTT); tbf holds both ends to RATE. */
const ONE_WAY_DELAY_MS = 10;
const RATE = '100mbit';
/** The registry fixture as a child in the namespace (compiled beside this file). */
const CHILD = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'lib', 'npm-registry-child.js');
/** The dev dependency left out of the install without a lockfile (see {@link packageJson}). */
const NO_LOCKFILE_DROPS = 'nyc';
/** What apt installs (its dependencies outside the base are in the repository too). */
const APT_INSTALL = ['jq', 'tree', 'file', 'less', 'sqlite3'];
/** Every .deb of the local repository, downloaded once with `apt-get download`. */
const APT_DEBS = [...APT_INSTALL, 'libjq1', 'libonig5', 'libmagic1', 'libmagic-mgc', 'libsqlite3-0', 'libreadline8', 'readline-common'];
const APT_SUITE = 'bookworm';
/** apt reading only the bench's source (the image's own sources never asked). */
const APT_SOURCE = '/etc/apt/sources.list.d/dsec-bench.list';
const APT_KEYRING = '/etc/apt/keyrings/dsec-bench.gpg';
const APT_OPTS = ['-o', `Dir::Etc::sourcelist=${APT_SOURCE}`, '-o', 'Dir::Etc::sourceparts=-', '-o', 'Acquire::Languages=none'];
/** An environment for host npm with nothing of the host's proxies or CA variables. */
const cleanEnv = (home: string): NodeJS.ProcessEnv => ({ PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: home });

let layers: Array<{ info: LayerInfo; name: string }> = [];

/** The base and Node toolkit in the bench cache, built there once. */
async function cachedLayers(cacheDir: string): Promise<PreloadedLayer[]> {
  const root = path.join(cacheDir, 'layers');
  const store = new LayerStore({ root, unmountLingerMs: 0 });
  await store.init();
  try {
    let base = await store.resolve(BASE_NAME).catch(() => undefined);
    if (!base) {
      progress(`install: building the Debian base (${BASE_PACKAGES.join(', ')}) into ${root}`);
      base = await store.build({ type: 'debian', packages: BASE_PACKAGES }, { kind: 'base', name: BASE_NAME });
    }
    let node = await store.resolve(NODE_NAME).catch(() => undefined);
    if (!node) {
      const dir = await mkdtemp(path.join(cacheDir, 'node-toolkit-'));
      try {
        await writeNodeToolkitTree(dir);
        node = await store.build({ type: 'dir', path: dir }, { kind: 'toolkit', name: NODE_NAME });
      } finally {
        await rm(dir, { recursive: true, force: true });
      }
    }
    layers = [
      { info: base, name: BASE_NAME },
      { info: node, name: NODE_NAME },
    ];
    return layers.map((l) => ({ blobDir: path.join(root, 'blobs', l.info.digest.replace(/^sha256:/, '')) }));
  } finally {
    await store.close();
  }
}

interface CapturedTree {
  /** package.json and package-lock.json of the project. */
  project: string;
  tarballs: Array<{ file: string }>;
}

/** minimist's package.json, its lockfile and every tarball it names, fetched from the public registry once. */
async function capturedTree(cacheDir: string): Promise<CapturedTree> {
  const dir = path.join(cacheDir, 'npm-install', PROJECT.replace('@', '-'));
  const project = path.join(dir, 'project');
  const tarDir = path.join(dir, 'tarballs');
  const done = path.join(dir, 'complete.json');
  const have = await readFile(done, 'utf8').catch(() => undefined);
  if (have) return { project, tarballs: (JSON.parse(have) as string[]).map((f) => ({ file: path.join(tarDir, f) })) };
  progress(`install: capturing ${PROJECT}'s dependency tree from registry.npmjs.org into ${dir} (once)`);
  await rm(dir, { recursive: true, force: true });
  await mkdir(project, { recursive: true });
  await mkdir(tarDir, { recursive: true });
  // The host's own environment and CA settings (this one-time capture is the host's npm talking
  // to its registry, whatever its network needs); its own cache, a lockfile with `resolved` URLs.
  const cache = path.join(dir, 'npm-cache');
  const npm = (args: string[], cwd: string): Promise<{ stdout: string }> =>
    run('npm', [...args, '--registry=https://registry.npmjs.org/', '--no-audit', '--no-fund', '--userconfig=/dev/null', `--cache=${cache}`], {
      cwd,
      maxBuffer: 64 * 1024 * 1024,
      timeout: INSTALL_TIMEOUT_MS,
    });
  const packed = (await npm(['pack', PROJECT, '--json'], dir)).stdout;
  const file = (JSON.parse(packed) as Array<{ filename: string }>)[0]!.filename;
  await run('tar', ['-xzf', path.join(dir, file), '-C', dir]);
  await cp(path.join(dir, 'package', 'package.json'), path.join(project, 'package.json'));
  await npm(['install', '--ignore-scripts'], project);
  await rm(path.join(project, 'node_modules'), { recursive: true, force: true });
  // Every tarball the lockfile names, from npm's content-addressed cache (sha512 integrity).
  const lock = JSON.parse(await readFile(path.join(project, 'package-lock.json'), 'utf8')) as {
    packages: Record<string, { resolved?: string; integrity?: string }>;
  };
  const names: string[] = [];
  for (const p of Object.values(lock.packages)) {
    if (!p.resolved?.startsWith('https://registry.npmjs.org/') || !p.integrity?.startsWith('sha512-')) continue;
    const hex = Buffer.from(p.integrity.slice('sha512-'.length), 'base64').toString('hex');
    const name = p.resolved.slice('https://registry.npmjs.org/'.length).replace(/[/@]/g, '_');
    if (names.includes(name)) continue;
    await cp(path.join(cache, '_cacache', 'content-v2', 'sha512', hex.slice(0, 2), hex.slice(2, 4), hex.slice(4)), path.join(tarDir, name));
    names.push(name);
  }
  await writeFile(done, JSON.stringify(names.sort()));
  progress(`install: ${names.length} tarballs captured`);
  return { project, tarballs: names.map((f) => ({ file: path.join(tarDir, f) })) };
}

/** The .debs of {@link APT_DEBS}, downloaded from the host's Debian sources once into the bench cache. */
async function capturedDebs(cacheDir: string): Promise<string[]> {
  const dir = path.join(cacheDir, 'apt-install', createHash('sha256').update(APT_DEBS.join(',')).digest('hex').slice(0, 12));
  const done = path.join(dir, 'complete');
  if (!(await readFile(done, 'utf8').catch(() => undefined))) {
    progress(`install: apt-get download of ${APT_DEBS.length} packages into ${dir} (once)`);
    await rm(dir, { recursive: true, force: true });
    await mkdir(dir, { recursive: true });
    await run('apt-get', ['download', ...APT_DEBS], { cwd: dir, timeout: INSTALL_TIMEOUT_MS });
    // apt-get download keeps a version's epoch as `<n>%3a` in the file name; the archive's own
    // pool names have no epoch.
    for (const f of await readdir(dir)) if (/_\d+%3a/.test(f)) await rename(path.join(dir, f), path.join(dir, f.replace(/_\d+%3a/, '_')));
    await writeFile(done, 'ok\n');
  }
  return (await readdir(dir)).filter((f) => f.endsWith('.deb')).map((f) => path.join(dir, f));
}

interface ShapedRegistry {
  address: string;
  stats(): Promise<{ connections: number; requests: number }>;
  reset(): Promise<void>;
  /** The same for the Debian repository (plain HTTP on port 80). */
  apt: { stats(): Promise<{ connections: number; requests: number }>; reset(): Promise<void> };
}

/** A network namespace with the registry child in it, behind a shaped link (tbf both ends, the child's delaying relay). */
async function shapedRegistry(link: ShapedLinkNames, index: string, tlsDir: string, aptDir: string): Promise<ShapedRegistry> {
  const { ns, address } = link;
  // The rate on both ends of the link (tbf: this kernel has no netem); the delay is the child's relay.
  await makeShapedLink(link, { rate: RATE, burst: '64kb', latency: '400ms', defaultRoute: true });
  const procs: ChildProcess[] = [];
  onCleanup(`registry child in ${ns}`, () => {
    for (const p of procs) p.kill('SIGKILL');
  });
  const child = spawn('ip', ['netns', 'exec', ns, process.execPath, CHILD, index, address, tlsDir, String(ONE_WAY_DELAY_MS), aptDir], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  procs.push(child);
  await new Promise<void>((resolve, reject) => {
    let out = '';
    child.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      if (out.includes('ready')) resolve();
    });
    child.once('exit', (code) => reject(new Error(`the registry child exited (${code}): ${out}`)));
  });
  const call = async (method: string, which = '/stats'): Promise<{ connections: number; requests: number }> => {
    const res = await fetch(`http://${address}:9000${which}`, { method, signal: AbortSignal.timeout(10_000) });
    return (await res.json()) as { connections: number; requests: number };
  };
  return {
    address,
    stats: () => call('GET'),
    reset: async () => {
      await call('POST');
    },
    apt: {
      stats: () => call('GET', '/apt'),
      reset: async () => {
        await call('POST', '/apt');
      },
    },
  };
}

/** One timed install: connections and requests at the registry, refusals in the sandbox's log. */
interface Measured {
  seconds: number;
  connections: number;
  requests: number;
  refused: number;
}

/**
 * The project's package.json: as captured with its lockfile; without it, minus nyc, whose
 * dependencies come bundled in its tarball (the fixture has no packuments for them, and npm
 * resolving without a lockfile asks for them).
 */
async function packageJson(tree: CapturedTree, lockfile: boolean): Promise<Buffer> {
  const raw = await readFile(path.join(tree.project, 'package.json'));
  if (lockfile) return raw;
  const pkg = JSON.parse(raw.toString('utf8')) as { devDependencies?: Record<string, string> };
  if (pkg.devDependencies) delete pkg.devDependencies[NO_LOCKFILE_DROPS];
  return Buffer.from(JSON.stringify(pkg, null, 2));
}

async function hostInstall(tree: CapturedTree, reg: ShapedRegistry, caFile: string, dir: string, lockfile = true): Promise<Measured> {
  const work = await mkdtemp(path.join(dir, 'host-'));
  await writeFile(path.join(work, 'package.json'), await packageJson(tree, lockfile));
  if (lockfile) await cp(path.join(tree.project, 'package-lock.json'), path.join(work, 'package-lock.json'));
  await reg.reset();
  const t0 = nowMs();
  await run(
    'npm',
    [
      'install',
      '--no-audit',
      '--no-fund',
      '--userconfig=/dev/null',
      `--registry=https://${reg.address}/`,
      `--cafile=${caFile}`,
      `--cache=${path.join(work, '.npm-cache')}`,
    ],
    { cwd: work, env: cleanEnv(work), maxBuffer: 64 * 1024 * 1024, timeout: INSTALL_TIMEOUT_MS },
  );
  const seconds = (nowMs() - t0) / 1000;
  const s = await reg.stats();
  return { seconds, ...s, refused: 0 };
}

async function sandboxInstall(client: DsecClient, tree: CapturedTree, reg: ShapedRegistry, net: NetworkPolicy, lockfile = true): Promise<Measured> {
  const sb = await Sandbox.create({ image: { base: BASE_NAME, toolkits: [NODE_NAME] }, resources: { cpu: 2, memoryMiB: 2048 }, network: net }, { client });
  try {
    await sb.exec(['mkdir', '-p', '/work', '/root'], { check: true });
    await sb.files.write('/work/package.json', await packageJson(tree, lockfile));
    if (lockfile) await sb.files.write('/work/package-lock.json', await readFile(path.join(tree.project, 'package-lock.json')));
    await reg.reset();
    const t0 = nowMs();
    const r = await sb.exec(['npm', 'install', '--no-audit', '--no-fund', '--no-update-notifier'], {
      cwd: '/work',
      env: { HOME: '/root', npm_config_cache: '/root/.npm' },
      timeoutMs: INSTALL_TIMEOUT_MS,
    });
    const seconds = (nowMs() - t0) / 1000;
    if (r.exitCode !== 0) throw new Error(`npm install in the sandbox: ${r.stderr.slice(-2000)}`);
    const s = await reg.stats();
    const refused = (await sb.network.log({ limit: 1000 })).filter((e) => e.verdict === 'denied' && e.reason?.startsWith('connection-limit')).length;
    return { seconds, ...s, refused };
  } finally {
    await sb.kill().catch(() => undefined);
  }
}

/** The apt script both sides run: the index, then the packages (time measured around it). */
const APT_SCRIPT = [
  `apt-get ${APT_OPTS.join(' ')} -q update`,
  `DEBIAN_FRONTEND=noninteractive apt-get ${APT_OPTS.join(' ')} -q -y --no-install-recommends install ${APT_INSTALL.join(' ')}`,
  `jq --version`,
].join(' && ');

const aptSource = (host: string, key: RepoKey | undefined): string =>
  `deb ${key ? `[signed-by=${APT_KEYRING}]` : '[trusted=yes]'} http://${host}/debian ${APT_SUITE} main\n`;

/** apt on the host: the same Debian base (chroot into a tmpfs overlay over the layer, in a mount namespace of its own), the host's network. */
async function hostApt(cacheDir: string, reg: ShapedRegistry, key: RepoKey | undefined, dir: string): Promise<Measured> {
  const store = new LayerStore({ root: path.join(cacheDir, 'layers'), unmountLingerMs: 0 });
  await store.init();
  const base = await store.resolve(BASE_NAME);
  const lower = await store.acquire(base.digest);
  try {
    const source = path.join(dir, 'host-apt.list');
    await writeFile(source, aptSource(reg.address, key));
    const keyring = path.join(dir, 'host-apt.gpg');
    if (key) await writeFile(keyring, key.keyring);
    // A private mount namespace: a tmpfs-backed overlay over the layer, /dev and /proc, then chroot;
    // every mount goes with the namespace when the command ends.
    const root = path.join(dir, 'host-apt-root');
    await mkdir(root, { recursive: true });
    const setup = [
      'set -e',
      'mount -t tmpfs tmpfs "$2"',
      'mkdir "$2/u" "$2/w" "$2/m"',
      'mount -t overlay overlay -o "lowerdir=$1,upperdir=$2/u,workdir=$2/w" "$2/m"',
      'mount --rbind /dev "$2/m/dev"',
      'mount -t proc proc "$2/m/proc"',
      `mkdir -p "$2/m${path.dirname(APT_KEYRING)}"`,
      `cp "$3" "$2/m${APT_SOURCE}"`,
      `if [ -n "$4" ]; then cp "$4" "$2/m${APT_KEYRING}"; fi`,
      'exec chroot "$2/m" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin sh -c "$5"',
    ].join('\n');
    const args = ['--mount', '--propagation', 'private', '--', 'sh', '-c', setup, 'sh', lower, root, source, key ? keyring : '', APT_SCRIPT];
    await reg.apt.reset();
    const t0 = nowMs();
    await run('unshare', args, { maxBuffer: 64 * 1024 * 1024, timeout: INSTALL_TIMEOUT_MS });
    const seconds = (nowMs() - t0) / 1000;
    return { seconds, ...(await reg.apt.stats()), refused: 0 };
  } finally {
    await store.release(base.digest);
    await store.close();
  }
}

/** apt in a sandbox of the same base, its source `http://deb.debian.org/debian` (the preset's name, or the mirror). */
async function sandboxApt(client: DsecClient, reg: ShapedRegistry, key: RepoKey | undefined, net: NetworkPolicy): Promise<Measured> {
  const sb = await Sandbox.create({ image: { base: BASE_NAME }, resources: { cpu: 2, memoryMiB: 1024 }, network: net }, { client });
  try {
    if (key) await sb.files.write(APT_KEYRING, key.keyring);
    await sb.files.write(APT_SOURCE, aptSource('deb.debian.org', key));
    await reg.apt.reset();
    const t0 = nowMs();
    const r = await sb.exec(['sh', '-c', APT_SCRIPT], { timeoutMs: INSTALL_TIMEOUT_MS });
    const seconds = (nowMs() - t0) / 1000;
    if (r.exitCode !== 0) throw new Error(`apt-get in the sandbox: ${r.stdout.slice(-1000)} ${r.stderr.slice(-2000)}`);
    const refused = (await sb.network.log({ limit: 1000 })).filter((e) => e.verdict === 'denied').length;
    return { seconds, ...(await reg.apt.stats()), refused };
  } finally {
    await sb.kill().catch(() => undefined);
  }
}

export const installScenario: Scenario = {
  name: 'install',
  title: '13. Package install through the egress proxy',
  onlyWhenNamed: true,
  method: [
    `\`npm install\` of ${PROJECT}'s development dependencies (its package.json and package-lock.json, every tarball`,
    'the lockfile names), captured once from registry.npmjs.org into the bench cache and served by the local registry',
    `fixture over TLS from a network namespace behind a shaped link (a relay delaying data ${ONE_WAY_DELAY_MS} ms each way = 20 ms RTT, tbf at`,
    `${RATE}/s). Every run starts with an empty npm cache. Host: npm on the host against the registry's address. Preset:`,
    'a sandbox (Debian base + the same Node and npm as a toolkit) with `presets: [npm]`, `registry.npmjs.org` mapped to',
    "the registry by the node's `hosts`, the registry's CA in `node.network.caCertificates`. Mirror cold / warm: the same",
    "with the npm mirror, first with the node's mirror cache empty, then full. Connections are what the registry accepted;",
    'refused are connection-limit refusals in the sandbox egress log. No lockfile: the same project without its',
    'package-lock.json and without nyc, whose 182 dependencies come bundled in its tarball (npm resolves every',
    'packument; the registry serves the captured versions only).',
    `apt: \`apt-get update\` and \`apt-get install\` of ${APT_INSTALL.join(', ')} (${APT_DEBS.length} real .debs downloaded once with`,
    '`apt-get download`, indexed with dpkg-scanpackages, the Release signed with a key made for the run) from the same',
    'child on port 80 behind the same link; host: chroot into the same Debian base (a tmpfs overlay, host network);',
    'sandboxes with the debian preset (`deb.debian.org` mapped by `hosts`) and the debian mirror, cold and warm.',
  ].join(' '),
  async run(ctx: ScenarioContext): Promise<void> {
    const tree = await capturedTree(ctx.cacheDir);
    const preload = await cachedLayers(ctx.cacheDir);
    const dir = path.join(ctx.dir, 'install');
    await mkdir(dir, { recursive: true });
    const contents = await contentsFromTarballs(tree.tarballs);
    const index = path.join(dir, 'registry.json');
    await writeFile(index, JSON.stringify({ packuments: [...contents.packuments], tarballs: [...contents.tarballs] }));
    const link = shapedLinkNames('reg', 'dbr', 215);
    const ca = await makeCertificateAuthority('dsec bench registry CA');
    const tlsDir = path.join(dir, 'tls');
    await mkdir(tlsDir, { recursive: true });
    const caFile = path.join(tlsDir, 'ca.pem');
    await writeFile(caFile, ca.cert);
    const pair = await ca.issue(['registry.npmjs.org', link.address]);
    await writeFile(path.join(tlsDir, 'key.pem'), pair.key, { mode: 0o600 });
    await writeFile(path.join(tlsDir, 'cert.pem'), pair.cert);
    progress(`install: registry with ${contents.packuments.size} packages, ${contents.tarballs.size} tarballs at ${link.address} behind a shaped link`);
    // The apt repository: the captured .debs, indexed and signed here (gpg on the host; else unsigned, trusted=yes).
    const debs = await capturedDebs(ctx.cacheDir);
    const aptDir = path.join(dir, 'apt-repo');
    const key = await makeRepoKey(dir);
    if (key) onCleanup('apt repository key', () => key.close());
    await writeDebianRepo(aptDir, debs, { suite: APT_SUITE, key });
    progress(`install: apt repository of ${debs.length} packages (${key ? 'signed' : 'unsigned: gpg is not installed, trusted=yes'})`);
    const reg = await shapedRegistry(link, index, tlsDir, aptDir);

    // A platform of its own: the node maps registry.npmjs.org to the registry and trusts its CA.
    const operatorRanges = 'allowedPrivateRanges' in NetworkConfigSchema.shape;
    const home = path.join(dir, 'home');
    for (const l of preload) {
      const blobs = path.join(home, 'node', 'layers', 'blobs');
      await mkdir(blobs, { recursive: true });
      await cp(l.blobDir, path.join(blobs, path.basename(l.blobDir)), { recursive: true });
    }
    const platform: Platform = await startPlatform({
      home,
      addr: '127.0.0.1:0',
      agentBinary: AGENT_BINARY,
      log: () => undefined,
      network: {
        hosts: { 'registry.npmjs.org': link.address, 'deb.debian.org': link.address },
        nameservers: [],
        caCertificates: [ca.cert],
        mirrors: { origins: [`http://${link.address}`] },
        ...(operatorRanges ? { allowedPrivateRanges: [`${link.address}/32`] } : {}),
      },
    });
    onCleanup('install platform', () => platform.shutdown());
    for (const l of layers) {
      const stored = await platform.edge.layers.resolve(l.info.digest);
      await platform.edge.layers.tag(stored.digest, l.name);
      await platform.services.layers.register(ROOT_PROJECT_ID, stored, l.name);
    }
    const client = new DsecClient({ apiUrl: platform.url, apiKey: platform.adminKey! });
    const policy = (extra: Partial<NetworkPolicy> = {}): NetworkPolicy => ({
      mode: 'allowlist',
      presets: ['npm'],
      ...(operatorRanges ? {} : { allowAddresses: [link.address] }),
      ...extra,
    });

    const results: Array<[string, Measured]> = [];
    progress('install: host');
    results.push(['host', await hostInstall(tree, reg, caFile, dir)]);
    progress('install: sandbox, npm preset');
    results.push(['sandbox, npm preset', await sandboxInstall(client, tree, reg, policy())]);
    progress('install: sandbox, npm mirror (cold)');
    results.push(['sandbox, npm mirror cold', await sandboxInstall(client, tree, reg, policy({ mirrors: { npm: {} } }))]);
    progress('install: sandbox, npm mirror (warm)');
    results.push(['sandbox, npm mirror warm', await sandboxInstall(client, tree, reg, policy({ mirrors: { npm: {} } }))]);
    progress('install: host, no lockfile');
    results.push(['host, no lockfile', await hostInstall(tree, reg, caFile, dir, false)]);
    progress('install: sandbox, npm preset, no lockfile');
    results.push(['sandbox, npm preset, no lockfile', await sandboxInstall(client, tree, reg, policy(), false)]);

    const aptPolicy = (extra: Partial<NetworkPolicy>): NetworkPolicy => ({
      mode: 'allowlist',
      ...(operatorRanges ? {} : { allowAddresses: [link.address] }),
      ...extra,
    });
    const apt: Array<[string, Measured]> = [];
    progress('install: apt, host');
    apt.push(['host', await hostApt(ctx.cacheDir, reg, key, dir)]);
    progress('install: apt, sandbox, debian preset');
    apt.push(['sandbox, debian preset', await sandboxApt(client, reg, key, aptPolicy({ presets: ['debian'] }))]);
    const mirror = aptPolicy({ mirrors: { debian: { upstream: `http://${link.address}/` } } });
    progress('install: apt, sandbox, debian mirror (cold)');
    apt.push(['sandbox, debian mirror cold', await sandboxApt(client, reg, key, mirror)]);
    progress('install: apt, sandbox, debian mirror (warm)');
    apt.push(['sandbox, debian mirror warm', await sandboxApt(client, reg, key, mirror)]);

    const host = results[0]![1].seconds;
    const hostNoLock = results[4]![1].seconds;
    const aptHost = apt[0]![1].seconds;
    const rows: Array<[string, string, Measured, number]> = [
      ...results.map(([what, m]): [string, string, Measured, number] => [
        what.includes('no lockfile') ? `npm install (no lockfile, without ${NO_LOCKFILE_DROPS})` : `npm install (${contents.tarballs.size} packages)`,
        what,
        m,
        what.includes('no lockfile') ? hostNoLock : host,
      ]),
      ...apt.map(([what, m]): [string, string, Measured, number] => [
        `apt-get update + install (${APT_INSTALL.length} packages, ${debs.length} .debs)`,
        what,
        m,
        aptHost,
      ]),
    ];
    for (const [metric, what, m, base] of rows) {
      ctx.record({
        scenario: 'install',
        metric,
        system: what,
        unit: 's',
        value: Number(m.seconds.toFixed(2)),
        note: `${(m.seconds / base).toFixed(2)}x host; ${m.connections} connections, ${m.requests} requests at the server; ${m.refused} refused`,
        compare: false,
      });
      progress(`install: ${metric}: ${what}: ${m.seconds.toFixed(1)} s, ${m.connections} connections, ${m.requests} requests, ${m.refused} refused`);
    }
    const preset = results[1]![1].seconds;
    const warm = results[3]![1].seconds;
    const aptPreset = apt[1]![1].seconds;
    ctx.note(
      `${contents.tarballs.size} packages. Targets: preset <= 1.5x host: ${(preset / host).toFixed(2)}x (${preset / host <= 1.5 ? 'met' : 'missed'}); mirror warm faster than the host's cold install: ${warm.toFixed(1)} s vs ${host.toFixed(1)} s (${warm < host ? 'met' : 'missed'}); apt with the debian preset <= 1.5x host: ${(aptPreset / aptHost).toFixed(2)}x (${aptPreset / aptHost <= 1.5 ? 'met' : 'missed'}).`,
    );
  },
};
