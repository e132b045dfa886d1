// The caches on the path of every exec (issue 15) never let a request through that the store
// would refuse: the routed sandbox rows (sandbox-row-cache.ts) and the verified keys (auth.ts).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { sql } from 'kysely';
import { harness } from '../testing/harness.js';
import type { Harness } from '../testing/harness.js';
import { mayChangeSandboxRows } from './sandbox-row-cache.js';

describe('routed sandbox rows kept in memory (real SQLite store, fake node)', () => {
  let h: Harness;
  before(async () => {
    h = await harness();
  });
  after(async () => h.close());

  const newSandbox = async () => (await h.services.sandboxes.create(h.admin, { image: { base: 'busybox' } })).id;
  const routed = async (id: string) => (await h.services.lifecycle.route(h.admin, id)).row;
  const refused = (id: string, p = h.admin) =>
    assert.rejects(h.services.lifecycle.route(p, id), (err: Error & { code?: string }) => err.code === 'SANDBOX_NOT_FOUND');

  test('a second route is served from memory; a write to the row drops it', async () => {
    const cache = h.store.sandboxRows!;
    const id = await newSandbox();
    await routed(id);
    const hits = cache.counts.hits;
    assert.equal((await routed(id)).state, 'running');
    assert.equal(cache.counts.hits, hits + 1);
    await h.store.transitionSandbox(id, ['running'], 'paused');
    const row = await h.store.sandboxRouted(id);
    assert.equal(row?.state, 'paused', 'the write was seen by the next read');
    await h.store.transitionSandbox(id, ['paused'], 'running');
  });

  test('a deleted sandbox is refused at once', async () => {
    const id = await newSandbox();
    await routed(id);
    await routed(id);
    await h.services.lifecycle.destroy(h.admin, id, { wait: true });
    await refused(id);
  });

  test('a sandbox moved to another project (as a pool claim moves one) is refused to the old project', async () => {
    const other = await h.services.iam.createProject(h.admin, { name: 'moved-to' });
    const child = await h.services.iam.createProject(h.admin, { name: 'moved-from' });
    const key = await h.services.iam.issueKey(child.id, 'k', 'admin');
    const p = await h.services.iam.authenticate(`Bearer ${key.key}`);
    const id = (await h.services.sandboxes.create(p, { image: { base: 'busybox' } })).id;
    await h.services.lifecycle.route(p, id);
    await h.services.lifecycle.route(p, id);
    await h.store.db.updateTable('sandboxes').set({ project_id: other.id }).where('id', '=', id).execute();
    await refused(id, p);
  });

  test('a key of another project is refused a sandbox whose row is cached', async () => {
    const id = await newSandbox();
    await routed(id);
    const project = await h.services.iam.createProject(h.admin, { name: 'stranger' });
    const key = await h.services.iam.issueKey(project.id, 'k', 'admin');
    const stranger = await h.services.iam.authenticate(`Bearer ${key.key}`);
    await refused(id, stranger);
  });

  test('raw SQL writes and a rolled-back transaction leave no stale row', async () => {
    const id = await newSandbox();
    await routed(id);
    await sql`UPDATE sandboxes SET state = 'stopping' WHERE id = ${id}`.execute(h.store.db);
    await refused(id);
    await sql`UPDATE sandboxes SET state = 'running' WHERE id = ${id}`.execute(h.store.db);
    assert.equal((await routed(id)).state, 'running');
    // A row read inside a transaction that is then rolled back is not what the store holds.
    await assert.rejects(
      h.store.db.transaction().execute(async (tx) => {
        await tx.updateTable('sandboxes').set({ state: 'stopping' }).where('id', '=', id).execute();
        assert.equal((await tx.selectFrom('sandboxes').select('state').where('id', '=', id).executeTakeFirst())?.state, 'stopping');
        throw new Error('roll back');
      }),
      /roll back/,
    );
    assert.equal((await routed(id)).state, 'running');
  });

  test('a read overtaken by a write does not fill the cache', async () => {
    const id = await newSandbox();
    const cache = h.store.sandboxRows!;
    cache.forget();
    let written = false;
    const row = await cache.get(id, async () => {
      const r = await h.store.sandboxOnly(id);
      await h.store.transitionSandbox(id, ['running'], 'paused');
      written = true;
      return r;
    });
    assert.ok(written);
    assert.equal(row?.state, 'running');
    assert.equal((await h.store.sandboxRouted(id))?.state, 'paused');
    await h.store.transitionSandbox(id, ['paused'], 'running');
  });

  test('which statements drop the rows', () => {
    assert.ok(mayChangeSandboxRows('update "sandboxes" set "state" = ?'));
    assert.ok(mayChangeSandboxRows('DELETE FROM sandboxes WHERE id = ?'));
    assert.ok(mayChangeSandboxRows('rollback to dsec_group_tx'));
    assert.ok(!mayChangeSandboxRows('insert into "sandbox_labels" ("sandbox_id") values (?)'));
    assert.ok(!mayChangeSandboxRows('insert into "audit" ("id") values (?)'));
  });
});

describe('verified API keys kept in memory', () => {
  let h: Harness;
  before(async () => {
    h = await harness();
  });
  after(async () => h.close());

  test('a revoked key is refused by the next request, though it was verified a moment ago', async () => {
    const key = await h.services.iam.issueKey(h.admin.projectId, 'revoked', 'member');
    const header = `Bearer ${key.key}`;
    assert.equal((await h.services.iam.authenticate(header)).keyId, key.id);
    assert.equal((await h.services.iam.authenticate(header)).keyId, key.id);
    await h.services.iam.revokeKey(h.admin, key.id);
    await assert.rejects(h.services.iam.authenticate(header), (err: Error & { code?: string }) => err.code === 'UNAUTHENTICATED');
  });

  test('a key revoked while its verification was under way is not kept', async () => {
    const key = await h.services.iam.issueKey(h.admin.projectId, 'racing', 'member');
    const header = `Bearer ${key.key}`;
    // The revoke lands right after the verification read the key (still live) from the store.
    const store = h.store;
    const keyByHash = store.keyByHash.bind(store);
    store.keyByHash = async (hash) => {
      const row = await keyByHash(hash);
      await h.services.iam.revokeKey(h.admin, key.id);
      return row;
    };
    try {
      await h.services.iam.authenticate(header);
    } finally {
      store.keyByHash = keyByHash;
    }
    await assert.rejects(h.services.iam.authenticate(header), (err: Error & { code?: string }) => err.code === 'UNAUTHENTICATED');
  });

  test('a wrong secret with a valid prefix is refused, and the valid one still works', async () => {
    const key = await h.services.iam.issueKey(h.admin.projectId, 'prefix', 'member');
    await h.services.iam.authenticate(`Bearer ${key.key}`);
    await assert.rejects(h.services.iam.authenticate(`Bearer ${key.key}x`), (err: Error & { code?: string }) => err.code === 'UNAUTHENTICATED');
    assert.equal((await h.services.iam.authenticate(`Bearer ${key.key}`)).keyId, key.id);
  });
});
