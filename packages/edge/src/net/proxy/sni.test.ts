// ClientHello parsing against what real TLS clients send (captured from node:tls on loopback).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import net from 'node:net';
import tls from 'node:tls';
import { parseClientHello, readClientHello, tlsAlert } from './sni.js';

/** The first bytes a TLS client sends, captured by a plain TCP server. */
async function captureClientHello(opts: tls.ConnectionOptions): Promise<Buffer> {
  const server = net.createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const port = (server.address() as net.AddressInfo).port;
  try {
    const got = new Promise<Buffer>((resolve) =>
      server.once('connection', async (s: net.Socket) => {
        const { buffered } = await readClientHello(s);
        s.destroy();
        resolve(buffered);
      }),
    );
    const client = tls.connect({ host: '127.0.0.1', port, ...opts });
    client.on('error', () => {});
    const hello = await got;
    client.destroy();
    return hello;
  } finally {
    server.close();
  }
}

test('finds the server name of a real ClientHello', async () => {
  const hello = await captureClientHello({ servername: 'registry.example.org' });
  assert.deepEqual(parseClientHello(hello), { state: 'done', serverName: 'registry.example.org' });
});

test('a ClientHello without SNI parses with no name', async () => {
  const hello = await captureClientHello({});
  assert.deepEqual(parseClientHello(hello), { state: 'done', serverName: undefined });
});

test('a ClientHello split across records and TCP segments is reassembled', async () => {
  const hello = await captureClientHello({ servername: 'split.example' });
  // Re-frame the handshake message into records of 50 bytes each.
  const body = hello.subarray(5, 5 + hello.readUInt16BE(3));
  const records: Buffer[] = [];
  for (let i = 0; i < body.length; i += 50) {
    const part = body.subarray(i, i + 50);
    const h = Buffer.from([0x16, 0x03, 0x01, 0, 0]);
    h.writeUInt16BE(part.length, 3);
    records.push(h, part);
  }
  const framed = Buffer.concat(records);
  for (const cut of [3, 60, framed.length - 1]) assert.deepEqual(parseClientHello(framed.subarray(0, cut)), { state: 'incomplete' }, `cut at ${cut}`);
  assert.deepEqual(parseClientHello(framed), { state: 'done', serverName: 'split.example' });
});

test('garbage and truncated hellos are invalid, never a crash', async () => {
  assert.equal(parseClientHello(Buffer.from('GET / HTTP/1.1\r\n\r\n')).state, 'invalid');
  assert.equal(parseClientHello(Buffer.from([0x16, 0x03, 0x01, 0x00, 0x00])).state, 'invalid');
  // A record that claims a ClientHello but whose body lies about its lengths.
  const lying = Buffer.from([0x16, 0x03, 0x01, 0x00, 0x08, 0x01, 0x00, 0x00, 0x04, 0x03, 0x03, 0xff, 0xff]);
  assert.equal(parseClientHello(lying).state, 'invalid');
  const hello = await captureClientHello({ servername: 'x.example' });
  for (let i = 0; i < 200; i++) {
    const fuzzed = Buffer.from(hello);
    fuzzed[5 + Math.floor(Math.random() * (fuzzed.length - 5))] = Math.floor(Math.random() * 256);
    const r = parseClientHello(fuzzed);
    assert.ok(['done', 'invalid', 'incomplete'].includes(r.state));
  }
});

test('an alert record is a well-formed fatal alert', () => {
  assert.deepEqual([...tlsAlert('access_denied')], [0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 49]);
});
