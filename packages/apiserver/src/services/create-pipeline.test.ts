// Which node creates share a createMany message: a node answers a group once all its items
// settle, and the message has a frame limit, so only small container creates are grouped.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { SandboxSpec } from '@dsec/protocol';
import { groupable } from './create-pipeline.js';

const base: SandboxSpec = { image: { base: `sha256:${'a'.repeat(64)}` } };

test('small container creates are grouped; VM boots, forks with memory and large specs go alone', () => {
  assert.equal(groupable(base), true);
  assert.equal(groupable({ ...base, backend: 'container', env: { A: 'x'.repeat(1000) } }), true);
  assert.equal(groupable({ ...base, backend: 'microvm' }), false);
  assert.equal(groupable({ ...base, backend: 'vm' }), false);
  assert.equal(groupable({ ...base, backend: 'microvm', memoryOf: 'sb-source' }), false);
  // An env of 128 KiB: 500 such items would make a frame beyond the node protocol's 64 MiB.
  assert.equal(groupable({ ...base, env: { BIG: 'x'.repeat(128 * 1024) } }), false);
});
