// Optional node setting: a compressed swap device in RAM (zram) that paused sandboxes' memory is
// swapped out to. Without swap, pausing can only drop page cache; with it, a paused sandbox's
// anonymous and tmpfs pages are compressed (typically 2-4x) and the rest of the node gets the
// difference. Running sandboxes do not swap (their cgroups' swappiness is 0).
import { execFile } from 'node:child_process';
import { mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { DsecError } from '@dsec/protocol';

const run = promisify(execFile);

/** Where the zram devices that dsec set up are recorded (for cleanup after a crash). */
export const ZRAM_MARKER_DIR = '/run/dsec/zram';
/** Priority of dsec's zram swap: above any disk swap the host has. */
const ZRAM_SWAP_PRIORITY = 100;
/** Largest zram swap accepted (MiB). */
export const MAX_ZRAM_SWAP_MIB = 1_048_576;

/** Options of {@link ZramSwap.enable}. */
export interface ZramSwapOptions {
  /** Uncompressed size of the device in MiB (how much memory may be swapped to it). */
  sizeMiB: number;
  /** Compression algorithm; default lz4 where the kernel has it, else the kernel's default. */
  algorithm?: string;
}

/** A zram device set up as swap by this node. */
export class ZramSwap {
  private constructor(
    /** The block device (`/dev/zram1`). */
    readonly device: string,
    private readonly index: number,
    private readonly hotAdded: boolean,
  ) {}

  /** Swap devices the kernel uses now (/proc/swaps). */
  static async active(): Promise<string[]> {
    const text = await readFile('/proc/swaps', 'utf8').catch(() => '');
    return text
      .split('\n')
      .slice(1)
      .map((l) => l.split(/\s+/)[0] ?? '')
      .filter(Boolean);
  }

  /**
   * Sets up a zram device as swap: a new one from /sys/class/zram-control when the kernel has
   * it, else an unused existing one. Fails with UNAVAILABLE when the kernel has no zram.
   */
  static async enable(opts: ZramSwapOptions): Promise<ZramSwap> {
    if (!Number.isInteger(opts.sizeMiB) || opts.sizeMiB < 1 || opts.sizeMiB > MAX_ZRAM_SWAP_MIB) {
      throw new DsecError('INVALID_ARGUMENT', `zramSwapMiB: must be an integer in 1..${MAX_ZRAM_SWAP_MIB}`, { field: 'zramSwapMiB' });
    }
    let index: number;
    let hotAdded = false;
    const hotAdd = await readFile('/sys/class/zram-control/hot_add', 'utf8').catch(() => undefined);
    if (hotAdd !== undefined) {
      index = Number(hotAdd.trim());
      hotAdded = true;
    } else {
      const found = await ZramSwap.unusedDevice();
      if (found === undefined) throw new DsecError('UNAVAILABLE', 'zram swap: this kernel has no free zram device (load the zram module)');
      index = found;
    }
    const swap = new ZramSwap(`/dev/zram${index}`, index, hotAdded);
    const sys = `/sys/block/zram${index}`;
    try {
      // Recorded first, so that a crash at any later step leaves a trace for the cleanup.
      await mkdir(ZRAM_MARKER_DIR, { recursive: true });
      await writeFile(path.join(ZRAM_MARKER_DIR, `zram${index}`), `${hotAdded ? 'hot-added' : 'existing'}\n`);
      const algorithms = await readFile(`${sys}/comp_algorithm`, 'utf8');
      const algorithm = opts.algorithm ?? (/\blz4\b/.test(algorithms) ? 'lz4' : undefined);
      if (algorithm) await writeFile(`${sys}/comp_algorithm`, algorithm);
      await writeFile(`${sys}/disksize`, `${opts.sizeMiB}M`);
      await run('mkswap', [swap.device]);
      await run('swapon', ['-p', String(ZRAM_SWAP_PRIORITY), swap.device]);
    } catch (err) {
      await swap.disable().catch(() => undefined);
      throw new DsecError('UNAVAILABLE', `zram swap on ${swap.device}: ${(err as Error).message}`);
    }
    return swap;
  }

  /** The zram swap an earlier edge set up and left on (recorded under ZRAM_MARKER_DIR), if any. */
  static async adopt(): Promise<ZramSwap | undefined> {
    const active = new Set(await ZramSwap.active());
    for (const name of await readdir(ZRAM_MARKER_DIR).catch(() => [] as string[])) {
      const m = /^zram(\d+)$/.exec(name);
      if (!m || !active.has(`/dev/${name}`)) continue;
      const how = await readFile(path.join(ZRAM_MARKER_DIR, name), 'utf8').catch(() => '');
      return new ZramSwap(`/dev/${name}`, Number(m[1]), how.startsWith('hot-added'));
    }
    return undefined;
  }

  private static async unusedDevice(): Promise<number | undefined> {
    const active = new Set(await ZramSwap.active());
    for (let i = 0; i < 64; i++) {
      const size = await readFile(`/sys/block/zram${i}/disksize`, 'utf8').catch(() => undefined);
      if (size === undefined) break;
      if (size.trim() === '0' && !active.has(`/dev/zram${i}`)) return i;
    }
    return undefined;
  }

  /** Bytes stored and memory used by the device (from mm_stat). */
  async usage(): Promise<{ storedBytes: number; compressedBytes: number; memoryUsedBytes: number }> {
    const f = (await readFile(`/sys/block/zram${this.index}/mm_stat`, 'utf8')).trim().split(/\s+/).map(Number);
    return { storedBytes: f[0] ?? 0, compressedBytes: f[1] ?? 0, memoryUsedBytes: f[2] ?? 0 };
  }

  /**
   * Turns the swap off (swapped pages are read back into memory first, so this needs room)
   * and releases the device.
   */
  async disable(): Promise<void> {
    if ((await ZramSwap.active()).includes(this.device)) await run('swapoff', [this.device]);
    // The device may still be held open for a moment after swapoff (EBUSY): try a few times.
    for (let attempt = 0; ; attempt++) {
      try {
        await writeFile(`/sys/block/zram${this.index}/reset`, '1');
        if (this.hotAdded) await writeFile('/sys/class/zram-control/hot_remove', String(this.index));
        break;
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') break;
        if (attempt >= 20) throw new DsecError('BACKEND_FAILED', `zram swap: releasing ${this.device}: ${(err as Error).message}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    }
    await rm(path.join(ZRAM_MARKER_DIR, `zram${this.index}`), { force: true });
  }
}
