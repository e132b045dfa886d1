// The watcher's expiry pass against an in-memory control plane (our own WatcherTarget).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { RaisedEvent } from '@dsec/protocol';
import { Watcher } from './watcher.js';
import type { WatchedSandbox, WatcherTarget } from './watcher.js';

/** A control plane holding `rows`, recording what the watcher asks of it. */
function target(rows: WatchedSandbox[]): WatcherTarget & { expired: string[]; raised: RaisedEvent[] } {
  const expired: string[] = [];
  const raised: RaisedEvent[] = [];
  return {
    expired,
    raised,
    nodes: () => [],
    sandboxes: async () => rows.map((r) => ({ ...r })),
    setNodeHealthy: () => undefined,
    expire: async (id) => void expired.push(id),
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
  assert.deepEqual(t.expired, ['lost', 'lost'], 'only the row that is not kept paused is expired, on each pass');
  const exceeded = (): string[] => t.raised.filter((e) => e.kind === 'lease.exceeded').map((e) => e.sandboxId ?? '');
  assert.deepEqual(exceeded(), ['kept', 'lost'], 'once per sandbox');

  // Resumed with a new lifetime, then past it again: a second lease.exceeded.
  rows[0] = { id: 'kept', node: 'n', state: 'running', expiresAt: new Date(Date.now() + 600_000).toISOString() };
  await watcher.pass();
  rows[0] = { id: 'kept', node: 'n', state: 'running', expiresAt: past };
  await watcher.pass();
  assert.deepEqual(exceeded(), ['kept', 'lost', 'kept']);
  assert.equal(t.expired.filter((id) => id === 'kept').length, 1, 'a running row past its lifetime is expired (paused)');
});
