// HTTP header handling for forwarded requests: hop-by-hop headers stay on their hop.
import type { IncomingHttpHeaders, IncomingMessage, OutgoingHttpHeaders } from 'node:http';

/** Headers that describe one connection, never forwarded (RFC 9110 7.6.1), plus proxy credentials. */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'expect',
]);

function connectionTokens(headers: IncomingHttpHeaders): Set<string> {
  const c = headers.connection;
  return new Set(
    (typeof c === 'string' ? c : '')
      .split(',')
      .map((t) => t.trim().toLowerCase())
      .filter(Boolean),
  );
}

/** `headers` without hop-by-hop ones (and those the Connection header names). */
export function endToEndHeaders(headers: IncomingHttpHeaders): OutgoingHttpHeaders {
  const named = connectionTokens(headers);
  const out: OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(headers)) {
    if (v === undefined || HOP_BY_HOP.has(k) || named.has(k)) continue;
    out[k] = v;
  }
  return out;
}

/** Approximate bytes of a request or status line plus headers on the wire. */
export function headBytes(firstLine: string, rawHeaders: readonly string[]): number {
  let n = firstLine.length + 4;
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) n += rawHeaders[i]!.length + rawHeaders[i + 1]!.length + 4;
  return n;
}

/**
 * The request head of an Upgrade request as it goes upstream (the tunnel carries the rest): the
 * origin-form path, `Host` set to the destination, proxy headers dropped.
 */
export function upgradeHead(req: IncomingMessage, path: string, authority: string): Buffer {
  const lines = [`${req.method ?? 'GET'} ${path} HTTP/1.1`, `Host: ${authority}`];
  for (let i = 0; i + 1 < req.rawHeaders.length; i += 2) {
    const name = req.rawHeaders[i]!;
    const lower = name.toLowerCase();
    if (lower === 'host' || lower === 'proxy-connection' || lower === 'proxy-authorization') continue;
    lines.push(`${name}: ${req.rawHeaders[i + 1]!}`);
  }
  return Buffer.from(lines.join('\r\n') + '\r\n\r\n', 'latin1');
}
