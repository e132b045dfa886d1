// The machine-wide cache of built layers (`/var/cache/dsec/runtimes` by default): a layer slow to
// build (a Debian package set) is built once per machine into `<cache>/<name>/` and adopted from
// there by hard link into a node's store, so that another node home on the machine (and the next
// start) takes it at once. The fncall runtimes and E2B's `base` template go through it.
import { randomBytes } from 'node:crypto';
import { access, mkdir, readdir, rename, rm, stat } from 'node:fs/promises';
import path from 'node:path';
import type { LayerInfo } from '@dsec/protocol';
import { mountsUnder, MNT, umount } from '../sys/linux.js';
import { LayerStore } from './store.js';

/** A build directory left this long ago belongs to a process that died while building. */
const STALE_BUILD_MS = 24 * 3600_000;

/** The cache entry of a layer name (names may hold `/` and `:`; entries are one directory level). */
export function cacheEntryOf(cacheDir: string, name: string): string {
  return path.join(cacheDir, name.replace(/[/:]/g, '_'));
}

/**
 * Takes the layer `name` from the cache into `layers`, or builds it there first with `build`
 * (given a scratch store of its own beside the cache). Another process building the same layer
 * at the same time loses the rename into place and takes the winner's.
 */
export async function buildThroughCache(
  layers: LayerStore,
  cacheDir: string,
  name: string,
  build: (scratch: LayerStore) => Promise<LayerInfo>,
): Promise<LayerInfo> {
  const entry = cacheEntryOf(cacheDir, name);
  if (await exists(path.join(entry, 'layer.json'))) return layers.adopt(entry, name);
  return inCacheScratch(cacheDir, path.basename(entry), 0o700, async (scratch) => {
    const store = new LayerStore({ root: scratch, unmountLingerMs: 0 });
    try {
      const info = await build(store);
      await store.close();
      await rename(path.join(scratch, 'blobs', info.digest.slice('sha256:'.length)), entry).catch(async (err: unknown) => {
        if (!(await exists(path.join(entry, 'layer.json')))) throw err;
      });
      return await layers.adopt(entry, name);
    } finally {
      await store.close().catch(() => undefined);
    }
  });
}

/**
 * Runs `build` in a new scratch directory `<cacheDir>/.build-<label>-<random>` (the cache made
 * with `mode` if missing), after removing the ones dead processes left; the scratch directory
 * goes, its mounts first, whatever happens. Every machine-wide cache builds through it.
 */
export async function inCacheScratch<T>(cacheDir: string, label: string, mode: number, build: (scratch: string) => Promise<T>): Promise<T> {
  await mkdir(cacheDir, { recursive: true, mode });
  await sweepStaleBuilds(cacheDir);
  const scratch = path.join(cacheDir, `.build-${label}-${randomBytes(4).toString('hex')}`);
  await mkdir(scratch, { mode: 0o700 });
  try {
    return await build(scratch);
  } finally {
    for (const m of await mountsUnder(scratch).catch(() => [] as string[])) umount(m, MNT.DETACH);
    await rm(scratch, { recursive: true, force: true });
  }
}

/** Removes build directories that dead processes left in the cache (their mounts first). */
async function sweepStaleBuilds(cacheDir: string): Promise<void> {
  for (const name of await readdir(cacheDir).catch(() => [] as string[])) {
    if (!name.startsWith('.build-')) continue;
    const dir = path.join(cacheDir, name);
    const st = await stat(dir).catch(() => undefined);
    if (!st || Date.now() - st.mtimeMs < STALE_BUILD_MS) continue;
    for (const m of await mountsUnder(dir)) umount(m, MNT.DETACH);
    await rm(dir, { recursive: true, force: true });
  }
}

async function exists(p: string): Promise<boolean> {
  return access(p).then(
    () => true,
    () => false,
  );
}
