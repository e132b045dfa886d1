// What the create path reads on every request and what rarely changes, kept in memory per
// process: a project's ancestry (a project's parent never changes, so a chain once read is
// kept), the layer rows of a layer scope (layer names, digests, sharing) and the spec keys of a
// project's pools. The store's writes of layers and pools drop them here and, on a shared store,
// tell every other replica to drop theirs ({@link CATALOG_CHANNEL}, LISTEN/NOTIFY); a replica
// whose listening connection (re)opens drops them too (it may have missed notifications), and
// on a shared store an entry is read again after {@link CATALOG_TTL_MS} whatever happens.
//
// What a stale entry can do, and why that is safe (see docs/deploy.md):
// - layers: a layer named or added on another replica a moment ago is not in the entry. The
//   create path resolves through the cache first and, when a reference does not resolve, again
//   from the store before refusing (LayerService.withResolver): a new layer is never refused.
//   A layer deleted on another replica may still resolve for the few milliseconds the
//   notification takes, as it would for a create that started just before the delete.
// - pools: a stale "no pool with this spec" creates a fresh sandbox instead of claiming one (the
//   create is served either way); a stale "a pool has this spec" costs the claim's read.
import { randomBytes } from 'node:crypto';
import type { LayerTable } from './schema.js';

/** The channel on which a replica tells the others that layers or pools changed. */
export const CATALOG_CHANNEL = 'dsec_catalog';
/** Longest life of a cached layer scope or pool set on a shared store (notifications can be missed). */
export const CATALOG_TTL_MS = 10_000;

interface Entry<V> {
  value: V;
  at: number;
}

/** Per-process caches of project ancestry, layer scopes and pool spec keys. */
export class CatalogCache {
  /** This process's mark on the notifications it sends (it ignores its own). */
  readonly origin = randomBytes(8).toString('hex');
  /** Reads and hits, for tests and reports. */
  readonly counts = { layerReads: 0, layerHits: 0, poolReads: 0, poolHits: 0, forgotten: 0 };
  private readonly chains = new Map<string, string[]>();
  private readonly scopes = new Map<string, Entry<LayerTable[]>>();
  private readonly pools = new Map<string, Entry<ReadonlySet<string>>>();
  /** Bumped on every forget: a read that began before it does not fill the cache. */
  private generation = 0;

  constructor(
    /** Other replicas write the same store: entries expire after `ttlMs`. */
    private readonly shared: boolean,
    private readonly ttlMs = CATALOG_TTL_MS,
  ) {}

  /** A project's ancestry (nearest first), read once: a project's parent never changes. */
  async ancestry(projectId: string, read: () => Promise<{ chain: string[]; known: boolean }>): Promise<string[]> {
    const hit = this.chains.get(projectId);
    if (hit) return hit;
    const { chain, known } = await read();
    // A project not (yet) known here is read again next time.
    if (known) this.chains.set(projectId, chain);
    return chain;
  }

  /** The layer rows of a scope (projects' ids, in order). */
  async layers(scope: readonly string[], read: () => Promise<LayerTable[]>): Promise<LayerTable[]> {
    const key = scope.join(' ');
    const hit = this.fresh(this.scopes.get(key));
    if (hit) {
      this.counts.layerHits++;
      return hit;
    }
    this.counts.layerReads++;
    return this.fill(this.scopes, key, read);
  }

  /** The spec keys of a project's pools. */
  async poolKeys(projectId: string, read: () => Promise<ReadonlySet<string>>): Promise<ReadonlySet<string>> {
    const hit = this.fresh(this.pools.get(projectId));
    if (hit) {
      this.counts.poolHits++;
      return hit;
    }
    this.counts.poolReads++;
    return this.fill(this.pools, projectId, read);
  }

  /** Drops every layer scope and pool set (layers or pools changed, here or elsewhere). */
  forget(): void {
    this.generation++;
    this.counts.forgotten++;
    this.scopes.clear();
    this.pools.clear();
  }

  private fresh<V>(e: Entry<V> | undefined): V | undefined {
    if (!e) return undefined;
    if (this.shared && Date.now() - e.at >= this.ttlMs) return undefined;
    return e.value;
  }

  private async fill<V>(map: Map<string, Entry<V>>, key: string, read: () => Promise<V>): Promise<V> {
    const gen = this.generation;
    const at = Date.now();
    const value = await read();
    if (gen === this.generation) map.set(key, { value, at });
    return value;
  }
}
