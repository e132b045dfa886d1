import assert from 'node:assert/strict';
import { test } from 'node:test';
import { DEBIAN_SNAPSHOT_UPSTREAM, DebianMirrorAdapter, snapshotStamp } from './debian.js';

const deb = new DebianMirrorAdapter();

test('archive paths pass through unchanged; pool and by-hash files are immutable, indexes refreshed', () => {
  assert.deepEqual(deb.classify('deb.debian.org', '/debian/dists/bookworm/InRelease'), {
    kind: 'other',
    upstreamPath: 'debian/dists/bookworm/InRelease',
    cache: 'metadata',
    servedWhenFrozen: true,
  });
  assert.equal(deb.classify('deb.debian.org', '/debian/dists/bookworm/main/binary-amd64/by-hash/SHA256/ab12')?.cache, 'immutable');
  assert.equal(deb.classify('security.debian.org', '/debian-security/pool/updates/main/o/openssl/libssl3_3.0.15-1~deb12u1_amd64.deb')?.cache, 'immutable');
  for (const bad of [
    '/',
    '/debian/',
    '/debian/dists',
    '/ubuntu/dists/x/Release',
    '/debian/../x/y',
    '/debian/dists/%2e%2e/x',
    '/debian/project/trace/x',
    '/debian/dists/a?b=1',
    '//debian/dists/a/b',
  ]) {
    assert.equal(deb.classify('deb.debian.org', bad), undefined, bad);
  }
});

test('frozen: a snapshot archive at the cutoff, immutable, from snapshot.debian.org by default', () => {
  const cutoff = new Date('2024-05-01T12:30:00.500Z');
  assert.equal(snapshotStamp(cutoff), '20240501T123000Z');
  const req = deb.classify('deb.debian.org', '/debian/dists/bookworm/main/binary-amd64/Packages.xz', cutoff)!;
  assert.equal(req.upstreamPath, 'debian/20240501T123000Z/dists/bookworm/main/binary-amd64/Packages.xz');
  assert.equal(req.cache, 'immutable');
  assert.equal(deb.upstreamBase('https://deb.debian.org', cutoff), DEBIAN_SNAPSHOT_UPSTREAM);
  assert.equal(deb.upstreamBase('https://deb.debian.org', undefined), 'https://deb.debian.org/');
  assert.equal(deb.upstreamBase('http://snapshots.internal/archive', cutoff), 'http://snapshots.internal/archive/');
});
