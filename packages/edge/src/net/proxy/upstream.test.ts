// Dialling checks the address it dials: a resolver that changes its answer between lookups
// (DNS rebinding) never gets the proxy to connect to an address the policy refuses.
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, describe, test } from 'node:test';
import { parseCidr, parseIpRange } from '@dsec/protocol';
import { compilePolicy } from '../policy.js';
import type { NameResolver } from '../types.js';
import { dialUpstream } from './upstream.js';

/** Two loopback listeners on one port: the allowed destination, and the node's own service. */
async function listenPair(): Promise<{ port: number; hits: { good: number; secret: number }; close: () => Promise<void> }> {
  const hits = { good: 0, secret: 0 };
  for (let attempt = 0; ; attempt++) {
    const good = net.createServer((s) => (hits.good++, s.end()));
    const secret = net.createServer((s) => (hits.secret++, s.end('secret')));
    await new Promise<void>((r) => good.listen(0, '127.0.0.2', r));
    const port = (good.address() as net.AddressInfo).port;
    try {
      await new Promise<void>((resolve, reject) => {
        secret.once('error', reject);
        secret.listen(port, '127.0.0.1', resolve);
      });
    } catch (err) {
      good.close();
      if (attempt >= 20) throw err;
      continue;
    }
    const close = async (): Promise<void> => {
      await new Promise((r) => good.close(r));
      await new Promise((r) => secret.close(r));
    };
    return { port, hits, close };
  }
}

describe('dialling the checked address', () => {
  let pair: Awaited<ReturnType<typeof listenPair>>;
  before(async () => {
    pair = await listenPair();
  });
  after(() => pair?.close());

  // The operator lets 127.0.0.2 be reached (node.network.allowedPrivateRanges); 127.0.0.1 is the node itself.
  const view = compilePolicy('sb', '10.213.0.2', { mode: 'allowlist', allow: [{ host: 'alt.test' }] }, 1, {
    pool: parseCidr('10.213.0.0/16')!,
    localAddresses: ['127.0.0.1'],
    allowedPrivateRanges: [parseIpRange('127.0.0.2/32')!],
  });

  test('a resolver alternating between an allowed address and loopback: every dial reaches the allowed one or none', async () => {
    const answers = [['127.0.0.2'], ['127.0.0.1'], ['127.0.0.1', '127.0.0.2'], ['::ffff:127.0.0.1'], ['2130706433']];
    let n = 0;
    const resolver: NameResolver = { resolve4: () => Promise.resolve(answers[n++ % answers.length]!) };
    let connected = 0;
    let refused = 0;
    for (let i = 0; i < 40; i++) {
      const r = await dialUpstream(resolver, view, { host: 'alt.test', port: pair.port }, 5_000);
      if ('socket' in r) {
        assert.equal(r.address, '127.0.0.2');
        assert.equal(r.socket.remoteAddress, '127.0.0.2', 'the socket is connected to the address that was checked');
        r.socket.destroy();
        connected++;
      } else {
        assert.ok('refused' in r && r.refused === 'restricted-address', JSON.stringify(r));
        refused++;
      }
    }
    assert.equal(connected, 16, 'the allowed answers (alone or beside loopback) connect');
    assert.equal(refused, 24);
    assert.equal(pair.hits.secret, 0, "the node's own service was never dialled");
  });

  test('without the operator range, no special address is dialled; the policy alone cannot reach the node', async () => {
    const bare = compilePolicy('sb', '10.213.0.2', { mode: 'allowlist', allow: [{ host: 'alt.test' }], allowAddresses: ['127.0.0.0/8'] }, 1, {
      pool: parseCidr('10.213.0.0/16')!,
      localAddresses: ['127.0.0.1'],
    });
    assert.equal(bare.addressAllowed('127.0.0.2'), true, 'a root policy may name a loopback range');
    assert.equal(bare.addressAllowed('127.0.0.1'), false, "but not the node's own address");
    for (const ip of ['::1', '::ffff:127.0.0.1', '64:ff9b::7f00:1', '0x7f.1', '10.213.0.9', '0.0.0.0', '224.0.0.1', 'fe80::1'])
      assert.equal(bare.addressAllowed(ip), false, ip);
    assert.equal(bare.addressAllowed('::ffff:127.0.0.2'), true, 'a mapped form is judged as its IPv4 address');
  });
});
