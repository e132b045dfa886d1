// What a node watches in its running sandboxes besides their commands: OOM kills and refused
// forks (the backend's counters, raised as events and told apart in exit reports) and processes
// that outlive the command that started them. Works through the backend's facets; a backend
// without them is simply not watched for that.
import { readFile } from 'node:fs/promises';
import type { ExitInfo, RaisedEvent, SandboxSpec } from '@dsec/protocol';
import type { CounterFacet, HostProcessFacet, SandboxCounters } from './backend.js';
import type { AgentExit } from './chronus/client.js';

/** Default interval of the OOM and pids-limit counter scan (a command's exit also triggers one). */
export const DEFAULT_COUNTER_SCAN_MS = 3000;
/** After a command exits, how long its processes may take to go before the survivors are reported. */
export const SURVIVOR_GRACE_MS = 500;
/** Survivor pids remembered per sandbox (each is reported once). */
const MAX_REPORTED_SURVIVORS = 1024;
/** Processes whose OOM baseline is remembered per sandbox. */
const MAX_OOM_BASELINES = 4096;

/** What the monitor needs of the node. */
export interface SandboxMonitorDeps {
  raise: (ev: RaisedEvent) => void;
  /** True while the sandbox is running (a paused or stopping one is not read). */
  isRunning: (id: string) => boolean;
  /** Sessions (the agent's pids) of the sandbox's running commands. */
  runningSessions: (id: string) => Promise<Set<number>>;
}

interface Watched {
  counters: CounterFacet | undefined;
  processes: HostProcessFacet | undefined;
  /** The sandbox's spec as it is now (the limits named in events). */
  spec: () => SandboxSpec;
  /** Counter values already reported as events. */
  seen: SandboxCounters;
  /** The OOM-kill count when each process started (to tell its OOM kill apart). */
  oomAtSpawn: Map<number, number>;
  /** Host pids already reported as outliving their command. */
  survivors: Set<number>;
  /** A survivor check waiting for its grace time. */
  survivorTimer?: NodeJS.Timeout;
}

/** Counters, OOM verdicts and survivor checks of a node's sandboxes. */
export class SandboxMonitor {
  private readonly watched = new Map<string, Watched>();
  private scanTimer: NodeJS.Timeout | undefined;
  private scanning = false;

  constructor(private readonly deps: SandboxMonitorDeps) {}

  /** Starts watching a sandbox; counts from before (a recovered sandbox) are not news. */
  add(id: string, facets: { counters?: CounterFacet | undefined; hostProcesses?: HostProcessFacet | undefined }, spec: () => SandboxSpec): void {
    const seen = facets.counters?.readNow(id) ?? { oomKills: 0, pidsLimitHits: 0 };
    this.watched.set(id, { counters: facets.counters, processes: facets.hostProcesses, spec, seen, oomAtSpawn: new Map(), survivors: new Set() });
  }

  /** Stops watching a sandbox (its destroy began). */
  remove(id: string): void {
    const w = this.watched.get(id);
    if (w) clearTimeout(w.survivorTimer);
    this.watched.delete(id);
  }

  /** Scans every sandbox's counters every `everyMs` (0: never). */
  start(everyMs: number): void {
    if (everyMs <= 0) return;
    this.scanTimer = setInterval(() => this.scan(), everyMs);
    this.scanTimer.unref();
  }

  /** Stops every timer; the sandboxes stay as they are. */
  close(): void {
    clearInterval(this.scanTimer);
    this.scanTimer = undefined;
    for (const w of this.watched.values()) clearTimeout(w.survivorTimer);
  }

  /** The OOM-kill count now: read before a command starts, handed to {@link spawned} after. */
  oomBaseline(id: string): number {
    return this.watched.get(id)?.counters?.readNow(id).oomKills ?? 0;
  }

  /** Remembers a started process's OOM baseline. */
  spawned(id: string, proc: number, oomBaseline: number): void {
    const w = this.watched.get(id);
    if (!w) return;
    if (w.oomAtSpawn.size >= MAX_OOM_BASELINES) w.oomAtSpawn.delete(w.oomAtSpawn.keys().next().value as number);
    w.oomAtSpawn.set(proc, oomBaseline);
  }

  /** Forgets a released process. */
  released(id: string, proc: number): void {
    this.watched.get(id)?.oomAtSpawn.delete(proc);
  }

  /** Converts an agent exit report, telling OOM kills from other SIGKILLs. */
  judge(id: string, exit: AgentExit): ExitInfo {
    let oomKilled = false;
    const w = this.watched.get(id);
    // A shell reports a child's SIGKILL as status 137: check the counter for both. An OOM
    // kill in the sandbox since the process started is attributed to it.
    const killed = exit.signal === 'SIGKILL' || exit.exitCode === 137;
    const before = w?.oomAtSpawn.get(exit.proc);
    if (killed && !exit.timedOut && before !== undefined && w?.counters) {
      oomKilled = w.counters.readNow(id).oomKills > before;
      // Report it now rather than at the next scan, naming the command.
      if (oomKilled) this.checkCounters(id, { proc: exit.proc, pid: exit.pid });
    }
    return {
      exitCode: exit.exitCode,
      signal: exit.signal,
      timedOut: exit.timedOut,
      oomKilled,
      durationMs: exit.durationMs,
      cpuUserMs: exit.cpuUserMs,
      cpuSysMs: exit.cpuSysMs,
      peakMemoryKiB: exit.peakMemoryKiB,
      stdoutBytes: exit.stdoutBytes,
      stderrBytes: exit.stderrBytes,
    };
  }

  /** A command exited: checks for survivors once its grace time is over (one pending check per sandbox). */
  exited(id: string): void {
    const w = this.watched.get(id);
    if (!w || w.survivorTimer || !w.processes) return;
    w.survivorTimer = setTimeout(() => {
      delete w.survivorTimer;
      this.checkCounters(id);
      void this.checkSurvivors(id).catch(() => undefined);
    }, SURVIVOR_GRACE_MS);
    w.survivorTimer.unref();
  }

  /**
   * Compares every sandbox's OOM and pids-limit counters with what was reported. The files are
   * read without blocking (thousands of sandboxes must not stall the event loop); one scan at
   * a time.
   */
  private scan(): void {
    if (this.scanning) return;
    this.scanning = true;
    void (async () => {
      for (const id of [...this.watched.keys()]) {
        const counters = this.watched.get(id)?.counters;
        if (!counters || !this.deps.isRunning(id)) continue;
        const c = await counters.read(id);
        this.report(id, c);
      }
    })()
      .catch(() => undefined)
      .finally(() => (this.scanning = false));
  }

  /** Raises oom.kill and pids.limit-hit for counter increases since the last check (one sandbox, read at once). */
  private checkCounters(id: string, context?: { proc: number; pid: number }): void {
    const counters = this.watched.get(id)?.counters;
    if (!counters || !this.deps.isRunning(id)) return;
    this.report(id, counters.readNow(id), context);
  }

  private report(id: string, now: SandboxCounters, context?: { proc: number; pid: number }): void {
    const w = this.watched.get(id);
    if (!w || !this.deps.isRunning(id)) return;
    const { resources } = w.spec();
    const limitMiB = resources?.memoryMiB;
    this.raiseGrowth(id, w, now, 'oomKills', 'oom.kill', (count) => ({
      message: `sandbox ${id}: ${count} process${count === 1 ? '' : 'es'} killed at the memory limit${limitMiB ? ` (${limitMiB} MiB)` : ''}`,
      data: { ...(limitMiB ? { memoryMiB: limitMiB } : {}), ...(context ? { proc: context.proc, pid: context.pid } : {}) },
    }));
    const limit = resources?.pids;
    this.raiseGrowth(id, w, now, 'pidsLimitHits', 'pids.limit-hit', (count) => ({
      message: `sandbox ${id}: ${count} fork${count === 1 ? '' : 's'} refused at the process limit${limit ? ` (${limit})` : ''}`,
      data: limit ? { pidsLimit: limit } : {},
    }));
  }

  /** Raises `kind` (a warning with the count and total) when counter `key` grew since last seen, and remembers the new value. */
  private raiseGrowth(
    id: string,
    w: Watched,
    now: SandboxCounters,
    key: keyof SandboxCounters,
    kind: 'oom.kill' | 'pids.limit-hit',
    describe: (count: number) => { message: string; data: Record<string, unknown> },
  ): void {
    if (now[key] <= w.seen[key]) return;
    const count = now[key] - w.seen[key];
    w.seen[key] = now[key];
    const { message, data } = describe(count);
    this.deps.raise({ kind, severity: 'warning', sandboxId: id, message, data: { count, total: now[key], ...data } });
  }

  /**
   * Raises process.survived-command for processes in the sandbox that belong to no running
   * command: chronus starts each command in a session of its own, so a process whose session
   * is not a running command's (nor the agent's) outlived the command that started it, or left
   * its session to escape it (a daemon).
   */
  private async checkSurvivors(id: string): Promise<void> {
    const w = this.watched.get(id);
    const host = w?.processes;
    if (!w || !host || !this.deps.isRunning(id)) return;
    // The agent alone (PID 1) is the common case: one file read.
    if (host.countNow(id) <= 1) {
      w.survivors.clear();
      return;
    }
    const candidates: Array<{ hostPid: number; pid: number; session: number; name: string }> = [];
    const present = new Set<number>();
    for (const hostPid of await host.hostPids(id)) {
      present.add(hostPid);
      const st = await readProcStatus(hostPid);
      if (!st || st.pid === 1 || st.session === 1 || st.zombie || w.survivors.has(hostPid)) continue;
      candidates.push({ hostPid, ...st });
    }
    for (const pid of w.survivors) if (!present.has(pid)) w.survivors.delete(pid);
    if (candidates.length === 0) return;
    // Sessions of running commands, read after the processes: a command started meanwhile
    // is listed here, so its processes are not taken for survivors.
    const running = await this.deps.runningSessions(id);
    const survivors = [];
    for (const c of candidates) {
      if (running.has(c.session)) continue;
      const again = await readProcStatus(c.hostPid);
      if (!again || again.zombie || again.session !== c.session) continue;
      survivors.push(c);
    }
    if (survivors.length === 0) return;
    for (const s of survivors) if (w.survivors.size < MAX_REPORTED_SURVIVORS) w.survivors.add(s.hostPid);
    const shown = survivors.slice(0, 16);
    this.deps.raise({
      kind: 'process.survived-command',
      severity: 'warning',
      sandboxId: id,
      message: `sandbox ${id}: ${survivors.length} process${survivors.length === 1 ? '' : 'es'} outlived their command: ${shown.map((s) => `${s.name} (pid ${s.pid})`).join(', ')}`,
      data: { count: survivors.length, processes: shown.map((s) => ({ pid: s.pid, name: s.name, session: s.session })) },
    });
  }
}

/** What the survivor check needs from /proc/<pid>/status, with pids as the sandbox sees them. */
async function readProcStatus(hostPid: number): Promise<{ pid: number; session: number; name: string; zombie: boolean } | undefined> {
  const text = await readFile(`/proc/${hostPid}/status`, 'utf8').catch(() => undefined);
  if (text === undefined) return undefined;
  const field = (name: string): string => new RegExp(`^${name}:\\s*(.*)$`, 'm').exec(text)?.[1]?.trim() ?? '';
  // NSpid and NSsid list the id in each nested pid namespace; the last is the sandbox's.
  const last = (name: string): number => Number(field(name).split(/\s+/).pop());
  return { pid: last('NSpid'), session: last('NSsid'), name: field('Name'), zombie: field('State').startsWith('Z') };
}
