// The agent binary as sandboxes see it: a copy on a small read-only tmpfs of its own under the
// node's home. A bind mount shows, in the sandbox's /proc/self/mountinfo, the path of its source
// inside the source's file system: binding chronus from the repository or /usr/lib showed that
// host path to every sandbox; bound from this tmpfs it shows `/chronus` on `dsec-agent`. The same
// tmpfs holds an empty directory that call sandboxes, which have no writable tmpfs, bind over their
// masked directories (`/proc/acpi`, `/sys/firmware`, ...): one superblock for the node instead of a
// tmpfs per masked directory per sandbox (every superblock costs each memory cgroup of the host a
// share of its shrinker map). Container sandboxes bind a folder of their own writable tmpfs.
import { createHash } from 'node:crypto';
import { chmod, copyFile, mkdir } from 'node:fs/promises';
import path from 'node:path';
import { mount, mountsUnder, MNT, MS, umount } from '../sys/linux.js';

/** Source name of the agent's tmpfs (what a sandbox's mountinfo shows). */
export const AGENT_MOUNT_SOURCE = 'dsec-agent';
/** Size of the agent's tmpfs: the static binary is about 1 MiB. */
const AGENT_MOUNT_MIB = 16;

/** What sandboxes bind from the agent's tmpfs. */
export interface AgentMount {
  /** The copy of chronus. */
  agent: string;
  /** An empty directory (mode 0555), bound read-only over each masked directory of a call sandbox. */
  maskDir: string;
}

/**
 * Mounts a fresh read-only tmpfs at `$home/agent` holding a copy of `agentBinary` and an empty
 * directory. The home is a shared mount, so both are seen in the runtime namespace too. A mount
 * left by an earlier process is detached first (its sandboxes keep their own bind mounts).
 */
export async function prepareAgentMount(home: string, agentBinary: string): Promise<AgentMount> {
  const dir = path.join(path.resolve(home), 'agent');
  await mkdir(dir, { recursive: true, mode: 0o755 });
  for (const m of await mountsUnder(dir)) umount(m, MNT.DETACH);
  mount(AGENT_MOUNT_SOURCE, dir, 'tmpfs', MS.NOSUID | MS.NODEV, `size=${AGENT_MOUNT_MIB}m,mode=0755`);
  const agent = path.join(dir, 'chronus');
  await copyFile(agentBinary, agent);
  const maskDir = path.join(dir, 'empty');
  await mkdir(maskDir);
  await chmod(maskDir, 0o555);
  mount('none', dir, null, MS.REMOUNT | MS.RDONLY | MS.NOSUID | MS.NODEV);
  return { agent, maskDir };
}

/**
 * A mark of the node's sandboxes that names no host path: the source of each sandbox's root
 * overlay, which the garbage collection of a crashed edge's leftovers looks for.
 */
export function nodeMarkFor(home: string): string {
  return `dsec-${createHash('sha256').update(path.resolve(home)).digest('hex').slice(0, 16)}`;
}
