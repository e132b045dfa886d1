// The DNS stub over real sockets on loopback: its decisions, against a compiled policy, and its wire format.
import assert from 'node:assert/strict';
import dgram from 'node:dgram';
import net from 'node:net';
import { after, before, describe, test } from 'node:test';
import { parseCidr } from '@dsec/protocol';
import { DnsStub, RCODE, buildResponse, parseQuery } from './dns.js';
import { compilePolicy } from './policy.js';
import { HostsResolver } from './resolver.js';
import type { EgressLogEntry } from './types.js';
import { seededRandom } from '../testing/prng.js';

function query(name: string, type = 1, id = 0x1234): Buffer {
  const labels = name.split('.').map((l) => Buffer.concat([Buffer.from([l.length]), Buffer.from(l)]));
  const header = Buffer.from([id >> 8, id & 255, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
  return Buffer.concat([header, ...labels, Buffer.from([0, 0, type, 0, 1])]);
}

const rcode = (b: Buffer): number => (b[3] ?? 0) & 0x0f;
const answers = (b: Buffer): number => b.readUInt16BE(6);

/** Asks the stub over UDP from `from` (a loopback address), or over TCP. */
async function ask(stub: DnsStub, msg: Buffer, from = '127.0.0.1', overTcp = false): Promise<Buffer | undefined> {
  if (overTcp) {
    const sock = net.connect({ host: '127.0.0.1', port: stub.port, localAddress: from });
    const framed = Buffer.concat([Buffer.from([msg.length >> 8, msg.length & 255]), msg]);
    sock.end(framed);
    const chunks: Buffer[] = [];
    for await (const c of sock) chunks.push(c as Buffer);
    const all = Buffer.concat(chunks);
    return all.length >= 2 ? all.subarray(2, 2 + all.readUInt16BE(0)) : undefined;
  }
  const sock = dgram.createSocket('udp4');
  await new Promise<void>((r) => sock.bind(0, from, r));
  try {
    return await new Promise<Buffer | undefined>((resolve) => {
      const timer = setTimeout(() => resolve(undefined), 300);
      sock.once('message', (m) => {
        clearTimeout(timer);
        resolve(m);
      });
      sock.send(msg, stub.port, '127.0.0.1');
    });
  } finally {
    sock.close();
  }
}

describe('DNS stub', () => {
  const node = { pool: parseCidr('10.213.0.0/16')!, localAddresses: [] };
  const view = compilePolicy(
    'sb',
    '127.0.0.1',
    { mode: 'allowlist', allow: [{ host: 'api.test' }, { host: 'rebind.test' }, { host: 'ghost.test' }], allowAddresses: ['127.0.0.2'] },
    1,
    node,
  );
  const log: EgressLogEntry[] = [];
  let stub: DnsStub;

  before(async () => {
    stub = await DnsStub.start({
      address: '127.0.0.1',
      sandboxes: { bySourceAddress: (ip) => (ip === '127.0.0.1' ? view : undefined) },
      resolver: new HostsResolver({ hosts: { 'api.test': '127.0.0.2', 'rebind.test': '127.0.0.1' }, nameservers: [] }),
      log: (e) => log.push(e),
    });
  });
  after(() => stub.close());

  test('allowed names get the listening address; the rest NXDOMAIN; strangers REFUSED', async () => {
    const ok = (await ask(stub, query('API.test')))!;
    assert.equal(ok.readUInt16BE(0), 0x1234);
    assert.equal(rcode(ok), RCODE.NOERROR);
    assert.equal(answers(ok), 1);
    assert.deepEqual([...ok.subarray(ok.length - 4)], [127, 0, 0, 1]);
    assert.equal(rcode((await ask(stub, query('other.test')))!), RCODE.NXDOMAIN);
    assert.equal(rcode((await ask(stub, query('rebind.test')))!), RCODE.NXDOMAIN, 'rebinding to 127.0.0.1');
    assert.equal(rcode((await ask(stub, query('ghost.test')))!), RCODE.NXDOMAIN, 'allowed but nonexistent');
    const aaaa = (await ask(stub, query('api.test', 28)))!;
    assert.deepEqual([rcode(aaaa), answers(aaaa)], [RCODE.NOERROR, 0]);
    assert.equal(rcode((await ask(stub, query('api.test'), '127.0.0.9'))!), RCODE.REFUSED);
    const tcp = (await ask(stub, query('api.test'), '127.0.0.1', true))!;
    assert.deepEqual([rcode(tcp), answers(tcp)], [RCODE.NOERROR, 1]);
    assert.deepEqual(
      log.map((e) => `${e.host} ${e.verdict}`),
      ['api.test allowed', 'other.test denied', 'rebind.test denied', 'api.test allowed'],
    );
  });

  test('malformed queries get FORMERR or nothing; the wire format round-trips', async () => {
    assert.equal(await ask(stub, Buffer.from([1, 2, 3])), undefined);
    const bad = query('api.test');
    bad[12] = 0xc0; // a compression pointer in the question
    assert.equal(rcode((await ask(stub, bad))!), RCODE.FORMERR);
    const q = parseQuery(query('a.b'));
    assert.ok(q && !('rcode' in q));
    assert.equal(q.name, 'a.b');
    const r = buildResponse(7, true, RCODE.NOERROR, q.raw, ['1.2.3.4', '5.6.7.8']);
    assert.equal(answers(r), 2);
    assert.equal(r.readUInt16BE(2) & 0x8000, 0x8000);
  });
});

/** A query whose labels are the given raw bytes. */
function rawQuery(labels: readonly Buffer[], type = 1): Buffer {
  const header = Buffer.from([0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
  return Buffer.concat([header, ...labels.map((l) => Buffer.concat([Buffer.from([l.length]), l])), Buffer.from([0, 0, type, 0, 1])]);
}

const LDH = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-';
/** Bytes that never belong in a host name's label. */
const BAD = [0x00, 0x2e, 0x5c, 0x20, 0x5f, 0x2a, 0x40, 0x2f, 0x3a, 0x0a, 0x7f, 0x80, 0xc3, 0xff, 0x25, 0x22];

function randomLabel(next: () => number): Buffer {
  const len = next() < 0.05 ? 50 + Math.floor(next() * 14) : 1 + Math.floor(next() * 12);
  const bytes: number[] = [];
  for (let i = 0; i < len; i++) bytes.push(next() < 0.08 ? BAD[Math.floor(next() * BAD.length)]! : LDH.charCodeAt(Math.floor(next() * LDH.length)));
  if (next() < 0.05) return Buffer.from(String(Math.floor(next() * 4294967295)));
  return Buffer.from(bytes);
}

/** The rule, written independently of the stub: labels of letters, digits, inner hyphens; 253 in all; the last not numeric or hex. */
function isHostName(labels: readonly Buffer[]): boolean {
  if (labels.length === 0) return false;
  for (const l of labels) {
    const s = l.toString('latin1');
    if (!/^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?$/.test(s)) return false;
  }
  const name = labels.map((l) => l.toString('latin1')).join('.');
  return name.length <= 253 && !/^(\d+|0x[0-9a-f]*)$/i.test(labels[labels.length - 1]!.toString('latin1'));
}

describe('DNS stub names (fuzz, fixed seeds)', () => {
  for (const seed of [11, 12, 13]) {
    test(`seed ${seed}: 20,000 questions; a name is accepted exactly when every label is letters, digits and inner hyphens`, () => {
      const next = seededRandom(seed);
      let good = 0;
      let bad = 0;
      for (let i = 0; i < 20_000; i++) {
        const labels = Array.from({ length: 1 + Math.floor(next() * (next() < 0.1 ? 6 : 3)) }, () => randomLabel(next));
        const msg = rawQuery(labels);
        const q = parseQuery(msg);
        const total = labels.reduce((n, l) => n + l.length + 1, 1);
        if (total > 255) {
          assert.ok(q && 'rcode' in q && q.rcode === RCODE.FORMERR, 'an over-long name is a format error');
          continue;
        }
        assert.ok(q && !('rcode' in q));
        const expected = isHostName(labels);
        assert.equal(q.nameProblem === undefined, expected, `${JSON.stringify(labels.map((l) => l.toString('latin1')))}: ${q.nameProblem ?? 'accepted'}`);
        if (expected) good++;
        else bad++;
      }
      assert.ok(good > 1000 && bad > 1000, `both kinds tried (${good} good, ${bad} bad)`);
    });
  }

  test('a bad name is refused before any policy check or lookup, and logged', async () => {
    const asked: string[] = [];
    const matched: string[] = [];
    const base = compilePolicy('sb', '127.0.0.1', { mode: 'allowlist', allow: [{ host: '*.test' }] }, 1, {
      pool: parseCidr('10.213.0.0/16')!,
      localAddresses: [],
    });
    const view = { ...base, allowsName: (n: string) => (matched.push(n), base.allowsName(n)) };
    const log: EgressLogEntry[] = [];
    const stub = await DnsStub.start({
      address: '127.0.0.1',
      sandboxes: { bySourceAddress: (ip) => (ip === '127.0.0.1' ? view : undefined) },
      resolver: { resolve4: (n) => (asked.push(n), Promise.resolve(['93.184.216.34'])) },
      log: (e) => log.push(e),
    });
    try {
      const bad = [
        [Buffer.from('a\0b'), Buffer.from('test')],
        [Buffer.from('a.b'), Buffer.from('test')],
        [Buffer.from('a\\.b'), Buffer.from('test')],
        [Buffer.from('x'.repeat(63)), Buffer.from('a_b'), Buffer.from('test')],
        [Buffer.from('-a'), Buffer.from('test')],
        [Buffer.from('caf\xc3\xa9', 'latin1'), Buffer.from('test')],
        [Buffer.from('127'), Buffer.from('1')],
        [Buffer.from('2130706433')],
        [Buffer.from('a'), Buffer.from('0x7f')],
      ];
      for (const labels of bad) {
        const reply = (await stub.answer(rawQuery(labels), '127.0.0.1'))!;
        assert.equal(rcode(reply), RCODE.REFUSED, JSON.stringify(labels.map(String)));
      }
      assert.deepEqual(asked, [], 'no lookup');
      assert.deepEqual(matched, [], 'no policy check');
      assert.equal(log.length, bad.length);
      assert.ok(log.every((e) => e.verdict === 'denied' && /^bad-name: /.test(e.reason ?? '') && !e.host.includes('\0')));
      const ok = (await stub.answer(rawQuery([Buffer.from('api'), Buffer.from('test')]), '127.0.0.1'))!;
      assert.equal(rcode(ok), RCODE.NOERROR, 'a good name still resolves');
      assert.deepEqual(asked, ['api.test']);
    } finally {
      await stub.close();
    }
  });
});
