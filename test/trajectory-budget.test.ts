// Trajectory byte budgets (issue 13 §3), end to end with small configured limits: a red tenant
// records more than its budget from real sandboxes (one in a sub-project, with another key).
// Its finished trajectory is evicted first; then its live trajectories are cut (nothing more
// recorded, a replay refused with TRAJECTORY_TRUNCATED); the blue tenant's trajectories, a
// finished one and a live one, are untouched. Needs root.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';
import { testProject } from './helpers/tenants.js';

/** The red tenant's budget: two of its 30,000-byte outputs (about 40 kB stored each) fit, three do not. */
const PER_TENANT = 100_000;
const BUSYBOX = { image: { base: 'busybox' }, resources: { cpu: 0.1, memoryMiB: 64, diskMiB: 32 } };
/** A command whose output is kept in the trajectory (as base64: about 40 kB). */
const BIG = { cmd: "head -c 30000 /dev/zero | tr '\\0' a" };

let platform: TestPlatform;
async function call(key: string, method: string, route: string, json?: unknown): Promise<{ status: number; body: any }> {
  const res = await fetch(platform.url + route, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(json !== undefined ? { 'content-type': 'application/json' } : {}) },
    ...(json !== undefined ? { body: JSON.stringify(json) } : {}),
    signal: AbortSignal.timeout(60_000),
  });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : undefined };
}

before(async () => {
  platform = await startTestPlatform({ limits: { trajectoryBytesPerTenant: PER_TENANT, trajectoryBytesTotal: 10 * PER_TENANT } });
});
after(async () => {
  await platform?.close();
});

/** A tenant (a project of the root) with a member key; `parent` makes a sub-project of it. */
async function tenant(name: string, parent?: string): Promise<{ id: string; key: string }> {
  const p = await testProject(platform, name, parent ? { parent } : {});
  return { id: p.id, key: p.member };
}

async function sandbox(key: string): Promise<string> {
  const r = await call(key, 'POST', '/v1/sandboxes', BUSYBOX);
  assert.equal(r.status, 201, JSON.stringify(r.body));
  return r.body.id as string;
}

async function exec(key: string, id: string, spec: { cmd: string }): Promise<void> {
  const r = await call(key, 'POST', `/v1/sandboxes/${id}/exec`, spec);
  assert.equal(r.status, 200, JSON.stringify(r.body));
  assert.equal(r.body.exitCode, 0, JSON.stringify(r.body));
}

async function trajectory(key: string, id: string): Promise<{ status: number; body: any }> {
  return call(key, 'GET', `/v1/sandboxes/${id}/trajectory?content=false`);
}

describe('trajectory byte budgets', () => {
  test('finished trajectories go first, then live ones are cut and not replayable; another tenant keeps its own', { timeout: 180_000 }, async () => {
    const red = await tenant('red');
    const redSub = await tenant('red-sub', red.id);
    const blue = await tenant('blue');

    // Blue: a finished trajectory and a live one.
    const blueDone = await sandbox(blue.key);
    await exec(blue.key, blueDone, { cmd: 'echo blue-finished' });
    assert.equal((await call(blue.key, 'DELETE', `/v1/sandboxes/${blueDone}`)).status, 204);
    const blueLive = await sandbox(blue.key);
    await exec(blue.key, blueLive, { cmd: 'echo blue-live' });

    // Red: a finished trajectory of one big step.
    const redDone = await sandbox(red.key);
    await exec(red.key, redDone, BIG);
    assert.equal((await call(red.key, 'DELETE', `/v1/sandboxes/${redDone}`)).status, 204);
    const ended = await trajectory(red.key, redDone);
    assert.equal(ended.status, 200, JSON.stringify(ended.body));
    assert.notEqual(ended.body.endedAt, null);

    // Red's live sandbox: the second big step fits; the third needs room: the finished one goes.
    const redLive = await sandbox(red.key);
    await exec(red.key, redLive, BIG);
    await exec(red.key, redLive, BIG);
    const live = await trajectory(red.key, redLive);
    assert.equal(live.status, 200);
    assert.equal(live.body.steps, 2);
    assert.equal(live.body.truncated, false);
    assert.equal((await trajectory(red.key, redDone)).status, 404, "red's finished trajectory was evicted first");

    // No finished trajectory of red is left: the next big step cuts the live one.
    await exec(red.key, redLive, BIG);
    await exec(red.key, redLive, { cmd: 'echo after-the-cut' });
    const cut = await trajectory(red.key, redLive);
    assert.equal(cut.status, 200);
    assert.equal(cut.body.truncated, true);
    assert.equal(cut.body.steps, 2, 'nothing is recorded after the cut');
    assert.ok(cut.body.bytes <= PER_TENANT, `red keeps at most its budget (${cut.body.bytes})`);
    const replay = await call(red.key, 'POST', `/v1/sandboxes/${redLive}/replay`, {});
    assert.equal(replay.status, 409, JSON.stringify(replay.body));
    assert.equal(replay.body.error.code, 'TRAJECTORY_TRUNCATED');
    assert.match(replay.body.error.message, /trajectoryBytesPerTenant/);

    // A sub-project with its own key counts against red's budget, not a budget of its own.
    const subLive = await sandbox(redSub.key);
    await exec(redSub.key, subLive, BIG);
    const sub = await trajectory(redSub.key, subLive);
    assert.equal(sub.body.truncated, true);
    assert.equal(sub.body.steps, 0);
    assert.equal((await call(redSub.key, 'POST', `/v1/sandboxes/${subLive}/replay`, {})).body.error.code, 'TRAJECTORY_TRUNCATED');

    // Blue's trajectories are whole, and blue records on.
    await exec(blue.key, blueLive, BIG);
    const blueNow = await trajectory(blue.key, blueLive);
    assert.equal(blueNow.body.truncated, false);
    assert.equal(blueNow.body.steps, 2);
    const blueOld = await trajectory(blue.key, blueDone);
    assert.equal(blueOld.status, 200, "blue's finished trajectory survives red's flood");
    assert.equal(blueOld.body.steps, 1);

    for (const [key, id] of [
      [blue.key, blueLive],
      [red.key, redLive],
      [redSub.key, subLive],
    ] as const)
      assert.equal((await call(key, 'DELETE', `/v1/sandboxes/${id}`)).status, 204);
  });
});
