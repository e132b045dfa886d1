// Trajectory byte budgets (issue 13 §3), end to end: a red tenant records more than its budget
// from real sandboxes (one in a sub-project, with another key). Its finished trajectory is
// evicted first; then its live trajectories are cut (nothing more recorded, a replay refused
// with TRAJECTORY_TRUNCATED); the blue tenant's trajectories, a finished one and a live one, are
// untouched, and blue creates, runs and reads files on. Needs root.
//
// A big step is a file write: a step keeps a copy of up to 1 MiB of written content (~1.4 MB as
// base64), but of a command's output only its first 64 KiB (~88 kB), whatever its size: filling
// the default 2 GiB with outputs takes ~24,500 commands, with 1 MiB writes ~1,540. `npm test`
// sets the budgets through the configuration's variables (`DSEC_LIMIT_TRAJECTORY_BYTES_*`, to a
// real `dsec up`) to 100 kB and 1 MB, with 30,000-byte writes (~40 kB stored). DSEC_LONG=1
// (`npm run test:long`) runs the same at the defaults (2 GiB per tenant, 8 GiB in all): 1 MiB
// writes, 47 to a trajectory under its own 64 MiB, ~1,540 of them in 34 red sandboxes. The
// counts below are computed from what one step stores.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, describe, test } from 'node:test';
import { DEFAULT_TRAJECTORY_BYTES_PER_TENANT } from '@dsec/protocol';
import { DEFAULT_TRAJECTORY_MAX_BYTES, TRAJECTORY_DATA_COPY_BYTES } from '@dsec/apiserver';
import { freshHome, removeHome, stop, up } from './helpers/child-platform.js';
import type { RunningNode } from './helpers/child-platform.js';
import { testProject } from './helpers/tenants.js';

const LONG = process.env.DSEC_LONG === '1';
/** Red's budget: the default, or (npm test) 100 kB: two of the small writes fit, three do not. */
const PER_TENANT = LONG ? DEFAULT_TRAJECTORY_BYTES_PER_TENANT : 100_000;
/** Bytes of a big step's file write: all of it is kept in the trajectory (as base64). */
const BIG_BYTES = LONG ? TRAJECTORY_DATA_COPY_BYTES : 30_000;
/** Red's live sandboxes filled side by side (each in order) while the budget still holds. */
const FILL_CONCURRENCY = 4;
const BUSYBOX = { image: { base: 'busybox' }, resources: { cpu: 0.1, memoryMiB: 64, diskMiB: 32 } };

/** The platform: `dsec up` as a child, on its own home. */
let platform: { url: string; adminKey: string; home: string };
let node: RunningNode | undefined;
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
  const home = await freshHome('dsec-trajectory-budget-');
  const env = LONG ? {} : { DSEC_LIMIT_TRAJECTORY_BYTES_PER_TENANT: String(PER_TENANT), DSEC_LIMIT_TRAJECTORY_BYTES_TOTAL: String(10 * PER_TENANT) };
  node = await up(home, { env });
  platform = { url: node.url, adminKey: node.apiKey, home };
});
after(async () => {
  if (node) await stop(node, 'SIGTERM');
  if (platform) await removeHome(platform.home);
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

/** A big step: a file of {@link BIG_BYTES} random bytes written through the API. */
async function writeBig(key: string, id: string): Promise<void> {
  const res = await fetch(`${platform.url}/v1/sandboxes/${id}/files?path=/tmp/big`, {
    method: 'PUT',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/octet-stream' },
    body: randomBytes(BIG_BYTES),
    signal: AbortSignal.timeout(60_000),
  });
  assert.equal(res.status, 204, await res.text());
}

async function trajectory(key: string, id: string): Promise<{ status: number; body: any }> {
  return call(key, 'GET', `/v1/sandboxes/${id}/trajectory?content=false`);
}

async function readFile(key: string, id: string, file: string): Promise<string> {
  const res = await fetch(`${platform.url}/v1/sandboxes/${id}/files?path=${encodeURIComponent(file)}`, { headers: { authorization: `Bearer ${key}` } });
  assert.equal(res.status, 200, file);
  return res.text();
}

describe('trajectory byte budgets', () => {
  test(
    'finished trajectories go first, then live ones are cut and not replayable; another tenant keeps its own',
    { timeout: LONG ? 1_800_000 : 180_000 },
    async () => {
      const red = await tenant('red');
      const redSub = await tenant('red-sub', red.id);
      const blue = await tenant('blue');

      // Blue: a finished trajectory and a live one.
      const blueDone = await sandbox(blue.key);
      await exec(blue.key, blueDone, { cmd: 'echo blue-finished' });
      assert.equal((await call(blue.key, 'DELETE', `/v1/sandboxes/${blueDone}`)).status, 204);
      const blueLive = await sandbox(blue.key);
      await exec(blue.key, blueLive, { cmd: 'echo blue-live' });

      // Red: a finished trajectory of one big step; its size is what each big step stores.
      const redDone = await sandbox(red.key);
      await writeBig(red.key, redDone);
      assert.equal((await call(red.key, 'DELETE', `/v1/sandboxes/${redDone}`)).status, 204);
      const ended = await trajectory(red.key, redDone);
      assert.equal(ended.status, 200, JSON.stringify(ended.body));
      assert.notEqual(ended.body.endedAt, null);
      const step = ended.body.bytes as number;
      /** Big steps red's budget holds, and big steps one trajectory holds under its own cap. */
      const fit = Math.floor(PER_TENANT / step);
      const perSandbox = Math.floor(DEFAULT_TRAJECTORY_MAX_BYTES / step);
      assert.ok(fit >= 2 && perSandbox >= 1, `${step} bytes a step`);

      // Red's live sandboxes: the steps that fit beside the finished one (sandboxes filled side by
      // side, each to its own cap), then one more that needs its room: the finished one goes, the
      // live ones stay whole.
      const redLive: string[] = [];
      const steps = new Map<string, number>();
      const bigSteps = async (id: string, n: number): Promise<void> => {
        for (let i = 0; i < n; i++) {
          await writeBig(red.key, id);
          steps.set(id, (steps.get(id) ?? 0) + 1);
        }
      };
      const plan: number[] = [];
      for (let left = fit - 1; left > 0; left -= perSandbox) plan.push(Math.min(left, perSandbox));
      for (let i = 0; i < plan.length; i += FILL_CONCURRENCY) {
        const ids = await Promise.all(plan.slice(i, i + FILL_CONCURRENCY).map(() => sandbox(red.key)));
        redLive.push(...ids);
        await Promise.all(ids.map((id, j) => bigSteps(id, plan[i + j]!)));
      }
      const needsSandbox = (): boolean => {
        const id = redLive[redLive.length - 1];
        return id === undefined || (steps.get(id) ?? 0) >= perSandbox;
      };
      const bigStep = async (): Promise<string> => {
        if (needsSandbox()) redLive.push(await sandbox(red.key));
        const id = redLive[redLive.length - 1]!;
        await bigSteps(id, 1);
        return id;
      };
      // `step` is a whole trajectory (its header and one step): what a step alone adds is measured
      // on a live one, and red's use is summed from what is stored, so that the step that must
      // evict is exactly the first that does not fit.
      const spare = await sandbox(red.key);
      const header = (await trajectory(red.key, spare)).body.bytes as number;
      redLive.push(spare);
      const stepOnly = ((await trajectory(red.key, redLive[0]!)).body.bytes - header) / steps.get(redLive[0]!)!;
      const stored = async (): Promise<number> => {
        let sum = 0;
        for (const id of redLive) sum += (await trajectory(red.key, id)).body.bytes as number;
        return sum;
      };
      /** Big steps while the next one (and the header of a sandbox it may need) still fits. */
      const fillUp = async (besides: number): Promise<void> => {
        while ((await stored()) + besides + stepOnly + (needsSandbox() ? header : 0) <= PER_TENANT) await bigStep();
      };
      await fillUp(step);
      assert.equal((await trajectory(red.key, redDone)).status, 200, 'the finished trajectory stays while the budget holds it');
      const before = await stored();
      await bigStep();
      assert.equal(
        (await trajectory(red.key, redDone)).status,
        404,
        `red's finished trajectory was evicted first (live ${before} + finished ${step} + step ${stepOnly} + header ${header} over ${PER_TENANT})`,
      );
      for (const id of redLive) {
        const live = await trajectory(red.key, id);
        assert.equal(live.status, 200);
        assert.equal(live.body.steps, steps.get(id) ?? 0);
        assert.equal(live.body.truncated, false);
      }

      // No finished trajectory of red is left: once the live ones fill the budget, the next big
      // step cuts the live trajectory it grows.
      await fillUp(0);
      const cutId = await bigStep();
      await exec(red.key, cutId, { cmd: 'echo after-the-cut' });
      const cut = await trajectory(red.key, cutId);
      assert.equal(cut.status, 200);
      assert.equal(cut.body.truncated, true);
      assert.equal(cut.body.steps, steps.get(cutId)! - 1, 'nothing is recorded after the cut');
      let kept = 0;
      for (const id of redLive) kept += (await trajectory(red.key, id)).body.bytes as number;
      assert.ok(kept <= PER_TENANT, `red keeps at most its budget (${kept})`);
      const replay = await call(red.key, 'POST', `/v1/sandboxes/${cutId}/replay`, {});
      assert.equal(replay.status, 409, JSON.stringify(replay.body));
      assert.equal(replay.body.error.code, 'TRAJECTORY_TRUNCATED');
      assert.match(replay.body.error.message, /trajectoryBytesPerTenant/);

      // A sub-project with its own key counts against red's budget, not a budget of its own.
      const subLive = await sandbox(redSub.key);
      await writeBig(redSub.key, subLive);
      const sub = await trajectory(redSub.key, subLive);
      assert.equal(sub.body.truncated, true);
      assert.equal(sub.body.steps, 0);
      assert.equal((await call(redSub.key, 'POST', `/v1/sandboxes/${subLive}/replay`, {})).body.error.code, 'TRAJECTORY_TRUNCATED');

      // Blue's trajectories are whole, and blue records on, creates, runs and reads files.
      await writeBig(blue.key, blueLive);
      const blueNow = await trajectory(blue.key, blueLive);
      assert.equal(blueNow.body.truncated, false);
      assert.equal(blueNow.body.steps, 2);
      const blueOld = await trajectory(blue.key, blueDone);
      assert.equal(blueOld.status, 200, "blue's finished trajectory survives red's flood");
      assert.equal(blueOld.body.steps, 1);
      const blueNew = await sandbox(blue.key);
      await exec(blue.key, blueNew, { cmd: 'echo blue-new > /tmp/note' });
      assert.equal(await readFile(blue.key, blueNew, '/tmp/note'), 'blue-new\n');
      assert.equal((await trajectory(blue.key, blueNew)).body.truncated, false);

      for (const [key, id] of [[blue.key, blueLive], [blue.key, blueNew], [redSub.key, subLive], ...redLive.map((id) => [red.key, id] as const)] as const)
        assert.equal((await call(key, 'DELETE', `/v1/sandboxes/${id}`)).status, 204);
    },
  );
});
