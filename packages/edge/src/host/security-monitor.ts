// Turns what the kernel reports about sandboxes into events: seccomp denials (from the audit
// netlink group), changes under watched paths (fanotify on the writable layers) and changes to
// read-only protected paths their server refused (its log), and that server's death (restarted,
// a bounded number of times). One poll loop per node reads them all without blocking; events
// are rate-limited per sandbox so that a sandbox that loops on a refused call cannot flood the
// event stream (what was dropped is counted).
import { readFileSync } from 'node:fs';
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

/** A sandbox's protected-path server as the monitor checks it. */
interface Served {
  serving: ServerCheck;
  /** Starts a new server after this one died (rejects when it cannot). */
  restart?: () => Promise<void>;
  /** When it may first be checked. */
  from: number;
  /** When it was restarted, within the last window. */
  restarts: number[];
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
  /** Adopted sandboxes' refusal logs, read once their grace has passed. */
  private readonly adopted = new Map<string, { log: string; from: number }>();
  private readonly windows = new Map<string, Window>();
  private readonly timer: NodeJS.Timeout;
  private overflowReported = false;

  constructor(private readonly o: SecurityMonitorOptions) {
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
   * `protected-path.server-restarted`. Past {@link MAX_SERVER_RESTARTS} in
   * {@link RESTART_WINDOW_MS}, or when a restart fails, they stay so: raised once as
   * `protected-path.server-gone`.
   */
  followRefusals(sandboxId: string, log: string, fromStart: boolean, serving?: ServerCheck, restart?: () => Promise<void>): void {
    const from = fromStart ? Date.now() : Date.now() + FOLLOW_GRACE_MS;
    if (fromStart) this.refusals.add(sandboxId, log, true);
    else this.adopted.set(sandboxId, { log, from });
    if (serving) this.servers.set(sandboxId, { serving, from, restarts: [], ...(restart ? { restart } : {}) });
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
      this.followAdopted(Date.now());
      this.pollRefusals();
      this.pollServers(Date.now());
      this.flushWindows(Date.now());
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
   * Checks the next few protected-path servers; one that is gone is restarted (within its
   * budget), or raised and not checked again.
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
      if (!s.restart || s.restarts.length >= MAX_SERVER_RESTARTS) {
        this.serverGone(sandboxId, s.restart ? `restarted ${s.restarts.length} times in ${RESTART_WINDOW_MS / 1000} s, not again` : undefined);
        continue;
      }
      s.restarts.push(now);
      this.restarting.set(sandboxId, s);
      s.restart().then(
        () => {
          if (this.restarting.get(sandboxId) !== s) return; // forgotten meanwhile
          this.restarting.delete(sandboxId);
          this.servers.set(sandboxId, s);
          this.o.raise({
            kind: 'protected-path.server-restarted',
            severity: 'warning',
            sandboxId,
            message: `the server of the read-only protected paths died and was restarted (${s.restarts.length} of ${MAX_SERVER_RESTARTS} in ${RESTART_WINDOW_MS / 1000} s)`,
            data: { restarts: s.restarts.length, limit: MAX_SERVER_RESTARTS },
          });
        },
        (err: unknown) => {
          if (this.restarting.get(sandboxId) !== s) return;
          this.restarting.delete(sandboxId);
          this.serverGone(sandboxId, `its restart failed: ${err instanceof Error ? err.message : String(err)}`);
        },
      );
    }
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
    const now = Date.now();
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

/** The event for a sandbox whose refused writes cannot be read (they are refused still, and not raised). */
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
