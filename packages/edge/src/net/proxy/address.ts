// Destinations as the egress proxy sees them: parsing of Host headers, CONNECT targets and SNI
// names, and IP-literal detection. (Which addresses may be dialled is the policy's question.)
import type { IncomingMessage } from 'node:http';
import { isIP, isIPv4, isIPv6 } from 'node:net';

/** Longest DNS name accepted as a destination (RFC 1035, without the trailing dot). */
export const MAX_HOSTNAME_LENGTH = 253;

/** `::ffff:a.b.c.d` -> `a.b.c.d`; any other address unchanged (lower-cased). */
export function normalizeAddress(ip: string): string {
  const lower = ip.toLowerCase();
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(lower);
  if (mapped && isIPv4(mapped[1]!)) return mapped[1]!;
  return lower;
}

/**
 * True when `host` is an IP literal or something a resolver would treat as one: dotted quads,
 * IPv6, and the numeric forms inet_aton accepts (`2130706433`, `0x7f.1`, `127.1`). A DNS top-level
 * label is never all-numeric, so any name whose last label is numeric or hex counts as literal.
 */
export function isIpLiteralLike(host: string): boolean {
  if (isIP(host)) return true;
  const labels = host.split('.');
  const last = labels[labels.length - 1] ?? '';
  return /^(\d+|0x[0-9a-f]*)$/i.test(last);
}

/** A destination as named by the client: host (lower case, no brackets, no trailing dot), port. */
export interface Destination {
  host: string;
  port: number;
}

/**
 * Normalises a host name or IP literal: lower case, brackets and one trailing dot removed.
 * Returns undefined when it is neither a valid DNS name nor an IP address.
 */
export function normalizeHost(raw: string): string | undefined {
  let host = raw.trim().toLowerCase();
  if (host.startsWith('[') && host.endsWith(']')) {
    host = host.slice(1, -1);
    return isIP(host) === 6 ? normalizeAddress(host) : undefined;
  }
  if (isIP(host)) return normalizeAddress(host);
  if (host.endsWith('.')) host = host.slice(0, -1);
  if (host.length === 0 || host.length > MAX_HOSTNAME_LENGTH) return undefined;
  // Letters, digits, hyphens and underscores (seen in real names, e.g. SRV-style labels).
  for (const label of host.split('.')) {
    if (!/^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$/.test(label)) return undefined;
  }
  return host;
}

/**
 * Parses an authority (`host`, `host:port`, `[v6]`, `[v6]:port`) as found in a Host header or a
 * CONNECT target. `defaultPort` applies when the authority names none; undefined when malformed.
 */
export function parseAuthority(authority: string, defaultPort?: number): Destination | undefined {
  const s = authority.trim();
  let hostPart: string;
  let portPart: string | undefined;
  if (s.startsWith('[')) {
    const end = s.indexOf(']');
    if (end < 0) return undefined;
    hostPart = s.slice(0, end + 1);
    const rest = s.slice(end + 1);
    if (rest !== '') {
      if (!rest.startsWith(':')) return undefined;
      portPart = rest.slice(1);
    }
  } else {
    const colon = s.lastIndexOf(':');
    if (colon >= 0) {
      if (s.indexOf(':') !== colon) return undefined; // a bare IPv6 address needs brackets
      hostPart = s.slice(0, colon);
      portPart = s.slice(colon + 1);
    } else hostPart = s;
  }
  const host = normalizeHost(hostPart);
  if (host === undefined) return undefined;
  let port = defaultPort;
  if (portPart !== undefined) {
    if (!/^\d{1,5}$/.test(portPart)) return undefined;
    port = Number(portPart);
  }
  if (port === undefined || port < 1 || port > 65535) return undefined;
  return { host, port };
}

/** `host:port`, with brackets around IPv6. */
export function formatDestination(d: Destination): string {
  return isIP(d.host) === 6 ? `[${d.host}]:${d.port}` : `${d.host}:${d.port}`;
}

/** A plain-HTTP request's destination, its origin-form path, and the Host value to send upstream. */
export interface HttpTarget {
  dest: Destination;
  path: string;
  authority: string;
}

/** Matches the absolute-form target of a plain-HTTP proxy request. */
const ABSOLUTE_HTTP = /^http:\/\/([^/?#]*)(.*)$/i;

/**
 * The destination, origin-form path and Host value of a plain-HTTP request: from its absolute URL
 * (explicit proxy) or its Host header (transparent, where `transparentPort` is the default port).
 */
export function httpTarget(via: 'http' | 'transparent-http', req: IncomingMessage, transparentPort: number): HttpTarget | { error: string } {
  const url = req.url ?? '';
  const abs = ABSOLUTE_HTTP.exec(url);
  let authority: string;
  let path: string;
  if (abs) {
    authority = abs[1]!;
    path = abs[2] || '/';
    if (!path.startsWith('/')) path = '/' + path;
  } else if (via === 'http') {
    return { error: /^https:/i.test(url) ? 'https URLs go through CONNECT' : 'a proxy request needs an absolute http:// URL' };
  } else {
    const host = req.headers.host;
    if (!host) return { error: 'no Host header' };
    if (!url.startsWith('/')) return { error: `unsupported request target ${url.slice(0, 100)}` };
    authority = host;
    path = url;
  }
  if (authority.includes('@')) return { error: 'credentials in the URL are not forwarded' };
  const dest = parseAuthority(authority, via === 'http' ? 80 : transparentPort);
  if (!dest) return { error: `invalid host ${authority.slice(0, 300)}` };
  const hostPart = isIPv6(dest.host) ? `[${dest.host}]` : dest.host;
  return { dest, path, authority: dest.port === 80 ? hostPart : `${hostPart}:${dest.port}` };
}
