// Name resolution for the egress proxy. The proxy resolves every name itself, checks each address
// it got, and dials exactly the address it checked: a sandbox's own DNS answers never decide where
// the proxy connects, and there is no second lookup between check and dial (no rebinding window).
import { lookup } from 'node:dns/promises';
import { isIP } from 'node:net';
import { normalizeAddress } from './address.js';

/** How long a system lookup may take before the destination counts as unresolvable. */
export const DEFAULT_LOOKUP_TIMEOUT_MS = 5_000;
/** Most addresses kept from one answer (the proxy tries them in order). */
export const MAX_ADDRESSES_PER_NAME = 8;

/** Options of {@link HostResolver}. */
export interface HostResolverOptions {
  /** Static answers consulted first (name -> address), like /etc/hosts. Default: none. */
  hosts?: Record<string, string>;
  /** Fall back to the system resolver (getaddrinfo) for names not in `hosts`. Default true. */
  useSystemResolver?: boolean;
  /** Timeout of a system lookup in ms. Default {@link DEFAULT_LOOKUP_TIMEOUT_MS}. */
  lookupTimeoutMs?: number;
}

/** Why a name did not resolve. */
export class ResolveError extends Error {
  constructor(
    readonly host: string,
    readonly reason: 'not-found' | 'timeout',
  ) {
    super(`${host}: ${reason === 'timeout' ? 'lookup timed out' : 'name not found'}`);
    this.name = 'ResolveError';
  }
}

/** Resolves destination names to addresses: the static map first, then the system resolver. */
export class HostResolver {
  private readonly hosts = new Map<string, string>();
  private readonly useSystem: boolean;
  private readonly timeoutMs: number;

  constructor(opts: HostResolverOptions = {}) {
    for (const [name, ip] of Object.entries(opts.hosts ?? {})) {
      if (!isIP(ip)) throw new Error(`hosts: ${name}: not an IP address: ${ip}`);
      this.hosts.set(name.toLowerCase().replace(/\.$/, ''), normalizeAddress(ip));
    }
    this.useSystem = opts.useSystemResolver ?? true;
    this.timeoutMs = opts.lookupTimeoutMs ?? DEFAULT_LOOKUP_TIMEOUT_MS;
  }

  /** The addresses of `host` (an IP literal resolves to itself); throws ResolveError. */
  async resolve(host: string): Promise<string[]> {
    if (isIP(host)) return [normalizeAddress(host)];
    const fixed = this.hosts.get(host);
    if (fixed !== undefined) return [fixed];
    if (!this.useSystem) throw new ResolveError(host, 'not-found');
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new ResolveError(host, 'timeout')), this.timeoutMs);
    });
    try {
      const answers = await Promise.race([lookup(host, { all: true, verbatim: true }), timeout]);
      const out = [...new Set(answers.map((a) => normalizeAddress(a.address)))].slice(0, MAX_ADDRESSES_PER_NAME);
      if (out.length === 0) throw new ResolveError(host, 'not-found');
      return out;
    } catch (err) {
      if (err instanceof ResolveError) throw err;
      throw new ResolveError(host, 'not-found');
    } finally {
      clearTimeout(timer);
    }
  }
}
