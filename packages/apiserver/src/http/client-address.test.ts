import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { TrustedProxies } from './client-address.js';

describe('client address behind proxies', () => {
  it('ignores X-Forwarded-For unless the peer is a trusted proxy', () => {
    const none = new TrustedProxies([]);
    assert.equal(none.clientAddress('203.0.113.9', '10.9.9.9'), '203.0.113.9');
    const t = new TrustedProxies(['10.0.0.0/8', '::1', '192.0.2.7']);
    assert.equal(t.clientAddress('203.0.113.9', '1.2.3.4'), '203.0.113.9', 'an untrusted peer may not forge its address');
    assert.equal(t.clientAddress('::ffff:10.1.2.3', '198.51.100.1'), '198.51.100.1');
    assert.equal(t.clientAddress('::1', '198.51.100.1'), '198.51.100.1');
  });

  it('walks from the right past trusted hops only', () => {
    const t = new TrustedProxies(['10.0.0.0/8', '192.0.2.7']);
    // The client wrote a fake first entry; the proxies appended the real hops after it.
    assert.equal(t.clientAddress('10.0.0.1', '6.6.6.6, 198.51.100.1, 192.0.2.7'), '198.51.100.1');
    assert.equal(t.clientAddress('10.0.0.1', '10.0.0.2, 10.0.0.3'), '10.0.0.2', 'only proxies: the farthest');
    assert.equal(t.clientAddress('10.0.0.1', 'garbage, 10.0.0.3'), '10.0.0.3', 'a malformed hop ends the walk');
    assert.equal(t.clientAddress('10.0.0.1', ''), '10.0.0.1');
  });

  it('refuses an entry that is not an address or range', () => {
    for (const bad of ['10.0.0.0/33', 'proxy.local', '10.0.0.0/x', '::1/129']) {
      assert.throws(() => new TrustedProxies([bad]), { code: 'INVALID_ARGUMENT' }, bad);
    }
  });
});
