// Tenant limits kept by the store (in-memory SQLite): rules per tenant with the root project's
// headroom, audit retention per project. Small limits, so that the test adds a handful of rows
// instead of a thousand (the end-to-end test in test/security/limits.test.ts uses the defaults).
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import Database from 'better-sqlite3';
import { DEFAULT_TENANT_LIMITS, DsecError } from '@dsec/protocol';
import { MAX_RULES } from '@dsec/watcher';
import { Authenticator } from './auth.js';
import type { Principal } from './auth.js';
import { ROOT_PROJECT_ID, StateStore } from './db/store.js';
import { WatchService } from './watch.js';

let store: StateStore;
let auth: Authenticator;
let watch: WatchService;
const quota = { sandboxes: 10, cpu: 10, memoryMiB: 1024 };

async function principal(projectId: string): Promise<Principal> {
  return {
    keyId: `key_${projectId}`,
    projectId,
    role: 'admin',
    visibleProjects: await auth.descendants(projectId),
    tenantId: await auth.tenantOf(projectId),
  };
}

function refusedWith(limit: string): (err: unknown) => boolean {
  return (err) => {
    assert.ok(err instanceof DsecError && err.code === 'LIMIT_EXCEEDED' && err.details.limit === limit, String(err));
    return true;
  };
}

before(async () => {
  store = await StateStore.openSqlite(new Database(':memory:'));
  auth = new Authenticator(store);
  watch = new WatchService(store, {
    // Two rules per tenant; the tenants together may use only three of the MAX_RULES.
    limits: { ...DEFAULT_TENANT_LIMITS, rulesPerTenant: 2, rootRuleHeadroom: MAX_RULES - 3, auditRowsPerProject: 3 },
    tenantProjects: (t) => auth.tenantProjects(t),
  });
  await watch.init();
});
after(async () => {
  await watch.close();
  await store.close();
});

test('rules: per tenant (a sub-project counts in its tenant), the tenants together leave the root its headroom', async () => {
  const a = await store.createProject({ name: 'a', parentId: ROOT_PROJECT_ID, quota });
  const aSub = await store.createProject({ name: 'a-sub', parentId: a.id, quota });
  const b = await store.createProject({ name: 'b', parentId: ROOT_PROJECT_ID, quota });
  await auth.invalidate();
  const rule = (n: number) => ({ kind: 'deny-domain' as const, domain: `r${n}.example` });
  await watch.createRule(await principal(a.id), rule(1));
  await watch.createRule(await principal(aSub.id), rule(2));
  await assert.rejects(watch.createRule(await principal(aSub.id), rule(3)), refusedWith('rulesPerTenant'));
  await watch.createRule(await principal(b.id), rule(4));
  await assert.rejects(watch.createRule(await principal(b.id), rule(5)), refusedWith('rootRuleHeadroom'));
  // The root project's admins can still add (an emergency rule).
  await watch.createRule(await principal(ROOT_PROJECT_ID), rule(6));
  await watch.createRule(await principal(ROOT_PROJECT_ID), rule(7));
});

test('audit retention per project: a flood in one project keeps only its newest entries and erases nothing of another', async () => {
  const entry = (projectId: string | null, i: number) => ({
    keyId: null,
    projectId,
    method: 'GET',
    route: `/v1/x/${i}`,
    sandboxId: null,
    status: projectId === null ? 401 : 200,
    durationMs: 1,
    command: null,
    exitCode: null,
  });
  watch.audit.record(entry('quiet', 0));
  watch.audit.record(entry('quiet', 1));
  for (let i = 0; i < 20; i++) watch.audit.record(entry('loud', i));
  watch.audit.record({ ...entry(null, 0), count: 40 });
  for (let i = 1; i < 10; i++) watch.audit.record(entry(null, i));
  await watch.maintain();
  const rows = await watch.store.queryAudit({ projectIds: 'all', order: 'asc', limit: 1000 });
  const of = (p: string | null) => rows.filter((r) => r.projectId === p).map((r) => r.route);
  assert.deepEqual(of('quiet'), ['/v1/x/0', '/v1/x/1']);
  assert.deepEqual(of('loud'), ['/v1/x/17', '/v1/x/18', '/v1/x/19']);
  assert.deepEqual(of(null), ['/v1/x/7', '/v1/x/8', '/v1/x/9']);
  // A collapsed entry keeps its count.
  const fresh = await StateStore.openSqlite(new Database(':memory:'));
  try {
    const w = new WatchService(fresh);
    w.audit.record({ ...entry(null, 0), count: 40 });
    await w.audit.flush();
    const [row] = await w.store.queryAudit({ projectIds: 'all', order: 'asc', limit: 10 });
    assert.equal(row?.count, 40);
    await w.close();
  } finally {
    await fresh.close();
  }
});
