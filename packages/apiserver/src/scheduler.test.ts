import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Placement } from './scheduler.js';
import type { NodeView } from './scheduler.js';

function node(name: string, allocated: Partial<NodeView['allocated']> = {}, extra: Partial<NodeView> = {}): NodeView {
  return {
    name,
    healthy: true,
    backends: ['container'],
    capacity: { cpu: 2, memoryMiB: 24_576, sandboxes: 4000 },
    allocated: { cpu: 0, memoryMiB: 0, sandboxes: 0, ...allocated },
    ...extra,
  };
}
const req = { backend: 'container' as const, cpu: 1, memoryMiB: 512, cpuClass: 'latency-sensitive' as const };

test('takes the least loaded of the sampled nodes', () => {
  const p = new Placement({ sampleK: 2 });
  const nodes = [node('a', { cpu: 10 }), node('b', { cpu: 2 })];
  assert.equal(p.place(req, nodes)?.name, 'b');
});

test('filters out unhealthy nodes, missing backends, full nodes and refusals', () => {
  const p = new Placement();
  assert.equal(p.place(req, [node('a', {}, { healthy: false })]), undefined);
  assert.equal(p.place({ ...req, backend: 'microvm' }, [node('a')]), undefined);
  assert.equal(p.place(req, [node('a', { sandboxes: 4000 })]), undefined);
  assert.equal(p.place(req, [node('a'), node('b')], new Set(['a']))?.name, 'b');
});

test('over-commits CPU by the ratio, and best-effort sandboxes count a tenth', () => {
  const p = new Placement({ cpuOvercommit: 4, memoryOvercommit: 1 });
  assert.ok(p.fits(node('a', { cpu: 7 }), req));
  assert.ok(!p.fits(node('a', { cpu: 7.5 }), req));
  assert.ok(p.fits(node('a', { cpu: 7.5 }), { ...req, cpuClass: 'best-effort' }));
  assert.ok(!p.fits(node('a', { memoryMiB: 24_400 }), req));
});

test('sampling spreads load over many nodes', () => {
  const p = new Placement({ sampleK: 2 });
  const nodes = Array.from({ length: 160 }, (_, i) => node(`n${i}`));
  const small = { ...req, cpu: 0.1, memoryMiB: 64 };
  for (let i = 0; i < 16_000; i++) {
    const n = p.place(small, nodes);
    assert.ok(n, `placement ${i} found a node`);
    n.allocated.cpu += 0.1;
    n.allocated.sandboxes += 1;
    n.allocated.memoryMiB += 64;
  }
  const counts = nodes.map((n) => n.allocated.sandboxes);
  assert.ok(Math.max(...counts) - Math.min(...counts) <= 10, `spread ${Math.min(...counts)}..${Math.max(...counts)}`);
});

test('microVMs prefer nodes whose boot probe found KVM', () => {
  const p = new Placement();
  const vm = { ...req, backend: 'microvm' as const };
  const tcg = node('tcg', {}, { backends: ['container', 'microvm'], microvmAccel: 'tcg' });
  const kvm = node('kvm', { cpu: 1 }, { backends: ['container', 'microvm'], microvmAccel: 'kvm' });
  for (let i = 0; i < 20; i++) assert.equal(p.place(vm, [tcg, kvm])?.name, 'kvm');
  assert.equal(p.place(vm, [tcg, kvm], new Set(['kvm']))?.name, 'tcg');
  assert.equal(p.place(req, [tcg, kvm])?.name, 'tcg', 'containers still go to the least loaded');
});
