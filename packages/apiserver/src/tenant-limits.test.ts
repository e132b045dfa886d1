import assert from 'node:assert/strict';
import { test } from 'node:test';
import { DsecError, LimitsConfigSchema, checkConfig, fairShare, newcomerReserve, pastHighWater, resolveLimits } from '@dsec/protocol';
import { tenantOfAncestry } from './auth.js';
import { AuthFailureGate, TenantSlots, clientAddress } from './tenant-limits.js';
import type { AuthFailureEntry } from './tenant-limits.js';

function refusedWith(limit: string): (err: unknown) => boolean {
  return (err) => {
    assert.ok(err instanceof DsecError, String(err));
    assert.equal(err.code, 'LIMIT_EXCEEDED');
    assert.equal(err.status, 429);
    assert.equal(err.details.limit, limit);
    return true;
  };
}

test('limits: defaults, configured values over them, bad values refused naming the key', () => {
  const d = resolveLimits();
  assert.equal(d.execsPerTenant, 64);
  assert.equal(resolveLimits({ execsPerTenant: 3 }).execsPerTenant, 3);
  assert.equal(resolveLimits({ execsPerTenant: 3 }).transfersPerTenant, d.transfersPerTenant);
  const bad = checkConfig({ limits: { execsPerTenant: 0 } });
  assert.equal(bad.ok, false);
  assert.equal(!bad.ok && bad.issue.key, 'limits.execsPerTenant');
  const unknown = checkConfig({ limits: { execsPerTennant: 3 } });
  assert.equal(!unknown.ok && unknown.issue.key, 'limits.execsPerTennant');
  assert.ok(LimitsConfigSchema.safeParse({ rootRuleHeadroom: 0 }).success);
});

test('tenants: a top-level project is its own tenant; below it, the top-level one; the root is its own', () => {
  assert.equal(tenantOfAncestry(['root'], 'root'), 'root');
  assert.equal(tenantOfAncestry(['red', 'root'], 'root'), 'red');
  assert.equal(tenantOfAncestry(['red-a-1', 'red-a', 'red', 'root'], 'root'), 'red');
  assert.equal(tenantOfAncestry(['public'], 'root'), 'public');
});

test('slots: refused past the tenant limit (others unaffected), past the fair share and past the node limit; release frees once', () => {
  const slots = new TenantSlots(resolveLimits({ execsPerTenant: 2, execsPerNode: 4 }));
  const r1 = slots.acquire('exec', 'red', 'n1');
  slots.acquire('exec', 'red', 'n1');
  assert.throws(() => slots.acquire('exec', 'red', 'n1'), refusedWith('execsPerTenant'));
  // Transfers and calls are other slots.
  slots.acquire('transfer', 'red', 'n1')();
  const b1 = slots.acquire('exec', 'blue', 'n1');
  // Over half the node in use: blue, holding 1, is at its share (4 among 2 tenants and one to come).
  assert.throws(() => slots.acquire('exec', 'blue', 'n1'), refusedWith('execsPerNode'));
  // Green holds nothing: it gets the slot the shares left; then the node is full for anyone.
  const g1 = slots.acquire('exec', 'green', 'n1');
  assert.throws(() => slots.acquire('exec', 'yellow', 'n1'), refusedWith('execsPerNode'));
  slots.acquire('exec', 'yellow', 'n2')();
  r1();
  r1();
  assert.equal(slots.inUse('exec', 'red'), 1);
  b1();
  g1();
  slots.acquire('exec', 'red', 'n1');
  assert.throws(() => slots.acquire('exec', 'red', 'n1'), refusedWith('execsPerTenant'));
});

test('fair share: the node cap among the holders and one to come, at least 1; applied past half the node', () => {
  assert.equal(fairShare(32, 1), 16);
  assert.equal(fairShare(32, 2), 10);
  assert.equal(fairShare(64, 4), 12);
  assert.equal(fairShare(3, 5), 1);
  assert.equal(pastHighWater(16, 32), false);
  assert.equal(pastHighWater(17, 32), true);
  assert.equal(newcomerReserve(32), 4);
  assert.equal(newcomerReserve(4), 1);
  // Default transfers (16 per tenant, 32 per node): red fills its own 16 (a lone tenant gets half
  // the node), red2 reaches its share of 10, and green stops where the newcomers' reserve of 4
  // begins (28 in use).
  const slots = new TenantSlots(resolveLimits());
  const red = Array.from({ length: 16 }, () => slots.acquire('transfer', 'red', 'n1'));
  assert.throws(() => new TenantSlots(resolveLimits({ transfersPerTenant: 32 })).acquire('transfer', 'red', 'n1', 17), refusedWith('transfersPerNode'));
  const red2 = Array.from({ length: 10 }, () => slots.acquire('transfer', 'red2', 'n1'));
  assert.throws(() => slots.acquire('transfer', 'red2', 'n1'), refusedWith('transfersPerNode'));
  // Red2's share on another node is its own.
  slots.acquire('transfer', 'red2', 'n2')();
  // Green's first grant is held to its share too (8 among three and one to come): a batch of 9 is refused whole.
  assert.throws(() => slots.acquire('transfer', 'green', 'n1', 9), refusedWith('transfersPerNode'));
  const green = [slots.acquire('transfer', 'green', 'n1'), slots.acquire('transfer', 'green', 'n1')];
  assert.throws(() => slots.acquire('transfer', 'green', 'n1'), refusedWith('transfersPerNode'));
  // Tenants holding none still get one slot each (main: yellow was refused), until four hold the reserve.
  const newcomers = ['yellow', 'cyan', 'magenta', 'black'].map((t) => slots.acquire('transfer', t, 'n1'));
  assert.throws(() => slots.acquire('transfer', 'white', 'n1'), refusedWith('transfersPerNode'));
  // Red2 lets go of everything: it no longer counts among the holders; green grows to its share
  // among the six holders and one to come (4).
  for (const r of red2) r();
  for (let i = 0; i < 2; i++) green.push(slots.acquire('transfer', 'green', 'n1'));
  assert.throws(() => slots.acquire('transfer', 'green', 'n1'), refusedWith('transfersPerNode'));
  assert.equal(slots.inUse('transfer', 'green'), 4);
  for (const r of [...red, ...green, ...newcomers]) r();
  // A batch takes its slots at once or not at all; a newcomer's batch must leave the reserve (8 of 64).
  const calls = new TenantSlots(resolveLimits());
  for (const t of ['a', 'b', 'c']) calls.acquire('call', t, 'n1', 16);
  calls.acquire('call', 'd', 'n1', 8);
  assert.throws(() => calls.acquire('call', 'd', 'n1', 8), refusedWith('callSlotsPerNode'));
  assert.throws(() => calls.acquire('call', 'e', 'n1', 8), refusedWith('callSlotsPerNode'));
  calls.acquire('call', 'e', 'n1');
});

test('fair share: whatever grants and releases come first, a tenant holding none gets a slot unless the reserve is held by as many tenants', () => {
  // A seeded generator (mulberry32), so that a failure repeats.
  let seed = 0x5eed;
  const random = (): number => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  for (const [tenantMax, nodeMax] of [
    [16, 32],
    [16, 64],
    [2, 4],
    [5, 7],
    [64, 512],
  ] as const) {
    const slots = new TenantSlots(resolveLimits({ transfersPerTenant: tenantMax, transfersPerNode: nodeMax }));
    const held = new Map<string, Array<{ count: number; release: () => void }>>();
    const holding = (): string[] => [...held].filter(([, g]) => g.length > 0).map(([t]) => t);
    for (let step = 0; step < 1000; step++) {
      // Few tenants and large grants, so that the holders fill the node as far as they may.
      const tenant = `t${Math.floor(random() * 5)}`;
      const grants = held.get(tenant) ?? [];
      held.set(tenant, grants);
      if (random() < 0.2 && grants.length > 0) {
        grants.splice(Math.floor(random() * grants.length), 1)[0]!.release();
      } else {
        const count = random() < 0.5 ? tenantMax : 1 + Math.floor(random() * tenantMax);
        try {
          grants.push({ count, release: slots.acquire('transfer', tenant, 'n1', count) });
        } catch (err) {
          assert.ok(err instanceof DsecError && err.code === 'LIMIT_EXCEEDED', String(err));
        }
      }
      const used = [...held.values()].flat().reduce((n, g) => n + g.count, 0);
      const holders = holding().length;
      assert.ok(used - holders <= nodeMax - newcomerReserve(nodeMax), `step ${step}: ${used} in use by ${holders} tenants`);
      if (holders < newcomerReserve(nodeMax)) {
        // A tenant that holds none on the node gets one slot there.
        slots.acquire('transfer', 'newcomer', 'n1')();
      }
    }
    for (const g of [...held.values()].flat()) g.release();
  }
});

test('slots: run() releases after a failure', async () => {
  const slots = new TenantSlots(resolveLimits({ callsPerTenant: 1 }));
  await assert.rejects(
    slots.run('call', 'red', 'n1', () => Promise.reject(new Error('boom'))),
    /boom/,
  );
  assert.equal(slots.inUse('call', 'red'), 0);
  assert.equal(await slots.run('call', 'red', 'n1', () => Promise.resolve(7)), 7);
});

test('client address: the peer, unless it is a trusted proxy; then the nearest untrusted forwarded hop', () => {
  const trusted = new Set(['10.0.0.1', '10.0.0.2']);
  assert.equal(clientAddress('::ffff:192.0.2.7', undefined, trusted), '192.0.2.7');
  // An untrusted peer's header is ignored: it could be anything.
  assert.equal(clientAddress('192.0.2.7', '198.51.100.1', trusted), '192.0.2.7');
  assert.equal(clientAddress('10.0.0.1', '203.0.113.9, 198.51.100.1, 10.0.0.2', trusted), '198.51.100.1');
  assert.equal(clientAddress('10.0.0.1', 'garbage, 10.0.0.2', trusted), '10.0.0.1');
  assert.equal(clientAddress(undefined, undefined, trusted), 'unknown');
});

test('failed authentications: blocked past the burst, refilled with time, collapsed into counted entries', () => {
  let now = 1_000_000;
  const entries: AuthFailureEntry[] = [];
  const gate = new AuthFailureGate(
    { authFailuresPerSecond: 5, authFailureBurst: 10 },
    (e) => entries.push(e),
    () => now,
  );
  try {
    const f = { method: 'GET', route: '/v1/*', status: 401 };
    assert.equal(gate.blocked('a'), false);
    for (let i = 0; i < 10; i++) gate.failed('a', f);
    assert.equal(gate.blocked('a'), true);
    assert.equal(gate.blocked('b'), false, 'another source is not blocked');
    assert.throws(() => {
      throw gate.refusal('a');
    }, refusedWith('authFailuresPerSecond'));
    // The first failure is written at once, the others wait for the flush, as one entry.
    assert.deepEqual(
      entries.map((e) => e.count),
      [1],
    );
    gate.failed('a', f);
    gate.flush();
    assert.deepEqual(
      entries.map((e) => e.count),
      [1, 10],
    );
    gate.flush();
    assert.equal(entries.length, 2, 'nothing new, nothing written');
    now += 1000;
    assert.equal(gate.blocked('a'), false, 'five tokens back after a second');
    // A source quiet long enough is forgotten; its next failure is written at once again.
    now += 10_000;
    gate.flush();
    gate.failed('a', f);
    assert.equal(entries.length, 3);
    assert.equal(entries[2]!.count, 1);
  } finally {
    gate.close();
  }
});
