// Turns what the kernel reports about sandboxes into events: seccomp denials (from the audit
// netlink group), changes under watched paths (fanotify on the writable layers) and changes to
// read-only protected paths their server refused (its log), and that server's death (restarted,
// at most MAX_SERVER_RESTARTS times a minute and MAX_SERVER_RESTARTS_EVER times in all, a few at
// a time on the node). One poll loop per node reads them all without blocking; events
// are rate-limited per sandbox so that a sandbox that loops on a refused call cannot flood the
// event stream (what was dropped is counted).
import { readFileSync } from 'node:fs';
import { DsecError } from '@dsec/protocol';
import type { RaisedEvent } from '@dsec/protocol';
import { ID_RANGE_SIZE, ID_RANGE_START, slotOfHostId } from './id-ranges.js';
import { AuditNetlinkReader, isExpectedRefusal, KmsgReader, parseSeccompRecord } from './seccomp-audit.js';
import type { SeccompRecordSource } from './seccomp-audit.js';
import { RefusedWriteLogs } from './refused-writes.js';
import { UpperWatcher } from './upper-watch.js';

/** How often the kernel log and the fanotify queue are read. */
export const SECURITY_POLL_MS = 200;
/** Events of one kind one sandbox may raise per window before the rest are only counted. */
export const EVENTS_PER_WINDOW = 20;
/** Length of a rate-limit window. */
export const EVENT_WINDOW_MS = 10_000;
/**
 * An adopted sandbox's refusal log is read, and its protected-path server first checked, this long
 * after it is followed: an edge that just started has its subscribers by then. A new sandbox's
 * server is checked at once (a death right after the create is restarted as soon as any other).
 */
const FOLLOW_GRACE_MS = 2_000;
/** Servers checked per poll at most, in turn. */
const SERVERS_PER_POLL = 32;

/** Whether a sandbox's protected-path server still runs; undefined when that cannot be told. */
export type ServerCheck = () => boolean | undefined;
/** Restarts of one sandbox's protected-path server within {@link RESTART_WINDOW_MS}; past them it stays gone. */
export const MAX_SERVER_RESTARTS = 3;
/** The window {@link MAX_SERVER_RESTARTS} counts in. */
export const RESTART_WINDOW_MS = 60_000;
/**
 * Restarts of one sandbox's protected-path server in its life; past them it stays gone. Each one
 * stacks a FUSE mount per path on the dead ones, held until the sandbox ends.
 */
export const MAX_SERVER_RESTARTS_EVER = 10;
/** Restarts running at once on the node (a dsec-launch each); the other dead servers wait their turn. */
export const MAX_RESTARTS_IN_FLIGHT = 4;
/** Wait before the retry of a restart that failed and may not fail again; doubled at each failure. */
export const RESTART_RETRY_MS = 1_000;

/** A sandbox's protected-path server as the monitor checks it. */
interface Served {
  serving: ServerCheck;
  /** Starts a new server after this one died (see ProtectedPathFacet.restart: a 4xx is a refusal). */
  restart?: () => Promise<void>;
  /** When it may next be checked. */
  from: number;
  /** When it was restarted (each try), within the last window. */
  restarts: number[];
  /** Restarts tried in its life. */
  tries: number;
  /** Tries that failed in a row, and why the last one did. */
  failures: number;
  failed?: string;
}
/** Records or fanotify events handled per poll (the rest wait for the next one). */
const MAX_PER_POLL = 4096;

/** What the monitor needs from the node. */
export interface SecurityMonitorOptions {
  /** Raises an event (Edge.raise). */
  raise(ev: RaisedEvent): void;
  /** The sandbox whose user namespace starts at this host uid, if any. */
  sandboxOfIdBase(hostUid: number): string | undefined;
  /** The cgroup parent of the node's sandboxes (to attribute a live pid without a user namespace). */
  cgroupParent: string;
  /** Whether to read the kernel log (default true). */
  kernelLog?: boolean;
  /** The clock, in ms (default Date.now). */
  now?: () => number;
}

interface Window {
  start: number;
  count: number;
  dropped: number;
}

/** The node's reader of seccomp denials and watched-path changes. */
export class SecurityMonitor {
  private readonly kmsg: SeccompRecordSource | undefined;
  private readonly watcher = new UpperWatcher();
  private readonly refusals = new RefusedWriteLogs();
  /** The protected-path servers still to be checked, with when they may first be. */
  private readonly servers = new Map<string, Served>();
  /** The servers being restarted (checked again once they serve). */
  private readonly restarting = new Map<string, Served>();
  /** Restarts not settled yet, those of sandboxes forgotten meanwhile included (their dsec-launch runs still). */
  private inFlight = 0;
  /** Adopted sandboxes' refusal logs, read once their grace has passed. */
  private readonly adopted = new Map<string, { log: string; from: number }>();
  private readonly windows = new Map<string, Window>();
  private readonly timer: NodeJS.Timeout;
  private overflowReported = false;
  private readonly now: () => number;

  constructor(private readonly o: SecurityMonitorOptions) {
    this.now = o.now ?? Date.now;
    // Every record from the audit group; the rate-limited kernel log only where it cannot be joined.
    this.kmsg = o.kernelLog === false ? undefined : (AuditNetlinkReader.open() ?? KmsgReader.open());
    this.timer = setInterval(() => this.poll(), SECURITY_POLL_MS);
    this.timer.unref();
  }

  /** True when seccomp denials can be observed here (the kernel log is readable). */
  get seesDenials(): boolean {
    return this.kmsg !== undefined;
  }

  /** Watches a sandbox's writable layer (host dir holding `upper/`) for changes to `paths`. */
  watch(sandboxId: string, rw: string, paths: string[]): void {
    this.watcher.add(sandboxId, rw, paths);
  }

  /**
   * Reads the log of the changes to a sandbox's read-only protected paths that their server
   * refused, from its start or (an adopted sandbox) from where the previous edge raised it to,
   * and checks (`serving`) that their server still runs: once it is gone the paths answer
   * ENOTCONN until `restart` has a new one serving them, which is raised as
   * `protected-path.server-restarted`. At most {@link MAX_RESTARTS_IN_FLIGHT} restarts run at
   * once on the node; one that failed is tried again after {@link RESTART_RETRY_MS} (doubled at
   * each failure). Past {@link MAX_SERVER_RESTARTS} tries in {@link RESTART_WINDOW_MS} or
   * {@link MAX_SERVER_RESTARTS_EVER} in all, or when a restart refuses, they stay so: raised once
   * as `protected-path.server-gone`.
   */
  followRefusals(sandboxId: string, log: string, fromStart: boolean, serving?: ServerCheck, restart?: () => Promise<void>): void {
    const from = fromStart ? this.now() : this.now() + FOLLOW_GRACE_MS;
    if (fromStart) this.refusals.add(sandboxId, log, true);
    else this.adopted.set(sandboxId, { log, from });
    if (serving) this.servers.set(sandboxId, { serving, from, restarts: [], tries: 0, failures: 0, ...(restart ? { restart } : {}) });
  }

  /** Stops watching a sandbox and forgets its rate-limit state. */
  forget(sandboxId: string): void {
    this.watcher.remove(sandboxId);
    this.refusals.remove(sandboxId);
    this.adopted.delete(sandboxId);
    this.servers.delete(sandboxId);
    this.restarting.delete(sandboxId);
    for (const key of this.windows.keys()) if (key.startsWith(`${sandboxId} `)) this.windows.delete(key);
  }

  /** Reads what is pending now (the timer calls it; tests may too). */
  poll(): void {
    try {
      this.pollKernelLog();
      this.pollWatches();
      this.followAdopted(this.now());
      this.pollRefusals();
      this.pollServers(this.now());
      this.flushWindows(this.now());
    } catch {
      // A failure to read is retried on the next tick; the node carries on.
    }
  }

  private pollKernelLog(): void {
    if (!this.kmsg) return;
    for (const line of this.kmsg.read(MAX_PER_POLL)) {
      const d = parseSeccompRecord(line);
      if (!d || isExpectedRefusal(d)) continue;
      const sandboxId = this.attribute(d.auid, d.uid, d.pid);
      if (!sandboxId) continue;
      // One budget per system call: a loop on one refused call cannot hide another.
      this.emit(
        sandboxId,
        {
          kind: 'seccomp.denied',
          severity: 'warning',
          sandboxId,
          message: `seccomp refused ${d.syscall} to ${d.comm || 'a process'} (pid ${d.pid})`,
          data: { syscall: d.syscall, syscallNr: d.syscallNr, arch: d.arch, pid: d.pid, comm: d.comm, exe: d.exe },
        },
        d.syscall,
      );
    }
  }

  private pollWatches(): void {
    if (this.watcher.size === 0) return;
    // Many writes to one file between two polls are one event.
    for (const { ops, ...h } of byPath(this.watcher.drain(MAX_PER_POLL))) {
      this.emit(h.sandboxId, {
        kind: 'protected-path.write',
        severity: 'warning',
        sandboxId: h.sandboxId,
        message: `${ops.join(', ')} of ${h.path} (watched: ${h.watched})`,
        data: { path: h.path, watched: h.watched, ops, pid: h.pid },
      });
    }
    if (this.watcher.overflowed && !this.overflowReported) {
      this.overflowReported = true;
      this.o.raise({
        kind: 'protected-path.write',
        severity: 'warning',
        message: 'the watch queue overflowed: some changes to watched paths were not seen',
        data: { overflow: true },
      });
    }
  }

  private pollRefusals(): void {
    if (this.refusals.size === 0) return;
    const { refused, overflowed } = this.refusals.drain(MAX_PER_POLL);
    // Many attempts on one path between two polls are one event.
    for (const { ops, ...r } of byPath(refused)) {
      this.emit(r.sandboxId, {
        kind: 'protected-path.write',
        severity: 'warning',
        sandboxId: r.sandboxId,
        message: `refused ${ops.join(', ')} of ${r.path} (read-only)`,
        data: { path: r.path, ops, refused: true },
      });
    }
    for (const sandboxId of overflowed) {
      this.o.raise({
        kind: 'protected-path.write',
        severity: 'warning',
        sandboxId,
        message: 'too many refused writes to read-only paths: the later ones were not logged',
        data: { overflow: true, refused: true },
      });
    }
  }

  /** Starts reading the adopted logs whose grace has passed; one that cannot be read is raised. */
  private followAdopted(now: number): void {
    for (const [sandboxId, a] of this.adopted) {
      if (now < a.from) continue;
      this.adopted.delete(sandboxId);
      try {
        this.refusals.add(sandboxId, a.log, false);
      } catch (err) {
        this.o.raise(unreadableRefusals(sandboxId, err));
      }
    }
  }

  /**
   * Checks the next few protected-path servers; one that is gone is restarted (within its budget,
   * when fewer than {@link MAX_RESTARTS_IN_FLIGHT} run: else it waits), or raised and not checked
   * again.
   */
  private pollServers(now: number): void {
    const due: Array<[string, Served]> = [];
    for (const entry of this.servers) {
      if (due.length >= SERVERS_PER_POLL) break;
      if (now >= entry[1].from) due.push(entry);
    }
    for (const [sandboxId, s] of due) {
      // To the end of the Map: the next poll starts with the ones not checked yet.
      this.servers.delete(sandboxId);
      if (s.serving() !== false) {
        this.servers.set(sandboxId, s);
        continue;
      }
      s.restarts = s.restarts.filter((t) => now - t < RESTART_WINDOW_MS);
      const spent =
        s.tries >= MAX_SERVER_RESTARTS_EVER
          ? `${s.tries} times in all`
          : s.restarts.length >= MAX_SERVER_RESTARTS
            ? `${s.restarts.length} times in ${RESTART_WINDOW_MS / 1000} s`
            : undefined;
      if (!s.restart || spent) {
        this.serverGone(sandboxId, s.restart ? `restarted ${spent}, not again${s.failed ? ` (the last restart failed: ${s.failed})` : ''}` : undefined);
        continue;
      }
      if (this.inFlight >= MAX_RESTARTS_IN_FLIGHT) {
        this.servers.set(sandboxId, s); // its turn comes when one settles
        continue;
      }
      this.startRestart(sandboxId, s, s.restart, now);
    }
  }

  /** Runs one restart: raised once it serves, tried again later when it failed, raised gone when it refused. */
  private startRestart(sandboxId: string, s: Served, restart: () => Promise<void>, now: number): void {
    s.restarts.push(now);
    s.tries++;
    this.restarting.set(sandboxId, s);
    this.inFlight++;
    const settled = (): boolean => {
      this.inFlight--;
      if (this.restarting.get(sandboxId) !== s) return false; // forgotten meanwhile
      this.restarting.delete(sandboxId);
      return true;
    };
    restart().then(
      () => {
        if (!settled()) return;
        s.failures = 0;
        delete s.failed;
        this.servers.set(sandboxId, s);
        this.o.raise({
          kind: 'protected-path.server-restarted',
          severity: 'warning',
          sandboxId,
          message: `the server of the read-only protected paths died and was restarted (${s.restarts.length} of ${MAX_SERVER_RESTARTS} in ${RESTART_WINDOW_MS / 1000} s, ${s.tries} of ${MAX_SERVER_RESTARTS_EVER} in all)`,
          data: { restarts: s.restarts.length, limit: MAX_SERVER_RESTARTS, tries: s.tries, lifetimeLimit: MAX_SERVER_RESTARTS_EVER },
        });
      },
      (err: unknown) => {
        if (!settled()) return;
        const why = err instanceof Error ? err.message : String(err);
        if (err instanceof DsecError && err.status < 500) {
          this.serverGone(sandboxId, `its restart was refused: ${why}`);
          return;
        }
        // Checked again after the wait: still dead, it is tried again within its budget.
        s.failed = why;
        s.from = this.now() + RESTART_RETRY_MS * 2 ** s.failures++;
        this.servers.set(sandboxId, s);
      },
    );
  }

  /** Raises a server that is gone for good: its paths answer ENOTCONN until the sandbox is recreated. */
  private serverGone(sandboxId: string, why: string | undefined): void {
    this.o.raise({
      kind: 'protected-path.server-gone',
      severity: 'critical',
      sandboxId,
      message: `the server of the read-only protected paths is gone${why ? ` (${why})` : ''}: they answer "not connected" (nothing can be written there, nor read)`,
      ...(why ? { data: { why } } : {}),
    });
  }

  /** Which sandbox a process belongs to: its login uid, its uid's range, or its live cgroup. */
  private attribute(auid: number, uid: number, pid: number): string | undefined {
    for (const id of [auid, uid]) {
      const slot = slotOfHostId(id);
      if (slot === undefined) continue;
      const found = this.o.sandboxOfIdBase(ID_RANGE_START + slot * ID_RANGE_SIZE);
      if (found) return found;
    }
    try {
      const text = readFileSync(`/proc/${pid}/cgroup`, 'utf8');
      const m = new RegExp(`/${escapeRegExp(this.o.cgroupParent)}/([a-z0-9-]{3,63})(/|$)`, 'm').exec(text);
      return m?.[1];
    } catch {
      return undefined; // already exited
    }
  }

  /** Raises within the sandbox's budget for the kind (and `subject`, when given); beyond it, counts. */
  private emit(sandboxId: string, ev: RaisedEvent, subject?: string): void {
    const key = subject === undefined ? `${sandboxId} ${ev.kind}` : `${sandboxId} ${ev.kind} ${subject}`;
    const now = this.now();
    let w = this.windows.get(key);
    if (!w || now - w.start >= EVENT_WINDOW_MS) {
      if (w) this.flushOne(key, w);
      w = { start: now, count: 0, dropped: 0 };
      this.windows.set(key, w);
    }
    if (w.count >= EVENTS_PER_WINDOW) {
      w.dropped++;
      return;
    }
    w.count++;
    this.o.raise(ev);
  }

  /** Reports what each finished window dropped. */
  private flushWindows(now: number): void {
    for (const [key, w] of this.windows) {
      if (now - w.start < EVENT_WINDOW_MS) continue;
      this.flushOne(key, w);
      this.windows.delete(key);
    }
  }

  private flushOne(key: string, w: Window): void {
    if (w.dropped === 0) return;
    const [sandboxId, kind, subject] = key.split(' ') as [string, RaisedEvent['kind'], string | undefined];
    this.o.raise({
      kind,
      severity: 'warning',
      sandboxId,
      message: `${w.dropped} more ${kind} events${subject ? ` (${subject})` : ''} in ${EVENT_WINDOW_MS / 1000} s were not raised one by one`,
      data: { suppressed: w.dropped, ...(subject ? { subject } : {}) },
    });
    w.dropped = 0;
  }

  /** Stops reading and releases every watch. */
  close(): void {
    clearInterval(this.timer);
    this.watcher.close();
    this.refusals.close();
    this.kmsg?.close();
  }
}

/** Hits on one path of one sandbox merged into one, with the distinct operations in order. */
function byPath<T extends { sandboxId: string; path: string; op: string }>(hits: readonly T[]): Array<T & { ops: string[] }> {
  const merged = new Map<string, T & { ops: string[] }>();
  for (const h of hits) {
    const key = `${h.sandboxId} ${h.path}`;
    const m = merged.get(key);
    if (!m) merged.set(key, { ...h, ops: [h.op] });
    else if (!m.ops.includes(h.op)) m.ops.push(h.op);
  }
  return [...merged.values()];
}

/** The event for a sandbox whose refused writes cannot be read (they are refused still, and not raised). */
function unreadableRefusals(sandboxId: string, err: unknown): RaisedEvent {
  return {
    kind: 'protected-path.write',
    severity: 'warning',
    sandboxId,
    message: `refused writes to read-only paths cannot be read, and are not raised: ${err instanceof Error ? err.message : String(err)}`,
    data: { refused: true, unreadable: true },
  };
}

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}
