// crun runs in a mount namespace of dsec's own, one per state directory, pinned by a bind mount
// of its nsfs file and entered for every crun call. On a host with hybrid cgroups crun refuses to
// run ("cgroups in hybrid mode not supported") unless /sys/fs/cgroup/unified is unmounted, which
// this namespace does. On every host it keeps the sandboxes' writable-layer mounts (on the host,
// under the private run directory) out of the table that each sandbox create copies. The state
// directory is made a shared mount first, so the layer mounts that edge makes on the host
// propagate into that namespace.
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { DsecError } from '@dsec/protocol';
import { mount, MS, umount, MNT } from '../sys/linux.js';
import type { CgroupMode } from './cgroups.js';

const run = promisify(execFile);

async function mountInfo(): Promise<Array<{ target: string; optional: string }>> {
  const text = await readFile('/proc/self/mountinfo', 'utf8');
  return text
    .split('\n')
    .filter(Boolean)
    .map((line) => {
      const f = line.split(' ');
      const sep = f.indexOf('-');
      return { target: f[4] ?? '', optional: f.slice(6, sep).join(' ') };
    });
}

/** Makes `dir` a mount point with shared propagation (idempotent). */
export async function makeSharedMount(dir: string): Promise<void> {
  await mkdir(dir, { recursive: true });
  const mine = (await mountInfo()).filter((m) => m.target === dir);
  if (mine.length === 0) mount(dir, dir, null, MS.BIND | MS.REC);
  const again = (await mountInfo()).filter((m) => m.target === dir);
  if (!again.some((m) => m.optional.includes('shared:'))) mount('none', dir, null, MS.SHARED);
}

/** The mount namespace crun runs in. */
export interface RuntimeNamespace {
  /** argv prefix that runs a command inside the namespace. */
  readonly prefix: string[];
  /** The namespace's nsfs file. */
  readonly nsFile: string;
  /** Removes the namespace and the home's bind mount (tests; a node keeps both). */
  destroy(): Promise<void>;
}

/** Directory for per-home runtime state that must not live on a shared mount. */
export function runDirFor(home: string): string {
  const tag = createHash('sha256').update(path.resolve(home)).digest('hex').slice(0, 12);
  return path.join('/run/dsec', tag);
}

/**
 * Prepares the namespace crun runs in: `home` becomes a shared mount, and a persistent mount
 * namespace (without /sys/fs/cgroup/unified on hybrid cgroups) is created or reused.
 */
export async function prepareRuntimeNamespace(home: string, mode: CgroupMode): Promise<RuntimeNamespace> {
  await makeSharedMount(home);
  const unmountHome = (): void => void umount(home, MNT.DETACH);

  const runDir = runDirFor(home);
  const nsFile = path.join(runDir, 'mntns');
  await mkdir(runDir, { recursive: true });
  // Lets a cleanup tell whose namespace this is once the home is gone.
  await writeFile(path.join(runDir, 'home'), path.resolve(home));
  // The nsfs bind mount must not sit on a shared mount: give the run dir a private mount.
  const infos = await mountInfo();
  if (!infos.some((m) => m.target === runDir)) {
    mount(runDir, runDir, null, MS.BIND);
    mount('none', runDir, null, MS.PRIVATE);
  }
  const pinned = (await mountInfo()).some((m) => m.target === nsFile);
  if (!pinned) {
    await writeFile(nsFile, '');
    try {
      const inside = mode === 'hybrid' ? ['umount', '-l', '/sys/fs/cgroup/unified'] : ['true'];
      await run('unshare', [`--mount=${nsFile}`, '--propagation', 'slave', ...inside]);
    } catch (err) {
      throw new DsecError('INTERNAL', `cannot create the runtime mount namespace: ${(err as Error).message}`);
    }
  }
  return {
    prefix: ['nsenter', `--mount=${nsFile}`, '--'],
    nsFile,
    destroy: async () => {
      umount(nsFile, MNT.DETACH);
      umount(runDir, MNT.DETACH);
      await rm(runDir, { recursive: true, force: true });
      unmountHome();
    },
  };
}
