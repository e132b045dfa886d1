// The client's address behind reverse proxies. `X-Forwarded-For` is a list each proxy appends
// its peer to; anyone can send one, so it is read only when the socket's peer is a configured
// trusted proxy, and only from the right as far as the hops are trusted proxies too.
import { BlockList, isIP } from 'node:net';
import { DsecError } from '@dsec/protocol';

/** An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`) as its IPv4 form. */
function plain(address: string): string {
  const a = address.trim();
  return /^::ffff:\d+\.\d+\.\d+\.\d+$/i.test(a) ? a.slice(7) : a;
}

/** The configured trusted proxies: addresses and CIDR ranges, IPv4 or IPv6. */
export class TrustedProxies {
  private readonly list = new BlockList();
  private readonly empty: boolean;

  /** Throws INVALID_ARGUMENT naming `trustedProxies` for an entry that is neither. */
  constructor(entries: readonly string[]) {
    this.empty = entries.length === 0;
    for (const entry of entries) {
      const [addr = '', prefix] = entry.split('/');
      const family = isIP(addr);
      const bits = prefix === undefined ? (family === 6 ? 128 : 32) : Number(prefix);
      if (family === 0 || !Number.isInteger(bits) || bits < 0 || bits > (family === 6 ? 128 : 32) || (prefix !== undefined && !/^\d+$/.test(prefix))) {
        throw new DsecError('INVALID_ARGUMENT', `trustedProxies: ${entry} is not an address or CIDR range`, { field: 'trustedProxies' });
      }
      this.list.addSubnet(addr, bits, family === 6 ? 'ipv6' : 'ipv4');
    }
  }

  /** True when `address` is one of the trusted proxies. */
  trusts(address: string): boolean {
    const a = plain(address);
    const family = isIP(a);
    if (this.empty || family === 0) return false;
    return this.list.check(a, family === 6 ? 'ipv6' : 'ipv4');
  }

  /**
   * The client of a request from socket peer `peer` with header `forwardedFor`: the peer itself
   * unless it is trusted; else the rightmost hop that is not a trusted proxy (a malformed hop
   * ends the walk at the proxy that wrote it).
   */
  clientAddress(peer: string, forwardedFor: string | undefined): string {
    let client = plain(peer);
    if (!forwardedFor || !this.trusts(client)) return client;
    const hops = forwardedFor.split(',').map(plain);
    for (let i = hops.length - 1; i >= 0; i--) {
      const hop = hops[i]!;
      if (isIP(hop) === 0) return client;
      client = hop;
      if (!this.trusts(hop)) return hop;
    }
    return client;
  }
}
