// The one address parser: every spelling of an address, and the class of each.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  classifyAddress,
  classifyRange,
  formatIpAddress,
  hostNameProblem,
  isLocalhostName,
  looksLikeIpLiteral,
  parseIpAddress,
  parseIpRange,
} from './addresses.js';

const canon = (s: string): string | undefined => {
  const a = parseIpAddress(s);
  return a && formatIpAddress(a);
};
const cls = (s: string): string => {
  const a = parseIpAddress(s);
  assert.ok(a, `${s} parses`);
  return classifyAddress(a);
};

describe('address spellings', () => {
  test('every inet_aton spelling of 127.0.0.1 is 127.0.0.1', () => {
    for (const s of [
      '127.0.0.1',
      '127.1',
      '127.0.1',
      '0x7f.1',
      '0x7f000001',
      '2130706433',
      '0177.0.0.1',
      '0177.0.0.01',
      '0x7F.0.0.1',
      '017700000001',
      '127.0.0.1.',
    ])
      assert.equal(canon(s), '127.0.0.1', s);
    assert.equal(canon('0'), '0.0.0.0');
    assert.equal(canon('0x'), '0.0.0.0');
    assert.equal(canon('4294967295'), '255.255.255.255');
  });

  test('not addresses', () => {
    for (const s of [
      '',
      '.',
      '4294967296',
      '256.0.0.1',
      '1.2.3.4.5',
      '08.1.1.1',
      '1.2.3.0x1ff',
      'a.b.c.d',
      '1..2',
      '0x1g',
      'example.com',
      '1.2.3.-4',
      ' ',
      '::1::',
      ':::',
      '1:2:3:4:5:6:7:8:9',
      '12345::',
      'fe80::1%',
      '::ffff:127.1',
      '::ffff:1.2.3.04',
    ])
      assert.equal(parseIpAddress(s), undefined, JSON.stringify(s));
  });

  test('IPv6 forms, canonical text', () => {
    assert.equal(canon('::1'), '::1');
    assert.equal(canon('[::1]'), '::1');
    assert.equal(canon('0:0:0:0:0:0:0:1'), '::1');
    assert.equal(canon('::'), '::');
    assert.equal(canon('::ffff:127.0.0.1'), '::ffff:127.0.0.1');
    assert.equal(canon('::FFFF:7f00:1'), '::ffff:127.0.0.1');
    assert.equal(canon('fe80::1%eth0'), 'fe80::1');
    assert.equal(canon('2001:db8:0:0:1:0:0:1'), '2001:db8::1:0:0:1');
    assert.equal(canon('64:ff9b::127.0.0.1'), '64:ff9b::7f00:1');
    assert.equal(canon('1:2:3:4:5:6:1.2.3.4'), '1:2:3:4:5:6:102:304');
  });

  test('IP-literal-looking names', () => {
    for (const s of ['127.1', '1.2.3.999', 'foo.0x10', 'a.123', '::1', '0x']) assert.equal(looksLikeIpLiteral(s), true, s);
    for (const s of ['example.com', 'a1.b2', '0x.example', 'xn--p1ai']) assert.equal(looksLikeIpLiteral(s), false, s);
  });
});

describe('address classes', () => {
  test('IPv4 special ranges', () => {
    const cases: Array<[string, string]> = [
      ['127.0.0.1', 'loopback'],
      ['127.255.1.2', 'loopback'],
      ['169.254.169.254', 'link-local'],
      ['10.1.2.3', 'private'],
      ['172.16.0.1', 'private'],
      ['172.31.255.255', 'private'],
      ['192.168.1.1', 'private'],
      ['100.64.0.1', 'shared'],
      ['100.127.255.255', 'shared'],
      ['0.0.0.0', 'unspecified'],
      ['224.0.0.1', 'multicast'],
      ['240.0.0.1', 'reserved'],
      ['255.255.255.255', 'broadcast'],
      ['192.0.2.1', 'documentation'],
      ['198.18.0.1', 'benchmarking'],
      ['93.184.216.34', 'public'],
      ['172.32.0.1', 'public'],
      ['100.128.0.1', 'public'],
    ];
    for (const [ip, c] of cases) assert.equal(cls(ip), c, ip);
  });

  test('IPv6: loopback, link-local, unique-local, multicast; IPv4 carried in mapped, NAT64, 6to4 forms', () => {
    const cases: Array<[string, string]> = [
      ['::1', 'loopback'],
      ['::', 'unspecified'],
      ['fe80::1', 'link-local'],
      ['febf::1', 'link-local'],
      ['fc00::1', 'private'],
      ['fd12:3456::1', 'private'],
      ['ff02::1', 'multicast'],
      ['2001:db8::1', 'documentation'],
      ['::ffff:127.0.0.1', 'loopback'],
      ['::ffff:7f00:1', 'loopback'],
      ['::ffff:169.254.169.254', 'link-local'],
      ['::ffff:0:10.0.0.1', 'private'],
      ['::127.0.0.1', 'loopback'],
      ['64:ff9b::7f00:1', 'loopback'],
      ['64:ff9b::a9fe:a9fe', 'link-local'],
      ['64:ff9b:1::10.0.0.1', 'private'],
      ['2002:7f00:1::', 'loopback'],
      ['2002:5db8:d822::1', 'public'],
      ['::ffff:93.184.216.34', 'public'],
      ['2606:2800:220:1::1', 'public'],
      ['4000::1', 'reserved'],
      ['2001::1', 'reserved'],
    ];
    for (const [ip, c] of cases) assert.equal(cls(ip), c, ip);
  });

  test("the node's own addresses and the sandbox pool", () => {
    const node = { localAddresses: ['203.0.113.7', '127.0.0.1'], pool: parseIpRange('10.213.0.0/16')! };
    assert.equal(classifyAddress(parseIpAddress('203.0.113.7')!, node), 'node');
    assert.equal(classifyAddress(parseIpAddress('::ffff:203.0.113.7')!, node), 'node');
    assert.equal(classifyAddress(parseIpAddress('10.213.4.5')!, node), 'sandbox-pool');
    assert.equal(classifyAddress(parseIpAddress('0x7f.1')!, node), 'node');
  });

  test('ranges: the class of the first special range they overlap', () => {
    assert.equal(classifyRange(parseIpRange('8.0.0.0/8')!), 'public');
    assert.equal(classifyRange(parseIpRange('127.0.0.0/8')!), 'loopback');
    assert.equal(classifyRange(parseIpRange('10.1.0.0/16')!), 'private');
    assert.equal(classifyRange(parseIpRange('169.0.0.0/8')!), 'link-local');
    assert.equal(classifyRange(parseIpRange('100.0.0.0/8')!), 'shared');
    assert.equal(classifyRange(parseIpRange('93.184.216.34')!), 'public');
    assert.equal(classifyRange(parseIpRange('64:ff9b::/96')!), 'reserved');
    assert.equal(classifyRange(parseIpRange('2606:2800::/32')!), 'public');
    assert.equal(parseIpRange('127.1/8'), undefined, 'ranges are written as canonical quads');
    assert.equal(parseIpRange('10.0.0.0/33'), undefined);
  });

  test('host names', () => {
    assert.equal(hostNameProblem('registry.npmjs.org'), undefined);
    assert.equal(hostNameProblem('a.b.'), undefined);
    assert.match(hostNameProblem('a..b') ?? '', /empty label/);
    assert.match(hostNameProblem('a_b.test') ?? '', /not letters/);
    assert.equal(hostNameProblem('a_b.test', { underscore: true }), undefined);
    assert.match(hostNameProblem('x'.repeat(64) + '.test') ?? '', /longer than 63/);
    assert.match(hostNameProblem('0x7f.1') ?? '', /IP address/);
    assert.match(hostNameProblem('-a.test') ?? '', /not letters/);
    assert.equal(isLocalhostName('LocalHost.'), true);
    assert.equal(isLocalhostName('a.localhost'), true);
    assert.equal(isLocalhostName('localhost.example'), false);
  });
});
