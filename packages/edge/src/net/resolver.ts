// Name resolution for the DNS stub and the egress proxy: the node's static hosts first, then the
// host's resolver (or none at all), with a small cache so a sandbox cannot make the node flood it.
import { Resolver } from 'node:dns/promises';
import { DsecError, isIPv4 } from '@dsec/protocol';
import type { NameResolver } from './types.js';

/** Longest time an answer (or a "no such name") is reused; an answer's own TTL bounds it further. */
export const RESOLVE_CACHE_TTL_MS = 30_000;
/** Most names cached. */
export const RESOLVE_CACHE_ENTRIES = 10_000;
/** Time one upstream query may take. */
export const RESOLVE_TIMEOUT_MS = 3_000;

/** Options of {@link HostsResolver}. */
export interface HostsResolverOptions {
  /** Static name -> IPv4 address map, answered without asking anyone. */
  hosts?: Record<string, string>;
  /** Resolvers to ask for other names; default the host's (resolv.conf); `[]` asks no one. */
  nameservers?: string[];
}

interface Cached {
  addresses: string[];
  until: number;
}

/** The node's {@link NameResolver}. */
export class HostsResolver implements NameResolver {
  private readonly hosts = new Map<string, string>();
  private readonly upstream: Resolver | undefined;
  private readonly cache = new Map<string, Cached>();
  private readonly inflight = new Map<string, Promise<string[]>>();

  constructor(opts: HostsResolverOptions = {}) {
    for (const [name, ip] of Object.entries(opts.hosts ?? {})) {
      if (!isIPv4(ip)) throw new DsecError('INVALID_ARGUMENT', `hosts: ${name} maps to ${ip}, not an IPv4 address`, { field: 'hosts' });
      this.hosts.set(name.toLowerCase().replace(/\.$/, ''), ip);
    }
    if (opts.nameservers === undefined || opts.nameservers.length > 0) {
      this.upstream = new Resolver({ timeout: RESOLVE_TIMEOUT_MS, tries: 2 });
      if (opts.nameservers) this.upstream.setServers(opts.nameservers);
    }
  }

  async resolve4(name: string, signal?: AbortSignal): Promise<string[]> {
    const key = name.toLowerCase().replace(/\.$/, '');
    if (isIPv4(key)) return [key];
    const fixed = this.hosts.get(key);
    if (fixed) return [fixed];
    if (!this.upstream) return [];
    const hit = this.cache.get(key);
    if (hit && hit.until > Date.now()) return hit.addresses;
    let pending = this.inflight.get(key);
    if (!pending) {
      pending = this.query(key).finally(() => this.inflight.delete(key));
      this.inflight.set(key, pending);
    }
    if (!signal) return pending;
    signal.throwIfAborted();
    return Promise.race([pending, new Promise<never>((_, reject) => signal.addEventListener('abort', () => reject(signal.reason as Error), { once: true }))]);
  }

  private async query(name: string): Promise<string[]> {
    let addresses: string[];
    let ttlMs = RESOLVE_CACHE_TTL_MS;
    try {
      const records = await (this.upstream as Resolver).resolve4(name, { ttl: true });
      addresses = records.map((r) => r.address);
      // An answer is reused no longer than its TTL says: a name that changes its address is
      // looked up again, and every connection is checked against the address it dials.
      for (const r of records) ttlMs = Math.min(ttlMs, Math.max(0, r.ttl) * 1000);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'ENOTFOUND' || code === 'ENODATA' || code === 'EBADNAME') addresses = [];
      else throw new DsecError(code === 'ETIMEOUT' ? 'TIMEOUT' : 'UNAVAILABLE', `cannot resolve ${name}: ${code ?? (err as Error).message}`);
    }
    if (this.cache.size >= RESOLVE_CACHE_ENTRIES) this.cache.delete(this.cache.keys().next().value as string);
    if (ttlMs > 0) this.cache.set(name, { addresses, until: Date.now() + ttlMs });
    return addresses;
  }

  /** Stops queries in flight. */
  close(): void {
    this.upstream?.cancel();
  }
}
