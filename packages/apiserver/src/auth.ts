// Identity and access: API keys (stored as SHA-256 hashes), roles, the project tree, and a
// per-key token bucket.
import { createHash, randomBytes } from 'node:crypto';
import { DsecError } from '@dsec/protocol';
import type { Role } from '@dsec/protocol';
import { ROOT_PROJECT_ID } from './db/store.js';
import { newE2bKeySecret } from './e2b/keys.js';
import type { StateStore } from './db/store.js';
import { WsTickets } from './ws-tickets.js';

/** Channel on which replicas announce a new project or a revoked key. */
export const IAM_CHANNEL = 'dsec_iam';
/** Prefix of every API key secret. */
export const KEY_PREFIX = 'dsec_';
/** Requests per second a key may make on average. */
export const DEFAULT_RATE_PER_SECOND = 100;
/** Requests a key may make in a burst. */
export const DEFAULT_RATE_BURST = 1000;
/** Most verified keys an apiserver keeps in memory (the oldest is dropped first). */
export const MAX_CACHED_KEYS = 10_000;

const ROLE_RANK: Record<Role, number> = { viewer: 0, member: 1, admin: 2 };

/** Who is calling: a key acting in one project with one role. */
export interface Principal {
  keyId: string;
  projectId: string;
  role: Role;
  /** The key's project and all its descendants. */
  visibleProjects: Set<string>;
  /**
   * The tenant the key's project belongs to: its top-level project (the child of the root
   * project it descends from), or the root project itself. Tenant limits count here.
   */
  tenantId: string;
}

/** The tenant of a project from its ancestry (itself first, the root project last). */
export function tenantOfAncestry(ancestry: readonly string[], rootId: string): string {
  if (ancestry[ancestry.length - 1] !== rootId || ancestry.length < 2) return ancestry[0] ?? rootId;
  return ancestry[ancestry.length - 2]!;
}

/** A new secret key and its hash (`format: 'e2b'`: `e2b_<hex>`, see e2b/keys.ts). */
export function newKeySecret(format: 'dsec' | 'e2b' = 'dsec'): { secret: string; hash: string } {
  const secret = format === 'e2b' ? newE2bKeySecret() : KEY_PREFIX + randomBytes(24).toString('base64url');
  return { secret, hash: hashKey(secret) };
}

/** The stored form of a key. */
export function hashKey(secret: string): string {
  return createHash('sha256').update(secret).digest('hex');
}

/** True when `role` is at least `min`. */
export function roleAtLeast(role: Role, min: Role): boolean {
  return ROLE_RANK[role] >= ROLE_RANK[min];
}

/** Throws PERMISSION_DENIED unless the principal's role is at least `min`. */
export function requireRole(p: Principal, min: Role): void {
  if (!roleAtLeast(p.role, min)) throw new DsecError('PERMISSION_DENIED', `this needs the ${min} role; the key has ${p.role}`);
}

/** The rate bucket a principal draws from: its tenant's, or (the root project's keys) its key's. */
export function rateBucketOf(p: Pick<Principal, 'keyId' | 'tenantId'>): string {
  return p.tenantId === ROOT_PROJECT_ID ? `key:${p.keyId}` : `tenant:${p.tenantId}`;
}

class TokenBucket {
  private tokens: number;
  private last = Date.now();
  constructor(
    private readonly ratePerSecond: number,
    private readonly burst: number,
  ) {
    this.tokens = burst;
  }
  /** Takes a token, or returns the ms until one is available. */
  take(): number {
    const t = Date.now();
    this.tokens = Math.min(this.burst, this.tokens + ((t - this.last) / 1000) * this.ratePerSecond);
    this.last = t;
    if (this.tokens >= 1) {
      this.tokens -= 1;
      return 0;
    }
    return Math.ceil(((1 - this.tokens) / this.ratePerSecond) * 1000);
  }
}

/** A request as a {@link CredentialHook} sees it. */
export interface AuthRequest {
  path: string;
  header(name: string): string | undefined;
}

/**
 * Another credential than `Authorization: Bearer <key>` (an endpoint token in the path, a key in
 * `X-API-Key`): the principal it names, or undefined when the request does not carry it. Each
 * kind lives in a module of its own and registers here ({@link Authenticator.addCredentialHook}).
 */
export type CredentialHook = (req: AuthRequest) => Promise<Principal> | undefined;

/** Resolves bearer tokens to principals, with a small cache and per-key rate limits. */
export class Authenticator {
  /** Principals of keys verified in the last cacheTtlMs, by their secret (at most {@link MAX_CACHED_KEYS}). */
  private readonly cache = new Map<string, { principal: Principal; at: number }>();
  /** Bumped by every {@link forget}: a key read that spans one is not cached. */
  private forgets = 0;
  private readonly hooks: CredentialHook[] = [];
  private readonly buckets = new Map<string, TokenBucket>();
  private tree: Map<string, string[]> | undefined;
  private treeAt = 0;

  constructor(
    private readonly store: StateStore,
    private readonly rate = { perSecond: DEFAULT_RATE_PER_SECOND, burst: DEFAULT_RATE_BURST },
    private readonly cacheTtlMs = 5_000,
  ) {}

  /** This process's name in announcements to the other replicas. */
  readonly origin = randomBytes(8).toString('hex');

  /** Single-use WebSocket tickets (ws-tickets.ts) in the store, each standing for the key that asked for it. */
  get wsTickets(): WsTickets {
    return (this.tickets ??= new WsTickets(this.store));
  }
  private tickets: WsTickets | undefined;

  /**
   * The principal of a WebSocket ticket: its key, checked (revoked, rate) as if it came itself.
   * A source under the failed-authentication gate (`cachedOnly`) cannot redeem: that reads the store.
   */
  async authenticateTicket(ticket: string, cachedOnly?: { refuse: () => Error }): Promise<Principal> {
    if (cachedOnly) throw cachedOnly.refuse();
    const keyId = await this.wsTickets.redeem(ticket);
    const row = keyId === undefined ? undefined : await this.store.key(keyId);
    if (!row || row.revoked_at) throw new DsecError('UNAUTHENTICATED', 'unknown, used or expired WebSocket ticket');
    return this.rateLimited({
      keyId: row.id,
      projectId: row.project_id,
      role: row.role,
      visibleProjects: await this.descendants(row.project_id),
      tenantId: await this.tenantOf(row.project_id),
    });
  }

  /**
   * Forgets cached keys and the project tree (after a revoke or a new project); on a shared
   * store the other replicas are told to forget theirs ({@link IAM_CHANNEL}).
   */
  async invalidate(): Promise<void> {
    this.forget();
    if (this.store.shared) await this.store.notify(IAM_CHANNEL, this.origin).catch(() => undefined);
  }

  /** Forgets cached keys and the project tree of this process only. */
  forget(): void {
    this.forgets++;
    this.cache.clear();
    this.tree = undefined;
    for (const fn of this.forgotten) fn();
  }

  /**
   * Calls `fn` each time cached keys are forgotten (a key revoked, a project made, here or on
   * another replica) until the returned function is called.
   */
  onForget(fn: () => void): () => void {
    const entry = (): void => fn();
    this.forgotten.add(entry);
    return () => this.forgotten.delete(entry);
  }
  private readonly forgotten = new Set<() => void>();

  /** Every project below `id` (and `id` itself). */
  async descendants(id: string): Promise<Set<string>> {
    // Replicas: another one may have made a project; the tree is read again after the cache TTL.
    if (this.tree && this.store.shared && Date.now() - this.treeAt >= this.cacheTtlMs) this.tree = undefined;
    if (!this.tree) {
      this.treeAt = Date.now();
      const tree = new Map<string, string[]>();
      for (const p of await this.store.projects()) {
        if (p.parent_id) (tree.get(p.parent_id) ?? tree.set(p.parent_id, []).get(p.parent_id)!).push(p.id);
      }
      this.tree = tree;
    }
    const out = new Set<string>([id]);
    const stack = [id];
    while (stack.length) {
      for (const child of this.tree.get(stack.pop()!) ?? []) {
        if (!out.has(child)) {
          out.add(child);
          stack.push(child);
        }
      }
    }
    return out;
  }

  /**
   * A token of the principal's bucket: one per tenant (every key of a tenant's projects draws
   * from it, so that more keys or sub-projects do not multiply the rate); the root project's
   * keys (the operator's) have one each. In memory when this process is the only apiserver,
   * else in the shared store so that replicas together hold the rate. The ms to wait, or 0.
   */
  private async takeToken(p: Principal): Promise<number> {
    const id = rateBucketOf(p);
    if (this.store.shared) return this.store.takeRateToken(id, this.rate.perSecond, this.rate.burst);
    let bucket = this.buckets.get(id);
    if (!bucket) this.buckets.set(id, (bucket = new TokenBucket(this.rate.perSecond, this.rate.burst)));
    return bucket.take();
  }

  /**
   * The projects whose use counts against a tenant's limits: the tenant and everything below
   * it; for the root project only itself (the tenants below it count on their own).
   */
  async tenantProjects(tenantId: string): Promise<Set<string>> {
    return tenantId === ROOT_PROJECT_ID ? new Set([ROOT_PROJECT_ID]) : this.descendants(tenantId);
  }

  /** The tenant of a project: its top-level project, or the root project itself. */
  async tenantOf(projectId: string): Promise<string> {
    return tenantOfAncestry(await this.store.ancestry(projectId), ROOT_PROJECT_ID);
  }

  /** Adds a credential tried before the `Authorization` header (see {@link CredentialHook}). */
  addCredentialHook(hook: CredentialHook): void {
    this.hooks.push(hook);
  }

  /**
   * The principal of an `Authorization` header value (or of a credential a hook finds in `req`);
   * throws UNAUTHENTICATED or RATE_LIMITED. With `cachedOnly` (a source refused for failing too
   * often) only a key that authenticated recently is accepted, without a look-up in the store;
   * any other is `refuse()`'s error.
   */
  async authenticate(header: string | undefined, cachedOnly?: { refuse: () => Error }, req?: AuthRequest): Promise<Principal> {
    for (const hook of req ? this.hooks : []) {
      const found = hook(req!);
      if (found === undefined) continue;
      if (cachedOnly) throw cachedOnly.refuse();
      return this.rateLimited(await found);
    }
    const m = /^Bearer\s+(\S+)$/i.exec(header ?? '');
    if (!m) throw cachedOnly?.refuse() ?? new DsecError('UNAUTHENTICATED', 'missing API key: send Authorization: Bearer <key>');
    return this.rateLimited(await this.keyPrincipal(m[1]!, cachedOnly));
  }

  /** The principal of a key's secret (for credential hooks that find a key elsewhere than `Authorization`), not rate-limited. */
  async keyPrincipal(secret: string, cachedOnly?: { refuse: () => Error }): Promise<Principal> {
    // Keyed by the secret itself: a key verified a moment ago costs no SHA-256 (issue 15). Only
    // keys found live in the store are kept; a revoke forgets them all at once (here, and on
    // the other replicas through IAM_CHANNEL, else within cacheTtlMs).
    const hit = this.cache.get(secret);
    if (hit && Date.now() - hit.at < this.cacheTtlMs) return hit.principal;
    if (hit) this.cache.delete(secret);
    if (cachedOnly) throw cachedOnly.refuse();
    const forgets = this.forgets;
    const row = await this.store.keyByHash(hashKey(secret));
    if (!row || row.revoked_at) throw new DsecError('UNAUTHENTICATED', 'unknown or revoked API key');
    const principal: Principal = {
      keyId: row.id,
      projectId: row.project_id,
      role: row.role,
      visibleProjects: await this.descendants(row.project_id),
      tenantId: await this.tenantOf(row.project_id),
    };
    // A revoke that came while this key was read must not be undone by caching the read.
    if (forgets === this.forgets) {
      if (this.cache.size >= MAX_CACHED_KEYS) this.cache.delete(this.cache.keys().next().value!);
      this.cache.set(secret, { principal, at: Date.now() });
    }
    return principal;
  }

  /** The principal, once a token of its tenant's bucket (the root project's keys: each its own) is taken (else RATE_LIMITED). */
  async rateLimited(principal: Principal): Promise<Principal> {
    const waitMs = await this.takeToken(principal);
    if (waitMs > 0) {
      const whose = principal.tenantId === ROOT_PROJECT_ID ? 'this key' : `tenant ${principal.tenantId} (all its keys together)`;
      throw new DsecError('RATE_LIMITED', `too many requests for ${whose}; retry in ${waitMs} ms (limits.requestsPerSecondPerTenant)`, {
        retryAfterMs: waitMs,
        limit: 'requestsPerSecondPerTenant',
      });
    }
    return principal;
  }
}
