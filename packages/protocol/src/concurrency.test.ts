import assert from 'node:assert/strict';
import { test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { KeyedSerialQueue, forEachBounded } from './concurrency.js';

test('forEachBounded never runs more than its limit and visits every item once', async () => {
  let running = 0;
  let most = 0;
  const seen: number[] = [];
  await forEachBounded([1, 2, 3, 4, 5, 6, 7], 3, async (n) => {
    running++;
    most = Math.max(most, running);
    await sleep(2);
    seen.push(n);
    running--;
  });
  assert.equal(most, 3);
  assert.deepEqual(seen.sort(), [1, 2, 3, 4, 5, 6, 7]);
});

test('forEachBounded takes no new item once stop says so', async () => {
  const started: number[] = [];
  await forEachBounded(
    [1, 2, 3, 4],
    1,
    async (n) => void started.push(n),
    () => started.length >= 2,
  );
  assert.deepEqual(started, [1, 2]);
});

test('KeyedSerialQueue runs one key in order, a failure does not stop the next, keys run side by side', async () => {
  const q = new KeyedSerialQueue();
  const order: string[] = [];
  const a1 = q.run('a', async () => {
    await sleep(5);
    order.push('a1');
    throw new Error('a1 failed');
  });
  const a2 = q.run('a', async () => void order.push('a2'));
  const b1 = q.run('b', async () => void order.push('b1'));
  await assert.rejects(a1, /a1 failed/);
  await Promise.all([a2, b1]);
  assert.deepEqual(order, ['b1', 'a1', 'a2']);
  assert.equal(q.pending('a'), undefined, 'forgotten once idle');
});
