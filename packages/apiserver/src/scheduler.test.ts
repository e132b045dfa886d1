import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Placement } from './scheduler.js';
import type { NodeCapacity } from '@dsec/protocol';
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

/** A 2-core, 24 GiB node with the edge's default admission limit. */
function newcomer(): NodeView {
  return node('laptop', {}, { capacity: { cpu: 2, memoryMiB: 24_576, sandboxes: 4000 } });
}
/** A default sandbox: 1 core, 512 MiB, latency-sensitive (the API's defaults). */
const defaultReq = { backend: 'container' as const, cpu: 1, memoryMiB: 512, cpuClass: 'latency-sensitive' as const };

function charge(p: Placement, n: NodeView, r: typeof defaultReq | (typeof defaultReq & { cpuClass: 'best-effort' })): void {
  n.allocated.cpu += p.cpuCharge(r);
  n.allocated.memoryMiB += r.memoryMiB;
  n.allocated.sandboxes += 1;
}

test('the defaults admit at least 500 idle default sandboxes on a 2-core, 24 GiB node', () => {
  const p = new Placement();
  const n = newcomer();
  // Idle as measured: a sandbox's agent asleep, ~3 MiB and a thousandth of a core each; the node
  // reports every 50 placements (the usage poll lags the creates).
  let placed = 0;
  while (placed < 2000 && p.place(defaultReq, [n])) {
    charge(p, n, defaultReq);
    placed++;
    if (placed % 50 === 0) n.usage = { cpu: placed * 0.001, memoryMiB: placed * 3, sandboxes: placed };
  }
  assert.ok(placed >= 500, `placed ${placed}`);
  // The requests bound the blast radius: no more than cpu x 256 cores of requests.
  assert.ok(placed <= 2 * 256, `placed ${placed}`);
  // A sandbox asking for more than the whole node has never fits.
  assert.ok(!p.fits(newcomer(), { ...defaultReq, cpu: 3 }));
  assert.ok(!p.fits(newcomer(), { ...defaultReq, memoryMiB: 30_000 }));
});

test('a burst before any measure still places 500 default sandboxes (idle estimates)', () => {
  const p = new Placement();
  const nodes = [newcomer()];
  const got = p.placeMany(
    Array.from({ length: 500 }, () => defaultReq),
    nodes,
  );
  assert.equal(got.filter(Boolean).length, 500);
});

test('running sandboxes are protected: a busy node takes no latency-sensitive sandbox, only best-effort ones', () => {
  const p = new Placement();
  const n = newcomer();
  for (let i = 0; i < 40; i++) charge(p, n, defaultReq);
  // Two of them run flat out: 1.7 of 2 cores measured busy.
  n.usage = { cpu: 1.7, memoryMiB: 2048, sandboxes: 40 };
  assert.ok(!p.fits(n, defaultReq), 'a latency-sensitive sandbox would compete with the running ones');
  const be = { ...defaultReq, cpuClass: 'best-effort' as const };
  assert.ok(p.fits(n, be), 'a best-effort sandbox runs at the lowest weight: it takes only idle cycles');
  // Memory measured past the target: nothing more, of either class.
  n.usage = { cpu: 0.1, memoryMiB: 24_576 * 0.85, sandboxes: 40 };
  assert.ok(!p.fits(n, defaultReq));
  assert.ok(!p.fits(n, be));
  // Once the load is gone, the node takes sandboxes again.
  n.usage = { cpu: 0.05, memoryMiB: 200, sandboxes: 40 };
  assert.ok(p.fits(n, defaultReq));
});

test('placement prefers the idler node by measured use, not by requests', () => {
  const p = new Placement({ sampleK: 2 });
  const busy = node('busy', { cpu: 10, memoryMiB: 5120, sandboxes: 10 }, { usage: { cpu: 1.5, memoryMiB: 4000, sandboxes: 10 } });
  const idle = node('idle', { cpu: 40, memoryMiB: 20_480, sandboxes: 40 }, { usage: { cpu: 0.05, memoryMiB: 120, sandboxes: 40 } });
  assert.equal(p.place(defaultReq, [busy, idle])?.name, 'idle');
});

test('anti-affinity spreads the sandboxes of one job over the nodes, batches included', () => {
  const p = new Placement({ sampleK: 2 });
  const counts = new Map<string, number>();
  const nodes = ['a', 'b', 'c', 'd'].map((name) => node(name, {}, { labelCount: (l: string) => (l === 'job=j1' ? (counts.get(name) ?? 0) : 0) }));
  counts.set('a', 1);
  const spread = { ...defaultReq, spread: 'job=j1' };
  const picked = p.place(spread, nodes);
  assert.ok(picked && picked.name !== 'a', 'the node already holding one of the job is avoided');
  const batch = p
    .placeMany(
      Array.from({ length: 3 }, () => spread),
      nodes,
    )
    .map((n) => n?.name);
  assert.deepEqual([...batch].sort(), ['b', 'c', 'd']);
});

test('the node registry turns usage reports into a CPU rate and memory', async () => {
  const { NodeRegistry } = await import('./nodes.js');
  const { FakeEdge } = await import('./testing/fake-edge.js');
  const reg = new NodeRegistry();
  reg.add(new FakeEdge('n1'));
  reg.setUsage('n1', { cpuUsageMs: 1000, memoryBytes: 64 * 1048576, sandboxes: 3 }, 10_000);
  assert.deepEqual(reg.get('n1')?.usage, { cpu: 0, memoryMiB: 64, sandboxes: 3 });
  reg.setUsage('n1', { cpuUsageMs: 2500, memoryBytes: 32 * 1048576, sandboxes: 2 }, 12_000);
  assert.deepEqual(reg.get('n1')?.usage, { cpu: 0.75, memoryMiB: 32, sandboxes: 2 });
});

test('the node registry keeps the accelerator of each VM backend its node reports; the API shows it, microvmAccel kept', async () => {
  const { NodeRegistry, accelFields } = await import('./nodes.js');
  const { FakeEdge } = await import('./testing/fake-edge.js');
  class VmNode extends FakeEdge {
    constructor(
      name: string,
      readonly extra: Partial<NodeCapacity>,
    ) {
      super(name);
    }
    override capacity(): NodeCapacity {
      return { ...super.capacity(), ...this.extra };
    }
  }
  const reg = new NodeRegistry();
  reg.add(new VmNode('both', { backends: ['container', 'microvm', 'vm'], microvm: { accel: 'kvm', bootMs: 900 }, vm: { accel: 'tcg', bootMs: 0 } }));
  reg.add(new VmNode('vm-only', { backends: ['container', 'vm'], vm: { accel: 'kvm', bootMs: 0 } }));
  reg.add(new FakeEdge('plain'));
  assert.deepEqual(reg.get('both')?.accel, { microvm: 'kvm', vm: 'tcg' });
  assert.deepEqual(accelFields(reg.get('both')!), { accel: { microvm: 'kvm', vm: 'tcg' }, microvmAccel: 'kvm' });
  assert.deepEqual(accelFields(reg.get('vm-only')!), { accel: { vm: 'kvm' } });
  assert.deepEqual(accelFields(reg.get('plain')!), {});
  // A full VM goes to the node whose vm backend has KVM, although it is the more loaded one (the
  // other has KVM for microVMs only).
  reg.charge('vm-only', 1, 512, 1);
  const p = new Placement();
  for (let i = 0; i < 20; i++) assert.equal(p.place({ ...req, backend: 'vm' }, reg.all())?.name, 'vm-only');
});

test('microVMs and full VMs prefer nodes whose boot probe found KVM for their backend', () => {
  const p = new Placement();
  for (const backend of ['microvm', 'vm'] as const) {
    const vm = { ...req, backend };
    const tcg = node('tcg', {}, { backends: ['container', backend], accel: { [backend]: 'tcg' } });
    const kvm = node('kvm', { cpu: 1 }, { backends: ['container', backend], accel: { [backend]: 'kvm' } });
    for (let i = 0; i < 20; i++) assert.equal(p.place(vm, [tcg, kvm])?.name, 'kvm', backend);
    assert.equal(p.place(vm, [tcg, kvm], new Set(['kvm']))?.name, 'tcg', backend);
    assert.equal(p.place(req, [tcg, kvm])?.name, 'tcg', 'containers still go to the least loaded');
  }
  // The preference follows the sandbox's own backend: KVM for microVMs says nothing about full VMs.
  // (The node with KVM for the other backend is the less loaded one each time.)
  const mixed = (cpu: { microvm: number; vm: number }): NodeView[] => [
    node('mvm-kvm', { cpu: cpu.microvm }, { backends: ['container', 'microvm', 'vm'], accel: { microvm: 'kvm', vm: 'tcg' } }),
    node('vm-kvm', { cpu: cpu.vm }, { backends: ['container', 'microvm', 'vm'], accel: { microvm: 'tcg', vm: 'kvm' } }),
  ];
  for (let i = 0; i < 20; i++) {
    assert.equal(p.place({ ...req, backend: 'vm' }, mixed({ microvm: 0.5, vm: 1.5 }))?.name, 'vm-kvm');
    assert.equal(p.place({ ...req, backend: 'microvm' }, mixed({ microvm: 1.5, vm: 0.5 }))?.name, 'mvm-kvm');
  }
});

test('microVM memory counts at full size: no idle discount, no over-commit', async () => {
  const p = new Placement();
  const vm = { ...req, cpu: 0.1, memoryMiB: 1024, backend: 'microvm' as const };
  const box = { ...vm, backend: 'container' as const };
  const n16 = (): NodeView =>
    node(
      'n',
      {},
      { backends: ['container', 'microvm'], capacity: { cpu: 16, memoryMiB: 16_384, sandboxes: 4000 }, usage: { cpu: 0, memoryMiB: 100, sandboxes: 0 } },
    );
  // 16 GiB at the 0.8 target: 12 microVMs of 1 GiB, however little they use yet.
  assert.equal(p.placeMany(Array(40).fill(vm), [n16()]).filter(Boolean).length, 12);
  // Full VMs alike, in a batch too (each sees the memory of the ones placed before it).
  const n16vm = (): NodeView => ({ ...n16(), backends: ['container', 'vm'] });
  assert.equal(p.placeMany(Array(40).fill({ ...vm, backend: 'vm' }), [n16vm()]).filter(Boolean).length, 12);
  // Containers of the same size still over-commit by measured use.
  assert.equal(p.placeMany(Array(40).fill(box), [n16()]).filter(Boolean).length, 40);
  // The microVMs' memory is a floor under the node's expected use: it holds for containers too.
  const full = { ...n16(), allocated: { cpu: 1.3, memoryMiB: 13_100, sandboxes: 13 } };
  assert.ok(p.fits(full, box));
  assert.ok(!p.fits({ ...full, microvmMemoryMiB: 13_100 }, box));
  // The registry counts a microVM's memory apart, and gives it back.
  const { NodeRegistry } = await import('./nodes.js');
  const { FakeEdge } = await import('./testing/fake-edge.js');
  const reg = new NodeRegistry();
  reg.add(new FakeEdge('n1'));
  reg.charge('n1', 0.1, 1024, 1, undefined, 'microvm');
  reg.charge('n1', 0.1, 512, 1, undefined, 'container');
  assert.equal(reg.get('n1')?.microvmMemoryMiB, 1024);
  reg.charge('n1', 0.1, 1024, -1, undefined, 'microvm');
  assert.equal(reg.get('n1')?.microvmMemoryMiB, 0);
});
