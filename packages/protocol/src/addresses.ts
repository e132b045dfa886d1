// IP addresses, defined once for the edge's egress proxy, its DNS stub and policies, and the
// apiserver's checks of tenants' policies: every spelling a resolver or URL parser accepts
// (dotted quads, inet_aton's `127.1`, `0x7f.1`, `2130706433` and octal parts; IPv6 with `::`,
// embedded IPv4 and zones), and the class of each address (loopback, link-local, private, ...).
// IPv6 forms that carry an IPv4 address (mapped, compatible, NAT64, 6to4) take the class of the
// IPv4 address they carry, so `::ffff:127.0.0.1` and `64:ff9b::7f00:1` are loopback.

/** An address: its family and its bytes (4 or 16), network order. */
export interface IpAddress {
  family: 4 | 6;
  bytes: Uint8Array;
}

/** A range of addresses: the network's bytes (host bits zero) and its prefix length. */
export interface IpRange {
  family: 4 | 6;
  bytes: Uint8Array;
  prefix: number;
}

/**
 * What an address is. `public`: dialled when a policy's names resolve there. Every other class
 * is special: reachable only through the node's operator setting (`node.network.allowedPrivateRanges`).
 */
export type AddressClass =
  | 'public'
  | 'unspecified'
  | 'loopback'
  | 'link-local'
  | 'private'
  | 'shared'
  | 'documentation'
  | 'benchmarking'
  | 'reserved'
  | 'multicast'
  | 'broadcast'
  | 'node'
  | 'sandbox-pool';

/** Classes no setting or policy makes dialable: they name no single remote host. */
export const NEVER_DIALLED_CLASSES: ReadonlySet<AddressClass> = new Set(['unspecified', 'multicast', 'broadcast', 'sandbox-pool']);

/** Longest DNS name (RFC 1035, without the trailing dot). */
export const MAX_DNS_NAME_LENGTH = 253;
/** Longest DNS label. */
export const MAX_DNS_LABEL_LENGTH = 63;

/** A dotted-quad IPv4 address in its one canonical spelling (no leading zeros). */
const DOTTED_QUAD = /^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$/;

/** True when `s` is an IPv4 address written as a canonical dotted quad (`127.0.0.1`). */
export function isCanonicalIPv4(s: string): boolean {
  return DOTTED_QUAD.test(s);
}

/** One part of an inet_aton address: decimal, `0x` hex or leading-zero octal; undefined if none. */
function atonPart(p: string): number | undefined {
  if (/^0x[0-9a-f]*$/i.test(p)) return p.length === 2 ? 0 : parseInt(p.slice(2), 16);
  if (/^0[0-7]*$/.test(p)) return parseInt(p, 8);
  if (/^[1-9]\d*$/.test(p)) return Number(p);
  return undefined;
}

/**
 * An IPv4 address in any spelling inet_aton and WHATWG URL parsers accept: one to four parts,
 * each decimal, hex or octal, the last filling the remaining bytes (`127.1`, `0x7f000001`,
 * `2130706433`, `0177.0.0.1`); one trailing dot is allowed. Undefined when it is not one.
 */
export function parseIPv4(s: string): IpAddress | undefined {
  const text = s.endsWith('.') ? s.slice(0, -1) : s;
  if (text.length === 0 || text.length > 64) return undefined;
  const parts = text.split('.');
  if (parts.length > 4) return undefined;
  const nums: number[] = [];
  for (const p of parts) {
    const n = atonPart(p);
    if (n === undefined || !Number.isFinite(n)) return undefined;
    nums.push(n);
  }
  const last = nums.pop() as number;
  if (nums.some((n) => n > 255) || last >= 256 ** (4 - nums.length)) return undefined;
  let value = last;
  nums.forEach((n, i) => (value += n * 256 ** (3 - i)));
  return { family: 4, bytes: Uint8Array.of(value >>> 24, (value >>> 16) & 255, (value >>> 8) & 255, value & 255) };
}

/**
 * An IPv6 address: `::` compression, an embedded dotted quad at the end, optional brackets; a
 * zone (`fe80::1%eth0`) is accepted and dropped. Undefined when it is not one.
 */
export function parseIPv6(s: string): IpAddress | undefined {
  let text = s;
  if (text.startsWith('[') && text.endsWith(']')) text = text.slice(1, -1);
  const zone = text.indexOf('%');
  if (zone >= 0) {
    if (!/^[A-Za-z0-9_.-]{1,64}$/.test(text.slice(zone + 1))) return undefined;
    text = text.slice(0, zone);
  }
  if (text.length < 2 || text.length > 45 || !text.includes(':')) return undefined;
  // An embedded dotted quad at the end stands for the last two words.
  const lastColon = text.lastIndexOf(':');
  const quad = text.slice(lastColon + 1);
  if (quad.includes('.')) {
    if (!isCanonicalIPv4(quad)) return undefined;
    const q = (parseIPv4(quad) as IpAddress).bytes;
    text = `${text.slice(0, lastColon + 1)}${(((q[0] ?? 0) << 8) | (q[1] ?? 0)).toString(16)}:${(((q[2] ?? 0) << 8) | (q[3] ?? 0)).toString(16)}`;
  }
  const halves = text.split('::');
  if (halves.length > 2) return undefined;
  const words = (h: string): number[] | undefined => {
    if (h === '') return [];
    const out: number[] = [];
    for (const w of h.split(':')) {
      if (!/^[0-9a-f]{1,4}$/i.test(w)) return undefined;
      out.push(parseInt(w, 16));
    }
    return out;
  };
  const head = words(halves[0] ?? '');
  const tail = halves.length === 2 ? words(halves[1] ?? '') : [];
  if (!head || !tail) return undefined;
  const count = head.length + tail.length;
  if (halves.length === 1 ? count !== 8 : count > 7) return undefined;
  const all = [...head, ...new Array<number>(8 - count).fill(0), ...tail];
  const bytes = new Uint8Array(16);
  all.forEach((w, i) => {
    bytes[i * 2] = w >> 8;
    bytes[i * 2 + 1] = w & 255;
  });
  return { family: 6, bytes };
}

/**
 * Any IP literal: an IPv4 address in any spelling ({@link parseIPv4}) or an IPv6 address, bare
 * or bracketed ({@link parseIPv6}). Undefined for anything else (a DNS name).
 */
export function parseIpAddress(s: string): IpAddress | undefined {
  const t = s.trim();
  return t.includes(':') ? parseIPv6(t) : parseIPv4(t);
}

/**
 * True when `host` is an IP literal or something a resolver or URL parser might take for one:
 * a name whose last label is numeric or `0x` hex is never a DNS name (no top-level label is
 * numeric), so it is a literal whether or not it parses.
 */
export function looksLikeIpLiteral(host: string): boolean {
  if (parseIpAddress(host)) return true;
  const labels = (host.endsWith('.') ? host.slice(0, -1) : host).split('.');
  return /^(\d+|0x[0-9a-f]*)$/i.test(labels[labels.length - 1] ?? '');
}

/** The canonical text of an address: a dotted quad, or RFC 5952 IPv6 (`::ffff:127.0.0.1` for mapped). */
export function formatIpAddress(a: IpAddress): string {
  const b = a.bytes;
  if (a.family === 4) return `${b[0]}.${b[1]}.${b[2]}.${b[3]}`;
  const words = Array.from({ length: 8 }, (_, i) => ((b[i * 2] ?? 0) << 8) | (b[i * 2 + 1] ?? 0));
  if (words.slice(0, 5).every((w) => w === 0) && words[5] === 0xffff) return `::ffff:${b[12]}.${b[13]}.${b[14]}.${b[15]}`;
  // The longest run of two or more zero words becomes `::` (the first of equal runs).
  let best = -1;
  let bestLen = 1;
  for (let i = 0; i < 8;) {
    if (words[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && words[j] === 0) j++;
    if (j - i > bestLen) {
      best = i;
      bestLen = j - i;
    }
    i = j;
  }
  const hex = (ws: number[]): string => ws.map((w) => w.toString(16)).join(':');
  if (best < 0) return hex(words);
  return `${hex(words.slice(0, best))}::${hex(words.slice(best + bestLen))}`;
}

/** An IP range, `address/prefix` (either family; a bare address is a single-address range). */
export function parseIpRange(s: string): IpRange | undefined {
  const slash = s.indexOf('/');
  const text = slash < 0 ? s : s.slice(0, slash);
  // Ranges are written by people: IPv4 in its canonical dotted quad only.
  const addr = text.includes(':') ? parseIPv6(text) : isCanonicalIPv4(text) ? parseIPv4(text) : undefined;
  if (!addr) return undefined;
  const max = addr.family === 4 ? 32 : 128;
  let prefix = max;
  if (slash >= 0) {
    const bits = s.slice(slash + 1);
    if (!/^\d{1,3}$/.test(bits)) return undefined;
    prefix = Number(bits);
    if (prefix > max) return undefined;
  }
  return { family: addr.family, bytes: masked(addr.bytes, prefix), prefix };
}

function masked(bytes: Uint8Array, prefix: number): Uint8Array {
  const out = new Uint8Array(bytes.length);
  for (let i = 0; i < bytes.length; i++) {
    const keep = Math.max(0, Math.min(8, prefix - i * 8));
    out[i] = (bytes[i] ?? 0) & ((0xff00 >> keep) & 0xff);
  }
  return out;
}

/** True when `r` contains `a` (same family only). */
export function rangeContains(r: IpRange, a: IpAddress): boolean {
  if (r.family !== a.family) return false;
  const m = masked(a.bytes, r.prefix);
  return m.every((b, i) => b === r.bytes[i]);
}

/** True when two ranges share any address. */
export function rangesOverlap(a: IpRange, b: IpRange): boolean {
  if (a.family !== b.family) return false;
  const p = Math.min(a.prefix, b.prefix);
  const ma = masked(a.bytes, p);
  const mb = masked(b.bytes, p);
  return ma.every((x, i) => x === mb[i]);
}

/** `a.b.c.d/n` or `v6/n`. */
export function formatIpRange(r: IpRange): string {
  return `${formatIpAddress({ family: r.family, bytes: r.bytes })}/${r.prefix}`;
}

const range = (s: string): IpRange => parseIpRange(s) as IpRange;

/** IPv4 special ranges and their classes (IANA's special-purpose registry); the first match wins. */
const IPV4_CLASSES: ReadonlyArray<[IpRange, AddressClass]> = [
  [range('255.255.255.255/32'), 'broadcast'],
  [range('0.0.0.0/8'), 'unspecified'],
  [range('10.0.0.0/8'), 'private'],
  [range('100.64.0.0/10'), 'shared'],
  [range('127.0.0.0/8'), 'loopback'],
  [range('169.254.0.0/16'), 'link-local'],
  [range('172.16.0.0/12'), 'private'],
  [range('192.0.0.0/24'), 'reserved'],
  [range('192.0.2.0/24'), 'documentation'],
  [range('192.31.196.0/24'), 'reserved'],
  [range('192.52.193.0/24'), 'reserved'],
  [range('192.88.99.0/24'), 'reserved'],
  [range('192.168.0.0/16'), 'private'],
  [range('192.175.48.0/24'), 'reserved'],
  [range('198.18.0.0/15'), 'benchmarking'],
  [range('198.51.100.0/24'), 'documentation'],
  [range('203.0.113.0/24'), 'documentation'],
  [range('224.0.0.0/4'), 'multicast'],
  [range('240.0.0.0/4'), 'reserved'],
];

/** IPv6 special ranges outside the IPv4-carrying ones; anything outside 2000::/3 is reserved. */
const IPV6_CLASSES: ReadonlyArray<[IpRange, AddressClass]> = [
  [range('::/128'), 'unspecified'],
  [range('::1/128'), 'loopback'],
  [range('fe80::/10'), 'link-local'],
  [range('fec0::/10'), 'private'],
  [range('fc00::/7'), 'private'],
  [range('ff00::/8'), 'multicast'],
  [range('100::/64'), 'reserved'],
  [range('2001::/23'), 'reserved'],
  [range('2001:db8::/32'), 'documentation'],
  [range('3fff::/20'), 'documentation'],
  [range('5f00::/16'), 'reserved'],
];
const GLOBAL_UNICAST = range('2000::/3');
const IPV4_CARRYING = ['::ffff:0:0/96', '::ffff:0:0:0/96', '::/96', '64:ff9b::/96', '64:ff9b:1::/48', '2002::/16'].map(range);

/** Every special IPv4 range (all but `public`), for range checks of policies and settings. */
export const SPECIAL_IPV4_RANGES: readonly IpRange[] = IPV4_CLASSES.map(([r]) => r);

/**
 * The IPv4 address an IPv6 address carries, if it is one of the forms that reach IPv4:
 * IPv4-mapped `::ffff:0:0/96`, translated `::ffff:0:0:0/96`, compatible `::/96`, NAT64
 * `64:ff9b::/96` and `64:ff9b:1::/48`, and 6to4 `2002::/16`.
 */
export function embeddedIPv4(a: IpAddress): IpAddress | undefined {
  if (a.family !== 6) return undefined;
  const b = a.bytes;
  const zero = (from: number, to: number): boolean => b.subarray(from, to).every((x) => x === 0);
  const v4 = (at: number): IpAddress => ({ family: 4, bytes: Uint8Array.from(b.subarray(at, at + 4)) });
  if (zero(0, 10) && b[10] === 0xff && b[11] === 0xff) return v4(12);
  if (zero(0, 8) && b[8] === 0xff && b[9] === 0xff && zero(10, 12)) return v4(12);
  if (zero(0, 12) && !zero(12, 14)) return v4(12); // ::a.b.c.d (not :: or ::1)
  if (b[0] === 0 && b[1] === 0x64 && b[2] === 0xff && b[3] === 0x9b) {
    if (zero(4, 12)) return v4(12);
    if (b[4] === 0 && b[5] === 1) return v4(12);
  }
  if (b[0] === 0x20 && b[1] === 0x02) return v4(2);
  return undefined;
}

/** Where an address lies on a node: its own interface addresses, and the sandbox pool. */
export interface NodeAddressContext {
  /** Addresses of the node's own interfaces (any spelling). */
  localAddresses?: readonly string[];
  /** The node's sandbox address pool. */
  pool?: IpRange;
}

/**
 * The class of an address. IPv6 forms carrying IPv4 take the IPv4 address's class; with a
 * node context, the node's own addresses are `node` and the sandbox pool `sandbox-pool`.
 */
export function classifyAddress(a: IpAddress, node?: NodeAddressContext): AddressClass {
  const inner = embeddedIPv4(a);
  if (inner) return classifyAddress(inner, node);
  if (node?.pool && rangeContains(node.pool, a)) return 'sandbox-pool';
  if (node?.localAddresses?.length) {
    const text = formatIpAddress(a);
    for (const l of node.localAddresses) {
      const p = parseIpAddress(l);
      if (p && formatIpAddress(p) === text) return 'node';
    }
  }
  const table = a.family === 4 ? IPV4_CLASSES : IPV6_CLASSES;
  for (const [r, cls] of table) if (rangeContains(r, a)) return cls;
  if (a.family === 6 && !rangeContains(GLOBAL_UNICAST, a)) return 'reserved';
  return 'public';
}

/**
 * The class of the first special range a range overlaps (a /8 that holds 10.0.0.0/8 is
 * `private`), or `public`. An IPv6 range overlapping a form that carries IPv4 is `reserved`.
 */
export function classifyRange(r: IpRange): AddressClass {
  if (r.family === 6 && IPV4_CARRYING.some((c) => rangesOverlap(c, r))) return 'reserved';
  const table = r.family === 4 ? IPV4_CLASSES : IPV6_CLASSES;
  for (const [s, cls] of table) if (rangesOverlap(s, r)) return cls;
  if (r.family === 6 && !(r.prefix >= 3 && rangeContains(GLOBAL_UNICAST, { family: 6, bytes: r.bytes }))) return 'reserved';
  return 'public';
}

/** Names that mean the machine itself whatever DNS says (RFC 6761): `localhost` and below it. */
export function isLocalhostName(name: string): boolean {
  const n = name.toLowerCase().replace(/\.$/, '');
  return n === 'localhost' || n.endsWith('.localhost') || n === 'localhost.localdomain';
}

/**
 * Why `name` is not a DNS host name (letters, digits and inner hyphens in labels of 1-63
 * characters, 253 in all, one trailing dot allowed, not an IP literal in any spelling), or
 * undefined. `underscore` also allows `_` (seen in real names such as SRV-style labels).
 */
export function hostNameProblem(name: string, opts: { underscore?: boolean } = {}): string | undefined {
  const n = name.endsWith('.') ? name.slice(0, -1) : name;
  if (n.length === 0) return 'empty';
  if (n.length > MAX_DNS_NAME_LENGTH) return `longer than ${MAX_DNS_NAME_LENGTH} characters`;
  const label = opts.underscore ? /^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$/i : /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/i;
  for (const l of n.split('.')) {
    if (l.length === 0) return 'an empty label';
    if (l.length > MAX_DNS_LABEL_LENGTH) return `a label longer than ${MAX_DNS_LABEL_LENGTH} characters`;
    if (!label.test(l)) return `label ${JSON.stringify(l)} is not letters, digits or inner hyphens`;
  }
  if (looksLikeIpLiteral(n)) return 'an IP address, not a name';
  return undefined;
}
