// Trajectory byte budgets over a real (in-memory SQLite) store: eviction order, the platform's
// ceiling, and the cut of live trajectories that do not fit. End to end from real sandboxes:
// test/trajectory-budget.test.ts.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import Database from 'better-sqlite3';
import { Authenticator } from './auth.js';
import { StateStore } from './db/store.js';
import { TrajectoryLog } from './trajectory.js';

let store: StateStore;
let log: TrajectoryLog;
let red = '';
let blue = '';
const quota = { sandboxes: 10, cpu: 10, memoryMiB: 1024 };
/** One step with a 4,000-byte copy: about 5.5 kB stored. */
const step = (seq: number) => ({
  seq,
  kind: 'exec' as const,
  startedAt: new Date().toISOString(),
  replayable: true,
  stdout: { bytes: 4000, sha256: 'x', base64: 'a'.repeat(5336) },
});

before(async () => {
  store = await StateStore.openSqlite(new Database(':memory:'));
  const auth = new Authenticator(store);
  red = (await store.createProject({ name: 'red', parentId: 'root', quota })).id;
  blue = (await store.createProject({ name: 'blue', parentId: 'root', quota })).id;
  log = new TrajectoryLog(store, () => Promise.resolve(undefined), {
    // Each tenant may keep 40 kB; all together 50 kB.
    budget: { bytesPerTenant: 40_000, bytesTotal: 50_000, tenantOf: (p) => auth.tenantOf(p), tenantProjects: (t) => auth.tenantProjects(t) },
  });
});
after(async () => {
  await log.close();
  await store.close();
});

function open(id: string, projectId: string): void {
  log.open({ sandboxId: id, projectId, spec: { backend: 'container', image: { base: 'x' }, resources: {} }, layers: [], createdAt: new Date().toISOString() });
}

function record(id: string, n: number, from = 0): void {
  for (let i = 0; i < n; i++) log.commit(id, step(from + i) as never);
}

test('the ceiling evicts the oldest finished trajectory of anyone, then cuts the growing live one', async () => {
  // Blue: two finished trajectories (the older first), 11 kB each.
  for (const id of ['blue-old', 'blue-new']) {
    open(id, blue);
    record(id, 2);
    await log.flush();
    log.end(id);
    await log.flush();
    await new Promise((r) => setTimeout(r, 5));
  }
  // Red: 33 kB, within its 40 kB; the total is now 55 kB > 50 kB: blue's oldest finished goes.
  open('red-live', red);
  record('red-live', 6);
  await log.flush();
  assert.equal(await store.trajectory('blue-old'), undefined, 'the oldest finished trajectory went');
  assert.ok(await store.trajectory('blue-new'), 'the newer one stays');
  assert.equal((await store.trajectory('red-live'))!.cut_at, null);
  // Red past its own 40 kB: it has nothing finished, so its live trajectory is cut (its steps of the batch stay out).
  record('red-live', 2, 6);
  await log.flush();
  const cut = (await store.trajectory('red-live'))!;
  assert.notEqual(cut.cut_at, null);
  assert.equal(cut.truncated, 1);
  assert.equal(cut.steps, 6);
  record('red-live', 1, 8);
  await log.flush();
  assert.equal((await store.trajectory('red-live'))!.steps, 6, 'nothing more is recorded');
  assert.ok(await store.trajectory('blue-new'), "red's cut did not take blue's finished trajectory");
  // Blue's live trajectory still records within the ceiling (red's cut freed nothing, but its growth was never counted).
  open('blue-live', blue);
  record('blue-live', 1);
  await log.flush();
  assert.equal((await store.trajectory('blue-live'))!.steps, 1);
});
