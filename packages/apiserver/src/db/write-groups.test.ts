// WriteGroups: one writer per key at a time by default (groups queue behind each other); with
// overlap, a group is what arrived in one turn and does not wait for the group in flight.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { WriteGroups } from './write-groups.js';

/** A writer that holds each group until released; records the groups it got. */
function heldWriter(): { groups: number[][]; release: () => void; writer: (key: string, items: readonly number[]) => Promise<Array<number | Error>> } {
  const groups: number[][] = [];
  let waiting: Array<() => void> = [];
  return {
    groups,
    release: () => {
      const w = waiting;
      waiting = [];
      for (const r of w) r();
    },
    writer: async (_key, items) => {
      groups.push([...items]);
      await new Promise<void>((r) => waiting.push(r));
      return items.map((i) => (i < 0 ? new Error(`bad ${i}`) : i * 10));
    },
  };
}

const turn = (): Promise<void> => new Promise((r) => setImmediate(r));

test('items of one turn form one group; later items wait for it, unless the groups overlap', async () => {
  for (const overlap of [false, true]) {
    const w = heldWriter();
    const g = new WriteGroups(w.writer, 500, overlap);
    const first = [g.submit('n', 1), g.submit('n', 2), g.submit('n', -3)];
    await turn();
    const second = [g.submit('n', 4)];
    await turn();
    await turn();
    assert.deepEqual(w.groups, overlap ? [[1, 2, -3], [4]] : [[1, 2, -3]], `overlap ${overlap}`);
    w.release();
    const settled = await Promise.allSettled(first);
    assert.deepEqual(
      settled.map((s) => (s.status === 'fulfilled' ? s.value : (s.reason as Error).message)),
      [10, 20, 'bad -3'],
    );
    await turn();
    await turn();
    w.release();
    assert.deepEqual(await Promise.all(second), [40]);
    assert.deepEqual(w.groups, [[1, 2, -3], [4]]);
    assert.deepEqual(g.written, { groups: 2, items: 4 });
  }
});
