// The machine's own CPU time and memory, from /proc: what /metrics exports for the node in the
// single-node form, and what the node usage stream turns into a CPU percentage between samples.
import { readFile } from 'node:fs/promises';
import os from 'node:os';

/** Modes of the first line of /proc/stat, in order. */
export const CPU_MODES = ['user', 'nice', 'system', 'idle', 'iowait', 'irq', 'softirq', 'steal'] as const;
/** USER_HZ: the unit of /proc/stat. */
export const CLOCK_TICKS_PER_SECOND = 100;

/** One reading of the machine. */
export interface MachineUse {
  /** CPU time by mode (seconds since boot, summed over cores), in {@link CPU_MODES} order; empty if /proc/stat could not be read. */
  cpuSeconds: number[];
  memoryTotalBytes: number;
  memoryAvailableBytes: number;
}

/** Reads the machine's CPU time and memory. */
export async function readMachineUse(): Promise<MachineUse> {
  const [stat, mem] = await Promise.all([readFile('/proc/stat', 'utf8').catch(() => ''), readFile('/proc/meminfo', 'utf8').catch(() => '')]);
  const ticks = /^cpu\s+(.*)$/m.exec(stat)?.[1]?.trim().split(/\s+/).map(Number);
  const kib = (name: string): number | undefined => {
    const m = new RegExp(`^${name}:\\s+(\\d+) kB$`, 'm').exec(mem);
    return m ? Number(m[1]) * 1024 : undefined;
  };
  return {
    cpuSeconds: ticks ? CPU_MODES.map((_, i) => (ticks[i] ?? 0) / CLOCK_TICKS_PER_SECOND) : [],
    memoryTotalBytes: kib('MemTotal') ?? os.totalmem(),
    memoryAvailableBytes: kib('MemAvailable') ?? os.freemem(),
  };
}

/** Busy share of all cores between two readings, in percent (0 when either lacks CPU time). */
export function cpuPercentBetween(before: MachineUse, after: MachineUse): number {
  const sum = (u: MachineUse): { busy: number; total: number } => {
    let busy = 0;
    let total = 0;
    u.cpuSeconds.forEach((s, i) => {
      total += s;
      if (CPU_MODES[i] !== 'idle' && CPU_MODES[i] !== 'iowait') busy += s;
    });
    return { busy, total };
  };
  const a = sum(before);
  const b = sum(after);
  const dt = b.total - a.total;
  return dt > 0 ? Math.min(100, Math.max(0, ((b.busy - a.busy) / dt) * 100)) : 0;
}
