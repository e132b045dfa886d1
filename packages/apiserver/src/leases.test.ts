import assert from 'node:assert/strict';
import { test } from 'node:test';
import { DsecError } from '@dsec/protocol';
import { ActivityTracker, grantLease, heartbeatIntervalMs, leaseOf, mergeLease } from './leases.js';

test('a lease gets its defaults; timeoutMs is the max lifetime; both at once is refused', () => {
  assert.deepEqual(grantLease({}), {
    idleTimeoutMs: 600_000,
    maxLifetimeMs: 3_600_000,
    onIdle: 'pause',
    ownerGraceMs: null,
    onOwnerLost: 'pause',
    autoResume: true,
  });
  assert.equal(grantLease({ timeoutMs: 5000 }).maxLifetimeMs, 5000);
  assert.deepEqual(grantLease({ lease: { idleTimeoutMs: 0, onOwnerLost: 'kill', ownerGraceMs: 0 } }), {
    idleTimeoutMs: 0,
    maxLifetimeMs: 3_600_000,
    onIdle: 'pause',
    ownerGraceMs: 0,
    onOwnerLost: 'kill',
    autoResume: true,
  });
  assert.throws(
    () => grantLease({ timeoutMs: 5000, lease: { maxLifetimeMs: 5000 } }),
    (err: unknown) => err instanceof DsecError && err.code === 'INVALID_ARGUMENT' && err.details.field === 'lease.maxLifetimeMs',
  );
});

test('a change replaces only the fields it gives; rows from before leases read as the defaults', () => {
  const base = grantLease({});
  assert.deepEqual(mergeLease(base, { autoResume: false }), { ...base, autoResume: false });
  const old = leaseOf({ lease: null, created_at: '2026-01-01T00:00:00.000Z', expires_at: '2026-01-01T00:10:00.000Z' });
  assert.equal(old.maxLifetimeMs, 600_000);
  assert.equal(old.onIdle, 'pause');
  assert.equal(base.onExpire, undefined, 'absent: kill at the end of the lifetime');
  assert.equal(mergeLease(base, { onExpire: 'pause' }).onExpire, 'pause');
});

test('owners heartbeat three times per grace period, within bounds', () => {
  assert.equal(heartbeatIntervalMs(60_000), 10_000);
  assert.equal(heartbeatIntervalMs(3000), 1000);
  assert.equal(heartbeatIntervalMs(300), 250);
});

test('activity: touched in memory, flushed in one write per interval, held while a request stays open', async () => {
  const writes: Array<{ ids: string[]; at: string }> = [];
  const store = { touchSandboxes: async (ids: string[], at: string) => void writes.push({ ids, at }) };
  const a = new ActivityTracker();
  const row = (id: string) => ({ id, created_at: '2026-01-01T00:00:00.000Z', last_active_at: null });
  assert.equal(a.lastActiveOf(row('x')), Date.parse('2026-01-01T00:00:00.000Z'));
  for (let i = 0; i < 1000; i++) a.touch('x', 5000 + i);
  a.touch('y', 7000);
  assert.equal(a.lastActiveMs('x'), 5999);
  await a.flush(store);
  assert.equal(writes.length, 1, 'a thousand touches, one write');
  assert.deepEqual(writes[0]?.ids.sort(), ['x', 'y']);
  await a.flush(store);
  assert.equal(writes.length, 1, 'nothing new, nothing written');

  const release = a.hold('z');
  assert.equal(a.lastActiveMs('z', 123_456), 123_456, 'held: active now');
  await a.flush(store);
  assert.deepEqual(writes[1]?.ids, ['z'], 'a held sandbox is written at every flush');
  release();
  release();
  assert.ok((a.lastActiveMs('z', Number.MAX_SAFE_INTEGER) ?? 0) < Number.MAX_SAFE_INTEGER, 'released: no longer active now');

  // An id that named no sandbox is forgotten, unless something touched it since.
  const t = a.touch('ghost', 1);
  a.forget('ghost', t);
  assert.equal(a.lastActiveMs('ghost'), undefined);
  const t2 = a.touch('real', 1);
  a.touch('real', 2);
  a.forget('real', t2);
  assert.equal(a.lastActiveMs('real'), 2);
});
