// The request rate is a tenant's, not a key's: extra keys (of the tenant's project or of its
// sub-projects) share the tenant's bucket; another tenant's bucket is its own; the root
// project's keys (the operator's) keep one each. A real (in-memory SQLite) store, small rates.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import Database from 'better-sqlite3';
import { DsecError } from '@dsec/protocol';
import { Authenticator, newKeySecret } from './auth.js';
import { ROOT_PROJECT_ID, StateStore } from './db/store.js';

const quota = { sandboxes: 10, cpu: 10, memoryMiB: 1024 };
/** A rate so slow that no token comes back during the test: only the burst counts. */
const RATE = { perSecond: 0.001, burst: 10 };

async function key(store: StateStore, projectId: string, name: string): Promise<string> {
  const { secret, hash } = newKeySecret();
  await store.createKey({ projectId, name, role: 'member', keyHash: hash });
  return `Bearer ${secret}`;
}

/** How many of `n` requests with `header` pass before RATE_LIMITED. */
async function passes(auth: Authenticator, header: string, n: number): Promise<number> {
  let ok = 0;
  for (let i = 0; i < n; i++) {
    try {
      await auth.authenticate(header);
      ok++;
    } catch (err) {
      assert.ok(err instanceof DsecError && err.code === 'RATE_LIMITED', String(err));
      assert.equal(err.details.limit, 'requestsPerSecondPerTenant');
    }
  }
  return ok;
}

test("two keys of one tenant (one in a sub-project) share the tenant's rate; another tenant and the operator keep theirs", async () => {
  const store = await StateStore.openSqlite(new Database(':memory:'));
  try {
    const auth = new Authenticator(store, RATE);
    const red = (await store.createProject({ name: 'red', parentId: ROOT_PROJECT_ID, quota })).id;
    const redSub = (await store.createProject({ name: 'red-sub', parentId: red, quota })).id;
    const blue = (await store.createProject({ name: 'blue', parentId: ROOT_PROJECT_ID, quota })).id;
    const [red1, red2, redSub1, blue1, root1, root2] = await Promise.all([
      key(store, red, 'r1'),
      key(store, red, 'r2'),
      key(store, redSub, 's1'),
      key(store, blue, 'b1'),
      key(store, ROOT_PROJECT_ID, 'o1'),
      key(store, ROOT_PROJECT_ID, 'o2'),
    ]);
    // Red's first key takes 6 of the 10; its second key gets the 4 left, not 10 of its own.
    assert.equal(await passes(auth, red1, 6), 6);
    assert.equal(await passes(auth, red2, 10), 4, "a second key does not multiply the tenant's rate");
    assert.equal(await passes(auth, redSub1, 5), 0, 'nor does a key of a sub-project');
    assert.equal(await passes(auth, red1, 1), 0);
    // Blue is untouched by red's use.
    assert.equal(await passes(auth, blue1, 10), 10);
    // The operator's keys: one bucket each.
    assert.equal(await passes(auth, root1, 10), 10);
    assert.equal(await passes(auth, root2, 10), 10);
  } finally {
    await store.close();
  }
});
