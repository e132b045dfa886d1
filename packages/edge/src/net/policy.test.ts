// Compiled policies: names, wildcards, ports, IP literals, addresses; patches and normalisation.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { NetworkPolicySchema, applyNetworkPatch, normalizeNetworkPolicy, parseCidr, withDeniedNames } from '@dsec/protocol';
import type { NetworkPolicy } from '@dsec/protocol';
import { compilePolicy } from './policy.js';

const node = { pool: parseCidr('10.213.0.0/16')!, localAddresses: ['192.0.2.2', '127.0.0.1'] };
const view = (p: NetworkPolicy) => compilePolicy('sb-1', '10.213.0.2', NetworkPolicySchema.parse(p), 1, node);

describe('compiled policies', () => {
  test('exact names, wildcards below a suffix, ports, presets', () => {
    const v = view({ mode: 'allowlist', allow: [{ host: 'API.example.com.' }, { host: '*.cdn.example', ports: [8443] }], presets: ['pypi'] });
    assert.deepEqual(v.allows('api.example.com', 443), { allowed: true, rule: 'allow:api.example.com' });
    assert.equal(v.allows('Api.Example.Com.', 80).allowed, true);
    assert.equal(v.allows('api.example.com', 22).allowed, false);
    assert.match(v.allows('api.example.com', 22).reason ?? '', /port 22 not allowed by allow:api\.example\.com/);
    assert.equal(v.allows('x.api.example.com', 443).allowed, false, 'an exact rule covers no subdomain');
    assert.equal(v.allows('a.b.cdn.example', 8443).allowed, true, 'a wildcard covers any depth');
    assert.equal(v.allows('cdn.example', 8443).allowed, false, 'nor the suffix itself');
    assert.equal(v.allows('evilcdn.example', 8443).allowed, false);
    assert.equal(v.allows('a.cdn.example', 443).allowed, false);
    assert.deepEqual(v.allows('files.pythonhosted.org', 443), { allowed: true, rule: 'preset:pypi:files.pythonhosted.org' });
    assert.equal(v.allowsName('a.cdn.example').allowed, true);
    assert.equal(v.allowsName('other.example').allowed, false);
  });

  test('denied names win over rules and presets, and survive patches', () => {
    const v = view({
      mode: 'allowlist',
      allow: [{ host: '*.example.com' }],
      presets: ['npm'],
      deny: ['secret.example.com', '*.hidden.example.com', 'registry.npmjs.org'],
    });
    assert.equal(v.allows('api.example.com', 443).allowed, true);
    assert.deepEqual(v.allows('Secret.Example.com.', 443), { allowed: false, rule: 'deny:secret.example.com', reason: 'denied by secret.example.com' });
    assert.equal(v.allows('a.b.hidden.example.com', 443).allowed, false);
    assert.equal(v.allowsName('x.hidden.example.com').allowed, false, 'the DNS stub refuses it too');
    assert.equal(v.allows('registry.npmjs.org', 443).allowed, false, 'over a preset');
    assert.equal(v.allows('registry.yarnpkg.com', 443).allowed, true);
    const patched = applyNetworkPatch({ mode: 'allowlist', allow: [{ host: 'a.test' }], deny: ['b.test'] }, { allow: { add: [{ host: 'b.test' }] } });
    assert.deepEqual(patched.deny, ['b.test'], 'a patch cannot drop a denied name');
    assert.equal(view(patched).allows('b.test', 443).allowed, false);
    assert.deepEqual(withDeniedNames({ mode: 'allowlist', deny: ['b.test'] }, ['A.test.', 'b.test']).deny, ['a.test', 'b.test']);
    assert.deepEqual(withDeniedNames({ mode: 'none' }, ['a.test']), { mode: 'none' });
  });

  test('IP literals only when a rule names them; mode none allows nothing', () => {
    const v = view({ mode: 'allowlist', allow: [{ host: '203.0.113.9', ports: [8080] }, { host: 'a.test' }] });
    assert.equal(v.allows('203.0.113.9', 8080).allowed, true);
    assert.equal(v.allows('203.0.113.10', 8080).allowed, false);
    assert.equal(v.addressAllowed('203.0.113.9'), true, 'a documentation address named by a rule');
    const none = view({ mode: 'none' });
    assert.equal(none.allows('a.test', 443).allowed, false);
    assert.equal(none.addressAllowed('93.184.216.34'), false);
  });

  test('addresses: public yes; special and local only when named; never the pool, 0/8 or multicast', () => {
    const v = view({ mode: 'allowlist', allow: [{ host: 'a.test' }], allowAddresses: ['127.0.0.2/32', '10.0.0.0/8'] });
    assert.equal(v.addressAllowed('93.184.216.34'), true);
    for (const ip of ['127.0.0.1', '192.168.1.1', '172.16.0.1', '169.254.169.254', '100.64.0.1', '192.0.2.2']) assert.equal(v.addressAllowed(ip), false, ip);
    assert.equal(v.addressAllowed('127.0.0.2'), true);
    assert.equal(v.addressAllowed('10.1.2.3'), true);
    assert.equal(v.addressAllowed('10.213.0.7'), false, 'the sandbox pool, even inside an allowed range');
    for (const ip of ['0.0.0.0', '224.0.0.1', '255.255.255.255', '::1', 'localhost']) assert.equal(v.addressAllowed(ip), false, ip);
  });
});

describe('policy patches', () => {
  test('add and remove rules, presets, addresses, mirrors; adding to none makes an allowlist', () => {
    let p: NetworkPolicy = { mode: 'none' };
    p = applyNetworkPatch(p, { presets: { add: ['npm'] } });
    assert.deepEqual(p, { mode: 'allowlist', presets: ['npm'] });
    p = applyNetworkPatch(p, {
      allow: { add: [{ host: 'a.test' }, { host: 'B.test', ports: [1] }] },
      allowAddresses: { add: ['127.0.0.2'] },
      mirrors: { npm: { freeze: '2024-01-01' } },
    });
    p = applyNetworkPatch(p, { allow: { add: [{ host: 'b.test', ports: [2] }], remove: ['a.test'] }, presets: { remove: ['npm'] } });
    assert.deepEqual(p.allow, [{ host: 'b.test', ports: [2] }]);
    assert.equal(p.presets, undefined);
    p = applyNetworkPatch(p, { mirrors: { npm: null } });
    assert.equal(p.mirrors, undefined);
    assert.deepEqual(applyNetworkPatch(p, { mode: 'none' }), { mode: 'none' });
    assert.deepEqual(applyNetworkPatch({ mode: 'none' }, { mirrors: { npm: null } }), { mode: 'none' }, 'removing nothing changes nothing');
  });

  test('normalisation lower-cases hosts and sorts ports and presets', () => {
    const n = normalizeNetworkPolicy({ mode: 'allowlist', allow: [{ host: 'A.Test.', ports: [443, 80, 443] }], presets: ['pypi', 'npm'] });
    assert.deepEqual(n, { mode: 'allowlist', allow: [{ host: 'a.test', ports: [80, 443] }], presets: ['npm', 'pypi'] });
    assert.equal(NetworkPolicySchema.safeParse({ mode: 'allowlist', allow: [{ host: 'a.test' }, { host: 'A.TEST' }] }).success, false, 'a host listed twice');
  });
});
