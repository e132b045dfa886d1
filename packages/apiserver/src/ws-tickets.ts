// Single-use tickets for WebSockets (POST /v1/ws-tickets). A browser cannot put an
// `Authorization` header on a WebSocket, and a key must never travel in a URL: the dashboard asks
// for a ticket with its key header, then offers it as a WebSocket sub-protocol
// (`Sec-WebSocket-Protocol: dsec.v1, dsec.ticket.<ticket>`). A ticket stands for the key that
// asked for it, is valid once and for at most 30 s, and lives in the state store (table
// `ws_tickets`, migration 0018_live), so that a ticket one replica issued opens a WebSocket on
// another. Only its SHA-256 is kept; it is never logged nor in the audit (the audit records the
// route, not the body). Redemption is one `DELETE ... RETURNING`: of two replicas redeeming one
// ticket at once, exactly one gets it (SQLite and PostgreSQL alike).
import { createHash, randomBytes } from 'node:crypto';
import type { Kysely, Migration } from 'kysely';
import type { StateStore } from './db/store.js';

/** How long a ticket may wait for its WebSocket (ms). */
export const WS_TICKET_TTL_MS = 30_000;
/** The sub-protocol the server answers with when a client offers it (the dashboard always does). */
export const WS_PROTOCOL = 'dsec.v1';
/** Prefix of the sub-protocol that carries a ticket. */
export const WS_TICKET_PROTOCOL_PREFIX = 'dsec.ticket.';
/** Tickets outstanding at once for one key; past it that key's oldest are dropped (not another key's). */
export const MAX_TICKETS_PER_KEY = 64;

/** What POST /v1/ws-tickets answers. */
export interface WsTicket {
  ticket: string;
  expiresAt: string;
}

/** A row of `ws_tickets`. */
interface WsTicketRow {
  ticket_hash: string;
  key_id: string;
  created_at: string;
  expires_at: string;
}

interface Tables {
  ws_tickets: WsTicketRow;
}

/** Migration 0018_live_ws_tickets: the outstanding WebSocket tickets, by their hash. */
export const migration0018LiveWsTickets: Migration = {
  async up(db: Kysely<unknown>): Promise<void> {
    await db.schema
      .createTable('ws_tickets')
      .addColumn('ticket_hash', 'text', (c) => c.primaryKey())
      .addColumn('key_id', 'text', (c) => c.notNull())
      .addColumn('created_at', 'text', (c) => c.notNull())
      .addColumn('expires_at', 'text', (c) => c.notNull())
      .execute();
    await db.schema.createIndex('ws_tickets_key').on('ws_tickets').columns(['key_id', 'created_at']).execute();
    await db.schema.createIndex('ws_tickets_expiry').on('ws_tickets').column('expires_at').execute();
  },
};

function hashTicket(ticket: string): string {
  return createHash('sha256').update(ticket).digest('hex');
}

/** Outstanding tickets in the state store: each stands for the key (by id) that asked for it. */
export class WsTickets {
  constructor(
    private readonly store: Pick<StateStore, 'db'>,
    private readonly ttlMs = WS_TICKET_TTL_MS,
  ) {}

  private get db(): Kysely<Tables> {
    return this.store.db as unknown as Kysely<Tables>;
  }

  /** A new ticket for the key `keyId` (the caller has authenticated it). */
  async issue(keyId: string): Promise<WsTicket> {
    const ticket = randomBytes(24).toString('base64url');
    const now = Date.now();
    const row: WsTicketRow = {
      ticket_hash: hashTicket(ticket),
      key_id: keyId,
      // Sub-millisecond order among one key's tickets: the cap drops the oldest.
      created_at: `${new Date(now).toISOString()}|${process.hrtime.bigint().toString().padStart(24, '0')}`,
      expires_at: new Date(now + this.ttlMs).toISOString(),
    };
    await this.db.transaction().execute(async (tx) => {
      await tx.deleteFrom('ws_tickets').where('expires_at', '<=', new Date(now).toISOString()).execute();
      // One key asking for many only drops its own oldest tickets.
      const own = await tx.selectFrom('ws_tickets').select('ticket_hash').where('key_id', '=', keyId).orderBy('created_at', 'desc').execute();
      const excess = own.slice(MAX_TICKETS_PER_KEY - 1).map((r) => r.ticket_hash);
      if (excess.length > 0) await tx.deleteFrom('ws_tickets').where('ticket_hash', 'in', excess).execute();
      await tx.insertInto('ws_tickets').values(row).execute();
    });
    return { ticket, expiresAt: row.expires_at };
  }

  /** The key id a ticket stands for, once; undefined when unknown, used or expired. */
  async redeem(ticket: string): Promise<string | undefined> {
    const row = await this.db.deleteFrom('ws_tickets').where('ticket_hash', '=', hashTicket(ticket)).returning(['key_id', 'expires_at']).executeTakeFirst();
    if (!row) return undefined;
    return Date.parse(row.expires_at) > Date.now() ? row.key_id : undefined;
  }

  /** Tickets outstanding (expired ones included until the next issue sweeps them). */
  async size(): Promise<number> {
    const r = await this.db
      .selectFrom('ws_tickets')
      .select((eb) => eb.fn.countAll<number>().as('n'))
      .executeTakeFirstOrThrow();
    return Number(r.n);
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
