import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { IncomingMessage, Server } from 'node:http';
import { connect } from 'node:net';
import type { AddressInfo, Socket } from 'node:net';
import { Readable } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import { getRequestListener } from '@hono/node-server';
import { Hono } from 'hono';
import { DsecError } from '@dsec/protocol';
import { readIncomingJson, requestHeader, requestSignal } from './validate.js';

/** Sends raw HTTP/1.1 bytes; resolves with the socket once they are written. */
async function rawRequest(port: number, text: string): Promise<Socket> {
  const socket = connect(port, '127.0.0.1');
  await new Promise<void>((resolve, reject) => socket.once('connect', resolve).once('error', reject));
  socket.write(text);
  return socket;
}

describe("headers and the abort signal read from Node's request (real HTTP)", () => {
  let server: Server;
  let port: number;
  /** The signals the routes saw, by request tag. */
  const seen = new Map<string, { signal: AbortSignal; again: AbortSignal }>();
  let waited: ((reason: unknown) => void) | undefined;

  before(async () => {
    const app = new Hono();
    app.get('/headers', (c) =>
      c.json({ a: requestHeader(c, 'x-a') ?? null, upper: requestHeader(c, 'X-A') ?? null, none: requestHeader(c, 'x-none') ?? null }),
    );
    app.get('/answer/:tag', (c) => {
      seen.set(c.req.param('tag'), { signal: requestSignal(c), again: requestSignal(c) });
      return c.text('ok');
    });
    app.get('/wait', async (c) => {
      const signal = requestSignal(c);
      const reason = await new Promise((resolve) => signal.addEventListener('abort', () => resolve(signal.reason)));
      waited?.(reason);
      return c.text('late');
    });
    server = createServer(getRequestListener(app.fetch));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    port = (server.address() as AddressInfo).port;
  });
  after(async () => {
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  });

  test('a header as c.req.header gives it: any case, repeated values joined, absent undefined', async () => {
    const socket = await rawRequest(port, 'GET /headers HTTP/1.1\r\nHost: x\r\nX-A: one\r\nx-a: two\r\nConnection: close\r\n\r\n');
    const chunks: Buffer[] = [];
    for await (const chunk of socket) chunks.push(chunk as Buffer);
    const body = Buffer.concat(chunks).toString('utf8').split('\r\n\r\n')[1]!;
    assert.deepEqual(JSON.parse(body), { a: 'one, two', upper: 'one, two', none: null });
  });

  test('the signal aborts when the client goes before its answer', async () => {
    const reason = new Promise((resolve) => (waited = resolve));
    const socket = await rawRequest(port, 'GET /wait HTTP/1.1\r\nHost: x\r\n\r\n');
    await new Promise((r) => setTimeout(r, 50));
    socket.destroy();
    const timeout = new Promise((_, reject) => setTimeout(() => reject(new Error('the signal did not abort within 2 s')), 2000).unref());
    // As the fetch Request's own: the request's error when its body was cut short, else the close.
    assert.match(String(await Promise.race([reason, timeout])), /aborted|prematurely closed/);
  });

  test('the signal of a request answered in full never aborts, and is one signal per request', async () => {
    const res = await fetch(`http://127.0.0.1:${port}/answer/full`, { headers: { connection: 'close' } });
    assert.equal(await res.text(), 'ok');
    await new Promise((r) => setTimeout(r, 50));
    const { signal, again } = seen.get('full')!;
    assert.equal(signal, again);
    assert.equal(signal.aborted, false);
  });

  test("without Node's request (app.request) it is the fetch Request's own", async () => {
    const app = new Hono();
    app.get('/', (c) => c.json({ same: requestSignal(c) === c.req.raw.signal, header: requestHeader(c, 'x-a') ?? null }));
    assert.deepEqual(await (await app.request('/', { headers: { 'x-a': 'v' } })).json(), { same: true, header: 'v' });
  });
});

describe('JSON bodies: strings the store cannot keep are refused', () => {
  /** A request whose body is `text`, as Node gives it. */
  const request = (text: string): IncomingMessage => Object.assign(Readable.from([Buffer.from(text)]), { headers: {} }) as unknown as IncomingMessage;
  const refused = async (text: string, field: string): Promise<void> => {
    await assert.rejects(readIncomingJson(request(text)), (err: unknown) => {
      assert.ok(err instanceof DsecError && err.code === 'INVALID_ARGUMENT', String(err));
      assert.equal(err.details?.field, field);
      return true;
    });
  };

  test('a NUL or an unpaired surrogate, in a value or a key, is a 400 naming where it is', async () => {
    await refused('{"env":{"A":"x\\ud800"}}', 'env.A');
    await refused('{"env":{"A":"\\udc00y"}}', 'env.A');
    await refused('{"labels":{"k":"a\\u0000b"}}', 'labels.k');
    await refused('{"command":["sh","-c","\\u0000"]}', 'command[2]');
    await refused('{"env":{"\\u0000":"x"}}', 'env');
    await refused('"\\ud800"', 'body');
  });

  test('a surrogate pair, other escapes and an escaped backslash before a u are kept', async () => {
    assert.deepEqual(await readIncomingJson(request('{"a":"\\ud83d\\ude00","b":"\\u00e9\\n","c":"\\\\u0000"}')), { a: '\u{1F600}', b: 'é\n', c: '\\u0000' });
    assert.deepEqual(await readIncomingJson(request('{"a":[1,{"b":null}]}')), { a: [1, { b: null }] });
  });
});
