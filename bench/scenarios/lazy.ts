// Lazy image loading: a node that has never seen an image starts a sandbox from it and runs one
// first command, with the image pulled whole first (eager), mounted lazily (chunks fetched as
// read, neighbours merged into one range request), and mounted lazily with the access profile
// the lazy run recorded (its chunks prefetched in the background, in blob order, from create on).
// Each start is on a fresh node home (an empty chunk cache) against a docker-registry in a network
// namespace the bench makes, reached over a veth pair shaped to a cluster link: tbf at 1 Gbit/s
// on both ends and a relay adding 0.5 ms each way (this kernel has no netem). Beside them, the
// large image's root as an OCI image in the same registry: `podman pull` + `podman run` of it
// through the same link, podman's storage new per round (bench/lib/podman.ts). Only with
// `--only lazy`.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Edge, LayerRegistry, LayerStore, layerTag, MNT, mountsUnder, startOciRegistry, umount } from '@dsec/edge';
import type { OciRegistry } from '@dsec/edge';
import type { LayerInfo } from '@dsec/protocol';
import { onCleanup } from '../lib/cleanup.js';
import { podmanPullRun, podmanVersion, pushAsOciImage } from '../lib/podman.js';
import { makeShapedLink, shapedLinkNames } from '../lib/shaped-link.js';
import type { ShapedLinkNames } from '../lib/shaped-link.js';
import { AGENT_BINARY } from '../lib/platform.js';
import type { PreloadedLayer } from '../lib/platform.js';
import type { Scenario, ScenarioContext } from '../lib/scenario.js';
import { nowMs, percentile, progress, sleep } from '../lib/stats.js';

const MiB = 1024 * 1024;
/** The small image's toolkit: many small files, all read by its first command. */
const SMALL_FILES = 2000;
const SMALL_FILE_BYTES = 8 * 1024;
/** Its first command reads the first this-many hundred files (without read-ahead each costs a request). */
const SMALL_READ_HUNDREDS = 2;
/** `lazy, one request per read`: no read-ahead (what a node did before requests were merged), small image only. */
const MODES = ['eager pull', 'lazy, one request per read', 'lazy', 'lazy + profile'] as const;

type Mode = (typeof MODES)[number];

/**
 * The large image: a Debian development base of more than 1 GiB with no filler (compilers, Go
 * with its standard library's sources, clang/LLVM, numpy and scipy), built once with the project's
 * Debian builder into the bench's persistent cache.
 */
const LARGE_PACKAGES = ['python3', 'python3-six', 'git', 'gcc', 'g++', 'make', 'golang-go', 'clang', 'python3-numpy', 'python3-scipy'];
const LARGE_NAME = `bench-lazy-${LARGE_PACKAGES.length}pkgs-${LARGE_PACKAGES.join('-').length}`;
/** The link: tbf rate on both ends of the veth pair, and the relay's one-way delay. */
const LINK_RATE = '1gbit';
const ONE_WAY_DELAY_US = 500;
/** bcrypt cost of the registry's password: a cluster registry's token check is cheap (see method). */
const BCRYPT_COST = 4;
/** Bytes over the link are sampled this often during a cold start (ms). */
const SAMPLE_MS = 100;
/** The OCI image of the large layer's root, for podman. */
const PODMAN_REPO = 'bench/debian';
const PODMAN = 'podman pull + run';
const RELAY = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'lib', 'delay-relay.js');

interface Image {
  name: string;
  base: LayerInfo;
  toolkits: LayerInfo[];
  cmd: string;
}

let debian: { info: LayerInfo; blobDir: string } | undefined;

/** The large image from the bench's persistent cache, built there on first use (minutes). */
async function cachedLargeImage(cacheDir: string): Promise<{ info: LayerInfo; blobDir: string }> {
  const root = path.join(cacheDir, 'layers');
  const store = new LayerStore({ root });
  try {
    let info = await store.resolve(LARGE_NAME).catch(() => undefined);
    if (!info) {
      progress(`lazy: building the large Debian image (${LARGE_PACKAGES.join(', ')}) into ${root}; later runs reuse it`);
      info = await store.build({ type: 'debian', packages: LARGE_PACKAGES }, { kind: 'base', name: LARGE_NAME, onProgress: (m) => progress(`lazy: ${m}`) });
    }
    return { info, blobDir: path.join(root, 'blobs', info.digest.replace(/^sha256:/, '')) };
  } finally {
    await store.close();
  }
}

/** A registry in a network namespace behind the shaped link: `url` through the relay (what nodes use). */
interface ShapedRegistry {
  registry: OciRegistry;
  url: string;
  /** The link's host-side interface: its received bytes are what came from the registry. */
  hostIf: string;
}

/** A network namespace joined to the host by a veth pair with tbf at LINK_RATE on both ends. */
async function shapedLink(): Promise<ShapedLinkNames> {
  const link = shapedLinkNames('lazy', 'dbl', 216);
  // The burst holds a few GSO segments (veth hands tbf 64 KiB packets); latency bounds the queue.
  await makeShapedLink(link, { rate: LINK_RATE, burst: '256kb', latency: '50ms' });
  return link;
}

/** A registry in `link`'s namespace on `port + 1`, behind the delaying relay on `port`. */
async function shapedRegistry(link: ShapedLinkNames, port: number): Promise<ShapedRegistry> {
  const registry = await startOciRegistry({ netns: { name: link.ns, address: link.address, port: port + 1 }, bcryptCost: BCRYPT_COST });
  onCleanup(`lazy bench registry ${link.address}:${port}`, () => registry.close());
  const relay: ChildProcess = spawn(
    'ip',
    ['netns', 'exec', link.ns, process.execPath, RELAY, link.address, String(port), link.address, String(port + 1), String(ONE_WAY_DELAY_US)],
    {
      stdio: ['ignore', 'pipe', 'inherit'],
    },
  );
  onCleanup(`lazy bench relay ${link.address}:${port}`, () => relay.kill('SIGKILL'));
  await new Promise<void>((resolve, reject) => {
    relay.stdout!.once('data', () => resolve());
    relay.once('exit', (code) => reject(new Error(`the delay relay exited (${code})`)));
  });
  return { registry, url: `http://${link.address}:${port}`, hostIf: link.hostIf };
}

/** Median of `GET /v2/` round trips (after a first one that opens the connection) through `url`. */
async function httpRoundTripMs(url: string): Promise<number> {
  await fetch(`${url}/v2/`).then((r) => r.arrayBuffer());
  const times: number[] = [];
  for (let i = 0; i < 20; i++) {
    const t0 = nowMs();
    await fetch(`${url}/v2/`).then((r) => r.arrayBuffer());
    times.push(nowMs() - t0);
  }
  return percentile(times, 50);
}

/** Bytes the host has received on interface `dev` (from the registry's namespace). */
const rxBytes = (dev: string): Promise<number> => readFile(`/sys/class/net/${dev}/statistics/rx_bytes`, 'utf8').then(Number);

/** Samples of the bytes received on `dev` from now on, every SAMPLE_MS until stopped: [ms, MiB]. */
function sampleLink(dev: string): { stop(): Promise<Array<[number, number]>> } {
  const points: Array<[number, number]> = [];
  const t0 = nowMs();
  let base: number | undefined;
  // A failed read (the link gone with a failed run) is kept for stop(), never left unhandled.
  let failure: unknown;
  const take = async (): Promise<void> => {
    try {
      const n = await rxBytes(dev);
      base ??= n;
      points.push([Math.round(nowMs() - t0), (n - base) / MiB]);
    } catch (err) {
      failure ??= err;
    }
  };
  let sampling = take();
  const timer = setInterval(() => {
    sampling = sampling.then(take);
  }, SAMPLE_MS);
  return {
    async stop() {
      clearInterval(timer);
      await sampling.then(take);
      if (failure !== undefined) throw failure instanceof Error ? failure : new Error(`reading the link counter of ${dev} failed`);
      return points;
    },
  };
}

/** Blob GETs (whole blobs and ranges) the registry answered. */
const blobGets = (registry: OciRegistry): number => registry.requests().filter((r) => /^GET \/v2\/.+\/blobs\/sha256:/.test(r)).length;

/**
 * One cold start of `image` on a fresh node home: create, then the first command to its end;
 * then a warm start on the same node (create and the same command again, chunks cached).
 */
async function coldStart(
  ctx: ScenarioContext,
  shaped: ShapedRegistry,
  image: Image,
  mode: Mode,
): Promise<{ ms: number; warmMs: number; bytes: number; requests: number; prefetched: number; overTime: Array<[number, number]> }> {
  const { registry } = shaped;
  const home = await mkdtemp(path.join(ctx.dir, `lazy-node-`));
  const endpoint = { url: shaped.url, username: registry.username, password: registry.password };
  const edge = await Edge.open({
    home,
    agentBinary: AGENT_BINARY,
    nodeName: 'lazy-bench',
    cgroupParent: `dsec-bench-lazy-${path.basename(home).slice(-6)}`,
    registry: {
      ...endpoint,
      lazy: mode !== 'eager pull',
      ...(mode === 'lazy, one request per read' ? { readAheadBytes: 0 } : {}),
    },
  });
  const done = onCleanup(`lazy bench node ${home}`, async () => {
    await edge.shutdown().catch(() => undefined);
    for (const m of (await mountsUnder(home)).reverse()) umount(m, MNT.DETACH);
    await rm(home, { recursive: true, force: true });
  });
  let link: ReturnType<typeof sampleLink> | undefined;
  try {
    registry.clearLog();
    const spec = { image: { base: image.base.digest, toolkits: image.toolkits.map((t) => t.digest) } };
    link = sampleLink(shaped.hostIf);
    const t0 = nowMs();
    const sb = await edge.create(spec);
    const r = await edge.exec(sb.id, { cmd: image.cmd });
    const ms = nowMs() - t0;
    const overTime = await link.stop();
    link = undefined;
    if (r.exitCode !== 0) throw new Error(`lazy: ${image.name}, ${mode}: first command failed: ${r.stderr.slice(-300)}`);
    const requests = blobGets(registry);
    const layers = [image.base, ...image.toolkits];
    const metaBytes = layers.reduce((n, l) => n + l.metaBytes, 0);
    const cache = await edge.layers.cacheStats();
    let prefetched = 0;
    for (const l of layers) prefetched += (await edge.layers.lazy?.serverStats(l.digest.slice(7)))?.prefetchedChunks ?? 0;
    // The profiles are stored after the first command's end, before the node goes.
    if (mode === 'lazy') await profilesStored(new LayerRegistry(endpoint), image, path.join(ctx.dir, 'lazy-profile.json'));
    const bytes = mode === 'eager pull' ? layers.reduce((n, l) => n + l.metaBytes + l.blobBytes, 0) : metaBytes + (cache?.fetchedBytes ?? 0);
    await edge.destroy(sb.id);
    const t1 = nowMs();
    const again = await edge.create(spec);
    const r2 = await edge.exec(again.id, { cmd: image.cmd });
    const warmMs = nowMs() - t1;
    if (r2.exitCode !== 0) throw new Error(`lazy: ${image.name}, ${mode}: warm command failed: ${r2.stderr.slice(-300)}`);
    await edge.destroy(again.id);
    return { ms, warmMs, bytes, requests, prefetched, overTime };
  } finally {
    // A run that failed before its first command ended still stops its sampler.
    await link?.stop().catch(() => undefined);
    await done();
  }
}

/** One cold `podman pull` + `podman run` of the large image through the shaped link, bytes over time sampled. */
async function podmanColdStart(
  ctx: ScenarioContext,
  shaped: ShapedRegistry,
  ref: string,
  cmd: string,
): Promise<{ ms: number; pullMs: number; warmMs: number; bytes: number; overTime: Array<[number, number]> }> {
  const link = sampleLink(shaped.hostIf);
  const rx0 = await rxBytes(shaped.hostIf);
  const endpoint = { url: shaped.url, username: shaped.registry.username, password: shaped.registry.password };
  let cold: { overTime: Array<[number, number]>; bytes: number } | undefined;
  try {
    const r = await podmanPullRun(
      ctx.dir,
      endpoint,
      ref,
      ['sh', '-c', cmd],
      async () => {
        cold = { overTime: await link.stop(), bytes: (await rxBytes(shaped.hostIf)) - rx0 };
      },
      ctx.peers.prefix,
    );
    if (!cold) throw new Error('lazy: podman: the cold run was not measured');
    return { ms: r.ms, pullMs: r.pullMs, warmMs: r.warmMs, ...cold };
  } finally {
    if (!cold) await link.stop();
  }
}

/** The podman rows of `image` beside dsec's: cold start, its pull, warm start, bytes, and dsec's ratios to it. */
function recordPodman(
  ctx: ScenarioContext,
  image: Image,
  total: number,
  rs: Array<Awaited<ReturnType<typeof podmanColdStart>>>,
  dsec: Map<Mode, Array<{ ms: number }>>,
): void {
  const med = (f: (r: (typeof rs)[number]) => number): number => percentile(rs.map(f), 50);
  const all = (f: (r: (typeof rs)[number]) => number): string => `runs: ${rs.map((r) => f(r).toFixed(0)).join(', ')}`;
  const n = rs.length;
  const base = { scenario: 'lazy', system: PODMAN, n };
  ctx.record({ ...base, metric: `${image.name}: create to first command end`, unit: 'ms', value: med((r) => r.ms), note: all((r) => r.ms) });
  ctx.record({ ...base, metric: `${image.name}: podman pull alone`, unit: 'ms', value: med((r) => r.pullMs), note: all((r) => r.pullMs) });
  ctx.record({
    ...base,
    metric: `${image.name}: warm start (same node again) to command end`,
    unit: 'ms',
    value: med((r) => r.warmMs),
    note: all((r) => r.warmMs),
  });
  ctx.record({
    ...base,
    metric: `${image.name}: bytes fetched`,
    unit: 'MiB',
    value: med((r) => r.bytes) / MiB,
    note: `bytes received over the link (gzip layer and HTTP); the image's root is ${(total / MiB).toFixed(1)} MiB as dsec layers`,
  });
  const middle = [...rs].sort((a, b) => a.ms - b.ms)[Math.floor((rs.length - 1) / 2)]!;
  ctx.record({
    ...base,
    n: 1,
    metric: `${image.name}: bytes received over the link over time`,
    unit: 'MiB',
    value: middle.overTime[middle.overTime.length - 1]?.[1] ?? 0,
    note: `the run of median cold start (${middle.ms.toFixed(0)} ms), sampled every ${SAMPLE_MS} ms from the pull's start to the run's end`,
    series: { x: 'ms since create', y: 'MiB received over the link', points: middle.overTime },
  });
  const podmanMs = med((r) => r.ms);
  for (const [mode, runs] of dsec) {
    if (mode === 'eager pull') continue;
    const ms = percentile(
      runs.map((r) => r.ms),
      50,
    );
    ctx.record({
      scenario: 'lazy',
      metric: `${image.name}: create to first command end, share of podman pull + run`,
      system: `dsec ${mode}`,
      unit: '%',
      n: Math.min(n, runs.length),
      value: (100 * ms) / podmanMs,
      note: `medians: dsec ${ms.toFixed(0)} ms, podman pull + run ${podmanMs.toFixed(0)} ms (target <= 25%)`,
    });
  }
}

/**
 * Deletes the access profiles of `image`'s layers from `registry` (the registry API's manifest
 * DELETE), so that the next lazy run records one again instead of prefetching.
 */
async function dropProfiles(registry: OciRegistry, repository: string, image: Image): Promise<void> {
  const auth = `Basic ${Buffer.from(`${registry.username}:${registry.password}`).toString('base64')}`;
  for (const l of [image.base, ...image.toolkits]) {
    const tag = `${layerTag(l.digest)}.profile`;
    const head = await fetch(`${registry.url}/v2/${repository}/manifests/${tag}`, {
      method: 'HEAD',
      headers: { authorization: auth, accept: 'application/vnd.oci.image.manifest.v1+json' },
    });
    const digest = head.headers.get('docker-content-digest');
    if (head.status === 404 || digest === null) continue;
    const del = await fetch(`${registry.url}/v2/${repository}/manifests/${digest}`, { method: 'DELETE', headers: { authorization: auth } });
    if (del.status !== 202) throw new Error(`lazy: DELETE of ${tag} answered ${del.status}`);
  }
}

/** Waits until the registry holds an access profile of every layer of `image` (the lazy run stores them). */
async function profilesStored(registry: LayerRegistry, image: Image, scratch: string): Promise<void> {
  const until = nowMs() + 60_000;
  for (const l of [image.base, ...image.toolkits]) {
    while ((await registry.profile(l.digest, scratch)) === undefined) {
      if (nowMs() > until) throw new Error(`lazy: no profile of ${l.digest} stored within 60 s`);
      await sleep(200);
    }
  }
}

export const lazyScenario: Scenario = {
  name: 'lazy',
  title: 'Lazy image loading',
  onlyWhenNamed: true,
  method: [
    'Cold start to the end of the first command on a node that has never seen the image (fresh node home, empty chunk',
    'cache), three ways: **eager pull** (the layers pulled whole from the registry, then mounted), **lazy** (EROFS',
    'metadata and chunk index pulled, data chunks fetched by HTTP range request as read, neighbouring missed extents',
    'and up to 1 MiB of read-ahead merged into one request), **lazy + profile** (the same, with the access profile the',
    "lazy run recorded up to its first command's end stored beside each layer in the registry and prefetched from",
    'create on, sorted by offset into runs of up to 8 MiB), and for the small image **lazy, one request per read** (no',
    'read-ahead; a registry of its own, so that its profile serves no other run). Then a warm start on the same node',
    '(create and the same command again, every chunk read cached): with eager pull that is a node with the layers',
    `local, as before lazy loading. Small image: the busybox base plus a toolkit of ${SMALL_FILES.toLocaleString('en')} files of`,
    `${SMALL_FILE_BYTES / 1024} KiB, first command \`cat\` of the first ${SMALL_READ_HUNDREDS * 100}. Large image: a Debian bookworm root with`,
    `${LARGE_PACKAGES.join(', ')} (more than 1 GiB, no filler; Go's standard library sources stand for a sizeable`,
    "repository), first command `python3 -c 'import json'`. The registry is Debian's docker-registry in a network",
    `namespace the bench makes, over a veth pair with tbf at ${LINK_RATE}/s on both ends and a relay in the namespace adding`,
    `${ONE_WAY_DELAY_US} µs each way (this kernel has no netem; timers make that at least 1 ms each way on a loaded machine:`,
    'the measured HTTP round trip is in the table). Its htpasswd hash has bcrypt cost 4: Basic auth checks it on every',
    "request, and a cluster registry's token check is cheap (at the usual cost 12 each request paid ~250 ms of CPU",
    'here). For the large image, **podman pull + run**: its root as a one-layer gzip OCI image (made once into the',
    "bench's cache) in the same registry, `podman pull` through the same link then `podman run --rm --network none` of",
    "the same command, with podman's storage (`--root`, `--runroot`, overlay driver) new in each round and removed after",
    "(the machine's podman storage is never used), then the same run again as its warm start.",
    'Three rounds (one with `--quick`), each running the modes in turn; each cell is the median, the runs in its note.',
  ].join(' '),
  async prepare({ cacheDir }): Promise<PreloadedLayer[]> {
    debian = await cachedLargeImage(cacheDir);
    return [{ blobDir: debian.blobDir }];
  },
  async run(ctx: ScenarioContext) {
    if (!debian) throw new Error('lazy: prepare() did not run');
    const edge = ctx.bench.platform.edge;
    const link = await shapedLink();
    const shaped = await shapedRegistry(link, 5000);
    // The runs without read-ahead get a registry of their own: the profile they record serves no other run.
    const beforeShaped = await shapedRegistry(link, 5002);
    const rtt = await httpRoundTripMs(shaped.url);
    progress(`lazy: HTTP round trip through the shaped link ${rtt.toFixed(2)} ms`);
    ctx.record({
      scenario: 'lazy',
      metric: 'link: HTTP round trip (GET /v2/, kept-alive connection, p50 of 20)',
      system: 'shaped link',
      unit: 'ms',
      n: 20,
      value: rtt,
    });
    const reg = new LayerRegistry({ url: shaped.registry.url, username: shaped.registry.username, password: shaped.registry.password });
    const before = new LayerRegistry({ url: beforeShaped.registry.url, username: beforeShaped.registry.username, password: beforeShaped.registry.password });

    const tree = path.join(ctx.dir, 'lazy', 'small');
    await mkdir(path.join(tree, 'opt', 'small'), { recursive: true });
    for (let i = 0; i < SMALL_FILES; i++) {
      const bytes = Buffer.alloc(SMALL_FILE_BYTES);
      for (let k = 0; k < bytes.length; k += 4) bytes.writeUInt32LE((i * 2654435761 + k * 40503) >>> 0, k);
      await writeFile(path.join(tree, 'opt', 'small', `f${String(i).padStart(4, '0')}`), bytes);
    }
    const busybox = await edge.layers.resolve('busybox');
    const small = await edge.layers.build({ type: 'dir', path: tree }, { kind: 'toolkit' });
    const large = debian.info;
    const images: Image[] = [
      { name: `small (busybox + ${SMALL_FILES} files)`, base: busybox, toolkits: [small], cmd: `cat /opt/small/f0[0-${SMALL_READ_HUNDREDS - 1}]* > /dev/null` },
      {
        name: `large (Debian ${((large.metaBytes + large.blobBytes) / 1024 / MiB).toFixed(2)} GiB)`,
        base: large,
        toolkits: [],
        cmd: "python3 -c 'import json'",
      },
    ];
    progress('lazy: pushing the layers to the registries (over the shaped link)');
    for (const l of [busybox, small, large]) {
      const files =
        l.digest === large.digest
          ? { meta: path.join(debian.blobDir, 'meta.erofs'), blob: path.join(debian.blobDir, 'data.blob') }
          : edge.layers.imageFiles(l.digest);
      await reg.push(files, l);
      if (l !== large) await before.push(files, l);
    }
    // The large image's root as a one-layer gzip OCI image in the same registry, for podman.
    const podman = await podmanVersion();
    let podmanImage: { ref: string; bytes: number } | undefined;
    if (podman === undefined) ctx.note('podman is not installed here: no podman pull + run rows.');
    else {
      progress(`lazy: pushing the large image as an OCI image for ${podman}`);
      try {
        podmanImage = await pushAsOciImage(
          { url: shaped.url, username: shaped.registry.username, password: shaped.registry.password },
          PODMAN_REPO,
          'large',
          ctx.cacheDir,
          edge.layers,
          large,
          progress,
        );
      } catch (err) {
        ctx.note(`podman: the OCI image could not be pushed: ${(err as Error).message.slice(0, 500)}`);
      }
    }
    // Rounds alternate the modes (eager, lazy, lazy + profile, ...); each cell is the median.
    const rounds = ctx.quick ? 1 : 3;
    for (const image of images) {
      const total = [image.base, ...image.toolkits].reduce((n, l) => n + l.metaBytes + l.blobBytes, 0);
      const results = new Map<Mode, Awaited<ReturnType<typeof coldStart>>[]>();
      const podmanRuns: Array<Awaited<ReturnType<typeof podmanColdStart>>> = [];
      for (let round = 0; round < rounds; round++) {
        for (const mode of MODES) {
          if (mode === 'lazy, one request per read' && image.base === large) continue;
          const target = mode === 'lazy, one request per read' ? beforeShaped : shaped;
          // A lazy run without a profile: the one the last round recorded goes first.
          if (mode === 'lazy' || mode === 'lazy, one request per read') await dropProfiles(target.registry, reg.repository, image);
          progress(`lazy: ${image.name}, ${mode}, round ${round + 1}/${rounds}`);
          const r = await coldStart(ctx, target, image, mode);
          results.set(mode, [...(results.get(mode) ?? []), r]);
        }
        if (podmanImage && image.base === large) {
          progress(`lazy: ${image.name}, ${PODMAN}, round ${round + 1}/${rounds}`);
          try {
            podmanRuns.push(await podmanColdStart(ctx, shaped, podmanImage.ref, image.cmd));
          } catch (err) {
            // dsec's rows stand without podman's: the failure is written in the notes.
            ctx.note(`podman pull + run failed in round ${round + 1}: ${(err as Error).message.slice(0, 500)}`);
          }
        }
      }
      for (const [mode, rs] of results) {
        const system = `dsec ${mode}`;
        const med = (f: (r: (typeof rs)[number]) => number): number => percentile(rs.map(f), 50);
        const all = (f: (r: (typeof rs)[number]) => number, digits = 0): string => `runs: ${rs.map((r) => f(r).toFixed(digits)).join(', ')}`;
        const n = rs.length;
        ctx.record({
          scenario: 'lazy',
          metric: `${image.name}: create to first command end`,
          system,
          unit: 'ms',
          n,
          value: med((r) => r.ms),
          note: all((r) => r.ms),
        });
        ctx.record({
          scenario: 'lazy',
          metric: `${image.name}: warm start (same node again) to command end`,
          system,
          unit: 'ms',
          n,
          value: med((r) => r.warmMs),
          note: all((r) => r.warmMs),
        });
        ctx.record({
          scenario: 'lazy',
          metric: `${image.name}: bytes fetched`,
          system,
          unit: 'MiB',
          n,
          value: med((r) => r.bytes) / MiB,
          note: `${((100 * med((r) => r.bytes)) / total).toFixed(1)}% of the image's ${(total / MiB).toFixed(1)} MiB`,
        });
        // The bytes over time of the run whose cold start is the median.
        const middle = [...rs].sort((a, b) => a.ms - b.ms)[Math.floor((rs.length - 1) / 2)]!;
        ctx.record({
          scenario: 'lazy',
          metric: `${image.name}: bytes received over the link over time`,
          system,
          unit: 'MiB',
          n: 1,
          value: middle.overTime[middle.overTime.length - 1]?.[1] ?? 0,
          note: `the run of median cold start (${middle.ms.toFixed(0)} ms), sampled every ${SAMPLE_MS} ms from create to the first command's end`,
          series: { x: 'ms since create', y: 'MiB received over the link', points: middle.overTime },
        });
        ctx.record({
          scenario: 'lazy',
          metric: `${image.name}: blob requests to the registry`,
          system,
          unit: 'requests',
          n,
          value: med((r) => r.requests),
          note: `${all((r) => r.requests)}${mode === 'lazy + profile' ? `; chunks prefetched: ${rs.map((r) => r.prefetched).join(', ')}` : ''}`,
        });
      }
      if (podmanRuns.length > 0) recordPodman(ctx, image, total, podmanRuns, results);
    }
    ctx.note('C FUSE server (dsec-lazyfs) only: a JavaScript FUSE server was not built to compare with (left).');
  },
};
