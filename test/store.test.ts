// The state store's behaviour, once on SQLite and once on PostgreSQL (a cluster of the test's
// own): the same migrations, the same answers. The PostgreSQL suite also checks what replicas
// rely on: two stores on one database migrate once and never over-admit, double-claim or
// double-number under concurrency.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import Database from 'better-sqlite3';
import { sql } from 'kysely';
import { NodeRegistry, ROOT_PROJECT_ID, StateStore, WatchStore, WsTickets, reconcileGoneReplica, reconcileOwnNodes } from '@dsec/apiserver';
import { FakeEdge } from '@dsec/apiserver/testing';
import { postgresSkipReason, startCommitCutter, startTestPostgres } from './helpers/postgres.js';
import type { TestPostgres } from './helpers/postgres.js';

const QUOTA = { sandboxes: 10, cpu: 100, memoryMiB: 100_000 };

function sandboxRow(id: string, projectId: string, extra: Record<string, unknown> = {}) {
  const t = new Date().toISOString();
  return {
    id,
    project_id: projectId,
    node: 'n1',
    backend: 'container',
    state: 'running',
    spec: '{}',
    layers: '[]',
    cpu: 1,
    memory_mib: 256,
    created_at: t,
    expires_at: new Date(Date.now() + 3_600_000).toISOString(),
    pool_id: null,
    ...extra,
  };
}

/** The behaviour every store has; `open` gives a fresh, empty store. */
function storeSuite(open: () => Promise<StateStore>): void {
  let store: StateStore;
  before(async () => {
    store = await open();
  });
  after(async () => {
    await store?.close();
  });

  it('has the root project and refuses a duplicate project name', async () => {
    assert.ok(await store.project(ROOT_PROJECT_ID));
    await store.createProject({ name: 'dup', parentId: ROOT_PROJECT_ID, quota: QUOTA });
    await assert.rejects(store.createProject({ name: 'dup', parentId: ROOT_PROJECT_ID, quota: QUOTA }), { code: 'CONFLICT' });
    await store.ping();
  });

  it('reserves within the quota of a project and its ancestors, and gives back', async () => {
    const parent = await store.createProject({ name: 'q-parent', parentId: ROOT_PROJECT_ID, quota: { sandboxes: 3, cpu: 100, memoryMiB: 100_000 } });
    const child = await store.createProject({ name: 'q-child', parentId: parent.id, quota: QUOTA });
    const r = { sandboxes: 1, cpu: 1, memoryMiB: 256 };
    await store.reserve(child.id, r);
    const many = await store.reserveMany(child.id, [r, r, r]);
    assert.deepEqual(
      many.map((e) => e?.code),
      [undefined, undefined, 'QUOTA_EXCEEDED'],
    );
    await assert.rejects(store.reserve(child.id, r), { code: 'QUOTA_EXCEEDED' });
    assert.equal((await store.project(child.id))!.used_sandboxes, 3, 'a refusal rolls back the child too');
    await store.unreserve(child.id, { sandboxes: 3, cpu: 3, memoryMiB: 768 });
    const p = (await store.project(parent.id))!;
    assert.deepEqual([p.used_sandboxes, p.used_cpu, p.used_memory_mib], [0, 0, 0]);
  });

  it('stores, lists, pages and deletes sandboxes with labels', async () => {
    const prj = await store.createProject({ name: 'sbx', parentId: ROOT_PROJECT_ID, quota: QUOTA });
    for (const id of ['sbx-a_1', 'sbx-B_2', 'sbx-c_3']) {
      await store.reserve(prj.id, { sandboxes: 1, cpu: 1, memoryMiB: 256 });
      await store.insertSandbox(sandboxRow(id, prj.id), { job: id === 'sbx-c_3' ? 'x' : 'y' });
    }
    // Text order is code-point order on both stores ('B' < 'a').
    const page1 = await store.listSandboxes({ projectIds: [prj.id], labels: [], limit: 2 });
    assert.deepEqual(
      page1.map((s) => s.id),
      ['sbx-B_2', 'sbx-a_1'],
    );
    const page2 = await store.listSandboxes({ projectIds: [prj.id], labels: [], limit: 2, after: page1[1]!.id });
    assert.deepEqual(
      page2.map((s) => s.id),
      ['sbx-c_3'],
    );
    const labelled = await store.listSandboxes({ projectIds: [prj.id], labels: [['job', 'y']], limit: 10 });
    assert.equal(labelled.length, 2);
    assert.equal(await store.transitionSandbox('sbx-a_1', ['running'], 'paused'), true);
    assert.equal(await store.transitionSandbox('sbx-a_1', ['running'], 'paused'), false);
    const row = (await store.sandbox('sbx-a_1'))!;
    assert.deepEqual(row.labels, { job: 'y' });
    assert.equal(row.cpu, 1);
    await store.deleteSandbox(row);
    assert.equal(await store.sandbox('sbx-a_1'), undefined);
    assert.equal((await store.project(prj.id))!.used_sandboxes, 2);
  });

  it('lists by label across chunks of the label index, with the other filters, page by page', async () => {
    const prj = await store.createProject({ name: 'big-list', parentId: ROOT_PROJECT_ID, quota: { sandboxes: 1000, cpu: 1000, memoryMiB: 1_000_000 } });
    const other = await store.createProject({ name: 'big-other', parentId: ROOT_PROJECT_ID, quota: QUOTA });
    // 260 with the label (every other one paused), interleaved in id order with rows the
    // filters leave out: another label value, another project.
    const ids: string[] = [];
    const inserts: Array<Promise<void>> = [];
    for (let i = 0; i < 260; i++) {
      const id = `big-${String(i).padStart(4, '0')}`;
      ids.push(id);
      inserts.push(store.insertSandbox(sandboxRow(id, prj.id, { state: i % 2 ? 'paused' : 'running' }), { job: 'big', n: String(i % 3) }));
      inserts.push(store.insertSandbox(sandboxRow(`${id}-x`, prj.id), { job: 'small' }));
    }
    inserts.push(store.insertSandbox(sandboxRow('big-0001-o', other.id), { job: 'big' }));
    await Promise.all(inserts);
    const running = ids.filter((_, i) => i % 2 === 0);
    const seen: string[] = [];
    let after: string | undefined;
    for (;;) {
      const page = await store.listSandboxes({ projectIds: [prj.id], labels: [['job', 'big']], state: 'running', limit: 50, ...(after ? { after } : {}) });
      seen.push(...page.map((r) => r.id));
      assert.ok(page.every((r) => r.state === 'running' && r.labels.job === 'big'));
      if (page.length < 50) break;
      after = page[page.length - 1]!.id;
    }
    assert.deepEqual(seen, running);
    // A page larger than the first chunk, with a second label on top.
    const both = await store.listSandboxes({
      projectIds: [prj.id],
      labels: [
        ['job', 'big'],
        ['n', '0'],
      ],
      limit: 500,
    });
    assert.deepEqual(
      both.map((r) => r.id),
      ids.filter((_, i) => i % 3 === 0),
    );
  });

  it("lists by a label other tenants use a lot: past a few chunks of the label index the rest of the page comes from the project's rows", async () => {
    const mine = await store.createProject({ name: 'few-common', parentId: ROOT_PROJECT_ID, quota: QUOTA });
    const crowd = await store.createProject({ name: 'crowd-common', parentId: ROOT_PROJECT_ID, quota: { sandboxes: 5000, cpu: 5000, memoryMiB: 10_000_000 } });
    // 2,000 of another project's ids sort before this project's three: more than the chunks a
    // list reads from the label's index (100 + 200 + 400 + 800).
    const inserts: Array<Promise<void>> = [];
    for (let i = 0; i < 2000; i++) inserts.push(store.insertSandbox(sandboxRow(`cmn-a${String(i).padStart(4, '0')}`, crowd.id), { tier: 'common' }));
    for (const id of ['cmn-b1', 'cmn-b2', 'cmn-b3']) inserts.push(store.insertSandbox(sandboxRow(id, mine.id), { tier: 'common' }));
    await Promise.all(inserts);
    const page = await store.listSandboxes({ projectIds: [mine.id], labels: [['tier', 'common']], limit: 2 });
    assert.deepEqual(
      page.map((r) => r.id),
      ['cmn-b1', 'cmn-b2'],
    );
    const rest = await store.listSandboxes({ projectIds: [mine.id], labels: [['tier', 'common']], limit: 2, after: 'cmn-b2' });
    assert.deepEqual(
      rest.map((r) => r.id),
      ['cmn-b3'],
    );
  });

  it('groups concurrent reservations and creating -> running moves, each with its own answer', async () => {
    const prj = await store.createProject({ name: 'grouped', parentId: ROOT_PROJECT_ID, quota: QUOTA });
    const r = { sandboxes: 1, cpu: 1, memoryMiB: 256 };
    const groupsBefore = store.reservations.written.groups;
    const results = await Promise.allSettled(Array.from({ length: 13 }, () => store.reserve(prj.id, r)));
    assert.equal(results.filter((x) => x.status === 'fulfilled').length, QUOTA.sandboxes, 'exactly the quota is admitted');
    assert.ok(results.filter((x) => x.status === 'rejected').every((x) => x.reason.code === 'QUOTA_EXCEEDED'));
    assert.ok(store.reservations.written.groups - groupsBefore < 13, 'concurrent reservations share transactions');
    assert.equal((await store.project(prj.id))!.used_sandboxes, QUOTA.sandboxes);
    await Promise.all(['gr-1', 'gr-2', 'gr-3'].map((id) => store.insertSandbox(sandboxRow(id, prj.id, { state: 'creating' }), {})));
    await store.insertSandbox(sandboxRow('gr-4', prj.id, { state: 'running' }), {});
    const moved = await Promise.all(['gr-1', 'gr-2', 'gr-3', 'gr-4', 'gr-none'].map((id) => store.transitionSandboxGrouped(id, ['creating'], 'running')));
    assert.deepEqual(moved, [true, true, true, false, false]);
    assert.equal((await store.sandboxOnly('gr-2'))!.state, 'running');
  });

  it("reads what a node's share needs of its rows, without their specs; counts a node's rows by state", async () => {
    const prj = await store.createProject({ name: 'shares', parentId: ROOT_PROJECT_ID, quota: QUOTA });
    const spec = (o: object): string => JSON.stringify({ image: { base: 'b' }, ...o });
    await store.insertSandbox(
      sandboxRow('sh-1', prj.id, { node: 'sh-a', spec: spec({ labels: { 'dsec.spread-by': 'job', job: 'j1' }, resources: { cpuClass: 'best-effort' } }) }),
      {},
    );
    await store.insertSandbox(sandboxRow('sh-2', prj.id, { node: 'sh-a', state: 'paused', paused_at: new Date().toISOString(), spec: spec({}) }), {});
    await store.insertSandbox(sandboxRow('sh-3', prj.id, { node: 'sh-b', spec: spec({ labels: {} }) }), {});
    const shares = new Map((await store.sandboxShares('sh-a')).map((r) => [r.id, r]));
    assert.deepEqual([...shares.keys()].sort(), ['sh-1', 'sh-2']);
    const one = shares.get('sh-1')!;
    assert.equal(one.cpu_class, 'best-effort');
    assert.deepEqual(JSON.parse(one.labels!), { 'dsec.spread-by': 'job', job: 'j1' });
    assert.equal('spec' in one, false);
    const two = shares.get('sh-2')!;
    assert.deepEqual([two.state, two.cpu_class, two.labels, typeof two.paused_at], ['paused', null, null, 'string']);
    assert.equal((await store.sandboxShares()).filter((r) => r.id.startsWith('sh-')).length, 3);
    assert.deepEqual(await store.sandboxStatesOn('sh-a'), { running: 1, paused: 1 });
    assert.deepEqual(
      (await store.sandboxesOnNodes(['sh-b', 'sh-none'])).map((r) => r.id),
      ['sh-3'],
    );
    assert.deepEqual(await store.sandboxesOnNodes([]), []);
  });

  it('writes a group of rows too large for one statement (megabytes of spec each) whole', async () => {
    const prj = await store.createProject({ name: 'big-specs', parentId: ROOT_PROJECT_ID, quota: QUOTA });
    const spec = (i: number): string => JSON.stringify({ image: { base: 'b' }, env: { BIG: String(i).repeat(6 * 1024 * 1024) } });
    await Promise.all([1, 2, 3].map((i) => store.insertSandbox(sandboxRow(`big-spec-${i}`, prj.id, { spec: spec(i) }), { n: String(i) })));
    for (const i of [1, 2, 3]) {
      const row = (await store.sandbox(`big-spec-${i}`))!;
      assert.equal(row.spec, spec(i));
      assert.deepEqual(row.labels, { n: String(i) });
    }
  });

  it('reads the shares of rows whose spec holds an escaped NUL or unpaired surrogate (written before the API refused them)', async () => {
    const prj = await store.createProject({ name: 'shares-odd', parentId: ROOT_PROJECT_ID, quota: QUOTA });
    const spec = JSON.stringify({ image: { base: 'b' }, env: { A: 'x\ud800', B: 'a\u0000b' }, labels: { job: 'j' }, resources: { cpuClass: 'best-effort' } });
    await store.insertSandbox(sandboxRow('odd-1', prj.id, { node: 'odd-n', spec }), {});
    await store.insertSandbox(sandboxRow('odd-2', prj.id, { node: 'odd-n', spec: JSON.stringify({ image: { base: 'b' } }) }), {});
    const shares = new Map((await store.sandboxShares('odd-n')).map((r) => [r.id, r]));
    assert.equal(shares.get('odd-1')?.cpu_class, 'best-effort');
    assert.deepEqual(JSON.parse(shares.get('odd-1')!.labels!), { job: 'j' });
    assert.deepEqual([shares.get('odd-2')?.cpu_class, shares.get('odd-2')?.labels], [null, null]);
    assert.ok((await store.sandboxShares()).some((r) => r.id === 'odd-1'));
  });

  it('hands one idempotency key to one request', async () => {
    const prj = await store.createProject({ name: 'idem', parentId: ROOT_PROJECT_ID, quota: QUOTA });
    const k = { projectId: prj.id, key: 'k1', requestHash: 'h', ttlMs: 60_000 };
    const results = await Promise.all([store.acquireIdempotencyKey(k), store.acquireIdempotencyKey(k), store.acquireIdempotencyKey(k)]);
    assert.equal(results.filter((r) => r.owned).length, 1);
    await store.completeIdempotencyKey(prj.id, 'k1', 'sbx-1', '{}');
    const again = await store.acquireIdempotencyKey(k);
    assert.equal(again.owned, false);
    assert.equal(!again.owned && again.row.sandbox_id, 'sbx-1');
  });

  it('claims a pooled member once', async () => {
    const prj = await store.createProject({ name: 'pool', parentId: ROOT_PROJECT_ID, quota: QUOTA });
    const { row: pool } = await store.putPool({
      projectId: prj.id,
      name: 'p',
      spec: '{}',
      resolved: '{}',
      specKey: 'sk',
      size: 1,
      idleTimeoutMs: 60_000,
      maxPools: 5,
    });
    await store.insertSandbox(sandboxRow('sbx-pooled', prj.id, { state: 'pooled', pool_id: pool.id }), {});
    const claim = {
      projectId: prj.id,
      specKey: 'sk',
      spec: '{"x":1}',
      labels: { a: 'b' },
      createdAt: new Date().toISOString(),
      expiresAt: new Date(Date.now() + 60_000).toISOString(),
      lease: '{}',
      ownerId: null,
    };
    const claims = await Promise.all([store.claimPooled(claim), store.claimPooled(claim), store.claimPooled(claim)]);
    assert.deepEqual(
      claims.filter(Boolean).map((c) => c!.id),
      ['sbx-pooled'],
    );
    assert.deepEqual((await store.sandbox('sbx-pooled'))!.labels, { a: 'b' });
  });

  it('records trajectories and numbers their steps from the database', async () => {
    const t = new Date().toISOString();
    await store.writeTrajectories({
      headers: [
        {
          sandbox_id: 'sbx-t',
          project_id: ROOT_PROJECT_ID,
          spec: '{}',
          layers: '[]',
          created_at: t,
          ended_at: null,
          steps: 0,
          bytes: 0,
          truncated: 0,
          cut_at: null,
        },
      ],
      steps: [0, 1].map((seq) => ({ sandbox_id: 'sbx-t', seq, kind: 'exec', started_at: t, bytes: 2, step: '{}' })),
      counters: [{ sandbox_id: 'sbx-t', steps: 2, bytes: 4, truncated: 0 }],
      ends: [],
    });
    assert.equal(await store.lastTrajectorySeq('sbx-t'), 1);
    assert.equal(await store.peekTrajectorySeq('sbx-t'), 2);
    const seqs = await Promise.all(Array.from({ length: 10 }, () => store.nextTrajectorySeq('sbx-t')));
    assert.deepEqual(
      seqs.sort((a, b) => a - b),
      [2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
    );
    assert.equal((await store.trajectorySteps('sbx-t', 0, 10)).length, 1);
    assert.equal((await store.trajectory('sbx-t'))!.steps, 2);
  });

  it('stores and pages events in id order', async () => {
    const watch = new WatchStore(store.db);
    const ev = (id: string) => ({
      id,
      at: new Date().toISOString(),
      kind: 'sandbox.lost' as const,
      severity: 'warning' as const,
      projectId: null,
      sandboxId: null,
      node: 'n1',
      message: id,
      data: { n: 1 },
    });
    await watch.insertEvents([ev('ev_0002'), ev('ev_0001'), ev('ev_0003')]);
    const page = await watch.queryEvents({ projectIds: 'all', includeUnscoped: true, limit: 2, order: 'asc', cursor: 'ev_0001' });
    assert.deepEqual(
      page.map((e) => e.id),
      ['ev_0002', 'ev_0003'],
    );
    assert.deepEqual(page[0]!.data, { n: 1 });
  });
}

describe('state store: SQLite', () => {
  storeSuite(() => StateStore.openSqlite(new Database(':memory:')));
});

const skip = postgresSkipReason();
describe('state store: PostgreSQL', { skip }, () => {
  let server: TestPostgres | undefined;
  let n = 0;
  const fresh = async (): Promise<string> => server!.createDatabase(`store_${++n}`);
  before(async () => {
    server = await startTestPostgres();
  });
  after(async () => {
    await server?.close();
  });

  describe('the suite', () => {
    storeSuite(async () => StateStore.openPostgres(await fresh()));
  });

  describe('replicas on one database', () => {
    it('migrate once when they start together, with synchronous commits', async () => {
      const url = await fresh();
      const stores = await Promise.all([StateStore.openPostgres(url), StateStore.openPostgres(url), StateStore.openPostgres(url)]);
      try {
        assert.ok(stores.every((s) => s.shared));
        const res = await server!.query('SELECT name FROM kysely_migration ORDER BY name', url.slice(url.lastIndexOf('/') + 1));
        assert.equal(new Set(res.rows.map((r: { name: string }) => r.name)).size, res.rows.length);
        assert.ok(res.rows.some((r: { name: string }) => r.name === '0007_replicas'));
        const sync = await sql<{ synchronous_commit: string }>`SHOW synchronous_commit`.execute(stores[0].db);
        assert.equal(sync.rows[0]?.synchronous_commit, 'on');
      } finally {
        for (const s of stores) await s.close();
      }
    });

    it('never over-admit: 50 concurrent reservations over two stores', async () => {
      const url = await fresh();
      const a = await StateStore.openPostgres(url);
      const b = await StateStore.openPostgres(url);
      try {
        const prj = await a.createProject({ name: 'race', parentId: ROOT_PROJECT_ID, quota: { sandboxes: 20, cpu: 1000, memoryMiB: 1_000_000 } });
        const r = { sandboxes: 1, cpu: 1, memoryMiB: 1 };
        const results = await Promise.allSettled(Array.from({ length: 50 }, (_, i) => (i % 2 ? a : b).reserve(prj.id, r)));
        assert.equal(results.filter((x) => x.status === 'fulfilled').length, 20);
        for (const x of results) if (x.status === 'rejected') assert.equal((x.reason as { code: string }).code, 'QUOTA_EXCEEDED');
        assert.equal((await b.project(prj.id))!.used_sandboxes, 20);
        assert.equal((await b.project(ROOT_PROJECT_ID))!.used_sandboxes, 20);
      } finally {
        await a.close();
        await b.close();
      }
    });

    it("a create's writes: a reservation is four statements, its id from the reservation row; rows, labels, keys and the row's take-back are one", async () => {
      const url = await fresh();
      const proxy = await startCommitCutter(server!.port);
      const s = await StateStore.openPostgres(proxy.url(url.slice(url.lastIndexOf('/') + 1)));
      const heads = (): string[] => proxy.statements.splice(0).map((q) => q.trim().split(/\s+/).slice(0, 3).join(' ').toLowerCase());
      try {
        const prj = await s.createProject({ name: 'trips', parentId: ROOT_PROJECT_ID, quota: QUOTA });
        const r = { sandboxes: 1, cpu: 0.1, memoryMiB: 256 };
        const held = async (): Promise<unknown[]> =>
          (await s.db.selectFrom('replica_reservations').select(['sandboxes', 'memory_mib']).where('project_id', '=', prj.id).execute()).map((h) => [
            Number(h.sandboxes),
            Number(h.memory_mib),
          ]);
        assert.deepEqual((await s.acquireIdempotencyKey({ projectId: prj.id, key: 'k1', requestHash: 'h', ttlMs: 60_000 })).owned, true);
        await s.ancestry(prj.id); // read once, then kept
        heads();
        await Promise.all([s.reserve(prj.id, r), s.reserve(prj.id, r), s.reserve(prj.id, r)]);
        // One group: BEGIN, the project and its parent, the replica's row (answering the transaction's id), COMMIT.
        assert.deepEqual(heads(), ['begin', 'update "projects" set', 'update "projects" set', 'insert into "replica_reservations"', 'commit']);
        assert.deepEqual(await held(), [[3, 768]]);
        const creating = (id: string) => sandboxRow(id, prj.id, { state: 'creating', cpu: 0.1 });
        heads();
        await Promise.all([s.insertSandbox(creating('trip-1'), { job: 'a', n: '1' }, 'k1'), s.insertSandbox(creating('trip-2'), { job: 'a' })]);
        assert.deepEqual(heads(), ['with rows_in as'], 'one statement');
        assert.deepEqual((await s.sandbox('trip-1'))?.labels, { job: 'a', n: '1' });
        assert.deepEqual((await s.sandbox('trip-2'))?.labels, { job: 'a' });
        assert.equal((await s.sandboxOnly('trip-1'))?.replica, s.sessionTag);
        assert.equal((await s.db.selectFrom('idempotency_keys').select('sandbox_id').where('key', '=', 'k1').executeTakeFirst())?.sandbox_id, 'trip-1');
        assert.deepEqual(await held(), [[1, 256]], 'the rows hold two of the three');
        // The last one's row: the replica's row holds nothing and goes, in the same statement (float CPU residue or not).
        heads();
        await s.insertSandbox(creating('trip-3'), {});
        assert.deepEqual(heads(), ['with rows_in as']);
        assert.deepEqual(await held(), []);
        // A reservation given back: BEGIN, the two projects, the row taken back (deleted at zero), COMMIT.
        await s.reserve(prj.id, r);
        heads();
        await s.unreserve(prj.id, r);
        assert.deepEqual(heads(), ['begin', 'update "projects" set', 'update "projects" set', 'with held_gone as', 'commit']);
        assert.deepEqual(await held(), []);
        assert.equal((await s.project(prj.id))!.used_sandboxes, 3);
        // A group with a row that cannot be written: that one fails alone, the others are written whole.
        await Promise.all([s.reserve(prj.id, r), s.reserve(prj.id, r)]);
        const results = await Promise.allSettled([s.insertSandbox(creating('trip-1'), { job: 'dup' }), s.insertSandbox(creating('trip-4'), { job: 'b' })]);
        assert.deepEqual(
          results.map((x) => x.status),
          ['rejected', 'fulfilled'],
        );
        assert.deepEqual((await s.sandbox('trip-4'))?.labels, { job: 'b' });
        assert.deepEqual((await s.sandbox('trip-1'))?.labels, { job: 'a', n: '1' }, 'the refused one changed nothing');
        assert.deepEqual(await held(), [[1, 256]], 'the refused row still held by the replica');
      } finally {
        await s.close();
        await proxy.close();
      }
    });

    it('a WebSocket ticket issued through one store is redeemed once through the other, however many try at once', async () => {
      const url = await fresh();
      const a = await StateStore.openPostgres(url);
      const b = await StateStore.openPostgres(url);
      try {
        const { ticket } = await new WsTickets(a).issue('key_t');
        const redeemers = [new WsTickets(a), new WsTickets(b)];
        const got = await Promise.all(Array.from({ length: 10 }, (_, i) => redeemers[i % 2]!.redeem(ticket)));
        assert.deepEqual(
          got.filter((k) => k !== undefined),
          ['key_t'],
        );
        const expired = await new WsTickets(b, 1).issue('key_u');
        await new Promise((r) => setTimeout(r, 10));
        assert.equal(await new WsTickets(a).redeem(expired.ticket), undefined, 'expired');
      } finally {
        await a.close();
        await b.close();
      }
    });

    it('share rate buckets and exclusive sections', async () => {
      const url = await fresh();
      const a = await StateStore.openPostgres(url);
      const b = await StateStore.openPostgres(url);
      try {
        // burst 10 at 0.001/s: exactly 10 takes succeed over both stores.
        const waits = await Promise.all(Array.from({ length: 30 }, (_, i) => (i % 2 ? a : b).takeRateToken('key_x', 0.001, 10)));
        assert.equal(waits.filter((w) => w === 0).length, 10);
        assert.ok(waits.filter((w) => w > 0).every((w) => w > 1000));
        // Takes of several buckets at once go in one statement; each bucket still grants only its own tokens.
        const groupsBefore = a.rateTakes.written.groups;
        const mixed = await Promise.all(Array.from({ length: 12 }, (_, i) => a.takeRateToken(`key_m${i % 3}`, 0.001, 2)));
        for (let k = 0; k < 3; k++) assert.equal(mixed.filter((w, i) => i % 3 === k && w === 0).length, 2, `bucket ${k}`);
        assert.ok(a.rateTakes.written.groups - groupsBefore < 12, 'grouped');
        let inside = 0;
        let most = 0;
        await Promise.all(
          Array.from({ length: 6 }, (_, i) =>
            (i % 2 ? a : b).exclusive('test', async () => {
              most = Math.max(most, ++inside);
              await new Promise((r) => setTimeout(r, 20));
              inside--;
            }),
          ),
        );
        assert.equal(most, 1);
      } finally {
        await a.close();
        await b.close();
      }
    });

    it("a gone replica's work: its rows on a node another starts with are settled at that start, orphans go, a claim and keys settle with its work", async () => {
      const url = await fresh();
      const a = await StateStore.openPostgres(url);
      const b = await StateStore.openPostgres(url);
      const edge = new FakeEdge('n1');
      const nodes = new NodeRegistry();
      nodes.add(edge);
      try {
        for (const id of ['sbx-pausing', 'sbx-claimed', 'sbx-live', 'sbx-kept', 'sbx-orphan']) await edge.create({ image: { base: 'busybox' } }, { id });
        // Replica a's work under way: a pause (the node paused it), a pool claim (the node not yet told), a create whose
        // key recorded its sandbox (the row stands), a create that died before its row.
        await a.insertSandbox(sandboxRow('sbx-pausing', ROOT_PROJECT_ID), {});
        assert.equal(await a.transitionSandbox('sbx-pausing', ['running'], 'pausing'), true);
        await edge.pause('sbx-pausing');
        const { row: pool } = await a.putPool({
          projectId: ROOT_PROJECT_ID,
          name: 'p',
          spec: '{}',
          resolved: '{}',
          specKey: 'sk',
          size: 1,
          idleTimeoutMs: 60_000,
          maxPools: 5,
        });
        await a.insertSandbox(sandboxRow('sbx-claimed', ROOT_PROJECT_ID, { state: 'pooled', pool_id: pool.id }), {});
        const t = new Date().toISOString();
        const claimed = await a.claimPooled({
          projectId: ROOT_PROJECT_ID,
          specKey: 'sk',
          spec: '{}',
          labels: {},
          createdAt: t,
          expiresAt: t,
          lease: '{}',
          ownerId: null,
        });
        assert.deepEqual([claimed?.state, claimed?.replica], ['creating', a.sessionTag], 'a claim is in flight, and whose');
        for (const key of ['stands', 'died']) await a.acquireIdempotencyKey({ projectId: ROOT_PROJECT_ID, key, requestHash: 'h', ttlMs: 60_000 });
        await a.insertSandbox(sandboxRow('sbx-kept', ROOT_PROJECT_ID), {}, 'stands');
        // Replica b's own create under way on the same node: never touched.
        await b.insertSandbox(sandboxRow('sbx-live', ROOT_PROJECT_ID, { state: 'creating' }), {});
        await a.close();
        assert.deepEqual(await b.replicasWithoutSessions(), [a.sessionTag]);

        const deps = { store: b, nodes, log: () => undefined };
        const start = await reconcileOwnNodes(deps);
        assert.deepEqual(
          Object.fromEntries(start.settled.map((s) => [s.id, s.to])),
          { 'sbx-pausing': 'running', 'sbx-claimed': 'deleted' },
          'settled at the start, against the node',
        );
        assert.deepEqual(start.orphans, ['sbx-orphan']);
        assert.equal(edge.sandboxes.get('sbx-pausing')?.state, 'running');
        assert.deepEqual([...edge.sandboxes.keys()].sort(), ['sbx-kept', 'sbx-live', 'sbx-pausing']);
        assert.equal((await b.sandboxOnly('sbx-live'))?.state, 'creating', "a live replica's create is left to it");

        const gone = await reconcileGoneReplica(deps, a.sessionTag!);
        assert.equal(gone.idempotencyKeys, 1);
        assert.deepEqual(gone.idempotencySettled, ['stands -> sbx-kept']);
        // A retry with either key: the standing sandbox, or a create anew; never a second sandbox.
        const stands = await b.acquireIdempotencyKey({ projectId: ROOT_PROJECT_ID, key: 'stands', requestHash: 'h', ttlMs: 60_000 });
        assert.deepEqual(stands.owned ? undefined : [stands.row.state, stands.row.sandbox_id], ['done', 'sbx-kept']);
        assert.equal((await b.acquireIdempotencyKey({ projectId: ROOT_PROJECT_ID, key: 'died', requestHash: 'h', ttlMs: 60_000 })).owned, true);
        assert.deepEqual(await b.replicasWithoutSessions(), [], 'nothing of it left');
      } finally {
        await a.close().catch(() => undefined);
        await b.close();
      }
    });

    it('refuse to open a database that cannot be reached, naming it without its password', async () => {
      const url = server!.url('no_such_database').replace('dsec@', 'dsec:secret@');
      await assert.rejects(StateStore.openPostgres(url), (err: Error & { code?: string }) => {
        assert.equal(err.code, 'UNAVAILABLE');
        assert.match(err.message, /no_such_database/);
        assert.doesNotMatch(err.message, /secret/);
        return true;
      });
    });
  });
});
