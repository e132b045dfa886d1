import { test } from 'node:test';
import assert from 'node:assert/strict';
import { isIpLiteralLike, normalizeAddress, normalizeHost, parseAuthority } from './address.js';
import { TokenBucket } from './limits.js';

test('authorities parse into host and port, or not at all', () => {
  assert.deepEqual(parseAuthority('Example.COM.', 80), { host: 'example.com', port: 80 });
  assert.deepEqual(parseAuthority('example.com:8443'), { host: 'example.com', port: 8443 });
  assert.deepEqual(parseAuthority('[::1]:443'), { host: '::1', port: 443 });
  assert.deepEqual(parseAuthority('[::ffff:127.0.0.1]', 80), { host: '127.0.0.1', port: 80 });
  for (const bad of [
    'example.com',
    'example.com:0',
    'example.com:65536',
    'a:b:c',
    '::1',
    '[::1',
    'exa mple.com:80',
    'a..b:80',
    '-a.com:80',
    'user@host:80',
    '',
  ]) {
    assert.equal(parseAuthority(bad), undefined, bad);
  }
  assert.equal(normalizeHost('x'.repeat(64) + '.com'), undefined, 'labels are at most 63 characters');
});

test('IP literals include what inet_aton would read as one', () => {
  for (const h of ['127.0.0.1', '::1', '2130706433', '0x7f.1', '127.1', '10.0.0.1', 'foo.0x7f']) assert.equal(isIpLiteralLike(h), true, h);
  for (const h of ['example.com', 'a1.b2.c3', '1.example', 'localhost']) assert.equal(isIpLiteralLike(h), false, h);
  assert.equal(normalizeAddress('::FFFF:10.1.2.3'), '10.1.2.3');
});

test('the token bucket admits burst + rate x time, shared by its takers', () => {
  let now = 0;
  const b = new TokenBucket(1000, 500, () => now);
  assert.equal(b.take(500), 0, 'the burst passes at once');
  assert.equal(b.take(100), 100, 'then 100 bytes wait 100 ms');
  now = 100;
  assert.equal(b.take(0), 0);
  now = 1100;
  assert.equal(b.take(500), 0, 'a full bucket again after a quiet second');
  b.configure(10, 10);
  assert.equal(b.take(10), 1000);
});
