// Leases and owners, apart from HTTP: what a sandbox's lease grants, when its API activity was
// last seen (kept in memory and written to the store about once a second, never once per
// request), and what an owner session looks like.
import { DEFAULT_IDLE_TIMEOUT_MS, DEFAULT_SANDBOX_TIMEOUT_MS, MAX_HEARTBEAT_INTERVAL_MS, invalidArgument } from '@dsec/protocol';
import type { GrantedLease, Lease, Owner } from '@dsec/protocol';
import type { OwnerTable, SandboxTable } from './db/schema.js';

/** Shortest heartbeat interval an owner is told to keep. */
export const MIN_HEARTBEAT_INTERVAL_MS = 250;
/** Interval at which recorded API activity is written to the store. */
export const ACTIVITY_FLUSH_INTERVAL_MS = 1000;

/** Why a sandbox was paused (`pause_reason`). */
export type PauseReason = 'api' | 'idle' | 'owner-lost' | 'owner-closed' | 'expired';

/** The lease a create request asks for, defaults filled in. `timeoutMs` is the old name of `lease.maxLifetimeMs`. */
export function grantLease(req: { timeoutMs?: number | undefined; lease?: Lease | undefined }, at: (field: string) => string = (f) => f): GrantedLease {
  if (req.timeoutMs !== undefined && req.lease?.maxLifetimeMs !== undefined) {
    throw invalidArgument(at('lease.maxLifetimeMs'), 'give at most one of timeoutMs or lease.maxLifetimeMs');
  }
  return mergeLease(defaultLease(req.timeoutMs ?? DEFAULT_SANDBOX_TIMEOUT_MS), req.lease ?? {});
}

/** The lease of a sandbox created without one. */
export function defaultLease(maxLifetimeMs: number): GrantedLease {
  return { idleTimeoutMs: DEFAULT_IDLE_TIMEOUT_MS, maxLifetimeMs, onIdle: 'pause', ownerGraceMs: null, onOwnerLost: 'pause', autoResume: true };
}

/** A granted lease with the fields of `change` replaced (what else `base` stores is kept). */
export function mergeLease<L extends GrantedLease>(base: L, change: Lease): L {
  const out = { ...base };
  if (change.idleTimeoutMs !== undefined) out.idleTimeoutMs = change.idleTimeoutMs;
  if (change.maxLifetimeMs !== undefined) out.maxLifetimeMs = change.maxLifetimeMs;
  if (change.onIdle !== undefined) out.onIdle = change.onIdle;
  if (change.ownerGraceMs !== undefined) out.ownerGraceMs = change.ownerGraceMs;
  if (change.onOwnerLost !== undefined) out.onOwnerLost = change.onOwnerLost;
  if (change.autoResume !== undefined) out.autoResume = change.autoResume;
  if (change.onExpire !== undefined) out.onExpire = change.onExpire;
  return out;
}

/**
 * A lease as a row stores it: the granted lease, and `renewMs`, the lifetime a sandbox resumed
 * after its lifetime ended (`onExpire: 'pause'`) gets from then: the `maxLifetimeMs` granted at
 * creation. Absent until a change of `maxLifetimeMs` or a renewal records it.
 */
export interface StoredLease extends GrantedLease {
  renewMs?: number;
}

/** A row's lease as stored (rows from before leases existed get the defaults). */
export function leaseOf(row: Pick<SandboxTable, 'lease' | 'created_at' | 'expires_at'>): StoredLease {
  if (row.lease) return JSON.parse(row.lease) as StoredLease;
  return defaultLease(Date.parse(row.expires_at) - Date.parse(row.created_at));
}

/** The next lease check of a sandbox without an idle timeout: never, until its lease or owner is written. */
export const NO_LEASE_CHECK_MS = Number.MAX_SAFE_INTEGER;

/**
 * When the lease pass must next look at a running sandbox for its idle timeout, given its last
 * activity (ms): no earlier than it can be due (activity only moves it later), in whole seconds
 * rounded down so that sandboxes active in the same second share one value (one write for all).
 */
export function nextLeaseCheckMs(lease: Pick<GrantedLease, 'idleTimeoutMs'>, lastActiveMs: number): number {
  if (lease.idleTimeoutMs <= 0) return NO_LEASE_CHECK_MS;
  return Math.floor((lastActiveMs + lease.idleTimeoutMs) / 1000) * 1000;
}

/** A row's granted lease as the API shows it (without what only the store keeps). */
export function grantedLeaseOf(row: Pick<SandboxTable, 'lease' | 'created_at' | 'expires_at'>): GrantedLease {
  const { renewMs: _renewMs, ...granted } = leaseOf(row);
  return granted;
}

/** The lifetime a sandbox resumed after its lifetime ended gets from the resume: the one granted at creation. */
export function renewSpanMs(lease: StoredLease): number {
  return lease.renewMs ?? lease.maxLifetimeMs;
}

/** How often an owner with this grace should heartbeat: three beats per grace period. */
export function heartbeatIntervalMs(graceMs: number): number {
  return Math.max(MIN_HEARTBEAT_INTERVAL_MS, Math.min(MAX_HEARTBEAT_INTERVAL_MS, Math.floor(graceMs / 3)));
}

/** An owner row as the API returns it. */
export function toOwner(row: OwnerTable, sandboxes: number): Owner {
  return {
    id: row.id,
    project: row.project_id,
    name: row.name,
    state: row.state as Owner['state'],
    graceMs: row.grace_ms,
    heartbeatIntervalMs: heartbeatIntervalMs(row.grace_ms),
    createdAt: row.created_at,
    heartbeatAt: row.heartbeat_at,
    sandboxes,
  };
}

/** What ActivityTracker writes its records to. */
export interface ActivityStore {
  touchSandboxes(ids: string[], at: string): Promise<void>;
}

/**
 * Last API activity per sandbox. A request records it in memory (a map write); a timer writes
 * the sandboxes touched since the last flush to the store in one statement. Requests that stay
 * open (a command being waited for, an output stream) hold their sandbox active until they end.
 */
export class ActivityTracker {
  private readonly last = new Map<string, number>();
  private dirty = new Set<string>();
  private readonly held = new Map<string, number>();

  /** Records activity now; returns the time recorded. */
  touch(id: string, at = Date.now()): number {
    this.last.set(id, at);
    this.dirty.add(id);
    return at;
  }

  /** Forgets a sandbox (destroyed, or an id that named none); with `at`, only that record. */
  forget(id: string, at?: number): void {
    if (at !== undefined && this.last.get(id) !== at) return;
    this.last.delete(id);
    this.dirty.delete(id);
    if (at === undefined) this.held.delete(id);
  }

  /** Holds a sandbox active until the returned function is called (once). */
  hold(id: string): () => void {
    this.touch(id);
    this.held.set(id, (this.held.get(id) ?? 0) + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const n = (this.held.get(id) ?? 1) - 1;
      if (n <= 0) this.held.delete(id);
      else this.held.set(id, n);
      if (this.last.has(id) || n > 0) this.touch(id);
    };
  }

  /** Last activity this process saw (now while held), in ms; undefined when it saw none. */
  lastActiveMs(id: string, now = Date.now()): number | undefined {
    if (this.held.has(id)) return now;
    return this.last.get(id);
  }

  /** A row's last activity: the later of the store's record and this process's. */
  lastActiveOf(row: Pick<SandboxTable, 'id' | 'created_at' | 'last_active_at'>, now = Date.now()): number {
    const stored = Date.parse(row.last_active_at ?? row.created_at);
    return Math.max(stored, this.lastActiveMs(row.id, now) ?? 0);
  }

  /** Writes the sandboxes touched (or held) since the last flush to the store. */
  async flush(store: ActivityStore): Promise<void> {
    for (const id of this.held.keys()) this.touch(id);
    if (this.dirty.size === 0) return;
    const ids = [...this.dirty];
    this.dirty = new Set();
    await store.touchSandboxes(ids, new Date().toISOString());
  }
}
