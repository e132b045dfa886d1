// Snapshots shared with sub-projects (issue 13 §3), end to end: a parent project's snapshot is
// invisible to its sub-project (not listed, not usable, not readable) until the parent shares it
// (`PATCH /v1/layers/{ref}` or `shareWithSubProjects` when it is taken); then the sub-project
// lists it and starts a sandbox from it that holds the parent's files. The sub-project cannot
// change the sharing, another tenant never sees it, and unsharing hides it again. Needs root.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';
import { testProject } from './helpers/tenants.js';

const SMALL = { cpu: 0.1, memoryMiB: 64, diskMiB: 32 };
let platform: TestPlatform;
const made: Array<{ key: string; id: string }> = [];

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

async function ok(r: Promise<{ status: number; body: any }>, what: string): Promise<any> {
  const got = await r;
  assert.ok(got.status >= 200 && got.status < 300, `${what}: ${got.status} ${JSON.stringify(got.body)}`);
  return got.body;
}

/** A project and its member key. */
async function project(name: string, parent?: string): Promise<{ id: string; key: string }> {
  const p = await testProject(platform, name, parent ? { parent } : {});
  return { id: p.id, key: p.member };
}

async function sandbox(key: string, from: object): Promise<{ status: number; body: any }> {
  const r = await call(key, 'POST', '/v1/sandboxes', { ...from, resources: SMALL });
  if (r.status === 201) made.push({ key, id: r.body.id as string });
  return r;
}

async function snapshots(key: string): Promise<string[]> {
  return ((await ok(call(key, 'GET', '/v1/layers?kind=snapshot'), 'layers')).items as Array<{ digest: string }>).map((l) => l.digest);
}

before(async () => {
  platform = await startTestPlatform();
});
after(async () => {
  for (const m of made) await call(m.key, 'DELETE', `/v1/sandboxes/${m.id}`).catch(() => undefined);
  await platform?.close();
});

describe('snapshots shared with sub-projects', () => {
  test('invisible before sharing, visible and usable after, hidden again when unshared', { timeout: 120_000 }, async () => {
    const parent = await project('parent');
    const child = await project('child', parent.id);
    const other = await project('other');

    const source = (await sandbox(parent.key, { image: { base: 'busybox' } })).body.id as string;
    await ok(call(parent.key, 'POST', `/v1/sandboxes/${source}/exec`, { cmd: 'echo from-parent > /root/mark' }), 'write');
    const snap = (await ok(call(parent.key, 'POST', `/v1/sandboxes/${source}/snapshot`, { name: 'answer' }), 'snapshot')).digest as string;

    // Before: the sub-project neither lists, reads nor uses it (by digest or by name).
    assert.ok(!(await snapshots(child.key)).includes(snap));
    assert.equal((await call(child.key, 'GET', `/v1/layers/${snap}`)).status, 404);
    for (const ref of [snap, 'answer']) {
      const r = await sandbox(child.key, { snapshot: ref });
      assert.ok(r.status === 404 || r.status === 400, `${ref}: ${r.status} ${JSON.stringify(r.body)}`);
    }
    // The sub-project cannot share its parent's snapshot itself.
    assert.equal((await call(child.key, 'PATCH', `/v1/layers/${snap}`, { shareWithSubProjects: true })).status, 404);
    // Only snapshots take the field; the body is checked.
    assert.equal((await call(parent.key, 'PATCH', `/v1/layers/${snap}`, { shareWithSubProjects: 'yes' })).body.error.field, 'shareWithSubProjects');

    // The parent shares it.
    const shared = await ok(call(parent.key, 'PATCH', `/v1/layers/${snap}`, { shareWithSubProjects: true }), 'share');
    assert.equal(shared.snapshot.sharedWithSubProjects, true);
    assert.ok((await snapshots(child.key)).includes(snap));
    assert.equal((await ok(call(child.key, 'GET', `/v1/layers/${snap}`), 'child get')).snapshot.sharedWithSubProjects, true);
    const fromShared = await sandbox(child.key, { snapshot: 'answer' });
    assert.equal(fromShared.status, 201, JSON.stringify(fromShared.body));
    const read = await ok(call(child.key, 'POST', `/v1/sandboxes/${fromShared.body.id as string}/exec`, { cmd: 'cat /root/mark' }), 'read');
    assert.equal(read.stdout, 'from-parent\n');
    // Still the parent's: the sub-project cannot unshare it; another tenant never sees it.
    assert.equal((await call(child.key, 'PATCH', `/v1/layers/${snap}`, { shareWithSubProjects: false })).status, 403);
    assert.ok(!(await snapshots(other.key)).includes(snap));
    assert.ok([400, 404].includes((await sandbox(other.key, { snapshot: snap })).status));

    // Unshared: hidden again.
    await ok(call(parent.key, 'PATCH', `/v1/layers/${snap}`, { shareWithSubProjects: false }), 'unshare');
    assert.ok(!(await snapshots(child.key)).includes(snap));
    assert.ok([400, 404].includes((await sandbox(child.key, { snapshot: snap })).status));

    // Shared when taken.
    await ok(call(parent.key, 'POST', `/v1/sandboxes/${source}/exec`, { cmd: 'echo second > /root/mark2' }), 'write again');
    const taken = await ok(call(parent.key, 'POST', `/v1/sandboxes/${source}/snapshot`, { shareWithSubProjects: true }), 'snapshot shared');
    assert.equal(taken.snapshot.sharedWithSubProjects, true);
    assert.ok((await snapshots(child.key)).includes(taken.digest as string));
  });
});
