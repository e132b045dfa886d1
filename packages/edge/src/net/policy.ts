// A network policy compiled for fast questions: may this sandbox reach host:port, may the proxy
// dial this address. Built once per policy change, asked on every connection and DNS query.
import { DEFAULT_ALLOW_PORTS, NETWORK_PRESETS, ipv4ToInt, isIPv4, parseCidr } from '@dsec/protocol';
import type { NetworkPolicy } from '@dsec/protocol';
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

/** Never dialled, whatever a policy says: "this host", multicast, reserved and broadcast. */
const NEVER = rangesOf(['0.0.0.0/8', '224.0.0.0/4', '240.0.0.0/4']);

/**
 * Dialled only when a policy names them: loopback, private, shared (CGNAT), link-local,
 * protocol-assignment, documentation and benchmarking ranges.
 */
export const SPECIAL_RANGES = rangesOf([
  '10.0.0.0/8',
  '100.64.0.0/10',
  '127.0.0.0/8',
  '169.254.0.0/16',
  '172.16.0.0/12',
  '192.0.0.0/24',
  '192.0.2.0/24',
  '192.88.99.0/24',
  '192.168.0.0/16',
  '198.18.0.0/15',
  '198.51.100.0/24',
  '203.0.113.0/24',
]);

/** What a compiled policy needs to know about its node. */
export interface NodeAddressing {
  /** The node's sandbox address pool: never dialled (it holds the gateway and every sandbox). */
  pool: Range;
  /** Addresses of the node's own interfaces: dialled only when a policy names them. */
  localAddresses: readonly string[];
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
  const local = new Set(node.localAddresses.filter(isIPv4).map(ipv4ToInt));

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
      if (policy.mode !== 'allowlist' || !isIPv4(ip)) return false;
      const n = ipv4ToInt(ip);
      if (NEVER.some((r) => inRange(n, r)) || inRange(n, node.pool)) return false;
      if (local.has(n) || SPECIAL_RANGES.some((r) => inRange(n, r))) return named.some((r) => inRange(n, r));
      return true;
    },
  };
  return view;
}
