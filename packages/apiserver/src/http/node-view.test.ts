// GET /v1/nodes and /v1/nodes/{name}: the operator's figures of the nodes (allocation, sandboxes,
// layer cache, address) only for keys of the root project, as in the node usage stream
// (fake node, real store).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { NodeDetailSchema } from '@dsec/protocol';
import type { NodeDetail } from '@dsec/protocol';
import { Metrics } from '../metrics.js';
import { harness } from '../testing/harness.js';
import type { Harness } from '../testing/harness.js';
import { createApp } from './app.js';

describe('what a key sees of the nodes in GET /v1/nodes and /v1/nodes/{name}', () => {
  let h: Harness;
  let app: ReturnType<typeof createApp>;
  let tenantProject = '';
  before(async () => {
    h = await harness();
    app = createApp(h.services, new Metrics(h.services), () => undefined);
    tenantProject = (await h.services.iam.createProject(h.admin, { name: 'tenant-n' })).id;
    await h.services.sandboxes.create(h.admin, { image: { base: 'busybox' } });
  });
  after(async () => {
    await h.services.lifecycle.teardownsIdle();
    await h.close();
  });

  const get = async (path: string, key: string) => {
    const res = await app.request(path, { headers: { authorization: `Bearer ${key}` } });
    return { status: res.status, body: (await res.json()) as { items?: NodeDetail[]; error?: { code: string } } };
  };
  const ours = async (key: string): Promise<NodeDetail> => {
    const res = await get('/v1/nodes', key);
    assert.equal(res.status, 200);
    const n = res.body.items?.find((i) => i.name === h.edge.nodeName);
    assert.ok(n);
    return NodeDetailSchema.parse(n);
  };

  test("a tenant's viewer gets the node without the cluster's allocation, sandboxes or address", async () => {
    for (const role of ['viewer', 'admin'] as const) {
      const key = (await h.services.iam.issueKey(tenantProject, `tenant-${role}`, role)).key!;
      const n = await ours(key);
      assert.equal(n.state, 'ready');
      assert.ok(n.healthy && n.backends.length > 0);
      assert.ok(n.capacity.cpu > 0 && n.capacity.sandboxes > 0, 'capacity is shown');
      assert.equal(n.allocated, null);
      assert.equal(n.allocatable, null);
      assert.equal(n.sandboxes, null);
      assert.equal(n.address, null);
      assert.ok(n.layerCache === undefined || n.layerCache === null);
      // One node in full stays the root project's admins'.
      assert.equal((await get(`/v1/nodes/${h.edge.nodeName}`, key)).status, 403);
    }
  });

  test("the root project's viewer gets the allocation and the sandboxes; its admin the same from /v1/nodes/{name}", async () => {
    const viewer = (await h.services.iam.issueKey(h.admin.projectId, 'root-viewer', 'viewer')).key!;
    const n = await ours(viewer);
    assert.equal(n.allocated?.sandboxes, 1);
    assert.ok(n.allocatable && n.allocatable.cpu > 0);
    assert.deepEqual(n.sandboxes, { running: 1 });
    const one = await get(`/v1/nodes/${h.edge.nodeName}`, h.adminKey);
    assert.equal(one.status, 200);
    const full = NodeDetailSchema.parse(one.body);
    assert.deepEqual(full.allocated, n.allocated);
    assert.deepEqual(full.sandboxes, { running: 1 });
  });
});
