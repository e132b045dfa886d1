// The watcher's pipeline on a real (in-memory SQLite) state store: rate limiting, retention,
// bounded live subscribers and the SSE stream's end for a consumer that falls behind.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import Database from 'better-sqlite3';
import type { RaisedEvent } from '@dsec/protocol';
import type { Principal } from './auth.js';
import { ROOT_PROJECT_ID, StateStore } from './db/store.js';
import { WatchService } from './watch.js';

let store: StateStore;
let watch: WatchService;
const root: Principal = { keyId: 'key_00', projectId: ROOT_PROJECT_ID, role: 'admin', visibleProjects: new Set([ROOT_PROJECT_ID]), tenantId: ROOT_PROJECT_ID };

before(async () => {
  store = await StateStore.openSqlite(new Database(':memory:'));
  watch = new WatchService(store, {
    events: { windowMs: 300, maxPerWindow: 3, flushIntervalMs: 50 },
    subscriberQueue: 5,
    eventRetention: { maxRows: 20, maxAgeMs: 3_600_000 },
    auditRetention: { maxRows: 5, maxAgeMs: 3_600_000 },
  });
  await watch.init();
});
after(async () => {
  await watch.close();
  await store.close();
});

const ev = (sandboxId: string, i: number, extra: Partial<RaisedEvent> = {}): RaisedEvent => ({
  kind: 'egress.denied',
  severity: 'warning',
  sandboxId,
  node: 'n1',
  message: `denied #${i}`,
  data: { i },
  ...extra,
});

test('a burst of one kind from one sandbox is a few events and a summary with the count', async () => {
  for (let i = 0; i < 30; i++) watch.events.ingest(ev('burst-1', i));
  watch.events.ingest(ev('burst-2', 0));
  await watch.events.flush();
  const first = await watch.listEvents(root, { sandbox: 'burst-1', order: 'asc' });
  assert.deepEqual(
    first.items.map((e) => e.data.i),
    [0, 1, 2],
  );
  // Once the window is over, one event stands for the 27 held back.
  await sleep(500);
  const all = await watch.listEvents(root, { sandbox: 'burst-1', order: 'asc' });
  assert.equal(all.items.length, 4);
  assert.equal(all.items[3]!.data.rateLimited, 27);
  assert.equal(all.items[3]!.data.i, 29);
  assert.equal((await watch.listEvents(root, { sandbox: 'burst-2' })).items.length, 1, 'another sandbox has its own budget');
  assert.equal(watch.events.rateLimited, 27);
});

test('retention keeps the newest rows and none older than the age limit', async () => {
  for (let i = 0; i < 40; i++) watch.events.ingest(ev(`ret-${i}`, i));
  watch.events.ingest(ev('old-1', 0, { at: new Date(Date.now() - 7_200_000).toISOString() }));
  for (let i = 0; i < 9; i++)
    watch.audit.record({
      keyId: 'key_00',
      projectId: ROOT_PROJECT_ID,
      method: 'GET',
      route: '/v1/sandboxes',
      sandboxId: null,
      status: 200,
      durationMs: 1,
      command: null,
      exitCode: null,
    });
  await watch.maintain();
  const left = await watch.listEvents(root, { limit: 1000 });
  assert.equal(left.items.length, 19, 'the newest 20 less the one past the age limit');
  assert.ok(!left.items.some((e) => e.sandbox === 'old-1'));
  assert.ok(left.items.some((e) => e.sandbox === 'ret-39'));
  const audit = await watch.listAudit(root, { limit: 1000 });
  assert.equal(audit.items.length, 5);
});

test('a subscriber that falls behind is cut off with a final dropped event, not buffered without bound', async () => {
  const res = watch.streamEvents(root, {}, undefined);
  assert.equal(res.headers.get('content-type'), 'text/event-stream; charset=utf-8');
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  assert.match(decoder.decode((await reader.read()).value), /^retry: 2000/);
  assert.equal(watch.events.subscriberCount, 1);
  // Nothing is read while 20 events arrive (each from its own sandbox: no rate limit).
  for (let i = 0; i < 20; i++) watch.events.ingest(ev(`slow-${i}`, i));
  await watch.events.flush();
  assert.equal(watch.events.subscriberCount, 0, 'the hub let go of it');
  let text = '';
  for (;;) {
    const r = await reader.read();
    if (r.done) break;
    text += decoder.decode(r.value);
  }
  assert.match(text, /event: dropped\ndata: \{"reason":"the client fell too far behind","resumeWith":"ev_\d+[0-9a-f]+"\}/);
  const delivered = text.match(/^id: /gm)?.length ?? 0;
  assert.ok(delivered <= 6, `delivered ${delivered} before the cut`);
});

test('open streams end when the hub ends its subscriptions (before the HTTP server closes)', async () => {
  const res = watch.streamEvents(root, { kind: 'oom.kill' }, undefined);
  const reader = res.body!.getReader();
  await reader.read();
  const pending = reader.read();
  watch.events.endSubscriptions();
  assert.equal((await pending).done, true);
});

test('an event about a row already gone is scoped to the project its raiser names; an unknown one without it only to the root', async () => {
  const team = await store.createProject({ name: 'owner-team', parentId: ROOT_PROJECT_ID, quota: { sandboxes: 10, cpu: 10, memoryMiB: 10_000 } });
  const member: Principal = { keyId: 'key_m', projectId: team.id, role: 'viewer', visibleProjects: new Set([team.id]), tenantId: team.id };
  const deleted: RaisedEvent = { kind: 'sandbox.deleted', severity: 'info', sandboxId: 'gone-1', node: 'n1', message: 'deleted', data: { from: 'running' } };
  watch.events.ingest(deleted, { projectId: team.id, labels: {} });
  watch.events.ingest({ ...deleted, sandboxId: 'gone-2' });
  const seen = await watch.listEvents(member, { kind: 'sandbox.deleted' });
  assert.deepEqual(
    seen.items.map((e) => [e.sandbox, e.project]),
    [['gone-1', team.id]],
  );
  const all = await watch.listEvents(root, { kind: 'sandbox.deleted' });
  assert.deepEqual(all.items.map((e) => e.sandbox).sort(), ['gone-1', 'gone-2']);
});
