// WebSocket tickets: single use, expiry, the bound on outstanding tickets, and the sub-protocol form.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { MAX_OUTSTANDING_TICKETS, MAX_TICKETS_PER_KEY, WS_TICKET_TTL_MS, WsTickets, ticketFromProtocols } from './ws-tickets.js';

describe('WebSocket tickets', () => {
  test('a ticket stands for its key once, and expires', async () => {
    assert.ok(WS_TICKET_TTL_MS <= 30_000);
    const t = new WsTickets();
    const a = t.issue('Bearer dsec_a', 'key_a');
    assert.match(a.ticket, /^[A-Za-z0-9_-]{32}$/);
    assert.ok(Date.parse(a.expiresAt) - Date.now() <= WS_TICKET_TTL_MS);
    assert.equal(t.redeem(a.ticket), 'Bearer dsec_a');
    assert.equal(t.redeem(a.ticket), undefined, 'single use');
    assert.equal(t.redeem('nope'), undefined);
    const short = new WsTickets(20);
    const b = short.issue('Bearer dsec_b', 'key_b');
    await new Promise((r) => setTimeout(r, 40));
    assert.equal(short.redeem(b.ticket), undefined, 'expired');
  });

  test('outstanding tickets are bounded; expired ones are swept', async () => {
    const t = new WsTickets(10);
    const first = t.issue('Bearer dsec_x', 'key_x');
    await new Promise((r) => setTimeout(r, 20));
    t.issue('Bearer dsec_y', 'key_y');
    assert.equal(t.size, 1, 'the expired ticket went at the next issue');
    assert.equal(t.redeem(first.ticket), undefined);
    // One key asking for many tickets drops only its own oldest ones.
    const many = new WsTickets();
    const other = many.issue('Bearer dsec_other', 'key_other');
    const mine = Array.from({ length: MAX_TICKETS_PER_KEY + 5 }, () => many.issue('Bearer dsec_z', 'key_z'));
    assert.equal(many.size, MAX_TICKETS_PER_KEY + 1);
    assert.equal(many.redeem(mine[0]!.ticket), undefined, 'its oldest went');
    assert.equal(many.redeem(mine.at(-1)!.ticket), 'Bearer dsec_z');
    assert.equal(many.redeem(other.ticket), 'Bearer dsec_other', "another key's ticket stays");
    // All keys together: at most MAX_OUTSTANDING_TICKETS.
    const all = new WsTickets();
    for (let i = 0; i < MAX_OUTSTANDING_TICKETS + 5; i++) all.issue(`Bearer dsec_${i}`, `key_${i}`);
    assert.equal(all.size, MAX_OUTSTANDING_TICKETS);
  });

  test("the per-key cap counts by key id, whatever the header's case or spacing", () => {
    const t = new WsTickets();
    const other = t.issue('Bearer dsec_other', 'key_other');
    const spellings = ['Bearer dsec_z', 'bearer dsec_z', 'Bearer  dsec_z', 'BEARER dsec_z'];
    const mine = Array.from({ length: MAX_TICKETS_PER_KEY * 4 }, (_, i) => t.issue(spellings[i % spellings.length]!, 'key_z'));
    assert.equal(t.size, MAX_TICKETS_PER_KEY + 1, 'one key, however it spells its header, holds at most its cap');
    assert.equal(t.redeem(mine.at(-1)!.ticket), 'BEARER dsec_z', 'the ticket keeps the header it was issued for');
    assert.equal(t.redeem(other.ticket), 'Bearer dsec_other');
  });

  test('the ticket is read from the offered sub-protocols', () => {
    assert.equal(ticketFromProtocols('dsec.v1, dsec.ticket.abc_-1'), 'abc_-1');
    assert.equal(ticketFromProtocols(['dsec.v1', 'dsec.ticket.x']), 'x');
    assert.equal(ticketFromProtocols('dsec.v1'), undefined);
    assert.equal(ticketFromProtocols(undefined), undefined);
  });
});
