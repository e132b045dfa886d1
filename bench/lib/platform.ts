// The platform under test: apiserver + edge + watcher in this process (startPlatform) on a temp
// home under /tmp/dsec-bench-* and a free loopback port, reached through the SDK.
import { cp, mkdir, mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startPlatform, ROOT_PROJECT_ID } from '@dsec/apiserver';
import type { Platform } from '@dsec/apiserver';
import { DEFAULT_MAX_SANDBOXES, mountsUnder, umount, MNT } from '@dsec/edge';
import { DsecClient, isDsecError } from '@dsec/sdk';
import type { CallRuntime } from '@dsec/sdk';
import { onCleanup } from './cleanup.js';
import { sleep } from './stats.js';

/** The static chronus binary built in this checkout. */
export const AGENT_BINARY = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../chronus/build/chronus');

/**
 * Placement over-commit bounds for the bench (requests per unit of the node; room is judged on
 * measured use either way, scheduler.ts). Density needs 10,000 idle sandboxes of 0.1 core and
 * 16 MiB (1,000 cores and 160 GiB of requests on 2 cores and 24 GiB); with these bounds (1,600
 * cores, 192 GiB) the edge's own limit (maxSandboxes, {@link benchMaxSandboxes}) binds. The
 * defaults (CPU x256, memory x12) would stop them near 5,000; the bench keeps its own so that its
 * figures stay comparable.
 */
export const BENCH_PLACEMENT = { cpuOvercommit: 800, memoryOvercommit: 8 };

/**
 * The bench node's admission limit for a density of `density` idle sandboxes: the node's default
 * or, above it, the density and room for the probes at 100% fill and the other scenarios' few.
 */
export function benchMaxSandboxes(density: number): number {
  return Math.max(DEFAULT_MAX_SANDBOXES, density + 100);
}

/**
 * The watcher's orphan grace for the bench: scenarios create sandboxes at the edge in-process
 * (the `dsec edge` rows) beside the control plane's watcher, and those have no record. An hour
 * keeps the watcher from destroying one under its scenario however slow the machine is (the
 * platform's shutdown removes whatever is left).
 */
export const BENCH_ORPHAN_GRACE_MS = 3_600_000;

/** Resources of the idle sandboxes of the sustained-creation and density scenarios. */
export const IDLE_RESOURCES = { cpu: 0.1, memoryMiB: 16, diskMiB: 16 };

/** A running platform and the clients the scenarios use. */
export interface BenchPlatform {
  platform: Platform;
  url: string;
  /** A client with the admin key. */
  admin: DsecClient;
  /**
   * A client with a fresh member key. The API limits each key to 100 requests/s (bursts of
   * 1000); a trainer with many workers gives each its own key, and so does the bench.
   */
  newClient(): Promise<DsecClient>;
  /** Registers a layer built outside the platform (the bench's cache) under `name`. */
  adoptLayer(info: { digest: string }, name: string): Promise<void>;
}

/** Layers copied into the node's store before it opens (cached builds). */
export interface PreloadedLayer {
  /** Directory `blobs/<hex>` of another layer store. */
  blobDir: string;
}

/** A temp dir named /tmp/dsec-bench-* (the test suite's leftover cleanup knows the pattern). */
export async function benchTempDir(): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-bench-'));
  onCleanup(`temp dir ${dir}`, async () => {
    for (const m of (await mountsUnder(dir).catch(() => [] as string[])).sort((a, b) => b.length - a.length)) {
      try {
        umount(m, MNT.DETACH);
      } catch {
        // already gone
      }
    }
    await rm(dir, { recursive: true, force: true });
  });
  return dir;
}

/**
 * Starts the platform under `home`, admitting `maxSandboxes` on its node; it is shut down (every
 * sandbox removed) at cleanup.
 */
export async function startBenchPlatform(home: string, preload: PreloadedLayer[] = [], maxSandboxes = DEFAULT_MAX_SANDBOXES): Promise<BenchPlatform> {
  for (const l of preload) {
    const blobs = path.join(home, 'node', 'layers', 'blobs');
    await mkdir(blobs, { recursive: true });
    await cp(l.blobDir, path.join(blobs, path.basename(l.blobDir)), { recursive: true });
  }
  const platform = await startPlatform({
    home,
    addr: '127.0.0.1:0',
    agentBinary: AGENT_BINARY,
    placement: BENCH_PLACEMENT,
    maxSandboxes,
    orphanGraceMs: BENCH_ORPHAN_GRACE_MS,
    // Nodes may join (the remote-edge scenario joins one): the node port on loopback.
    cluster: { nodeAddr: '127.0.0.1:0' },
    // The Debian runtimes of calls from a machine-wide cache (built there once); none at start.
    calls: { runtimeCache: BENCH_RUNTIME_CACHE, prebuild: [] },
    log: () => undefined,
  });
  onCleanup('platform', () => platform.shutdown());
  const adminKey = platform.adminKey;
  if (!adminKey) throw new Error('a fresh platform home gave no admin key');
  const admin = new DsecClient({ apiUrl: platform.url, apiKey: adminKey, requestTimeoutMs: 120_000 });
  let keys = 0;
  return {
    platform,
    url: platform.url,
    admin,
    async newClient() {
      const k = await admin.keys.create({ name: `bench-${keys++}`, role: 'member' });
      return new DsecClient({ apiUrl: platform.url, apiKey: k.key, requestTimeoutMs: 120_000 });
    },
    async adoptLayer(info, name) {
      const stored = await platform.edge.layers.resolve(info.digest);
      await platform.edge.layers.tag(stored.digest, name);
      await platform.services.layers.register(ROOT_PROJECT_ID, stored, name);
    },
  };
}

/** Calls `fn`, waiting and repeating while the API answers RATE_LIMITED. */
/** Machine-wide cache of the fncall runtimes' Debian layers for benchmark runs. */
export const BENCH_RUNTIME_CACHE = '/var/tmp/dsec-bench-cache/runtimes';

/**
 * Waits until a call of `runtime` runs (its layer built in the background, or taken from the
 * cache); a call before that is refused at once with UNAVAILABLE.
 */
export async function waitForRuntime(client: DsecClient, runtime: CallRuntime, code: string, withinMs = 1_800_000): Promise<void> {
  const until = Date.now() + withinMs;
  for (;;) {
    try {
      await client.calls.run({ runtime, code });
      return;
    } catch (err) {
      if (!isDsecError(err) || err.code !== 'UNAVAILABLE' || Date.now() > until) throw err;
      await sleep(2000);
    }
  }
}

export async function retryRateLimited<T>(fn: () => Promise<T>): Promise<T> {
  for (;;) {
    try {
      return await fn();
    } catch (err) {
      if (!isDsecError(err) || err.code !== 'RATE_LIMITED') throw err;
      rateLimitedHits++;
      await sleep(err.details.retryAfterMs ?? 50);
    }
  }
}

/** How often the bench was told RATE_LIMITED (reported; 0 means the limit never interfered). */
export let rateLimitedHits = 0;
