// WebSocket tickets in the state store (SQLite here; test/store.test.ts redeems one across two
// PostgreSQL stores): single use (also when redeemed concurrently), expiry, only the hash kept,
// the per-key bound, and the sub-protocol form.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import Database from 'better-sqlite3';
import { sql } from 'kysely';
import { StateStore } from './db/store.js';
import { MAX_TICKETS_PER_KEY, WS_TICKET_TTL_MS, WsTickets, ticketFromProtocols } from './ws-tickets.js';

describe('WebSocket tickets', () => {
  let store: StateStore;
  before(async () => {
    store = await StateStore.openSqlite(new Database(':memory:'));
  });
  after(async () => {
    await store.close();
  });

  test('a ticket stands for its key once, and expires; only its hash is stored', async () => {
    assert.ok(WS_TICKET_TTL_MS <= 30_000);
    const t = new WsTickets(store);
    const a = await t.issue('key_a');
    assert.match(a.ticket, /^[A-Za-z0-9_-]{32}$/);
    assert.ok(Date.parse(a.expiresAt) - Date.now() <= WS_TICKET_TTL_MS);
    const rows = await sql<Record<string, string>>`SELECT * FROM ws_tickets`.execute(store.db);
    assert.ok(!JSON.stringify(rows.rows).includes(a.ticket), 'the ticket itself is not stored');
    assert.equal(await t.redeem(a.ticket), 'key_a');
    assert.equal(await t.redeem(a.ticket), undefined, 'single use');
    assert.equal(await t.redeem('nope'), undefined);
    const short = new WsTickets(store, 20);
    const b = await short.issue('key_b');
    await new Promise((r) => setTimeout(r, 40));
    assert.equal(await short.redeem(b.ticket), undefined, 'expired');
  });

  test('of concurrent redemptions of one ticket exactly one succeeds', async () => {
    const t = new WsTickets(store);
    const { ticket } = await t.issue('key_c');
    const got = await Promise.all(Array.from({ length: 8 }, () => t.redeem(ticket)));
    assert.deepEqual(
      got.filter((k) => k !== undefined),
      ['key_c'],
    );
  });

  test('expired tickets are swept; one key asking for many drops only its own oldest', async () => {
    const short = new WsTickets(store, 10);
    await short.issue('key_x');
    await new Promise((r) => setTimeout(r, 20));
    const t = new WsTickets(store);
    const before = await t.size();
    const other = await t.issue('key_other');
    assert.equal(await t.size(), before, 'the expired ticket went at the next issue');
    const mine = [];
    for (let i = 0; i < MAX_TICKETS_PER_KEY + 5; i++) mine.push(await t.issue('key_z'));
    assert.equal(await t.redeem(mine[0]!.ticket), undefined, 'its oldest went');
    assert.equal(await t.redeem(mine[4]!.ticket), undefined);
    assert.equal(await t.redeem(mine[5]!.ticket), 'key_z');
    assert.equal(await t.redeem(mine.at(-1)!.ticket), 'key_z');
    assert.equal(await t.redeem(other.ticket), 'key_other', "another key's ticket stays");
  });

  test('the ticket is read from the offered sub-protocols', () => {
    assert.equal(ticketFromProtocols('dsec.v1, dsec.ticket.abc_-1'), 'abc_-1');
    assert.equal(ticketFromProtocols(['dsec.v1', 'dsec.ticket.x']), 'x');
    assert.equal(ticketFromProtocols('dsec.v1'), undefined);
    assert.equal(ticketFromProtocols(undefined), undefined);
  });
});
