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
