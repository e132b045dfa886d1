// Single-use tickets for WebSockets (POST /v1/ws-tickets). A browser cannot put an
// `Authorization` header on a WebSocket, and a key must never travel in a URL: the dashboard asks
// for a ticket with its key header, then offers it as a WebSocket sub-protocol
// (`Sec-WebSocket-Protocol: dsec.v1, dsec.ticket.<ticket>`). A ticket stands for the key that
// asked for it, is valid once and for at most 30 s, and is kept only in this process's memory
// (never logged, never in the audit: the audit records the route, not the body).
import { randomBytes } from 'node:crypto';

/** How long a ticket may wait for its WebSocket (ms). */
export const WS_TICKET_TTL_MS = 30_000;
/** The sub-protocol the server answers with when a client offers it (the dashboard always does). */
export const WS_PROTOCOL = 'dsec.v1';
/** Prefix of the sub-protocol that carries a ticket. */
export const WS_TICKET_PROTOCOL_PREFIX = 'dsec.ticket.';
/** Tickets outstanding at once, all keys together; past it the oldest are dropped. */
export const MAX_OUTSTANDING_TICKETS = 10_000;
/** Tickets outstanding at once for one key; past it that key's oldest is dropped (not another key's). */
export const MAX_TICKETS_PER_KEY = 64;

/** What POST /v1/ws-tickets answers. */
export interface WsTicket {
  ticket: string;
  expiresAt: string;
}

/** Outstanding tickets: each maps to the `Authorization` value of the request that asked for it. */
export class WsTickets {
  private readonly tickets = new Map<string, { authorization: string; keyId: string; expires: number }>();
  /** Each key's outstanding tickets (by key id, not by header text: `bearer  k` is `Bearer k`), oldest first. */
  private readonly byKey = new Map<string, Set<string>>();

  constructor(private readonly ttlMs = WS_TICKET_TTL_MS) {}

  /** A new ticket for the key `keyId` that sent `authorization` (already authenticated by the caller). */
  issue(authorization: string, keyId: string): WsTicket {
    this.sweep();
    // One key asking for many only drops its own oldest tickets.
    const own = this.byKey.get(keyId);
    while (own && own.size >= MAX_TICKETS_PER_KEY) this.drop(own.values().next().value!);
    while (this.tickets.size >= MAX_OUTSTANDING_TICKETS) this.drop(this.tickets.keys().next().value!);
    const ticket = randomBytes(24).toString('base64url');
    const expires = Date.now() + this.ttlMs;
    this.tickets.set(ticket, { authorization, keyId, expires });
    (this.byKey.get(keyId) ?? this.byKey.set(keyId, new Set()).get(keyId)!).add(ticket);
    return { ticket, expiresAt: new Date(expires).toISOString() };
  }

  /** The `Authorization` value a ticket stands for, once; undefined when unknown, used or expired. */
  redeem(ticket: string): string | undefined {
    const t = this.tickets.get(ticket);
    if (!t) return undefined;
    this.drop(ticket);
    return t.expires > Date.now() ? t.authorization : undefined;
  }

  /** Tickets outstanding (expired ones included until the next sweep). */
  get size(): number {
    return this.tickets.size;
  }

  private drop(ticket: string): void {
    const t = this.tickets.get(ticket);
    if (!t) return;
    this.tickets.delete(ticket);
    const own = this.byKey.get(t.keyId);
    own?.delete(ticket);
    if (own?.size === 0) this.byKey.delete(t.keyId);
  }

  /** Drops expired tickets: they are in issue order, so the walk stops at the first live one. */
  private sweep(): void {
    const now = Date.now();
    for (const [k, t] of this.tickets) {
      if (t.expires > now) break;
      this.drop(k);
    }
  }
}

/** The ticket offered in a `Sec-WebSocket-Protocol` header, if any. */
export function ticketFromProtocols(header: string | string[] | undefined): string | undefined {
  const text = Array.isArray(header) ? header.join(',') : (header ?? '');
  for (const p of text.split(',')) {
    const v = p.trim();
    if (v.startsWith(WS_TICKET_PROTOCOL_PREFIX)) return v.slice(WS_TICKET_PROTOCOL_PREFIX.length);
  }
  return undefined;
}
