// Test fixture: the whole platform (apiserver + edge) in-process on a throw-away home and a free
// loopback port, closed and removed even when a test fails.
import { readFile, mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { startPlatform } from '@dsec/apiserver';
import { mountsUnder, umount, MNT } from '@dsec/edge';
import { AGENT_BINARY } from './node.js';

/** A running platform and what a client needs to reach it. */
export interface TestPlatform {
  url: string;
  adminKey: string;
  home: string;
  /** Closes the platform and removes its home (mounts included). */
  close(): Promise<void>;
}

/** A loopback port that was free a moment ago. */
export async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve, reject) => server.once('error', reject).listen(0, '127.0.0.1', resolve));
  const port = (server.address() as net.AddressInfo).port;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** Starts a platform on a temp home (its name contains 'dsec'). */
export async function startTestPlatform(): Promise<TestPlatform> {
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
    const platform = await startPlatform({ home, addr: `127.0.0.1:${await freePort()}`, agentBinary: AGENT_BINARY, log: process.env.DSEC_TEST_LOG ? (line: string) => console.error(line) : () => undefined });
    const adminKey = platform.adminKey ?? (await readFile(platform.adminKeyFile, 'utf8')).trim();
    return {
      url: platform.url,
      adminKey,
      home,
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
