import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { EventEmitter } from 'node:events';
import http2 from 'node:http2';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import type { TestContext } from 'node:test';
import { DsecError } from '../errors.js';
import { NODE_SESSION_HTTP2 } from '../nodes.js';
import { WireEdgeClient } from './client.js';
import { FakeEdge } from './fake-edge.js';
import type { FakeProcess } from './fake-edge.js';
import { MAX_UNSENT_BYTES, MAX_WIRE_FRAME_BYTES, framedTransport } from './framed-transport.js';
import { EDGE_WIRE_VERSION, STREAM_WINDOW_EVENTS, encodeFrame } from './frames.js';
import { serveEdge } from './server.js';
import type { FrameParts, Transport } from './transport.js';
import { MAX_FRAME_PARTS, encodeValue } from './values.js';

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

/** A FakeEdge served over one HTTP/2 stream with the node session's windows, and its wire client (closed after the test). */
async function servedOverH2(t: TestContext): Promise<{ fake: FakeEdge; wire: WireEdgeClient }> {
  const { client, server } = await h2Stream(t);
  const fake = new FakeEdge();
  serveEdge(fake, framedTransport(client), { heartbeatMs: 0 });
  const wire = await WireEdgeClient.connect(framedTransport(server));
  t.after(() => wire.close());
  return { fake, wire };
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
  const { fake, wire } = await servedOverH2(t);
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

/** A byte stream whose reads the test hands in, chunk by chunk; what is written is kept. */
class ChunkedDuplex extends EventEmitter {
  readonly written: Buffer[] = [];
  destroyed: Error | undefined;
  write(chunk: Uint8Array): boolean {
    this.written.push(Buffer.from(chunk));
    return true;
  }
  cork(): void {}
  uncork(): void {}
  end(): void {
    this.emit('end');
  }
  destroy(err?: Error): void {
    this.destroyed = err;
    this.emit('close');
  }
}

/** The bytes of one frame as framedTransport writes it. */
function frameBytes(text: string, parts: FrameParts): Buffer {
  const out = new ChunkedDuplex();
  framedTransport(out).send(text, parts);
  return Buffer.concat(out.written);
}

test('a frame that comes a byte at a time arrives whole; small parts do not keep the reads they came in', async () => {
  const big = randomBytes(256 * 1024);
  const bytes = frameBytes('{"t":"x"}', [big, Buffer.from('tiny')]);
  const duplex = new ChunkedDuplex();
  const got = received(framedTransport(duplex));
  for (let i = 0; i < bytes.length; i++) duplex.emit('data', bytes.subarray(i, i + 1));
  assert.equal(got.length, 1);
  assert.equal(got[0]![0], '{"t":"x"}');
  assert.ok(Buffer.from(got[0]![1][0]!).equals(big));
  assert.equal(Buffer.from(got[0]![1][1]!).toString(), 'tiny');
  // A whole frame inside one 64 KiB read: its small part is its own copy, not a view of the read.
  const read = Buffer.alloc(64 * 1024);
  const small = frameBytes('{"t":"y"}', [Buffer.from('0123456789')]);
  small.copy(read);
  duplex.emit('data', read.subarray(0, small.length));
  const part = got[1]![1][0]!;
  assert.equal(Buffer.from(part).toString(), '0123456789');
  assert.ok(part.buffer.byteLength < read.length, `a 10-byte part holds ${part.buffer.byteLength} bytes`);
});

test('a stream that ends inside a frame is a failure, not a graceful close', async () => {
  const duplex = new ChunkedDuplex();
  const transport = framedTransport(duplex);
  received(transport);
  const closed = new Promise<Error | undefined>((resolve) => transport.onClose(resolve));
  duplex.emit('data', frameBytes('{"t":"x"}', [Buffer.alloc(100)]).subarray(0, 50));
  duplex.emit('end');
  assert.match(String((await closed)?.message), /ended inside a frame/);
});

test('a message larger than the protocol carries is refused whole when sent, and the session stays', async () => {
  const duplex = new ChunkedDuplex();
  const transport = framedTransport(duplex);
  const huge = Buffer.alloc(MAX_WIRE_FRAME_BYTES);
  assert.throws(
    () => transport.send('{"t":"reply"}', [huge]),
    (err: unknown) => err instanceof DsecError && err.code === 'PAYLOAD_TOO_LARGE',
  );
  assert.equal(duplex.written.length, 0, 'nothing of it was written');
  transport.send('{"t":"next"}', []);
  assert.equal(duplex.written.length, 1);
  assert.equal(duplex.destroyed, undefined);
});

test('an edge whose reply is too large for one message fails that call alone', async (t) => {
  const { fake, wire } = await servedOverH2(t);
  fake.files.set('/big', new Uint8Array(MAX_WIRE_FRAME_BYTES + 1));
  await assert.rejects(wire.readFile('sb', '/big'), { code: 'PAYLOAD_TOO_LARGE' });
  // The node's session carries on: the next call is answered.
  fake.files.set('/small', Buffer.from('ok'));
  assert.equal(Buffer.from(await wire.readFile('sb', '/small')).toString(), 'ok');
  // And a call too large to send fails alone, before anything of it is sent.
  await assert.rejects(wire.writeFile('sb', '/huge', new Uint8Array(MAX_WIRE_FRAME_BYTES + 1)), { code: 'PAYLOAD_TOO_LARGE' });
  assert.equal(Buffer.from(await wire.readFile('sb', '/small')).toString(), 'ok');
});

test('an edge that sends a stream more output than its credit allows is cut off, not queued without bound', async (t) => {
  const { client, server } = await h2Stream(t);
  const rogue = framedTransport(client);
  let spawned = false;
  rogue.onFrame((text) => {
    const frame = JSON.parse(text) as { t: string; id: number };
    // Answers the first call (the spawn) and nothing after.
    if (frame.t !== 'call' || spawned) return;
    spawned = true;
    rogue.send(encodeFrame({ t: 'reply', id: frame.id, value: { pid: 1, osPid: 1 } }));
    // Far past the window, with nobody reading.
    for (let i = 0; i < 10 * STREAM_WINDOW_EVENTS; i++) {
      const parts: Uint8Array[] = [];
      rogue.send(encodeFrame({ t: 'output', id: frame.id, event: encodeValue({ kind: 'data', fd: 1, data: Buffer.from('x') }, parts) }), parts);
    }
  });
  rogue.send(encodeFrame({ t: 'hello', version: EDGE_WIRE_VERSION, nodeName: 'rogue', capacity: new FakeEdge().capacity(), heartbeatMs: 0 }));
  const wire = await WireEdgeClient.connect(framedTransport(server));
  t.after(() => wire.close());
  await wire.spawn('sb', { cmd: 'yes' });
  // The next call is never answered: it fails with the session's loss, which names the cause.
  await assert.rejects(
    wire.list(),
    (err: unknown) => err instanceof DsecError && err.code === 'UNAVAILABLE' && /more output than its credit/.test(err.message),
  );
});

test('a peer that stops taking what is sent is cut off once too much waits for it', async () => {
  const duplex = new ChunkedDuplex();
  const transport = framedTransport(duplex);
  const closed = new Promise<Error | undefined>((resolve) => transport.onClose(resolve));
  transport.send('{"t":"a"}', []);
  assert.equal(duplex.destroyed, undefined);
  // What a Node stream reports when its peer takes nothing.
  Object.defineProperty(duplex, 'writableLength', { value: MAX_UNSENT_BYTES + 1 });
  transport.send('{"t":"b"}', []);
  assert.match(String((duplex.destroyed as Error | undefined)?.message), /has not taken/);
  assert.ok(await closed);
});

test('text that is not UTF-8 in a frame spread over reads cuts the peer off, and throws nothing', async () => {
  const bytes = frameBytes('{"t":"abc"}', [Buffer.alloc(1000)]);
  // The text's first byte made a lone continuation byte: not UTF-8.
  bytes[4 * 3] = 0x80;
  const duplex = new ChunkedDuplex();
  const got = received(framedTransport(duplex));
  duplex.emit('data', bytes.subarray(0, 20));
  duplex.emit('data', bytes.subarray(20));
  assert.equal(got.length, 0);
  assert.match(String(duplex.destroyed?.message), /broke the framing/);
});
