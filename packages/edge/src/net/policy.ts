// A network policy compiled for fast questions: may this sandbox reach host:port, may the proxy
// dial this address. Built once per policy change, asked on every connection and DNS query.
import {
  DEFAULT_ALLOW_PORTS,
  NETWORK_PRESETS,
  NEVER_DIALLED_CLASSES,
  classifyAddress,
  embeddedIPv4,
  formatIpAddress,
  ipv4ToInt,
  isIPv4,
  parseCidr,
  parseIpAddress,
  rangeContains,
} from '@dsec/protocol';
import type { IpRange, NetworkPolicy } from '@dsec/protocol';
import type { EgressPolicyView, EgressVerdict } from './types.js';

/** An IPv4 range as numbers. */
export interface Range {
  base: number;
  prefix: number;
}

/** Parses CIDR strings into ranges (invalid ones are skipped: callers validated them). */
export function rangesOf(cidrs: readonly string[]): Range[] {
  return cidrs.map(parseCidr).filter((r): r is Range => r !== undefined);
}

/** True when the address (as a number) lies in the range. */
export function inRange(ip: number, r: Range): boolean {
  const mask = r.prefix === 0 ? 0 : (0xffffffff << (32 - r.prefix)) >>> 0;
  return (ip & mask) >>> 0 === r.base;
}

/** What a compiled policy needs to know about its node. */
export interface NodeAddressing {
  /** The node's sandbox address pool: never dialled (it holds the gateway and every sandbox). */
  pool: Range;
  /** Addresses of the node's own interfaces: dialled only inside `allowedPrivateRanges`. */
  localAddresses: readonly string[];
  /** The operator's special ranges that allowed names may resolve to (`node.network.allowedPrivateRanges`). */
  allowedPrivateRanges?: readonly IpRange[];
}

/** An IPv4 {@link Range} as protocol's {@link IpRange}. */
function ipRangeOf(r: Range): IpRange {
  return { family: 4, bytes: Uint8Array.of(r.base >>> 24, (r.base >>> 16) & 255, (r.base >>> 8) & 255, r.base & 255), prefix: r.prefix };
}

/**
 * Whether the proxy may dial `ip` for a policy that names the special ranges `named`: public
 * IPv4 addresses yes; the pool, "this network", multicast and broadcast never; the node's own
 * addresses only inside the operator's `allowedPrivateRanges`; other special addresses
 * (loopback, link-local, private, shared, reserved, ...) inside those or a range the policy
 * names. IPv6 forms that carry IPv4 are judged as that IPv4 address; other IPv6, never.
 */
export function dialable(ip: string, named: readonly Range[], node: NodeAddressing): boolean {
  const parsed = parseIpAddress(ip);
  if (!parsed) return false;
  const a = parsed.family === 4 ? parsed : embeddedIPv4(parsed);
  if (!a) return false;
  const cls = classifyAddress(a, { localAddresses: node.localAddresses, pool: ipRangeOf(node.pool) });
  if (NEVER_DIALLED_CLASSES.has(cls)) return false;
  if (cls === 'public') return true;
  if ((node.allowedPrivateRanges ?? []).some((r) => rangeContains(r, a))) return true;
  if (cls === 'node') return false;
  const n = ipv4ToInt(formatIpAddress(a));
  return named.some((r) => inRange(n, r));
}

interface PortRule {
  rule: string;
  ports: ReadonlySet<number> | 'default';
}

const normName = (h: string): string => h.toLowerCase().replace(/\.$/, '');
const DEFAULT_PORTS = new Set(DEFAULT_ALLOW_PORTS);

/** Compiles a (validated) policy for one sandbox. */
export function compilePolicy(sandboxId: string, address: string, policy: NetworkPolicy, version: number, node: NodeAddressing): EgressPolicyView {
  const exact = new Map<string, PortRule[]>();
  const wildcard = new Map<string, PortRule[]>();
  const add = (pattern: string, r: PortRule): void => {
    const host = normName(pattern);
    const [map, key] = host.startsWith('*.') ? [wildcard, host.slice(2)] : [exact, host];
    const list = map.get(key);
    if (list) list.push(r);
    else map.set(key, [r]);
  };
  if (policy.mode === 'allowlist') {
    for (const r of policy.allow ?? []) add(r.host, { rule: `allow:${normName(r.host)}`, ports: r.ports ? new Set(r.ports) : 'default' });
    for (const name of policy.presets ?? []) {
      for (const domain of NETWORK_PRESETS[name] ?? []) add(domain, { rule: `preset:${name}:${domain}`, ports: 'default' });
    }
  }
  const named = rangesOf(policy.mode === 'allowlist' ? [...(policy.allowAddresses ?? []), ...(policy.allow ?? []).map((r) => r.host).filter(isIPv4)] : []);

  // Denied names win over every rule and preset.
  const deniedExact = new Set<string>();
  const deniedSuffixes = new Set<string>();
  if (policy.mode === 'allowlist') {
    for (const d of policy.deny ?? []) {
      const host = normName(d);
      if (host.startsWith('*.')) deniedSuffixes.add(host.slice(2));
      else deniedExact.add(host);
    }
  }
  /** The deny entry that covers `name`, if any. */
  const denial = (name: string): string | undefined => {
    if (deniedExact.has(name)) return name;
    if (isIPv4(name)) return undefined;
    for (let i = name.indexOf('.'); i !== -1; i = name.indexOf('.', i + 1)) if (deniedSuffixes.has(name.slice(i + 1))) return `*.${name.slice(i + 1)}`;
    return undefined;
  };

  /** Rules that match `name`: exact first, then the nearest wildcard suffix outward. */
  const matching = (name: string): PortRule[] => {
    const out = [...(exact.get(name) ?? [])];
    if (!isIPv4(name)) {
      for (let i = name.indexOf('.'); i !== -1; i = name.indexOf('.', i + 1)) out.push(...(wildcard.get(name.slice(i + 1)) ?? []));
    }
    return out;
  };

  const view: EgressPolicyView = {
    sandboxId,
    mode: policy.mode,
    address,
    policy,
    version,
    mirrors: policy.mode === 'allowlist' ? (policy.mirrors ?? {}) : {},
    allows(host: string, port: number): EgressVerdict {
      if (policy.mode !== 'allowlist') return { allowed: false, reason: 'network mode is none' };
      const name = normName(host);
      const denied = denial(name);
      if (denied !== undefined) return { allowed: false, rule: `deny:${denied}`, reason: `denied by ${denied}` };
      const rules = matching(name);
      if (rules.length === 0) return { allowed: false, reason: isIPv4(name) ? 'IP address not named by any rule' : 'no rule matches' };
      for (const r of rules) {
        if ((r.ports === 'default' ? DEFAULT_PORTS : r.ports).has(port)) return { allowed: true, rule: r.rule };
      }
      return { allowed: false, reason: `port ${port} not allowed by ${rules.map((r) => r.rule).join(', ')}` };
    },
    allowsName(host: string): EgressVerdict {
      if (policy.mode !== 'allowlist') return { allowed: false, reason: 'network mode is none' };
      const denied = denial(normName(host));
      if (denied !== undefined) return { allowed: false, rule: `deny:${denied}`, reason: `denied by ${denied}` };
      const rule = matching(normName(host))[0];
      return rule ? { allowed: true, rule: rule.rule } : { allowed: false, reason: 'no rule matches' };
    },
    addressAllowed(ip: string): boolean {
      return policy.mode === 'allowlist' && dialable(ip, named, node);
    },
  };
  return view;
}
