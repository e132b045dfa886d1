// Destinations as the egress proxy sees them: parsing of Host headers, CONNECT targets and SNI
// names, and IP-literal detection. (Which addresses may be dialled is the policy's question.)
import type { IncomingMessage } from 'node:http';
import { isIP, isIPv6 } from 'node:net';
import { embeddedIPv4, formatIpAddress, hostNameProblem, looksLikeIpLiteral, parseIPv4, parseIPv6, parseIpAddress } from '@dsec/protocol';

/** `::ffff:a.b.c.d` (and every other IPv6 form carrying IPv4) -> `a.b.c.d`; any address in its canonical text. */
export function normalizeAddress(ip: string): string {
  const a = parseIpAddress(ip);
  if (!a) return ip.toLowerCase();
  return formatIpAddress(a.family === 6 ? (embeddedIPv4(a) ?? a) : a);
}

/**
 * True when `host` is an IP literal or something a resolver would treat as one: dotted quads,
 * IPv6, and the numeric forms inet_aton accepts (`2130706433`, `0x7f.1`, `127.1`). A DNS top-level
 * label is never all-numeric, so any name whose last label is numeric or hex counts as literal.
 */
export function isIpLiteralLike(host: string): boolean {
  return looksLikeIpLiteral(host);
}

/** A destination as named by the client: host (lower case, no brackets, no trailing dot), port. */
export interface Destination {
  host: string;
  port: number;
}

/**
 * Normalises a host name or IP literal: lower case, brackets and one trailing dot removed; an IP
 * literal in any spelling (`0x7f.1`, `[::ffff:7f00:1]`) becomes its canonical text, IPv4 for the
 * IPv6 forms that carry one, so that every spelling meets the same checks. Returns undefined when
 * it is neither a valid DNS name nor an IP address (a numeric-looking name that is no address).
 */
export function normalizeHost(raw: string): string | undefined {
  let host = raw.trim().toLowerCase();
  if (host.startsWith('[') && host.endsWith(']')) {
    const a = parseIPv6(host.slice(1, -1));
    return a && !host.includes('%') ? normalizeAddress(formatIpAddress(a)) : undefined;
  }
  if (host.includes(':')) return isIP(host) === 6 ? normalizeAddress(host) : undefined;
  if (looksLikeIpLiteral(host)) {
    const a = parseIPv4(host);
    return a ? formatIpAddress(a) : undefined;
  }
  if (host.endsWith('.')) host = host.slice(0, -1);
  // Letters, digits, hyphens and underscores (seen in real names, e.g. SRV-style labels).
  return hostNameProblem(host, { underscore: true }) === undefined ? host : undefined;
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
