import assert from 'node:assert/strict';
import { test } from 'node:test';
import { WarmPool } from './pool.js';

function counting(): { pool: WarmPool<number>; created: () => number; discarded: number[] } {
  let next = 0;
  const discarded: number[] = [];
  const pool = new WarmPool<number>({ create: () => Promise.resolve(++next), discard: (i) => discarded.push(i), healthy: () => true }, { min: 1, max: 4 });
  return { pool, created: () => next, discarded };
}

test('a recycled item comes back after its reset and is handed out again, not discarded', async () => {
  const { pool, discarded } = counting();
  try {
    const first = await pool.claim();
    let finish!: (ok: boolean) => void;
    pool.recycle(first, () => new Promise<boolean>((r) => (finish = r)));
    const seen = [await pool.claim()];
    assert.notEqual(seen[0], first, 'not handed out while its reset runs');
    finish(true);
    await new Promise((r) => setImmediate(r));
    for (let i = 0; i < 4 && !seen.includes(first); i++) seen.push(await pool.claim());
    assert.ok(seen.includes(first), `claimed: ${seen.join(',')}`);
    assert.deepEqual(discarded, []);
  } finally {
    await pool.close();
  }
});

test('an item whose reset fails or throws is discarded, never handed out', async () => {
  const { pool, discarded } = counting();
  try {
    const a = await pool.claim();
    const b = await pool.claim();
    pool.recycle(a, () => Promise.resolve(false));
    pool.recycle(b, () => Promise.reject(new Error('reset failed')));
    await new Promise((r) => setTimeout(r, 10));
    assert.deepEqual(discarded.sort(), [a, b].sort());
    const c = await pool.claim();
    assert.ok(c !== a && c !== b);
  } finally {
    await pool.close();
  }
});

test('an item recycled while the pool closes is discarded', async () => {
  const { pool, discarded } = counting();
  const a = await pool.claim();
  let finish!: (ok: boolean) => void;
  pool.recycle(a, () => new Promise<boolean>((r) => (finish = r)));
  const closed = pool.close();
  finish(true);
  await closed;
  assert.ok(discarded.includes(a));
});
