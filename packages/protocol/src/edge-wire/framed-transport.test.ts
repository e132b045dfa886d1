import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import http2 from 'node:http2';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import type { TestContext } from 'node:test';
import { NODE_SESSION_HTTP2 } from '../nodes.js';
import { WireEdgeClient } from './client.js';
import { FakeEdge } from './fake-edge.js';
import type { FakeProcess } from './fake-edge.js';
import { MAX_WIRE_FRAME_BYTES, framedTransport } from './framed-transport.js';
import { STREAM_WINDOW_EVENTS } from './frames.js';
import { serveEdge } from './server.js';
import type { FrameParts, Transport } from './transport.js';
import { MAX_FRAME_PARTS } from './values.js';

/** Both ends of one HTTP/2 stream on loopback (cleartext: TLS adds nothing to the framing), with the node session's windows. */
async function h2Stream(t: TestContext): Promise<{ client: http2.ClientHttp2Stream; server: http2.ServerHttp2Stream }> {
  const settings = { initialWindowSize: NODE_SESSION_HTTP2.initialWindowSize };
  const server = http2.createServer({ settings });
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on('session', (s) => sessions.add(s));
  const accepted = new Promise<http2.ServerHttp2Stream>((resolve) =>
    server.once('stream', (s) => {
      s.respond({ ':status': 200 });
      resolve(s);
    }),
  );
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const session = http2.connect(`http://127.0.0.1:${(server.address() as AddressInfo).port}`, { settings });
  session.on('error', () => undefined);
  t.after(async () => {
    session.destroy();
    for (const s of sessions) s.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
  const client = session.request({ ':method': 'POST', ':path': '/session' });
  client.on('error', () => undefined);
  return { client, server: await accepted };
}

const received = (t: Transport): Array<[string, FrameParts]> => {
  const got: Array<[string, FrameParts]> = [];
  t.onFrame((f, parts) => got.push([f, parts]));
  return got;
};

async function until(cond: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + 2000;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

test('frames and their byte parts cross an HTTP/2 stream intact, whatever sizes the reads come in', async (t) => {
  const { client, server } = await h2Stream(t);
  const a = framedTransport(client);
  const b = framedTransport(server);
  const got = received(b);
  const big = randomBytes(300 * 1024);
  const sent: Array<[string, Uint8Array[]]> = [];
  for (let i = 0; i < 50; i++) {
    const frame: [string, Uint8Array[]] = [JSON.stringify({ t: 'output', id: i, note: 'ünïcode ✓' }), i % 2 ? [new Uint8Array(0), randomBytes(i), big] : []];
    sent.push(frame);
    a.send(...frame);
  }
  await until(() => got.length === sent.length, 'the frames');
  got.forEach(([f, parts], i) => {
    assert.equal(f, sent[i]?.[0]);
    assert.deepEqual(
      parts.map((p) => Buffer.from(p).toString('hex')),
      sent[i]?.[1].map((p) => Buffer.from(p).toString('hex')),
    );
  });
});

test('a peer that breaks the framing is cut off', async (t) => {
  for (const head of [
    [10, MAX_FRAME_PARTS + 1],
    [MAX_WIRE_FRAME_BYTES + 1, 0],
  ]) {
    const { client, server } = await h2Stream(t);
    const b = framedTransport(server);
    const got = received(b);
    const closed = new Promise<Error | undefined>((resolve) => b.onClose(resolve));
    const bytes = Buffer.alloc(8);
    bytes.writeUInt32BE(head[0] as number, 0);
    bytes.writeUInt32BE(head[1] as number, 4);
    client.write(bytes);
    assert.match(String(await closed), /broke the framing/);
    assert.equal(got.length, 0);
  }
});

test('over HTTP/2 with the node session windows, a reader that stops reading stops the edge pulling output', async (t) => {
  const { client, server } = await h2Stream(t);
  const fake = new FakeEdge();
  serveEdge(fake, framedTransport(client), { heartbeatMs: 0 });
  const wire = await WireEdgeClient.connect(framedTransport(server));
  t.after(() => wire.close());
  const stream = await wire.spawn('sb', { cmd: 'yes', env: { CHUNKS: '5000' } });
  const proc = fake.procs.get(stream.pid) as FakeProcess;
  await until(() => proc.pulled >= STREAM_WINDOW_EVENTS, 'the first window');
  await new Promise((r) => setTimeout(r, 100));
  // The HTTP/2 windows (megabytes) would hold thousands of these events: the credit holds it at the window.
  assert.ok(proc.pulled <= STREAM_WINDOW_EVENTS + 1, `pulled ${proc.pulled} with nobody reading`);
  let i = 0;
  for await (const ev of stream) {
    assert.ok(ev.kind === 'data');
    assert.equal(Buffer.from(ev.data).toString(), `line ${i}\n`);
    i++;
  }
  assert.equal(i, 5000);
  const data = randomBytes(200 * 1024);
  await wire.writeFile('sb', '/f', data);
  assert.ok(Buffer.from(await wire.readFile('sb', '/f')).equals(data));
});
