// Lazy image loading: a node that has never seen an image starts a sandbox from it and runs one
// first command, with the image pulled whole first (eager), mounted lazily (chunks fetched as
// read, neighbours merged into one range request), and mounted lazily with the access profile
// the lazy run recorded (its chunks prefetched in the background from create on). Each start is
// on a fresh node home (an empty chunk cache) against one docker-registry on loopback that asks
// for a password (bcrypt) on every request, as the tests' does. Only with `--only lazy`.
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { Edge, LayerRegistry, MNT, mountsUnder, startOciRegistry, umount } from '@dsec/edge';
import type { OciRegistry } from '@dsec/edge';
import type { LayerInfo } from '@dsec/protocol';
import { onCleanup } from '../lib/cleanup.js';
import { AGENT_BINARY } from '../lib/platform.js';
import type { PreloadedLayer } from '../lib/platform.js';
import type { Scenario, ScenarioContext } from '../lib/scenario.js';
import { nowMs, progress, sleep } from '../lib/stats.js';
import { BASE_PACKAGES, cachedDebianBase } from './episode.js';

const MiB = 1024 * 1024;
/** The small image's toolkit: many small files, all read by its first command. */
const SMALL_FILES = 2000;
const SMALL_FILE_BYTES = 8 * 1024;
/** Its first command reads the first this-many hundred files (without read-ahead each costs a request). */
const SMALL_READ_HUNDREDS = 2;
/** `lazy, one request per read`: no read-ahead (what a node did before requests were merged), small image only. */
const MODES = ['eager pull', 'lazy, one request per read', 'lazy', 'lazy + profile'] as const;

type Mode = (typeof MODES)[number];

interface Image {
  name: string;
  base: LayerInfo;
  toolkits: LayerInfo[];
  cmd: string;
}

let debian: { info: LayerInfo; blobDir: string } | undefined;

/** Blob GETs (whole blobs and ranges) the registry answered. */
const blobGets = (registry: OciRegistry): number => registry.requests().filter((r) => /^GET \/v2\/.+\/blobs\/sha256:/.test(r)).length;

/** One cold start of `image` on a fresh node home: create, then the first command to its end. */
async function coldStart(
  ctx: ScenarioContext,
  registry: OciRegistry,
  image: Image,
  mode: Mode,
): Promise<{ ms: number; bytes: number; requests: number; prefetched: number }> {
  const home = await mkdtemp(path.join(ctx.dir, `lazy-node-`));
  const endpoint = { url: registry.url, username: registry.username, password: registry.password };
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
  try {
    registry.clearLog();
    const t0 = nowMs();
    const sb = await edge.create({ image: { base: image.base.digest, toolkits: image.toolkits.map((t) => t.digest) } });
    const r = await edge.exec(sb.id, { cmd: image.cmd });
    const ms = nowMs() - t0;
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
    return { ms, bytes, requests, prefetched };
  } finally {
    await done();
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
    "lazy run recorded up to its first command's end stored beside each layer in the registry and prefetched in",
    'merged ranges from create on), and for the small image **lazy, one request per read** (no read-ahead: what a node did',
    'before requests were merged; a registry of its own, so that its profile serves no other run). Small image: the busybox base plus a toolkit of',
    `${SMALL_FILES.toLocaleString('en')} files of ${SMALL_FILE_BYTES / 1024} KiB, first command \`cat\` of the first ${SMALL_READ_HUNDREDS * 100} (in name order, as in the blob). Large image: the Debian`,
    `base of the episode scenario (${BASE_PACKAGES.join(', ')}), first command \`python3 -c 'import json'\`. The registry is`,
    "Debian's docker-registry on loopback with htpasswd (bcrypt) auth: every request pays a bcrypt check, so requests",
    'count more than bytes here. No `tc` shaping (loopback): the time column flatters eager pulls; bytes and',
    'requests are what a cluster link would carry. One start per cell.',
  ].join(' '),
  async prepare({ cacheDir }): Promise<PreloadedLayer[]> {
    debian = await cachedDebianBase(cacheDir);
    return [{ blobDir: debian.blobDir }];
  },
  async run(ctx: ScenarioContext) {
    if (!debian) throw new Error('lazy: prepare() did not run');
    const edge = ctx.bench.platform.edge;
    const registry = await startOciRegistry();
    onCleanup('lazy bench registry', () => registry.close());
    const endpoint = { url: registry.url, username: registry.username, password: registry.password };
    const reg = new LayerRegistry(endpoint);

    const tree = path.join(ctx.dir, 'lazy', 'small');
    await mkdir(path.join(tree, 'opt', 'small'), { recursive: true });
    for (let i = 0; i < SMALL_FILES; i++) {
      const bytes = Buffer.alloc(SMALL_FILE_BYTES);
      for (let k = 0; k < bytes.length; k += 4) bytes.writeUInt32LE((i * 2654435761 + k * 40503) >>> 0, k);
      await writeFile(path.join(tree, 'opt', 'small', `f${String(i).padStart(4, '0')}`), bytes);
    }
    const busybox = await edge.layers.resolve('busybox');
    const small = await edge.layers.build({ type: 'dir', path: tree }, { kind: 'toolkit' });
    const images: Image[] = [
      { name: `small (busybox + ${SMALL_FILES} files)`, base: busybox, toolkits: [small], cmd: `cat /opt/small/f0[0-${SMALL_READ_HUNDREDS - 1}]* > /dev/null` },
      { name: `large (Debian: ${BASE_PACKAGES.join(', ')})`, base: debian.info, toolkits: [], cmd: "python3 -c 'import json'" },
    ];
    // The runs without read-ahead get a registry of their own: the profile they record serves no other run.
    const beforeRegistry = await startOciRegistry();
    onCleanup('lazy bench registry (one request per read)', () => beforeRegistry.close());
    const before = new LayerRegistry({ url: beforeRegistry.url, username: beforeRegistry.username, password: beforeRegistry.password });
    progress('lazy: pushing the layers to the registries');
    for (const l of [busybox, small, debian.info]) {
      const files =
        l.digest === debian.info.digest
          ? { meta: path.join(debian.blobDir, 'meta.erofs'), blob: path.join(debian.blobDir, 'data.blob') }
          : edge.layers.imageFiles(l.digest);
      await reg.push(files, l);
      if (l !== debian.info) await before.push(files, l);
    }
    for (const image of images) {
      const total = [image.base, ...image.toolkits].reduce((n, l) => n + l.metaBytes + l.blobBytes, 0);
      for (const mode of MODES) {
        if (mode === 'lazy, one request per read' && image.base === debian.info) continue;
        progress(`lazy: ${image.name}, ${mode}`);
        const r = await coldStart(ctx, mode === 'lazy, one request per read' ? beforeRegistry : registry, image, mode);
        const system = `dsec ${mode}`;
        ctx.record({ scenario: 'lazy', metric: `${image.name}: create to first command end`, system, unit: 'ms', n: 1, value: r.ms });
        ctx.record({
          scenario: 'lazy',
          metric: `${image.name}: bytes fetched`,
          system,
          unit: 'MiB',
          n: 1,
          value: r.bytes / MiB,
          note: `${((100 * r.bytes) / total).toFixed(1)}% of the image's ${(total / MiB).toFixed(1)} MiB`,
        });
        ctx.record({
          scenario: 'lazy',
          metric: `${image.name}: blob requests to the registry`,
          system,
          unit: 'requests',
          n: 1,
          value: r.requests,
          ...(mode === 'lazy + profile' ? { note: `${r.prefetched} chunks prefetched by the profile` } : {}),
        });
      }
    }
    ctx.note('C FUSE server (dsec-lazyfs) only: a JavaScript FUSE server was not built to compare with (left).');
  },
};
