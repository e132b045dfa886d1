// Reads a sandbox's resource use from its cgroups. crun creates and removes the cgroups; edge
// only reads them (and checks that none are left behind). Works with cgroup v1 (including this
// machine's hybrid layout) and v2.
import { readFileSync } from 'node:fs';
import { readFile, readdir, rmdir, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { DsecError } from '@dsec/protocol';
import type { SandboxStats } from '@dsec/protocol';

/** How long a freeze may take before it is given up (tasks in uninterruptible sleep delay it). */
export const DEFAULT_FREEZE_TIMEOUT_MS = 10_000;

/** The cgroup layout of the host. */
export type CgroupMode = 'v1' | 'hybrid' | 'v2';

const CGROUP_ROOT = '/sys/fs/cgroup';
/** v1 controllers a sandbox gets a cgroup in (crun's cgroupfs manager creates them). */
export const V1_CONTROLLERS = ['cpu', 'cpuacct', 'cpuset', 'memory', 'devices', 'freezer', 'blkio', 'pids'] as const;

/** Detects v2 (unified), v1, or hybrid (v1 controllers plus a v2 mount at /sys/fs/cgroup/unified). */
export async function detectCgroupMode(): Promise<CgroupMode> {
  const mounts = await readFile('/proc/self/mounts', 'utf8');
  let rootIsV2 = false;
  let unified = false;
  for (const line of mounts.split('\n')) {
    const [, target, fstype] = line.split(' ');
    if (target === CGROUP_ROOT && fstype === 'cgroup2') rootIsV2 = true;
    if (target === `${CGROUP_ROOT}/unified` && fstype === 'cgroup2') unified = true;
  }
  if (rootIsV2) return 'v2';
  return unified ? 'hybrid' : 'v1';
}

async function readNum(file: string): Promise<number> {
  try {
    const text = (await readFile(file, 'utf8')).trim();
    return text === 'max' ? Infinity : Number(text.split(/\s+/)[0]);
  } catch {
    return 0;
  }
}

async function readKeyed(file: string): Promise<Map<string, number>> {
  const out = new Map<string, number>();
  try {
    for (const line of (await readFile(file, 'utf8')).split('\n')) {
      const [k, v] = line.split(' ');
      if (k && v) out.set(k, Number(v));
    }
  } catch {
    // a missing file reads as empty
  }
  return out;
}

/** Resource counters of one cgroup (a sandbox's stats less its disk). */
export type CgroupStats = Omit<SandboxStats, 'diskUsedBytes' | 'diskLimitBytes'>;

/** Access to the cgroups of sandboxes under one parent (`/dsec` by default). */
export class Cgroups {
  constructor(
    readonly mode: CgroupMode,
    readonly parent: string = 'dsec',
  ) {}

  /** The OCI `cgroupsPath` for a sandbox. */
  pathFor(id: string): string {
    return `/${this.parent}/${id}`;
  }

  private dir(controller: string, id: string): string {
    return this.mode === 'v2' ? path.join(CGROUP_ROOT, this.parent, id) : path.join(CGROUP_ROOT, controller, this.parent, id);
  }

  /** Counters of a sandbox's cgroup. */
  async stats(id: string): Promise<CgroupStats> {
    if (this.mode === 'v2') {
      const d = this.dir('', id);
      const cpu = await readKeyed(path.join(d, 'cpu.stat'));
      const events = await readKeyed(path.join(d, 'memory.events'));
      return {
        cpuUsageMs: (cpu.get('usage_usec') ?? 0) / 1000,
        memoryBytes: await readNum(path.join(d, 'memory.current')),
        memoryPeakBytes: await readNum(path.join(d, 'memory.peak')),
        memoryLimitBytes: await readNum(path.join(d, 'memory.max')),
        pids: await readNum(path.join(d, 'pids.current')),
        pidsLimit: await readNum(path.join(d, 'pids.max')),
        oomKills: events.get('oom_kill') ?? 0,
      };
    }
    const mem = (f: string): string => path.join(this.dir('memory', id), f);
    const oom = await readKeyed(mem('memory.oom_control'));
    return {
      cpuUsageMs: (await readNum(path.join(this.dir('cpuacct', id), 'cpuacct.usage'))) / 1e6,
      memoryBytes: await readNum(mem('memory.usage_in_bytes')),
      memoryPeakBytes: await readNum(mem('memory.max_usage_in_bytes')),
      memoryLimitBytes: await readNum(mem('memory.limit_in_bytes')),
      pids: await readNum(path.join(this.dir('pids', id), 'pids.current')),
      pidsLimit: await readNum(path.join(this.dir('pids', id), 'pids.max')),
      oomKills: oom.get('oom_kill') ?? 0,
    };
  }

  /** OOM kills so far in a sandbox's memory cgroup. */
  async oomKills(id: string): Promise<number> {
    if (this.mode === 'v2') return (await readKeyed(path.join(this.dir('', id), 'memory.events'))).get('oom_kill') ?? 0;
    return (await readKeyed(path.join(this.dir('memory', id), 'memory.oom_control'))).get('oom_kill') ?? 0;
  }

  /** OOM kills so far, read synchronously (a few microseconds; used on the exec path). */
  oomKillsSync(id: string): number {
    const file = this.mode === 'v2' ? path.join(this.dir('', id), 'memory.events') : path.join(this.dir('memory', id), 'memory.oom_control');
    try {
      const m = /^oom_kill (\d+)$/m.exec(readFileSync(file, 'utf8'));
      return m ? Number(m[1]) : 0;
    } catch {
      return 0;
    }
  }

  /**
   * Freezes every process of a sandbox (cgroup freezer) and waits until all are frozen: their
   * files hold still while they are read. On timeout the sandbox is thawed and TIMEOUT thrown.
   */
  async freeze(id: string, timeoutMs = DEFAULT_FREEZE_TIMEOUT_MS): Promise<void> {
    const v2 = this.mode === 'v2';
    const dir = this.dir(v2 ? '' : 'freezer', id);
    try {
      await writeFile(path.join(dir, v2 ? 'cgroup.freeze' : 'freezer.state'), v2 ? '1' : 'FROZEN');
    } catch (err) {
      throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${id} has no freezer cgroup: ${(err as Error).message}`, { sandboxId: id });
    }
    const deadline = Date.now() + timeoutMs;
    for (let waitMs = 1; ; waitMs = Math.min(waitMs * 2, 50)) {
      const frozen = v2 ? /^frozen 1$/m.test(await readFile(path.join(dir, 'cgroup.events'), 'utf8')) : (await readFile(path.join(dir, 'freezer.state'), 'utf8')).trim() === 'FROZEN';
      if (frozen) return;
      if (Date.now() > deadline) {
        await this.thaw(id);
        throw new DsecError('TIMEOUT', `sandbox ${id} did not freeze within ${timeoutMs} ms`, { sandboxId: id });
      }
      await sleep(waitMs);
    }
  }

  /** True when a sandbox's cgroup is frozen or freezing (paused, or being packed). */
  async isFrozen(id: string): Promise<boolean> {
    const v2 = this.mode === 'v2';
    const file = path.join(this.dir(v2 ? '' : 'freezer', id), v2 ? 'cgroup.freeze' : 'freezer.state');
    const text = (await readFile(file, 'utf8').catch(() => '')).trim();
    return v2 ? text === '1' : text === 'FROZEN' || text === 'FREEZING';
  }

  /** Lets a frozen sandbox's processes run again; a sandbox that is gone is not an error. */
  async thaw(id: string): Promise<void> {
    const v2 = this.mode === 'v2';
    await writeFile(path.join(this.dir(v2 ? '' : 'freezer', id), v2 ? 'cgroup.freeze' : 'freezer.state'), v2 ? '0' : 'THAWED').catch((err: NodeJS.ErrnoException) => {
      if (err.code !== 'ENOENT') throw err;
    });
  }

  /** Times a fork failed in a sandbox because of its pids limit (the `max` of pids.events). */
  pidsLimitHitsSync(id: string): number {
    const file = path.join(this.mode === 'v2' ? this.dir('', id) : this.dir('pids', id), 'pids.events');
    try {
      const m = /^max (\d+)$/m.exec(readFileSync(file, 'utf8'));
      return m ? Number(m[1]) : 0;
    } catch {
      return 0;
    }
  }

  /** {@link pidsLimitHitsSync}, read without blocking (the periodic scan over every sandbox). */
  async pidsLimitHits(id: string): Promise<number> {
    const file = path.join(this.mode === 'v2' ? this.dir('', id) : this.dir('pids', id), 'pids.events');
    const m = /^max (\d+)$/m.exec(await readFile(file, 'utf8').catch(() => ''));
    return m ? Number(m[1]) : 0;
  }

  /** Tasks in a sandbox's cgroup now (0 when it has none). */
  pidsCurrentSync(id: string): number {
    try {
      return Number(readFileSync(path.join(this.mode === 'v2' ? this.dir('', id) : this.dir('pids', id), 'pids.current'), 'utf8').trim()) || 0;
    } catch {
      return 0;
    }
  }

  /** Host pids of the processes in a sandbox's cgroup. */
  async procs(id: string): Promise<number[]> {
    const file = path.join(this.mode === 'v2' ? this.dir('', id) : this.dir('pids', id), 'cgroup.procs');
    const text = await readFile(file, 'utf8').catch(() => '');
    return text.split('\n').filter(Boolean).map(Number);
  }

  /** Milliseconds since a sandbox's cgroup was made (Infinity when it has none). */
  async ageMs(id: string): Promise<number> {
    const st = await stat(this.mode === 'v2' ? this.dir('', id) : this.dir('memory', id)).catch(() => undefined);
    return st ? Date.now() - st.mtimeMs : Infinity;
  }

  /**
   * Kills every process in a sandbox's cgroup (a runtime that lost track of its container
   * leaves them). Repeats until the cgroup is empty: a process may fork while it is killed.
   */
  async killAll(id: string): Promise<number> {
    const killed = new Set<number>();
    if (this.mode === 'v2') await writeFile(path.join(this.dir('', id), 'cgroup.kill'), '1').catch(() => undefined);
    for (let round = 0; round < 100; round++) {
      const pids = await this.procs(id);
      if (pids.length === 0) break;
      for (const pid of pids) {
        try {
          process.kill(pid, 'SIGKILL');
          killed.add(pid);
        } catch {
          // already gone
        }
      }
      await sleep(10);
    }
    return killed.size;
  }

  /** Directories of a sandbox's cgroup that exist (for leak checks and cleanup). */
  async existing(id: string): Promise<string[]> {
    const dirs = this.mode === 'v2' ? [this.dir('', id)] : V1_CONTROLLERS.map((c) => this.dir(c, id));
    const out: string[] = [];
    for (const d of dirs) {
      if (await stat(d).then(() => true, () => false)) out.push(d);
    }
    return out;
  }

  /** Removes a sandbox's (empty) cgroups that the runtime left behind. */
  async remove(id: string): Promise<void> {
    for (const d of await this.existing(id)) {
      await rmdir(d).catch(() => undefined);
    }
  }

  /** Removes the (empty) parent cgroups of this node's sandboxes. */
  async removeParent(): Promise<void> {
    const dirs = this.mode === 'v2' ? [path.join(CGROUP_ROOT, this.parent)] : V1_CONTROLLERS.map((c) => path.join(CGROUP_ROOT, c, this.parent));
    for (const d of dirs) await rmdir(d).catch(() => undefined);
  }

  /** Ids of sandboxes that have a cgroup under the parent. */
  async list(): Promise<string[]> {
    const d = this.mode === 'v2' ? path.join(CGROUP_ROOT, this.parent) : path.join(CGROUP_ROOT, 'memory', this.parent);
    const entries = await readdir(d, { withFileTypes: true }).catch(() => []);
    return entries.filter((e) => e.isDirectory()).map((e) => e.name);
  }
}
