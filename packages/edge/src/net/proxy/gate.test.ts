import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ConnectionGate } from './gate.js';
import type { GatePass, GateRefusal } from './gate.js';

const passed = (r: GatePass | GateRefusal): GatePass => {
  if ('refused' in r) throw new Error(`refused: ${r.detail}`);
  return r;
};

test('admits up to the sandbox limit at once, then queues first come first served', async () => {
  const gate = new ConnectionGate({ maxPerSandbox: 2, maxTotal: 100, queueTimeoutMs: 5_000 });
  const a = passed(await gate.admit('a'));
  const b = passed(await gate.admit('a'));
  assert.equal(a.waitedMs, 0);
  const order: number[] = [];
  const third = gate.admit('a').then((r) => (order.push(3), passed(r)));
  const fourth = gate.admit('a').then((r) => (order.push(4), passed(r)));
  assert.equal(gate.waitingOf('a'), 2);
  // Another sandbox is not held up by a's queue.
  passed(await gate.admit('b')).release();
  a.release();
  const t = await third;
  assert.equal(gate.openOf('a'), 2);
  b.release();
  const f = await fourth;
  assert.deepEqual(order, [3, 4]);
  t.release();
  f.release();
  f.release(); // idempotent
  assert.equal(gate.openOf('a'), 0);
  assert.equal(gate.totalOpen, 0);
});

test('a newcomer does not overtake a waiter of its own sandbox', async () => {
  const gate = new ConnectionGate({ maxPerSandbox: 1, maxTotal: 100, queueTimeoutMs: 5_000 });
  const first = passed(await gate.admit('a'));
  const waiter = gate.admit('a');
  first.release(); // the waiter is admitted (asynchronously); a newcomer now must queue behind it
  const newcomer = gate.admit('a');
  const w = passed(await waiter);
  assert.equal(gate.waitingOf('a'), 1);
  w.release();
  passed(await newcomer).release();
  assert.equal(gate.totalOpen, 0);
});

test('the node limit queues every sandbox; a wait ends in a refusal naming the limit', async () => {
  const queued: string[] = [];
  const gate = new ConnectionGate({ maxPerSandbox: 10, maxTotal: 2, queueTimeoutMs: 50, onQueued: (k, limit) => queued.push(`${k}:${limit}`) });
  const p1 = passed(await gate.admit('a'));
  const p2 = passed(await gate.admit('b'));
  const r = await gate.admit('c');
  assert.ok('refused' in r);
  assert.equal(r.refused, 'node');
  assert.match(r.detail, /^node limit of 2 connections \(waited 0 s\)$/);
  assert.deepEqual(queued, ['c:node']);
  assert.equal(gate.waiting, 0);
  p1.release();
  p2.release();
});

test('a client that leaves while it waits leaves the queue', async () => {
  const gate = new ConnectionGate({ maxPerSandbox: 1, maxTotal: 10, queueTimeoutMs: 5_000 });
  const p = passed(await gate.admit('a'));
  let abandon: () => void = () => {};
  const waiting = gate.admit('a', (fn) => (abandon = fn));
  assert.equal(gate.waiting, 1);
  abandon();
  const r = await waiting;
  assert.ok('refused' in r);
  assert.equal(gate.waiting, 0);
  p.release();
  assert.equal(gate.totalOpen, 0);
});

test('queue timeout 0 refuses at once; close refuses waiters', async () => {
  const now = new ConnectionGate({ maxPerSandbox: 1, queueTimeoutMs: 0 });
  const p = passed(await now.admit('a'));
  const r = await now.admit('a');
  assert.ok('refused' in r && r.refused === 'sandbox');
  p.release();

  const gate = new ConnectionGate({ maxPerSandbox: 1, queueTimeoutMs: 5_000 });
  const q = passed(await gate.admit('a'));
  const waiting = gate.admit('a');
  gate.close();
  const c = await waiting;
  assert.ok('refused' in c && c.refused === 'closed');
  q.release();
  const after = await gate.admit('b');
  assert.ok('refused' in after && after.refused === 'closed');
});
