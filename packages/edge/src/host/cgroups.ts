// Reads a sandbox's resource use from its cgroups, and freezes, reclaims and thaws them for
// pause and resume. crun creates and removes the cgroups; edge reads them, changes only the
// freezer and (while paused) the memory controller's reclaim settings, and checks that none are
// left behind. Works with cgroup v1 (including this machine's hybrid layout) and v2.
import { closeSync, openSync, readSync } from 'node:fs';
import { mkdir, readFile, readdir, rmdir, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { DsecError } from '@dsec/protocol';
import type { SandboxStats } from '@dsec/protocol';
import { closeFd, MADV_WILLNEED, pidfdOpen, processMadvise } from '../sys/linux.js';

/** How long a freeze may take before it is given up (tasks in uninterruptible sleep delay it). */
export const DEFAULT_FREEZE_TIMEOUT_MS = 10_000;

/** The cgroup layout of the host. */
export type CgroupMode = 'v1' | 'hybrid' | 'v2';

const CGROUP_ROOT = '/sys/fs/cgroup';
/** v1 controllers a sandbox gets a cgroup in (crun's cgroupfs manager creates them). */
export const V1_CONTROLLERS = ['cpu', 'cpuacct', 'cpuset', 'memory', 'devices', 'freezer', 'blkio', 'pids'] as const;
/** v1 hierarchies the runtime makes a sandbox's cgroup in: the controllers and the named `systemd` one. */
const V1_HIERARCHIES: readonly string[] = [...V1_CONTROLLERS, 'systemd'];

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

/**
 * memory.swappiness of a paused sandbox (v1): its anonymous and tmpfs pages may go to swap.
 * Running sandboxes are created with 0 (limit reclaim drops page cache, never swaps).
 */
export const PAUSED_SWAPPINESS = 100;

/** Memory settings a pause changed, to be put back on resume. */
export interface MemorySettings {
  /** v1: memory.swappiness before the pause. */
  swappiness?: number;
  /** v2: memory.swap.max before the pause. */
  swapMax?: string;
}

/** What reclaiming a frozen sandbox's memory did. */
export interface ReclaimResult {
  beforeBytes: number;
  afterBytes: number;
  /** The sandbox's pages in swap afterwards. */
  swapBytes: number;
  /** What to put back on resume. */
  restore: MemorySettings;
}

/** What a prefetch after resume did. */
export interface PrefetchResult {
  processes: number;
  /** Bytes of address space advised (MADV_WILLNEED), not bytes read. */
  advisedBytes: number;
}

/** Most reclaim passes over a paused sandbox (v1). */
const MAX_RECLAIM_PASSES = 4;
/** A pass that frees less than this ends the reclaim. */
const RECLAIM_PROGRESS_BYTES = 1048576;

/** Address ranges of a process worth reading back in: everything but the kernel's own pages. */
async function prefetchRanges(pid: number): Promise<Array<[bigint, bigint]>> {
  const maps = await readFile(`/proc/${pid}/maps`, 'utf8').catch(() => '');
  const out: Array<[bigint, bigint]> = [];
  for (const line of maps.split('\n')) {
    const m = /^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$/.exec(line);
    if (!m || /^\[(vvar|vvar_vclock|vdso|vsyscall)\]$/.test(m[4] ?? '') || m[3]?.startsWith('---')) continue;
    const start = BigInt(`0x${m[1]}`);
    out.push([start, BigInt(`0x${m[2]}`) - start]);
  }
  return out;
}

/** Sandboxes whose counter files stay open between reads (the most recently read ones). */
const MAX_HELD_SANDBOXES = 256;

/**
 * Counter files read on the exec path (OOM kills, refused forks, tasks), held open per sandbox
 * and read again from offset 0: one system call a read instead of readFileSync's five. A file of
 * a removed cgroup fails its read (ENODEV), also when a cgroup of the same path was made since
 * (a restarted sandbox): it is then opened anew. At most {@link MAX_HELD_SANDBOXES} sandboxes
 * hold files; the least recently read gives its files back first.
 */
class HeldCounterFiles {
  /** Open files per sandbox id, least recently read first. */
  private readonly held = new Map<string, Map<string, number>>();
  private readonly buf = Buffer.alloc(4096);

  /** The text of `file` of sandbox `id` now; undefined when it cannot be read. */
  read(id: string, file: string): string | undefined {
    let files = this.held.get(id);
    if (files) this.held.delete(id);
    else {
      files = new Map();
      if (this.held.size >= MAX_HELD_SANDBOXES) this.release(this.held.keys().next().value as string);
    }
    this.held.set(id, files);
    for (let attempt = 0; attempt < 2; attempt++) {
      let fd = files.get(file);
      if (fd === undefined) {
        try {
          fd = openSync(file, 'r');
        } catch {
          return undefined;
        }
        files.set(file, fd);
      }
      try {
        return this.buf.toString('latin1', 0, readSync(fd, this.buf, 0, this.buf.length, 0));
      } catch {
        closeSync(fd);
        files.delete(file);
      }
    }
    return undefined;
  }

  /** Closes a sandbox's files (its cgroup goes). */
  release(id: string): void {
    for (const fd of this.held.get(id)?.values() ?? []) closeSync(fd);
    this.held.delete(id);
  }

  /** Closes every file held. */
  close(): void {
    for (const id of [...this.held.keys()]) this.release(id);
  }
}

/** Access to the cgroups of sandboxes under one parent (`/dsec` by default). */
export class Cgroups {
  private readonly counterFiles = new HeldCounterFiles();

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

  /** CPU (cumulative) and memory of all the node's sandboxes together: the parent's counters. */
  async parentUsage(): Promise<{ cpuUsageMs: number; memoryBytes: number }> {
    if (this.mode === 'v2') {
      const d = path.join(CGROUP_ROOT, this.parent);
      const cpu = await readKeyed(path.join(d, 'cpu.stat'));
      return { cpuUsageMs: (cpu.get('usage_usec') ?? 0) / 1000, memoryBytes: await readNum(path.join(d, 'memory.current')) };
    }
    return {
      cpuUsageMs: (await readNum(path.join(CGROUP_ROOT, 'cpuacct', this.parent, 'cpuacct.usage'))) / 1e6,
      memoryBytes: await readNum(path.join(CGROUP_ROOT, 'memory', this.parent, 'memory.usage_in_bytes')),
    };
  }

  /** OOM kills so far in a sandbox's memory cgroup. */
  async oomKills(id: string): Promise<number> {
    if (this.mode === 'v2') return (await readKeyed(path.join(this.dir('', id), 'memory.events'))).get('oom_kill') ?? 0;
    return (await readKeyed(path.join(this.dir('memory', id), 'memory.oom_control'))).get('oom_kill') ?? 0;
  }

  /** OOM kills so far, read synchronously (a few microseconds, from a held file; used on the exec path). */
  oomKillsSync(id: string): number {
    const file = this.mode === 'v2' ? path.join(this.dir('', id), 'memory.events') : path.join(this.dir('memory', id), 'memory.oom_control');
    const m = /^oom_kill (\d+)$/m.exec(this.counterFiles.read(id, file) ?? '');
    return m ? Number(m[1]) : 0;
  }

  private async usage(id: string): Promise<{ usageBytes: number; swapBytes: number }> {
    if (this.mode === 'v2') {
      const d = this.dir('', id);
      return { usageBytes: await readNum(path.join(d, 'memory.current')), swapBytes: await readNum(path.join(d, 'memory.swap.current')) };
    }
    const d = this.dir('memory', id);
    return { usageBytes: await readNum(path.join(d, 'memory.usage_in_bytes')), swapBytes: (await readKeyed(path.join(d, 'memory.stat'))).get('swap') ?? 0 };
  }

  /** Memory (cgroup usage) and swap of a sandbox. */
  async memory(id: string): Promise<{ usageBytes: number; swapBytes: number }> {
    return this.usage(id);
  }

  /** True when a sandbox's processes are frozen. */
  async frozen(id: string): Promise<boolean> {
    if (this.mode === 'v2') return (await readKeyed(path.join(this.dir('', id), 'cgroup.events'))).get('frozen') === 1;
    return (await readFile(path.join(this.dir('freezer', id), 'freezer.state'), 'utf8').catch(() => '')).trim() === 'FROZEN';
  }

  /**
   * Freezes every process of a sandbox (v1 freezer, v2 cgroup.freeze) and waits until the
   * kernel reports them frozen: a pause, or a snapshot whose files must hold still while they
   * are read. A sandbox that does not freeze in time is thawed again and TIMEOUT thrown: it is
   * never left half-frozen.
   */
  async freeze(id: string, timeoutMs = DEFAULT_FREEZE_TIMEOUT_MS): Promise<void> {
    await this.writeFreezer(id, true);
    const deadline = Date.now() + timeoutMs;
    for (let wait = 1; !(await this.frozen(id)); wait = Math.min(wait * 2, 20)) {
      if (Date.now() >= deadline) {
        await this.thaw(id).catch(() => undefined);
        throw new DsecError('TIMEOUT', `sandbox ${id}: its processes did not freeze within ${timeoutMs} ms`, { sandboxId: id });
      }
      await sleep(wait);
    }
  }

  /** True when a sandbox's cgroup is frozen or freezing (asked to freeze: paused, or being packed). */
  async isFrozen(id: string): Promise<boolean> {
    const v2 = this.mode === 'v2';
    const file = path.join(this.dir(v2 ? '' : 'freezer', id), v2 ? 'cgroup.freeze' : 'freezer.state');
    const text = (await readFile(file, 'utf8').catch(() => '')).trim();
    return v2 ? text === '1' : text === 'FROZEN' || text === 'FREEZING';
  }

  /** Lets a frozen sandbox's processes run again; a sandbox that is gone is not an error. */
  async thaw(id: string): Promise<void> {
    await this.writeFreezer(id, false).catch((err: unknown) => {
      if (!(err instanceof DsecError && err.code === 'SANDBOX_NOT_FOUND')) throw err;
    });
  }

  private async writeFreezer(id: string, frozen: boolean): Promise<void> {
    const file = this.mode === 'v2' ? path.join(this.dir('', id), 'cgroup.freeze') : path.join(this.dir('freezer', id), 'freezer.state');
    const value = this.mode === 'v2' ? (frozen ? '1' : '0') : frozen ? 'FROZEN' : 'THAWED';
    await writeFile(file, value).catch((err: unknown) => {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${id} has no cgroup`, { sandboxId: id });
      throw new DsecError('BACKEND_FAILED', `sandbox ${id}: ${frozen ? 'freeze' : 'thaw'}: ${(err as Error).message}`, { sandboxId: id });
    });
  }

  /**
   * Makes a frozen sandbox's memory reclaimable and reclaims it: page cache is dropped, and
   * where the node has swap, anonymous and tmpfs pages are swapped out. cgroup v1 has no
   * memory.reclaim: `memory.force_empty` reclaims a cgroup that still has tasks (with the
   * cgroup's swappiness raised first); v2 writes the usage to `memory.reclaim` with
   * `memory.swap.max` lifted. Reclaim is best effort; whatever it could not free stays.
   */
  async reclaim(id: string): Promise<ReclaimResult> {
    const before = await this.usage(id);
    const restore: MemorySettings = {};
    if (this.mode === 'v2') {
      const d = this.dir('', id);
      const swapMax = (await readFile(path.join(d, 'memory.swap.max'), 'utf8').catch(() => '')).trim();
      if (swapMax && swapMax !== 'max') {
        restore.swapMax = swapMax;
        await writeFile(path.join(d, 'memory.swap.max'), 'max').catch(() => undefined);
      }
      // EAGAIN when less than asked could be reclaimed: the rest is simply not reclaimable.
      await writeFile(path.join(d, 'memory.reclaim'), String(before.usageBytes)).catch(() => undefined);
    } else {
      const d = this.dir('memory', id);
      const swappiness = await readNum(path.join(d, 'memory.swappiness'));
      if (swappiness !== PAUSED_SWAPPINESS) {
        restore.swappiness = swappiness;
        await writeFile(path.join(d, 'memory.swappiness'), String(PAUSED_SWAPPINESS)).catch(() => undefined);
      }
      // One pass reclaims the inactive pages and moves the active ones to the inactive list;
      // further passes take those, until a pass frees little.
      let usage = before.usageBytes;
      for (let pass = 0; pass < MAX_RECLAIM_PASSES; pass++) {
        await writeFile(path.join(d, 'memory.force_empty'), '0').catch(() => undefined);
        const now = (await this.usage(id)).usageBytes;
        if (usage - now < RECLAIM_PROGRESS_BYTES) break;
        usage = now;
      }
    }
    const after = await this.usage(id);
    return { beforeBytes: before.usageBytes, afterBytes: after.usageBytes, swapBytes: after.swapBytes, restore };
  }

  /** Puts back the memory settings a pause changed. */
  async restoreMemory(id: string, s: MemorySettings): Promise<void> {
    if (this.mode === 'v2') {
      if (s.swapMax !== undefined) await writeFile(path.join(this.dir('', id), 'memory.swap.max'), s.swapMax).catch(() => undefined);
    } else if (s.swappiness !== undefined) {
      await writeFile(path.join(this.dir('memory', id), 'memory.swappiness'), String(s.swappiness)).catch(() => undefined);
    }
  }

  /**
   * Sets a running sandbox's memory limit, without swap (as its bundle set it: swap total equal
   * to the limit, v2's `memory.swap.max` 0, which this leaves alone). v1 keeps memory+swap at or
   * above memory, so the two are written in the order a lower or a higher limit needs. Lowering
   * under what cannot be reclaimed fails (v1: EBUSY) or, on v2, makes the kernel OOM-kill in the
   * cgroup.
   */
  async setMemoryLimit(id: string, bytes: number): Promise<void> {
    if (this.mode === 'v2') {
      await writeFile(path.join(this.dir('', id), 'memory.max'), String(bytes));
      return;
    }
    const d = this.dir('memory', id);
    const memory = path.join(d, 'memory.limit_in_bytes');
    const memsw = path.join(d, 'memory.memsw.limit_in_bytes');
    // Without swap accounting (no memsw file) the memory limit alone is the cap.
    const hasMemsw = await stat(memsw).then(
      () => true,
      () => false,
    );
    const lowering = bytes < (await readNum(memory));
    if (lowering || !hasMemsw) await writeFile(memory, String(bytes));
    if (hasMemsw) await writeFile(memsw, String(bytes));
    if (!lowering && hasMemsw) await writeFile(memory, String(bytes));
  }

  /** Times a fork failed in a sandbox because of its pids limit (the `max` of pids.events). */
  pidsLimitHitsSync(id: string): number {
    const file = path.join(this.mode === 'v2' ? this.dir('', id) : this.dir('pids', id), 'pids.events');
    const m = /^max (\d+)$/m.exec(this.counterFiles.read(id, file) ?? '');
    return m ? Number(m[1]) : 0;
  }

  /** {@link pidsLimitHitsSync}, read without blocking (the periodic scan over every sandbox). */
  async pidsLimitHits(id: string): Promise<number> {
    const file = path.join(this.mode === 'v2' ? this.dir('', id) : this.dir('pids', id), 'pids.events');
    const m = /^max (\d+)$/m.exec(await readFile(file, 'utf8').catch(() => ''));
    return m ? Number(m[1]) : 0;
  }

  /** Tasks in a sandbox's cgroup now (0 when it has none). */
  pidsCurrentSync(id: string): number {
    return Number(this.counterFiles.read(id, path.join(this.mode === 'v2' ? this.dir('', id) : this.dir('pids', id), 'pids.current'))?.trim()) || 0;
  }

  /** Host pids of the processes in a sandbox's cgroup. */
  async procs(id: string): Promise<number[]> {
    const file = path.join(this.mode === 'v2' ? this.dir('', id) : this.dir('pids', id), 'cgroup.procs');
    const text = await readFile(file, 'utf8').catch(() => '');
    return text.split('\n').filter(Boolean).map(Number);
  }

  /**
   * Reads a resumed sandbox's swapped-out process memory back in (MADV_WILLNEED on each of its
   * processes' mappings through process_madvise(2)), so that its first steps do not fault page
   * by page. Does nothing when none of it is in swap. tmpfs files come back on first access.
   */
  async prefetch(id: string): Promise<PrefetchResult> {
    if ((await this.usage(id)).swapBytes === 0) return { processes: 0, advisedBytes: 0 };
    let processes = 0;
    let advised = 0n;
    for (const pid of await this.procs(id)) {
      const fd = pidfdOpen(pid);
      if (fd === undefined) continue;
      try {
        advised += processMadvise(fd, await prefetchRanges(pid), MADV_WILLNEED);
        processes++;
      } finally {
        closeFd(fd);
      }
    }
    return { processes, advisedBytes: Number(advised) };
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

  /**
   * Waits until a sandbox's cgroup has no process left (the kernel empties it as the killed
   * processes exit); false when some are still there after `timeoutMs`.
   */
  async waitEmpty(id: string, timeoutMs: number): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    // Killed processes are usually gone within a few ms: poll every ms at first, then back off.
    for (let poll = 0; ; poll++) {
      if ((await this.procs(id)).length === 0) return true;
      if (Date.now() >= deadline) return false;
      await sleep(poll < 20 ? 1 : Math.min(2 ** (poll - 19), 20));
    }
  }

  /** Directories of a sandbox's cgroup that exist (for leak checks and cleanup). */
  async existing(id: string): Promise<string[]> {
    const found = await Promise.all(
      this.dirsOf(id).map((d) =>
        stat(d).then(
          () => d,
          () => undefined,
        ),
      ),
    );
    return found.filter((d): d is string => d !== undefined);
  }

  /** The directories of a sandbox's cgroup, one per hierarchy (v1) or the one (v2). */
  private dirsOf(id: string): string[] {
    return this.mode === 'v2' ? [this.dir('', id)] : V1_HIERARCHIES.map((c) => this.dir(c, id));
  }

  /**
   * Makes a sandbox's cgroups where no runtime does (a microVM's QEMU process) with its memory,
   * CPU and pids limits, and returns the `cgroup.procs` files a process joins them by.
   */
  async create(id: string, limits: { memoryBytes: number; cpu: number; pids: number }): Promise<string[]> {
    const procs: string[] = [];
    const period = 100_000;
    const quota = Math.max(1000, Math.round(limits.cpu * period));
    if (this.mode === 'v2') {
      const d = this.dir('', id);
      await mkdir(d, { recursive: true });
      await writeFile(path.join(d, 'memory.max'), String(limits.memoryBytes));
      await writeFile(path.join(d, 'cpu.max'), `${quota} ${period}`);
      await writeFile(path.join(d, 'pids.max'), String(limits.pids));
      return [path.join(d, 'cgroup.procs')];
    }
    for (const c of V1_HIERARCHIES) {
      if (c === 'cpuset') continue; // empty cpus/mems until copied; the parent's apply.
      const d = this.dir(c, id);
      await mkdir(d, { recursive: true });
      if (c === 'memory') await writeFile(path.join(d, 'memory.limit_in_bytes'), String(limits.memoryBytes));
      if (c === 'cpu') {
        await writeFile(path.join(d, 'cpu.cfs_period_us'), String(period));
        await writeFile(path.join(d, 'cpu.cfs_quota_us'), String(quota));
      }
      if (c === 'pids') await writeFile(path.join(d, 'pids.max'), String(limits.pids));
      procs.push(path.join(d, 'cgroup.procs'));
    }
    return procs;
  }

  /** Closes the counter files held open for the exec path's reads (the node's backends close). */
  closeCounterFiles(): void {
    this.counterFiles.close();
  }

  /** Removes a sandbox's (empty) cgroups that the runtime left behind. */
  async remove(id: string): Promise<void> {
    this.counterFiles.release(id);
    // One rmdir per hierarchy, all at once (one gone already is ENOENT, ignored): no stat first.
    await Promise.all(this.dirsOf(id).map((d) => rmdir(d).catch(() => undefined)));
  }

  /** Removes the (empty) parent cgroups of this node's sandboxes. */
  async removeParent(): Promise<void> {
    const dirs = this.mode === 'v2' ? [path.join(CGROUP_ROOT, this.parent)] : V1_HIERARCHIES.map((c) => path.join(CGROUP_ROOT, c, this.parent));
    for (const d of dirs) await rmdir(d).catch(() => undefined);
  }

  /** Ids of sandboxes that have a cgroup under the parent. */
  async list(): Promise<string[]> {
    const d = this.mode === 'v2' ? path.join(CGROUP_ROOT, this.parent) : path.join(CGROUP_ROOT, 'memory', this.parent);
    const entries = await readdir(d, { withFileTypes: true }).catch(() => []);
    return entries.filter((e) => e.isDirectory()).map((e) => e.name);
  }
}
