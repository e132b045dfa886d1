// The watcher's passes (expiry, reconcile, orphans, garbage collection) against an in-memory
// control plane (our own WatcherTarget).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { RaisedEvent } from '@dsec/protocol';
import { Watcher } from './watcher.js';
import type { WatchedNode, WatchedSandbox, WatcherTarget } from './watcher.js';

/** A control plane holding `rows`, recording what the watcher asks of it. */
function target(rows: WatchedSandbox[], nodes: WatchedNode[] = []): WatcherTarget & { expiredIds: string[]; raised: RaisedEvent[]; asked: string[][] } {
  const expiredIds: string[] = [];
  const raised: RaisedEvent[] = [];
  const asked: string[][] = [];
  return {
    expiredIds,
    raised,
    asked,
    nodes: () => nodes,
    sandboxes: async (names) => {
      asked.push([...names]);
      return rows.filter((r) => names.includes(r.node)).map((r) => ({ ...r }));
    },
    expired: async (at) => rows.filter((r) => r.expiresAt <= at).map((r) => ({ ...r })),
    setNodeHealthy: () => undefined,
    expire: async (id) => void expiredIds.push(id),
    markLost: async () => undefined,
    raise: (ev) => void raised.push(ev),
  };
}

test('expiry: a sandbox kept paused is not expired again on every pass; a renewed lifetime raises lease.exceeded at its next end', async () => {
  const past = new Date(Date.now() - 60_000).toISOString();
  const rows: WatchedSandbox[] = [
    { id: 'kept', node: 'n', state: 'paused', expiresAt: past, keptPaused: true },
    { id: 'lost', node: 'n', state: 'lost', expiresAt: past },
  ];
  const t = target(rows);
  const watcher = new Watcher(t);
  await watcher.pass();
  await watcher.pass();
  assert.deepEqual(t.expiredIds, ['lost', 'lost'], 'only the row that is not kept paused is expired, on each pass');
  const exceeded = (): string[] => t.raised.filter((e) => e.kind === 'lease.exceeded').map((e) => e.sandboxId ?? '');
  assert.deepEqual(exceeded(), ['kept', 'lost'], 'once per sandbox');

  // Resumed with a new lifetime, then past it again: a second lease.exceeded.
  rows[0] = { id: 'kept', node: 'n', state: 'running', expiresAt: new Date(Date.now() + 600_000).toISOString() };
  await watcher.pass();
  rows[0] = { id: 'kept', node: 'n', state: 'running', expiresAt: past };
  await watcher.pass();
  assert.deepEqual(exceeded(), ['kept', 'lost', 'kept']);
  assert.equal(t.expiredIds.filter((id) => id === 'kept').length, 1, 'a running row past its lifetime is expired (paused)');
});

test('reconcile: past the bound, each pass compares a share of the nodes in turn; orphans go and missing sandboxes are lost on later visits', async () => {
  const future = new Date(Date.now() + 600_000).toISOString();
  const rows: WatchedSandbox[] = [];
  const onNode = new Map<string, string[]>();
  const destroyed: string[] = [];
  const nodes: WatchedNode[] = ['a', 'b', 'c', 'd'].map((name) => {
    const ids = Array.from({ length: 3 }, (_, i) => `${name}-${i}`);
    for (const id of ids) rows.push({ id, node: name, state: 'running', expiresAt: future });
    onNode.set(name, [...ids]);
    return {
      name,
      sandboxIds: async () => [...onNode.get(name)!],
      destroyOrphan: async (id) => {
        destroyed.push(id);
        onNode.set(
          name,
          onNode.get(name)!.filter((x) => x !== id),
        );
      },
    };
  });
  onNode.get('d')!.push('d-orphan');
  onNode.set('b', ['b-0', 'b-1']);
  const t = target(rows, nodes);
  const lost: string[] = [];
  t.markLost = async (id) => void lost.push(id);
  const watcher = new Watcher(t, { reconcileRowsPerPass: 6, lostAfterMs: 20, orphanGraceMs: 20 });
  await watcher.pass();
  assert.deepEqual(t.asked, [['a', 'b', 'c', 'd']], 'nodes not seen yet count no records: the first pass takes them all');
  assert.deepEqual(destroyed, [], 'an orphan seen once: not destroyed yet');
  assert.deepEqual(lost, [], 'missing once: not lost yet');
  for (let i = 0; i < 2; i++) {
    await new Promise((r) => setTimeout(r, 30));
    await watcher.pass();
  }
  assert.deepEqual(
    t.asked.slice(1),
    [
      ['a', 'b'],
      ['c', 'd'],
    ],
    'then two nodes (six records) a pass, in turn',
  );
  assert.deepEqual(lost, ['b-2'], 'lost on the next visit of its node');
  assert.deepEqual(destroyed, ['d-orphan'], 'the orphan destroyed on the next visit of its node');
});

test('garbage collection visits every node, whatever share of them a pass reconciles', async () => {
  const future = new Date(Date.now() + 600_000).toISOString();
  const rows: WatchedSandbox[] = [];
  const collected: string[] = [];
  const nodes: WatchedNode[] = ['a', 'b', 'c', 'd'].map((name) => {
    const ids = Array.from({ length: 3 }, (_, i) => `${name}-${i}`);
    for (const id of ids) rows.push({ id, node: name, state: 'running', expiresAt: future });
    return {
      name,
      sandboxIds: async () => [...ids],
      destroyOrphan: async () => undefined,
      collectGarbage: async () => {
        collected.push(name);
        return 0;
      },
    };
  });
  const t = target(rows, nodes);
  const watcher = new Watcher(t, { reconcileRowsPerPass: 6, gcIntervalMs: 0 });
  for (let i = 0; i < 3; i++) await watcher.pass();
  assert.deepEqual(
    t.asked.slice(1),
    [
      ['a', 'b'],
      ['c', 'd'],
    ],
    'reconcile takes two nodes a pass once their records are known',
  );
  assert.deepEqual(collected, ['a', 'b', 'c', 'd', 'a', 'b', 'c', 'd', 'a', 'b', 'c', 'd'], 'each pass collects on all four');
});

test('orphans: one seen once survives; seen again after the grace it is destroyed; one whose record came during the grace is kept', async () => {
  const future = new Date(Date.now() + 600_000).toISOString();
  const rows: WatchedSandbox[] = [];
  let onNode = ['edge-made', 'racing-create'];
  const destroyed: string[] = [];
  const node: WatchedNode = {
    name: 'n',
    sandboxIds: async () => [...onNode],
    destroyOrphan: async (id) => {
      destroyed.push(id);
      onNode = onNode.filter((x) => x !== id);
    },
  };
  const watcher = new Watcher(target(rows, [node]), { orphanGraceMs: 40 });
  await watcher.pass();
  await watcher.pass();
  assert.deepEqual(destroyed, [], 'within the grace: nothing is destroyed, however many passes see it');
  // The create pipeline's record arrives during the grace (rows come before sandboxes; a slow store may not).
  rows.push({ id: 'racing-create', node: 'n', state: 'creating', expiresAt: future });
  await new Promise((r) => setTimeout(r, 50));
  await watcher.pass();
  assert.deepEqual(destroyed, ['edge-made'], 'past the grace: the one still without a record goes, the one now known stays');
  assert.deepEqual(onNode, ['racing-create']);
  // Its record gone later (deleted while the node kept it): a new grace starts from then.
  rows.length = 0;
  await watcher.pass();
  assert.deepEqual(destroyed, ['edge-made'], 'known once: its grace starts again when its record goes');
  await new Promise((r) => setTimeout(r, 50));
  await watcher.pass();
  assert.deepEqual(destroyed, ['edge-made', 'racing-create']);
});

test('orphans: a grace of 0 destroys at first sight', async () => {
  const destroyed: string[] = [];
  const node: WatchedNode = { name: 'n', sandboxIds: async () => ['x'], destroyOrphan: async (id) => void destroyed.push(id) };
  await new Watcher(target([], [node]), { orphanGraceMs: 0 }).pass();
  assert.deepEqual(destroyed, ['x']);
});
