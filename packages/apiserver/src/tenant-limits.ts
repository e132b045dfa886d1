// The control plane's side of the tenant limits (protocol's limits.ts): slots for work that
// holds node memory or file descriptors while it runs (commands, file transfers, function
// calls), counted per tenant and per node, and for the live streams a replica serves (counted
// per tenant and per replica), and the gate that rate-limits failed
// authentications by source before they reach the audit trail.
import { isIP } from 'node:net';
import { fairShare, limitExceeded, newcomerReserve, pastHighWater, reserveAllows } from '@dsec/protocol';
import type { LimitName, TenantLimits } from '@dsec/protocol';

/** Work that holds a slot while it runs. */
export type SlotKind = 'exec' | 'transfer' | 'call' | 'stream';

/** The limits of each kind of slot: per tenant, per node. */
const SLOT_LIMITS: Record<SlotKind, { tenant: LimitName; node: LimitName; what: string }> = {
  exec: { tenant: 'execsPerTenant', node: 'execsPerNode', what: 'commands' },
  transfer: { tenant: 'transfersPerTenant', node: 'transfersPerNode', what: 'file transfers' },
  call: { tenant: 'callsPerTenant', node: 'callSlotsPerNode', what: 'function calls' },
  stream: { tenant: 'streamsPerTenant', node: 'streamsPerReplica', what: 'live streams' },
};

/** The "node" of stream slots: the replica that serves them. */
export const STREAM_REPLICA = 'this replica';

/** How long a refused caller should wait before it tries again (a slot frees when work ends). */
const SLOT_RETRY_MS = 1000;

/**
 * Counts running work per tenant and per node; a slot past either limit is refused (429). A
 * node's cap is shared fairly: once more than half of it would be in use, every tenant (one
 * taking its first slots too) holds at most its fair share after the grant (protocol's
 * `fairShare`); and every grant leaves the newcomers' reserve free unless it is one slot for a
 * tenant holding none there (`reserveAllows`). So a tenant that holds nothing on a node gets a
 * slot there unless `newcomerReserve(nodeMax)` tenants already hold slots on it. A batch is
 * granted whole or refused whole. Every check and count is O(1) and synchronous, so concurrent
 * requests never see each other half-counted.
 */
export class TenantSlots {
  private readonly used = new Map<string, number>();

  constructor(readonly limits: TenantLimits) {}

  /**
   * Takes `count` slots of `kind` for `tenantId` on `node`, or throws LIMIT_EXCEEDED naming the
   * limit that refused them. The returned release may be called any number of times.
   */
  acquire(kind: SlotKind, tenantId: string, node: string, count = 1): () => void {
    const l = SLOT_LIMITS[kind];
    const tenantKey = `${kind}\0t\0${tenantId}`;
    const nodeKey = `${kind}\0n\0${node}`;
    // The tenant's slots on this node, and how many tenants hold slots on it.
    const heldKey = `${kind}\0nt\0${node}\0${tenantId}`;
    const holdersKey = `${kind}\0h\0${node}`;
    const tenantMax = this.limits[l.tenant];
    const nodeMax = this.limits[l.node];
    const tenantUsed = this.used.get(tenantKey) ?? 0;
    const nodeUsed = this.used.get(nodeKey) ?? 0;
    const held = this.used.get(heldKey) ?? 0;
    if (tenantUsed + count > tenantMax) {
      throw limitExceeded(l.tenant, tenantMax, `tenant ${tenantId} runs ${tenantUsed} ${l.what}; ${count} more is too many`, SLOT_RETRY_MS);
    }
    const holder = kind === 'stream' ? node : `node ${node}`;
    if (nodeUsed + count > nodeMax) {
      throw limitExceeded(l.node, nodeMax, `${holder} runs ${nodeUsed} ${l.what}; ${count} more is too many`, SLOT_RETRY_MS);
    }
    // The tenants holding slots on the node once this grant is made (the asker among them).
    const holders = (this.used.get(holdersKey) ?? 0) + (held === 0 ? 1 : 0);
    if (pastHighWater(nodeUsed + count, nodeMax)) {
      const share = fairShare(nodeMax, holders);
      if (held + count > share) {
        throw limitExceeded(
          l.node,
          nodeMax,
          `${holder} runs ${nodeUsed} ${l.what}, over half of its ${nodeMax}; tenant ${tenantId} holds ${held} there, ${count} more is past its fair share of ${share} (${holders} tenants holding slots and room for one more)`,
          SLOT_RETRY_MS,
        );
      }
    }
    if (!reserveAllows(nodeUsed + count, nodeMax, held, count)) {
      const reserve = newcomerReserve(nodeMax);
      throw limitExceeded(
        l.node,
        nodeMax,
        `${holder} runs ${nodeUsed} ${l.what}; ${count} more would leave fewer than the ${reserve} kept for tenants holding none there (tenant ${tenantId} holds ${held})`,
        SLOT_RETRY_MS,
      );
    }
    if (held === 0) this.add(holdersKey, 1);
    this.add(tenantKey, count);
    this.add(nodeKey, count);
    this.add(heldKey, count);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.add(tenantKey, -count);
      this.add(nodeKey, -count);
      if (this.add(heldKey, -count) === 0) this.add(holdersKey, -1);
    };
  }

  /** Runs `fn` holding `count` slots. */
  async run<T>(kind: SlotKind, tenantId: string, node: string, fn: () => Promise<T>, count = 1): Promise<T> {
    const release = this.acquire(kind, tenantId, node, count);
    try {
      return await fn();
    } finally {
      release();
    }
  }

  /** Slots of `kind` in use by a tenant (for metrics and tests). */
  inUse(kind: SlotKind, tenantId: string): number {
    return this.used.get(`${kind}\0t\0${tenantId}`) ?? 0;
  }

  /** Adds `n` to a count (gone at 0); returns the new count. */
  private add(key: string, n: number): number {
    const v = (this.used.get(key) ?? 0) + n;
    if (v <= 0) this.used.delete(key);
    else this.used.set(key, v);
    return Math.max(0, v);
  }
}

/**
 * The client's address: the socket's peer, or, when that peer is a trusted proxy, the nearest
 * address in `X-Forwarded-For` that is not a trusted proxy itself (the right-most first: only
 * the entries the trusted proxies appended can be believed).
 */
export function clientAddress(peer: string | undefined, forwardedFor: string | undefined, trustedProxies: ReadonlySet<string>): string {
  const direct = normalizeAddress(peer ?? '') || 'unknown';
  if (!trustedProxies.has(direct) || !forwardedFor) return direct;
  const hops = forwardedFor
    .split(',')
    .map((s) => normalizeAddress(s.trim()))
    .filter((s) => s !== '');
  for (let i = hops.length - 1; i >= 0; i--) if (!trustedProxies.has(hops[i]!)) return hops[i]!;
  return direct;
}

/** An address as one spelling (an IPv4 address mapped into IPv6 as IPv4); '' when not an address. */
function normalizeAddress(s: string): string {
  const bare = s.replace(/^\[|\]$/g, '');
  const v4 = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(bare);
  if (v4) return v4[1]!;
  return isIP(bare) ? bare.toLowerCase() : '';
}

/** One audit entry for the failed authentications of one source (collapsed). */
export interface AuthFailureEntry {
  method: string;
  route: string;
  status: number;
  /** Failures this entry stands for. */
  count: number;
  at: string;
}

/** Sources tracked at once; past it the oldest is forgotten (its pending count is written first). */
const MAX_SOURCES = 10_000;
/** Interval at which collapsed failures are written to the audit trail. */
export const AUTH_FAILURE_FLUSH_MS = 1000;

interface SourceState {
  tokens: number;
  last: number;
  /** Failures not yet written, and the last one's shape. */
  pending: number;
  lastFailure?: Omit<AuthFailureEntry, 'count' | 'at'>;
}

/**
 * Failed and unauthenticated requests, by source: each source has a token bucket of failures
 * (`authFailuresPerSecond`, `authFailureBurst`); a source whose bucket is empty is refused
 * before its key is even looked up (a recently authenticated key still passes). The first
 * failure of a quiet source is audited at once; later ones are collapsed into one entry per
 * source and interval, with their count.
 */
export class AuthFailureGate {
  private readonly sources = new Map<string, SourceState>();
  private readonly timer: NodeJS.Timeout;
  /** Failures refused without a look-up (the bucket was empty). */
  refused = 0;

  constructor(
    private readonly limits: Pick<TenantLimits, 'authFailuresPerSecond' | 'authFailureBurst'>,
    private readonly audit: (entry: AuthFailureEntry) => void,
    private readonly now: () => number = Date.now,
  ) {
    this.timer = setInterval(() => this.flush(), AUTH_FAILURE_FLUSH_MS);
    this.timer.unref();
  }

  /** True when `source` has used up its failures: authenticate it from the cache only. */
  blocked(source: string): boolean {
    const s = this.sources.get(source);
    return s !== undefined && this.refill(s) < 1;
  }

  /** The refusal of a blocked source (429 naming the limit). */
  refusal(source: string): Error {
    const perSecond = this.limits.authFailuresPerSecond;
    return limitExceeded('authFailuresPerSecond', perSecond, `too many failed authentications from ${source}`, Math.ceil(1000 / perSecond));
  }

  /** Counts one failed or refused authentication of `source`. */
  failed(source: string, failure: Omit<AuthFailureEntry, 'count' | 'at'>): void {
    let s = this.sources.get(source);
    if (!s) {
      if (this.sources.size >= MAX_SOURCES) this.forgetOldest();
      s = { tokens: this.limits.authFailureBurst, last: this.now(), pending: 0 };
      this.sources.set(source, s);
    }
    const quiet = s.pending === 0 && s.lastFailure === undefined;
    this.refill(s);
    s.tokens = Math.max(0, s.tokens - 1);
    if (quiet) {
      // The first failure of a quiet source is written at once: one typo is seen at once.
      s.lastFailure = failure;
      this.audit({ ...failure, count: 1, at: new Date(this.now()).toISOString() });
      return;
    }
    s.pending++;
    s.lastFailure = failure;
  }

  /** Writes the collapsed failures of every source; forgets sources that are quiet and full. */
  flush(): void {
    for (const [source, s] of this.sources) {
      if (s.pending > 0 && s.lastFailure) {
        this.audit({ ...s.lastFailure, count: s.pending, at: new Date(this.now()).toISOString() });
        s.pending = 0;
      } else if (this.refill(s) >= this.limits.authFailureBurst) this.sources.delete(source);
    }
  }

  /** Stops the timer and writes what is pending. */
  close(): void {
    clearInterval(this.timer);
    this.flush();
  }

  private refill(s: SourceState): number {
    const t = this.now();
    s.tokens = Math.min(this.limits.authFailureBurst, s.tokens + ((t - s.last) / 1000) * this.limits.authFailuresPerSecond);
    s.last = t;
    return s.tokens;
  }

  private forgetOldest(): void {
    const [source, s] = this.sources.entries().next().value as [string, SourceState];
    if (s.pending > 0 && s.lastFailure) this.audit({ ...s.lastFailure, count: s.pending, at: new Date(this.now()).toISOString() });
    this.sources.delete(source);
  }
}
