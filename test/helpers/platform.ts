// Test fixture: the whole platform (apiserver + edge) in-process on a throw-away home and a free
// loopback port, closed and removed even when a test fails.
import { cp, mkdir, readFile, mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { startPlatform } from '@dsec/apiserver';
import type { Platform, PlatformOptions } from '@dsec/apiserver';
import { mountsUnder, umount, MNT } from '@dsec/edge';
import { AGENT_BINARY } from './node.js';

/** A running platform and what a client needs to reach it. */
export interface TestPlatform {
  url: string;
  adminKey: string;
  home: string;
  /** The platform itself (its edge, control plane and watcher services). */
  platform: Platform;
  /** Closes the platform and removes its home (mounts included). */
  close(): Promise<void>;
}

/** Starts a platform on a temp home (its name contains 'dsec'), with optional extra options. */
export async function startTestPlatform(
  options: Omit<PlatformOptions, 'home' | 'addr' | 'agentBinary' | 'log'> = {},
  /** Layer blob directories (`<store>/blobs/<hex>` of a cache store) copied into the node's store before it opens. */
  preloadBlobDirs: readonly string[] = [],
): Promise<TestPlatform> {
  const home = await mkdtemp(path.join(os.tmpdir(), 'dsec-platform-'));
  const removeHome = async (): Promise<void> => {
    for (const m of await mountsUnder(home).catch(() => [] as string[])) {
      try {
        umount(m, MNT.DETACH);
      } catch {
        // already gone
      }
    }
    await rm(home, { recursive: true, force: true });
  };
  try {
    for (const dir of preloadBlobDirs) {
      const blobs = path.join(home, 'node', 'layers', 'blobs');
      await mkdir(blobs, { recursive: true });
      await cp(dir, path.join(blobs, path.basename(dir)), { recursive: true });
    }
    // DSEC_EDGE_WIRE=loopback: the control plane reaches the edge through the wire protocol.
    const edgeWire = process.env.DSEC_EDGE_WIRE === 'loopback' ? 'loopback' : 'off';
    const platform = await startPlatform({
      edgeWire,
      ...options,
      home,
      addr: '127.0.0.1:0',
      agentBinary: AGENT_BINARY,
      log: process.env.DSEC_TEST_LOG ? (line: string) => console.error(line) : () => undefined,
    });
    const adminKey = platform.adminKey ?? (await readFile(platform.adminKeyFile, 'utf8')).trim();
    return {
      url: platform.url,
      adminKey,
      home,
      platform,
      async close() {
        await platform.shutdown().catch((err: unknown) => console.error('platform shutdown:', err));
        await removeHome();
      },
    };
  } catch (err) {
    await removeHome();
    throw err;
  }
}
