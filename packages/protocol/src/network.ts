// The network policy of a sandbox: its schema, the named presets (kept here, in one place, for
// edge, its egress proxy and clients alike) and the pure functions that patch and match it.
import { z } from 'zod';
import { classifyAddress, classifyRange, isLocalhostName, parseIpAddress, parseIpRange } from './addresses.js';
import { LabelsSchema } from './common.js';

/**
 * Named presets and the domains each expands to. A `*.` pattern matches every name below the
 * suffix, never the suffix itself. Presets allow ports 80 and 443.
 */
export const NETWORK_PRESETS = {
  npm: ['registry.npmjs.org', 'registry.yarnpkg.com'],
  pypi: ['pypi.org', 'files.pythonhosted.org'],
  debian: ['deb.debian.org', 'security.debian.org'],
  ubuntu: ['archive.ubuntu.com', 'security.ubuntu.com', 'ports.ubuntu.com'],
  alpine: ['dl-cdn.alpinelinux.org'],
  github: ['github.com', 'api.github.com', 'codeload.github.com', 'objects.githubusercontent.com', 'raw.githubusercontent.com'],
  go: ['proxy.golang.org', 'sum.golang.org'],
  crates: ['crates.io', 'index.crates.io', 'static.crates.io'],
  maven: ['repo.maven.apache.org', 'repo1.maven.org'],
  huggingface: ['huggingface.co', 'cdn-lfs.huggingface.co', '*.hf.co'],
} as const satisfies Record<string, readonly string[]>;

/** The name of a preset in {@link NETWORK_PRESETS}. */
export type NetworkPreset = keyof typeof NETWORK_PRESETS;
/** Every preset name. */
export const NETWORK_PRESET_NAMES = Object.keys(NETWORK_PRESETS) as NetworkPreset[];

/** Ports a rule allows when it names none (and the ports every preset allows). */
export const DEFAULT_ALLOW_PORTS: readonly number[] = [80, 443];
/** Most allow rules in one policy. */
export const MAX_ALLOW_RULES = 1024;
/** Most ports in one rule. */
export const MAX_RULE_PORTS = 64;
/** Most address ranges in `allowAddresses`. */
export const MAX_ALLOW_ADDRESSES = 64;
/** Shortest prefix `allowAddresses` accepts (no range wider than a /8). */
export const MIN_ALLOW_ADDRESS_PREFIX = 8;

const LABEL_RE = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/i;
const IPV4_RE = /^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$/;

/** True when `s` is a dotted-quad IPv4 address (no leading zeros). */
export function isIPv4(s: string): boolean {
  return IPV4_RE.test(s);
}

/** Why `name` is not a DNS name dsec accepts, or undefined when it is one. */
export function domainNameProblem(name: string): string | undefined {
  if (name.length === 0) return 'empty';
  if (name.length > 253) return 'longer than 253 characters';
  const labels = name.split('.');
  for (const label of labels) {
    if (!LABEL_RE.test(label)) return `label "${label}" is not 1-63 letters, digits or inner hyphens`;
  }
  if (/^\d+$/.test(labels[labels.length - 1] ?? '')) return 'the last label is numeric (an IP address is written as one, in full)';
  return undefined;
}

/**
 * Why `host` is not a valid rule host, or undefined: an exact DNS name, `*.` followed by one, or
 * an IPv4 address. `*` alone and wildcards inside a name are refused.
 */
export function hostPatternProblem(pattern: string): string | undefined {
  // A fully qualified name may end in a dot.
  const host = pattern.endsWith('.') ? pattern.slice(0, -1) : pattern;
  if (isIPv4(host)) return undefined;
  if (host.startsWith('*.')) {
    const why = domainNameProblem(host.slice(2));
    return why ? `not a wildcard pattern (*.suffix): ${why}` : undefined;
  }
  if (host.includes('*')) return 'a wildcard is only allowed as a leading "*." (e.g. *.example.com)';
  const why = domainNameProblem(host);
  return why ? `not a domain name, *.suffix pattern or IPv4 address: ${why}` : undefined;
}

/** A rule host: `exact.name`, `*.suffix` or an IPv4 address (case-insensitive). */
export const HostPatternSchema = z
  .string()
  .max(255)
  .superRefine((v, ctx) => {
    const why = hostPatternProblem(v);
    if (why) ctx.addIssue({ code: 'custom', message: `${JSON.stringify(v)}: ${why}` });
  });

/** A TCP port, 1..65535. */
export const PortSchema = z.number().int('port must be an integer').min(1, 'port out of range 1-65535').max(65535, 'port out of range 1-65535');

/** One allow rule: a host pattern and the ports it opens (default 80 and 443). */
export const AllowRuleSchema = z.strictObject({
  host: HostPatternSchema,
  ports: z.array(PortSchema).min(1).max(MAX_RULE_PORTS).optional(),
});
/** One allow rule. */
export type AllowRule = z.infer<typeof AllowRuleSchema>;

/** A preset name from {@link NETWORK_PRESETS}. */
export const PresetNameSchema = z.enum(NETWORK_PRESET_NAMES as [NetworkPreset, ...NetworkPreset[]], {
  error: (iss) => `unknown preset ${JSON.stringify(iss.input)} (known: ${NETWORK_PRESET_NAMES.join(', ')})`,
});

/** Parses `a.b.c.d/n` into a network address and prefix, or undefined. */
export function parseCidr(s: string): { base: number; prefix: number } | undefined {
  const [addr, bits, extra] = s.split('/');
  if (extra !== undefined || addr === undefined || !isIPv4(addr)) return undefined;
  const prefix = bits === undefined ? 32 : /^\d{1,2}$/.test(bits) ? Number(bits) : NaN;
  if (!(prefix >= 0 && prefix <= 32)) return undefined;
  const mask = prefix === 0 ? 0 : (0xffffffff << (32 - prefix)) >>> 0;
  return { base: (ipv4ToInt(addr) & mask) >>> 0, prefix };
}

/** An IPv4 address as an unsigned 32-bit number. */
export function ipv4ToInt(ip: string): number {
  return ip.split('.').reduce((n, part) => ((n << 8) | Number(part)) >>> 0, 0);
}

/** An IPv4 address range, `a.b.c.d/n` (a bare address is a /32), at least a /8. */
export const CidrSchema = z
  .string()
  .max(18)
  .superRefine((v, ctx) => {
    const c = parseCidr(v);
    if (!c) ctx.addIssue({ code: 'custom', message: `${JSON.stringify(v)}: not an IPv4 address or a.b.c.d/n range` });
    else if (c.prefix < MIN_ALLOW_ADDRESS_PREFIX) ctx.addIssue({ code: 'custom', message: `${JSON.stringify(v)}: wider than a /${MIN_ALLOW_ADDRESS_PREFIX}` });
  });

/** A package mirror the egress proxy serves for a preset: where it fetches from, and a cutoff. */
export const MirrorSchema = z.strictObject({
  /** Registry the mirror reads from (default: the preset's public registry). */
  upstream: z
    .url({ protocol: /^https?$/, error: 'must be an http or https URL' })
    .max(2048)
    .optional(),
  /** Releases published after this time are hidden (ISO date or date-time). */
  freeze: z.union([z.iso.datetime({ offset: true }), z.iso.date()], { error: 'must be an ISO date (2024-05-01) or date-time' }).optional(),
});
/** A package mirror. */
export type Mirror = z.infer<typeof MirrorSchema>;

const byPreset = <T extends z.ZodType>(value: T) =>
  z.record(z.string(), value).superRefine((m, ctx) => {
    for (const key of Object.keys(m)) {
      if (!(NETWORK_PRESET_NAMES as string[]).includes(key)) {
        ctx.addIssue({ code: 'custom', path: [key], message: `unknown preset ${JSON.stringify(key)} (known: ${NETWORK_PRESET_NAMES.join(', ')})` });
      }
    }
  });

/** Mirrors by preset name. */
export const MirrorsSchema = byPreset(MirrorSchema);
/** Package mirrors by preset. */
export type Mirrors = z.infer<typeof MirrorsSchema>;

/** Network modes: `none` (loopback only, the default) or `allowlist`. */
export const NetworkModeSchema = z.enum(['none', 'allowlist']);
/** A network mode. */
export type NetworkMode = z.infer<typeof NetworkModeSchema>;

const uniqueBy = <T>(items: readonly T[] | undefined, key: (t: T) => string, ctx: z.RefinementCtx, field: string): void => {
  const seen = new Set<string>();
  items?.forEach((item, i) => {
    const k = key(item);
    if (seen.has(k)) ctx.addIssue({ code: 'custom', path: [field, i], message: `${JSON.stringify(k)} is listed twice` });
    seen.add(k);
  });
};

/**
 * A sandbox's network policy. `none`: loopback only. `allowlist`: connections through the egress
 * proxy to the hosts the rules and presets name; names resolving to loopback, private or other
 * special addresses are refused unless `allowAddresses` covers them (or a rule names the address).
 */
export const NetworkPolicySchema = z
  .strictObject({
    mode: NetworkModeSchema,
    allow: z.array(AllowRuleSchema).max(MAX_ALLOW_RULES).optional(),
    presets: z.array(PresetNameSchema).max(NETWORK_PRESET_NAMES.length).optional(),
    /** Loopback, private or special ranges that allowed names may resolve to. */
    allowAddresses: z.array(CidrSchema).max(MAX_ALLOW_ADDRESSES).optional(),
    mirrors: MirrorsSchema.optional(),
    /**
     * Names refused even when a rule or preset allows them; run-time `deny-domain` rules
     * (POST /v1/rules) are merged in here and kept through every later change of the policy.
     */
    deny: z.array(HostPatternSchema).max(MAX_ALLOW_RULES).optional(),
  })
  .superRefine((p, ctx) => {
    if (p.mode === 'none') {
      for (const field of ['allow', 'presets', 'allowAddresses', 'mirrors'] as const) {
        const v = p[field];
        if (v !== undefined && (Array.isArray(v) ? v.length > 0 : Object.keys(v).length > 0)) {
          ctx.addIssue({ code: 'custom', path: [field], message: 'mode none allows nothing; use mode allowlist' });
        }
      }
    }
    uniqueBy(p.allow, (r) => r.host.toLowerCase().replace(/\.$/, ''), ctx, 'allow');
    uniqueBy(p.presets, (s) => s, ctx, 'presets');
    uniqueBy(p.deny, (h) => h.toLowerCase().replace(/\.$/, ''), ctx, 'deny');
  });
/** A sandbox's network policy. */
export type NetworkPolicy = z.infer<typeof NetworkPolicySchema>;

/** The policy of a sandbox created without one. */
export const DEFAULT_NETWORK_POLICY: NetworkPolicy = { mode: 'none' };

const addRemove = <T extends z.ZodType, R extends z.ZodType>(item: T, remove: R, max: number) =>
  z.strictObject({ add: z.array(item).max(max).optional(), remove: z.array(remove).max(max).optional() });

/**
 * A change to a policy. Adding rules, presets, addresses or mirrors to a `none` policy makes it
 * an allowlist; `mode: 'none'` drops everything. An added rule replaces one with the same host.
 */
export const NetworkPolicyPatchSchema = z.strictObject({
  mode: NetworkModeSchema.optional(),
  allow: addRemove(AllowRuleSchema, HostPatternSchema, MAX_ALLOW_RULES).optional(),
  presets: addRemove(PresetNameSchema, PresetNameSchema, NETWORK_PRESET_NAMES.length).optional(),
  allowAddresses: addRemove(CidrSchema, CidrSchema, MAX_ALLOW_ADDRESSES).optional(),
  /** Mirrors to set, or `null` to remove one. */
  mirrors: byPreset(MirrorSchema.nullable()).optional(),
});
/** A change to a policy. */
export type NetworkPolicyPatch = z.infer<typeof NetworkPolicyPatchSchema>;

const normHost = (h: string): string => h.toLowerCase().replace(/\.$/, '');

/** Lower-cases hosts, drops trailing dots, sorts and de-duplicates ports and lists. */
export function normalizeNetworkPolicy(p: NetworkPolicy): NetworkPolicy {
  if (p.mode === 'none') return { mode: 'none' };
  const out: NetworkPolicy = { mode: 'allowlist' };
  if (p.allow?.length) {
    out.allow = p.allow.map((r) => {
      const rule: AllowRule = { host: normHost(r.host) };
      if (r.ports) rule.ports = [...new Set(r.ports)].sort((a, b) => a - b);
      return rule;
    });
  }
  if (p.presets?.length) out.presets = [...new Set(p.presets)].sort();
  if (p.allowAddresses?.length) out.allowAddresses = [...new Set(p.allowAddresses)];
  if (p.mirrors && Object.keys(p.mirrors).length) out.mirrors = { ...p.mirrors };
  if (p.deny?.length) out.deny = [...new Set(p.deny.map(normHost))].sort();
  return out;
}

/** A policy with more names denied (run-time `deny-domain` rules); `none` denies everything already. */
export function withDeniedNames(p: NetworkPolicy, names: readonly string[]): NetworkPolicy {
  if (p.mode === 'none' || names.length === 0) return p;
  return { ...p, deny: [...new Set([...(p.deny ?? []), ...names].map(normHost))].sort() };
}

/** Applies a patch to a policy; the caller validates the result with {@link NetworkPolicySchema}. */
export function applyNetworkPatch(current: NetworkPolicy, patch: NetworkPolicyPatch): NetworkPolicy {
  if (patch.mode === 'none') return { mode: 'none' };
  const allow = new Map((current.allow ?? []).map((r) => [normHost(r.host), r]));
  for (const host of patch.allow?.remove ?? []) allow.delete(normHost(host));
  for (const rule of patch.allow?.add ?? []) allow.set(normHost(rule.host), rule);
  const presets = new Set<NetworkPreset>(current.presets ?? []);
  for (const p of patch.presets?.remove ?? []) presets.delete(p);
  for (const p of patch.presets?.add ?? []) presets.add(p);
  const addrs = new Set(current.allowAddresses ?? []);
  for (const a of patch.allowAddresses?.remove ?? []) addrs.delete(a);
  for (const a of patch.allowAddresses?.add ?? []) addrs.add(a);
  const mirrors: Record<string, Mirror> = { ...(current.mirrors ?? {}) };
  for (const [name, m] of Object.entries(patch.mirrors ?? {})) {
    if (m === null) delete mirrors[name];
    else mirrors[name] = m;
  }
  const adds = Boolean(
    patch.allow?.add?.length || patch.presets?.add?.length || patch.allowAddresses?.add?.length || Object.values(patch.mirrors ?? {}).some((m) => m !== null),
  );
  const mode = patch.mode ?? (current.mode === 'none' && adds ? 'allowlist' : current.mode);
  if (mode === 'none') return { mode: 'none' };
  const out: NetworkPolicy = { mode };
  if (allow.size) out.allow = [...allow.values()];
  if (presets.size) out.presets = [...presets].sort();
  if (addrs.size) out.allowAddresses = [...addrs];
  if (Object.keys(mirrors).length) out.mirrors = mirrors;
  // Denied names are not the tenant's to patch away (run-time rules put them there).
  if (current.deny?.length) out.deny = current.deny;
  return out;
}

/** Traffic and attempt counters of a sandbox's network. */
export const NetworkStatsSchema = z.object({
  /** Bytes from upstreams to the sandbox, through the proxy. */
  bytesIn: z.number(),
  /** Bytes from the sandbox to upstreams, through the proxy. */
  bytesOut: z.number(),
  /** Proxy connections open now. */
  connections: z.number(),
  /** Proxy connections since the sandbox joined the network. */
  totalConnections: z.number(),
  /** Attempts allowed (connections and DNS answers). */
  allowed: z.number(),
  /** Attempts denied (proxy, DNS stub and kernel). */
  denied: z.number(),
});
/** Traffic and attempt counters of a sandbox's network. */
export type NetworkStats = z.infer<typeof NetworkStatsSchema>;

/** GET /v1/sandboxes/{id}/network; also the reply of PUT and PATCH. */
export const SandboxNetworkSchema = z.object({
  policy: NetworkPolicySchema,
  /** The sandbox's address (allowlist only). */
  address: z.string().optional(),
  /** Its gateway: DNS stub and proxy (allowlist only). */
  gateway: z.string().optional(),
  /** `HTTP_PROXY` value commands in the sandbox get (allowlist only). */
  proxy: z.string().optional(),
  stats: NetworkStatsSchema,
});

export type SandboxNetwork = z.infer<typeof SandboxNetworkSchema>;

/** One egress attempt and its verdict. */
export const EgressLogEntrySchema = z.object({
  at: z.string().optional(),
  sandboxId: z.string(),
  /** Where it was decided: proxy (`http`, `connect`, `transparent-http`, `transparent-tls`, `mirror`), `dns` or `kernel`. */
  via: z.string(),
  host: z.string(),
  port: z.number(),
  protocol: z.string().optional(),
  address: z.string().optional(),
  verdict: z.enum(['allowed', 'denied']),
  rule: z.string().optional(),
  reason: z.string().optional(),
});

/** One egress attempt and its verdict. */
export type EgressLogEntry = z.infer<typeof EgressLogEntrySchema>;

/** Default and largest number of attempts `GET .../network/log` returns. */
export const DEFAULT_NETWORK_LOG_LIMIT = 100;

export const MAX_NETWORK_LOG_LIMIT = 1000;

/** GET /v1/sandboxes/{id}/network/log query. */
export const NetworkLogQuerySchema = z.strictObject({
  limit: z.coerce.number().int().min(1).max(MAX_NETWORK_LOG_LIMIT).optional(),
});
/** GET /v1/sandboxes/{id}/network/log query. */
export type NetworkLogQuery = z.infer<typeof NetworkLogQuerySchema>;

/** Most sandboxes one `network:apply` changes. */
export const MAX_NETWORK_APPLY_SANDBOXES = 10_000;

/** POST /v1/network:apply — replace or patch the policy of every sandbox matching the labels. */
export const ApplyNetworkRequestSchema = z
  .strictObject({
    selector: z.strictObject({
      labels: LabelsSchema.refine((l) => Object.keys(l).length > 0, 'give at least one label'),
    }),
    policy: NetworkPolicySchema.optional(),
    patch: NetworkPolicyPatchSchema.optional(),
  })
  .refine((r) => (r.policy === undefined) !== (r.patch === undefined), { error: 'give exactly one of policy or patch', path: ['policy'] });

export type ApplyNetworkRequest = z.infer<typeof ApplyNetworkRequestSchema>;

/** The outcome of `network:apply`, per sandbox. */
export const ApplyNetworkResultSchema = z.object({
  /** Sandboxes the selector matched. */
  matched: z.number(),
  applied: z.array(z.object({ id: z.string(), network: NetworkPolicySchema })),
  /** Sandboxes whose policy did not change (their old policy stays in force). */
  failed: z.array(z.object({ id: z.string(), error: z.object({ code: z.string(), message: z.string() }) })),
});

export type ApplyNetworkResult = z.infer<typeof ApplyNetworkResultSchema>;

// -- issue 13 §2 (net): what a tenant's policy may not name --

/** An entry of a policy that names a destination no tenant may allow: its field path and why. */
export interface RestrictedEntry {
  /** Path below the policy (`allowAddresses.0`, `allow.2.host`). */
  path: string;
  message: string;
}

const OPERATOR_ONLY = 'is reserved to the operator (node.network.allowedPrivateRanges); a tenant policy cannot allow it';

/** Why a rule host names a special destination (a special address or a localhost name), or undefined. */
export function restrictedHost(host: string): string | undefined {
  const h = host.toLowerCase().replace(/\.$/, '');
  if (isLocalhostName(h.startsWith('*.') ? h.slice(2) : h)) return `${JSON.stringify(host)} is the node itself and ${OPERATOR_ONLY}`;
  const addr = parseIpAddress(h);
  if (!addr) return undefined;
  const cls = classifyAddress(addr);
  return cls === 'public' ? undefined : `${JSON.stringify(host)} is a ${cls} address and ${OPERATOR_ONLY}`;
}

/** Why an `allowAddresses` range covers special addresses, or undefined. */
export function restrictedRange(cidr: string): string | undefined {
  const r = parseIpRange(cidr);
  if (!r) return undefined;
  const cls = classifyRange(r);
  return cls === 'public' ? undefined : `${JSON.stringify(cidr)} covers ${cls} addresses and ${OPERATOR_ONLY}`;
}

/**
 * The entries of a policy that only the operator may allow: rule hosts that are special
 * addresses (loopback, link-local, private, ...) or localhost names, and `allowAddresses`
 * ranges that overlap a special range. Names that resolve there are refused when dialled.
 */
export function restrictedEntries(p: NetworkPolicy): RestrictedEntry[] {
  const out: RestrictedEntry[] = [];
  p.allow?.forEach((r, i) => {
    const why = restrictedHost(r.host);
    if (why) out.push({ path: `allow.${i}.host`, message: why });
  });
  p.allowAddresses?.forEach((a, i) => {
    const why = restrictedRange(a);
    if (why) out.push({ path: `allowAddresses.${i}`, message: why });
  });
  return out;
}

/** The same for a patch: the rules and ranges it adds (`allow.add.0.host`, `allowAddresses.add.1`). */
export function restrictedPatchEntries(p: NetworkPolicyPatch): RestrictedEntry[] {
  const out: RestrictedEntry[] = [];
  p.allow?.add?.forEach((r, i) => {
    const why = restrictedHost(r.host);
    if (why) out.push({ path: `allow.add.${i}.host`, message: why });
  });
  p.allowAddresses?.add?.forEach((a, i) => {
    const why = restrictedRange(a);
    if (why) out.push({ path: `allowAddresses.add.${i}`, message: why });
  });
  return out;
}
// -- end net --
