import assert from 'node:assert/strict';
import { test } from 'node:test';
import { DsecError } from '@dsec/protocol';
import { AdmissionQueue } from './admission.js';
import type { Admitted } from './admission.js';

/** A capacity of `free` slots: attempts take one or are refused with QUOTA_EXCEEDED. */
class Slots {
  taken: string[] = [];
  constructor(public free: number) {}
  attempt(who: string, queue: AdmissionQueue): () => Promise<Admitted & { who: string }> {
    return async () => {
      if (this.free <= 0) throw new DsecError('QUOTA_EXCEEDED', 'full', { retryAfterMs: 1000 });
      this.free--;
      this.taken.push(who);
      return {
        who,
        release: async () => {
          this.free++;
          this.taken.splice(this.taken.indexOf(who), 1);
          queue.notify();
        },
      };
    };
  }
  /** Frees one slot taken by `who`, as a destroy would. */
  free1(queue: AdmissionQueue): void {
    this.free++;
    queue.notify();
  }
}

const tick = (ms = 10): Promise<void> => new Promise((r) => setTimeout(r, ms));

test('refuses at once without wait; admits at once when there is room', async () => {
  const q = new AdmissionQueue();
  const slots = new Slots(1);
  assert.equal((await q.admit('a', slots.attempt('a1', q))).who, 'a1');
  await assert.rejects(q.admit('a', slots.attempt('a2', q)), (e: DsecError) => e.code === 'QUOTA_EXCEEDED');
  assert.equal(q.waiting(), 0);
  q.close();
});

test('waiters are admitted as capacity frees, FIFO in a project and round-robin across projects', async () => {
  const q = new AdmissionQueue({ recheckMs: 60_000 });
  const slots = new Slots(0);
  const order: string[] = [];
  const wait = (project: string, who: string): Promise<void> =>
    q.admit(project, slots.attempt(who, q), { wait: true, timeoutMs: 10_000 }).then((a) => void order.push(a.who));
  const all = [wait('a', 'a1'), wait('a', 'a2'), wait('a', 'a3'), wait('b', 'b1'), wait('b', 'b2')];
  await tick();
  assert.equal(q.waiting(), 5);
  assert.equal(q.waiting('a'), 3);
  for (let i = 0; i < 5; i++) {
    slots.free1(q);
    await tick();
  }
  await Promise.all(all);
  // One admission per project per round: a project with many waiters cannot starve another.
  assert.deepEqual(order, ['a1', 'b1', 'a2', 'b2', 'a3']);
  assert.equal(q.waiting(), 0);
  q.close();
});

test('a project with waiters refuses its new non-waiting requests; a new waiter queues behind them', async () => {
  const q = new AdmissionQueue({ recheckMs: 60_000 });
  const slots = new Slots(0);
  const first = q.admit('a', slots.attempt('a1', q), { wait: true, timeoutMs: 10_000 });
  await tick();
  slots.free = 1; // room appears without a notify: the next request must not jump the queue
  await assert.rejects(q.admit('a', slots.attempt('a2', q)), (e: DsecError) => e.code === 'QUOTA_EXCEEDED' && /waiting/.test(e.message));
  assert.equal(slots.free, 1);
  q.notify();
  assert.equal((await first).who, 'a1');
  q.close();
});

test('a wait times out with the refusal, its reason and Retry-After; a cancel leaves the queue', async () => {
  const q = new AdmissionQueue({ recheckMs: 60_000 });
  const slots = new Slots(0);
  await assert.rejects(q.admit('a', slots.attempt('a1', q), { wait: true, timeoutMs: 50 }), (e: DsecError) => {
    assert.equal(e.code, 'QUOTA_EXCEEDED');
    assert.equal(e.details.reason, 'wait-timeout');
    assert.equal(typeof e.details.retryAfterMs, 'number');
    return true;
  });
  const ac = new AbortController();
  const cancelled = q.admit('a', slots.attempt('a2', q), { wait: true, timeoutMs: 10_000, signal: ac.signal });
  await tick();
  assert.equal(q.waiting(), 1);
  ac.abort();
  await assert.rejects(cancelled, (e: DsecError) => e.code === 'CANCELLED');
  assert.equal(q.waiting(), 0);
  slots.free1(q);
  await tick();
  // Nobody took the freed slot: the cancelled request is gone for good.
  assert.equal(slots.free, 1);
  assert.deepEqual(slots.taken, []);
  q.close();
});

test('the queue is bounded: past its limits a request is refused with ADMISSION_QUEUE_FULL', async () => {
  const q = new AdmissionQueue({ maxQueued: 3, maxQueuedPerProject: 2, recheckMs: 60_000 });
  const slots = new Slots(0);
  const waiting = [q.admit('a', slots.attempt('a1', q), { wait: true }), q.admit('a', slots.attempt('a2', q), { wait: true })];
  await tick();
  await assert.rejects(q.admit('a', slots.attempt('a3', q), { wait: true }), (e: DsecError) => e.code === 'ADMISSION_QUEUE_FULL' && e.status === 429);
  waiting.push(q.admit('b', slots.attempt('b1', q), { wait: true }));
  await tick();
  await assert.rejects(q.admit('c', slots.attempt('c1', q), { wait: true }), (e: DsecError) => e.code === 'ADMISSION_QUEUE_FULL');
  q.close();
  for (const w of waiting) await assert.rejects(w, (e: DsecError) => e.code === 'UNAVAILABLE');
  assert.equal(q.waiting(), 0);
});

test('other errors of an attempt end the wait at once', async () => {
  const q = new AdmissionQueue({ recheckMs: 60_000 });
  let calls = 0;
  const attempt = async (): Promise<Admitted> => {
    calls++;
    if (calls === 1) throw new DsecError('QUOTA_EXCEEDED', 'full');
    throw new DsecError('INVALID_ARGUMENT', 'bad');
  };
  const p = q.admit('a', attempt, { wait: true, timeoutMs: 10_000 });
  q.notify();
  await assert.rejects(p, (e: DsecError) => e.code === 'INVALID_ARGUMENT');
  assert.equal(q.waiting(), 0);
  q.close();
});
