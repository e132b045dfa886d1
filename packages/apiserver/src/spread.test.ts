// Anti-affinity through the services: sandboxes labelled `dsec.spread-by: job` are spread over
// the nodes by their `job` label, in single and batch creates; a destroy gives the node's count
// back. Real SQLite store in memory, two in-memory nodes.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import Database from 'better-sqlite3';
import { Authenticator } from './auth.js';
import type { Principal } from './auth.js';
import { PUBLIC_PROJECT_ID, ROOT_PROJECT_ID, StateStore } from './db/store.js';
import { NodeRegistry } from './nodes.js';
import { Placement, SPREAD_BY_LABEL } from './scheduler.js';
import { createServices } from './services/index.js';
import type { Services } from './services/index.js';
import { FakeEdge, fakeLayer } from './testing/fake-edge.js';

let store: StateStore;
let services: Services;
let nodes: NodeRegistry;
let admin: Principal;

before(async () => {
  store = await StateStore.openSqlite(new Database(':memory:'));
  const auth = new Authenticator(store);
  nodes = new NodeRegistry();
  const base = fakeLayer('busybox');
  for (const name of ['n1', 'n2', 'n3']) {
    const edge = new FakeEdge(name);
    edge.layerInfos.set(base.digest, base);
    nodes.add(edge);
  }
  services = createServices({ store, auth, nodes, placement: new Placement({ sampleK: 2 }), raise: () => undefined, log: () => undefined });
  await services.layers.register(PUBLIC_PROJECT_ID, base, 'busybox');
  const key = await services.iam.issueKey(ROOT_PROJECT_ID, 'admin', 'admin');
  admin = await auth.authenticate(`Bearer ${key.key ?? ''}`);
});

after(async () => {
  await services.poolManager.stop();
  services.admission.close();
  await services.trajectory.close();
  await store.close();
});

const labels = (job: string): Record<string, string> => ({ job, [SPREAD_BY_LABEL]: 'job' });

test('the sandboxes of one job go one per node while nodes without one remain', async () => {
  const ids: string[] = [];
  for (let i = 0; i < 3; i++) ids.push((await services.sandboxes.create(admin, { image: { base: 'busybox' }, labels: labels('a') })).id);
  const on = (await Promise.all(ids.map((id) => store.sandbox(id)))).map((r) => r?.node);
  assert.deepEqual([...on].sort(), ['n1', 'n2', 'n3']);
  assert.equal(nodes.get('n1')?.labelCount?.('job=a'), 1);

  // A batch of another job spreads the same way; the first job's count does not weigh on it.
  const batch = await services.sandboxes.createBatch(admin, { spec: { image: { base: 'busybox' }, labels: labels('b') }, count: 6 });
  const batchNodes = await Promise.all(batch.items.map(async (it) => (await store.sandbox(it.sandbox!.id))?.node));
  for (const n of ['n1', 'n2', 'n3']) assert.equal(batchNodes.filter((x) => x === n).length, 2, JSON.stringify(batchNodes));

  // A destroy gives the count back: the next sandbox of job a goes where it left.
  const gone = await store.sandbox(ids[0]!);
  await services.lifecycle.destroy(admin, ids[0]!);
  assert.equal(nodes.get(gone!.node)?.labelCount?.('job=a'), 0);
  const again = await services.sandboxes.create(admin, { image: { base: 'busybox' }, labels: labels('a') });
  assert.equal((await store.sandbox(again.id))?.node, gone!.node);
});

test('a sandbox its node reports lost gives its charge and spread count back once; deleting it gives nothing more', async () => {
  const sb = await services.sandboxes.create(admin, { image: { base: 'busybox' }, labels: labels('lost') });
  const row = (await store.sandbox(sb.id))!;
  const n = nodes.get(row.node)!;
  const before = { ...n.allocated };
  const other = ['n1', 'n2', 'n3'].find((x) => x !== row.node)!;
  const lost = {
    kind: 'sandbox.lost' as const,
    severity: 'warning' as const,
    sandboxId: sb.id,
    message: 'its QEMU process exited',
    data: { backend: 'microvm' },
  };
  // Another node cannot speak for it.
  services.nodeAdmin.nodeEvent({ ...lost, node: other });
  await new Promise((r) => setTimeout(r, 50));
  assert.equal((await store.sandbox(sb.id))?.state, 'running');
  services.nodeAdmin.nodeEvent({ ...lost, node: row.node });
  for (let i = 0; i < 100 && (await store.sandbox(sb.id))?.state !== 'lost'; i++) await new Promise((r) => setTimeout(r, 10));
  assert.equal((await store.sandbox(sb.id))?.state, 'lost');
  assert.equal(n.labelCount?.('job=lost'), 0);
  assert.equal(n.allocated.sandboxes, before.sandboxes - 1);
  await services.lifecycle.destroy(admin, sb.id);
  assert.equal(await store.sandbox(sb.id), undefined);
  assert.deepEqual(
    { ...n.allocated, cpu: Math.round(n.allocated.cpu * 1000) },
    { ...before, sandboxes: before.sandboxes - 1, cpu: Math.round((before.cpu - 1) * 1000), memoryMiB: before.memoryMiB - row.memory_mib },
  );
});
