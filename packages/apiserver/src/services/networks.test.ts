import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { harness } from '../testing/harness.js';
import type { Harness } from '../testing/harness.js';

describe('networks keep the run-time denied names (fake node, real store)', () => {
  let h: Harness;
  before(async () => {
    h = await harness({ deniedNames: async () => ['Evil.example.'] });
  });
  after(async () => h.close());

  test('a replaced and a patched policy both carry the denied names, and the stored spec follows', async () => {
    const { sandboxes, networks } = h.services;
    const sb = await sandboxes.create(h.admin, { image: { base: 'busybox' }, labels: { job: 'n' } });
    const replaced = await networks.change(h.admin, sb.id, { replace: { mode: 'allowlist', allow: [{ host: 'A.example' }] } });
    assert.deepEqual(replaced.policy, { mode: 'allowlist', allow: [{ host: 'a.example' }], deny: ['evil.example'] });
    const patched = await networks.change(h.admin, sb.id, { patch: { allow: { add: [{ host: 'b.example' }] } } });
    assert.deepEqual(patched.policy.deny, ['evil.example']);
    assert.equal(patched.policy.allow?.length, 2);
    assert.deepEqual((await sandboxes.get(h.admin, sb.id)).network, patched.policy);
    const applied = await networks.apply(h.admin, { selector: { labels: { job: 'n' } }, policy: { mode: 'none' } });
    assert.equal(applied.matched, 1);
    assert.deepEqual(applied.applied[0]?.network, { mode: 'none' });
  });
});
