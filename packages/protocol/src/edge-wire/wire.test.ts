import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { describe, test } from 'node:test';
import { DsecError, isDsecError } from '../errors.js';
import type { EdgeClient, OutputEvent } from '../edge-client.js';
import type { RaisedEvent } from '../events.js';
import { WireEdgeClient } from './client.js';
import { FakeEdge, FakeProcess } from './fake-edge.js';
import { STREAM_WINDOW_EVENTS, UPLOAD_WINDOW_CHUNKS } from './frames.js';
import { edgeThroughWire, loopbackEdge } from './loopback.js';
import { serveEdge } from './server.js';
import type { FrameParts, Transport } from './transport.js';
import { loopbackTransport } from './transport.js';
import { INTERNAL_MESSAGE, decodeValue, encodeValue, fromWireError, toWireError } from './values.js';

/** A fake edge served over a loopback pair; every frame each way is kept. */
async function connect(
  opts: { heartbeatMs?: number } = {},
): Promise<{ fake: FakeEdge; client: WireEdgeClient; logs: string[]; frames: Array<[string, FrameParts]>; serverEnd: Transport; clientEnd: Transport }> {
  const fake = new FakeEdge();
  const [clientEnd, serverEnd] = loopbackTransport();
  const frames: Array<[string, FrameParts]> = [];
  const tap = (t: Transport): Transport => ({
    ...t,
    send: (f, parts) => (frames.push([f, parts ?? []]), t.send(f, parts)),
    onFrame: (r) => t.onFrame(r),
    onClose: (l) => t.onClose(l),
    close: (e) => t.close(e),
  });
  const logs: string[] = [];
  serveEdge(fake, tap(serverEnd), { log: (l) => logs.push(l), heartbeatMs: opts.heartbeatMs ?? 0 });
  const client = await WireEdgeClient.connect(tap(clientEnd));
  return { fake, client, logs, frames, serverEnd, clientEnd };
}

/** `v` with every Buffer turned into a plain Uint8Array (the wire gives Buffers, as the in-process edge does). */
function plain(v: unknown): unknown {
  if (v instanceof Uint8Array) return new Uint8Array(v);
  if (Array.isArray(v)) return v.map(plain);
  if (v && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, plain(x)]));
  return v;
}

const tick = (ms = 5): Promise<void> => new Promise((r) => setTimeout(r, ms));
const text = (b: Uint8Array): string => new TextDecoder().decode(b);

describe('values', () => {
  test('bytes, undefined in arrays and objects that look like tags come back as they were', () => {
    const v = { a: new Uint8Array([0, 1, 255]), b: [1, undefined, 'x'], c: { $b: 'not bytes' }, d: { $o: 1 }, e: { $u: 0, other: 1 }, f: Buffer.from('hi') };
    const back = decodeValue(JSON.parse(JSON.stringify(encodeValue(v)))) as typeof v;
    assert.deepEqual(plain(back.a), new Uint8Array([0, 1, 255]));
    assert.deepEqual(back.b, [1, undefined, 'x']);
    assert.deepEqual(back.c, { $b: 'not bytes' });
    assert.deepEqual(back.d, { $o: 1 });
    assert.deepEqual(back.e, { $u: 0, other: 1 });
    assert.ok(back.f instanceof Uint8Array);
    assert.equal(text(back.f), 'hi');
  });

  test("with a frame's parts, bytes travel beside the JSON; a part the frame lacks is refused", () => {
    const parts: Uint8Array[] = [];
    const v = { out: new Uint8Array([1, 2]), lit: { $p: 3 } };
    const text = JSON.stringify(encodeValue(v, parts));
    assert.equal(text, '{"out":{"$p":0},"lit":{"$o":{"$p":3}}}');
    const back = decodeValue(JSON.parse(text), parts) as typeof v;
    assert.deepEqual([...back.out], [1, 2]);
    assert.deepEqual(back.lit, { $p: 3 });
    assert.throws(
      () => decodeValue({ $p: 1 }, parts),
      (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT'),
    );
  });

  test('what has no wire form is refused', () => {
    assert.throws(() => encodeValue({ f: () => 1 }), /function/);
    assert.throws(() => encodeValue({ s: new AbortController().signal }), /AbortSignal/);
    assert.throws(() => encodeValue(NaN), /NaN/);
    assert.throws(() => encodeValue(new Map()), /Map/);
    assert.throws(() => encodeValue(new Error('x')), /Error/);
    assert.throws(() => encodeValue(new Int32Array(2)), /Int32Array/);
  });

  test('a Date travels as its ISO string, a class instance as its own fields (as with JSON)', () => {
    class Point {
      constructor(
        readonly x: number,
        readonly y: number,
      ) {}
    }
    assert.deepEqual(decodeValue(encodeValue({ at: new Date(0), p: new Point(1, 2) })), { at: '1970-01-01T00:00:00.000Z', p: { x: 1, y: 2 } });
  });

  test('a DsecError keeps its code, message and details; anything else is INTERNAL and logged', () => {
    const e = fromWireError(JSON.parse(JSON.stringify(toWireError(new DsecError('QUOTA_EXCEEDED', 'too many', { retryAfterMs: 5, field: 'x' })))));
    assert.ok(e instanceof DsecError);
    assert.equal(e.code, 'QUOTA_EXCEEDED');
    assert.equal(e.status, 429);
    assert.equal(e.message, 'too many');
    assert.deepEqual(e.details, { retryAfterMs: 5, field: 'x' });
    const logs: string[] = [];
    const w = toWireError(new Error('/secret/path exploded'), (l) => logs.push(l));
    assert.deepEqual(w, { code: 'INTERNAL', message: INTERNAL_MESSAGE });
    assert.match(logs[0] ?? '', /secret\/path exploded/);
  });
});

describe('WireEdgeClient over serveEdge', () => {
  test('the hello carries the node name and capacity; heartbeats refresh the capacity', async () => {
    const { fake, client } = await connect({ heartbeatMs: 5 });
    assert.equal(client.nodeName, 'fake-node');
    assert.deepEqual(client.capacity(), fake.cap);
    fake.cap = { ...fake.cap, cpu: 2 };
    await tick(30);
    assert.equal(client.capacity().cpu, 2);
    // Each VM backend's accelerator and boot time travel with the capacity.
    fake.cap = { ...fake.cap, backends: ['container', 'microvm', 'vm'], microvm: { accel: 'tcg', bootMs: 900 }, vm: { accel: 'kvm', bootMs: 4000 } };
    await tick(30);
    assert.deepEqual(client.capacity(), fake.cap);
    client.close();
  });

  test('heartbeats keep a connection alive; silence past the limit loses it', async () => {
    const pair = async (heartbeatMs: number): Promise<WireEdgeClient> => {
      const [c, s] = loopbackTransport();
      serveEdge(new FakeEdge(), s, { heartbeatMs });
      return WireEdgeClient.connect(c, { silenceTimeoutMs: 300 });
    };
    const beating = await pair(10);
    const silent = await pair(0);
    await tick(500);
    assert.equal((await beating.list()).length, 1);
    await assert.rejects(silent.list(), (e: unknown) => isDsecError(e, 'UNAVAILABLE') && /no frame from the edge/.test(e.message));
    beating.close();
  });

  test('a server of another version is refused', async () => {
    const [c, s] = loopbackTransport();
    s.send(JSON.stringify({ t: 'hello', version: 99, nodeName: 'n', capacity: new FakeEdge().cap, heartbeatMs: 0 }));
    await assert.rejects(WireEdgeClient.connect(c), (e: unknown) => isDsecError(e, 'UNAVAILABLE') && /version 99/.test(e.message));
  });

  test('every method returns what the edge returned', async () => {
    const { fake, client } = await connect();
    const direct = new FakeEdge();
    const policy = { mode: 'allowlist' as const, allow: [{ host: 'example.com' }] };
    const cases: Array<[string, (e: EdgeClient) => Promise<unknown>]> = [
      ['create', (e) => e.create({ image: { base: 'busybox', toolkits: ['py'] }, labels: { a: 'b' }, env: { X: '1' } }, { id: 'sb-9' })],
      ['claim', (e) => e.claim('sb-1', { env: { A: '1' }, labels: { l: 'v' } })],
      ['destroy', (e) => e.destroy('sb-1')],
      ['list', (e) => e.list()],
      ['stats', (e) => e.stats('sb-1')],
      ['pause', (e) => e.pause('sb-1', { reason: 'idle' })],
      ['resume', (e) => e.resume('sb-1', { prefetch: true })],
      ['snapshot', (e) => e.snapshot('sb-1', { labels: { k: 'v' } })],
      ['diff', (e) => e.diff('sb-1', { paths: ['/a', '/b'], hash: true })],
      ['verify', (e) => e.verify('sb-1', { expected: { '/a': 'c'.repeat(64) } })],
      ['collectGarbage', (e) => e.collectGarbage({ calls: true })],
      ['usage', (e) => e.usage()],
      ['exec', (e) => e.exec('sb-1', { cmd: 'echo hi', stdin: new Uint8Array([1, 2]) }, { maxOutputBytes: 5 })],
      ['exec argv', (e) => e.exec('sb-1', { argv: ['ls', '-l'], stdin: 'text' })],
      ['processes', (e) => e.processes('sb-1')],
      [
        'writeFile+readFile',
        async (e) => (
          await e.writeFile('sb-1', '/f', new Uint8Array([0, 200, 7]), { mode: 0o600 }),
          await e.writeFile('sb-1', '/f', 'x', { append: true }),
          e.readFile('sb-1', '/f', { offset: 1 })
        ),
      ],
      ['listDir', (e) => e.listDir('sb-1', '/')],
      ['stat', (e) => e.stat('sb-1', '/f')],
      ['mkdir', (e) => e.mkdir('sb-1', '/d')],
      ['remove', (e) => e.remove('sb-1', '/d', { recursive: true })],
      ['rename', (e) => e.rename('sb-1', '/a', '/b')],
      ['symlink', (e) => e.symlink('sb-1', '/l', '/target')],
      ['xattrs', async (e) => (await e.xattrs('sb-1', ['/f'], 'user.e2b.', { replace: { k: 'v' } }), e.xattrs('sb-1', ['/f', '/missing'], 'user.e2b.'))],
      ['writeStdin', (e) => e.writeStdin('sb-1', 99, 'data', true)],
      ['signal', (e) => e.signal('sb-1', 99, 'SIGTERM')],
      ['resize', (e) => e.resize('sb-1', 99, 24, 80)],
      ['setNetwork', (e) => e.setNetwork('sb-1', policy)],
      ['networkInfo', (e) => e.networkInfo('sb-1')],
      ['networkLog', (e) => e.networkLog('sb-1', 5)],
      ['layers.resolve', (e) => e.layers.resolve('busybox:latest')],
      ['layers.list', (e) => e.layers.list({ kind: 'base' })],
      ['layers.list all', (e) => e.layers.list()],
      ['layers.build busybox', (e) => e.layers.build({ type: 'busybox' }, { kind: 'base', name: 'bb', labels: { x: 'y' } })],
      ['layers.remove', (e) => e.layers.remove('bb')],
      ['calls.run', (e) => e.calls.run({ runtime: 'sh', code: 'echo 1' })],
      [
        'calls.runBatch',
        (e) =>
          e.calls.runBatch({
            calls: [
              { runtime: 'sh', code: 'a' },
              { runtime: 'node', code: 'b' },
            ],
          }),
      ],
    ];
    for (const [name, run] of cases) {
      assert.deepEqual(plain(await run(client)), plain(await run(direct)), name);
    }
    assert.deepEqual([...fake.files.keys()], ['/f'], 'the writes reached the edge');
    client.close();
  });

  test('errors keep their code and details; bad arguments are refused at the edge naming the field', async () => {
    const { fake, client, logs } = await connect();
    await assert.rejects(client.destroy('nope'), (e: unknown) => isDsecError(e, 'SANDBOX_NOT_FOUND') && e.status === 404 && e.details.sandboxId === 'nope');
    await assert.rejects(
      client.readFile('sb', '/missing'),
      (e: unknown) => isDsecError(e, 'FILE_NOT_FOUND') && e.details.errno === 'ENOENT' && e.details.path === '/missing',
    );
    await assert.rejects(client.layers.resolve('missing'), (e: unknown) => isDsecError(e, 'LAYER_NOT_FOUND') && e.details.layer === 'missing');
    await assert.rejects(
      client.create({ image: { base: 'NOT A REF' } }),
      (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT') && e.details.field === 'spec.image.base',
    );
    await assert.rejects(client.exec('sb', { cmd: 'a', argv: ['b'] }), (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT') && e.details.field === 'spec.cmd');
    await assert.rejects(client.resize('sb', 1, 0, 80), (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT') && e.details.field === 'rows');
    await assert.rejects(
      client.create({ image: { base: 'busybox' }, labels: { fail: 'internal' } }),
      (e: unknown) => isDsecError(e, 'INTERNAL') && e.message === INTERNAL_MESSAGE && !e.message.includes('secret'),
    );
    assert.ok(
      logs.some((l) => l.includes('secret detail of the node')),
      'the real message is logged on the edge side',
    );
    assert.equal(fake.procs.size, 0);
    client.close();
  });

  test('createMany: many creates in one call frame, each item its own outcome in order', async () => {
    const { client, frames } = await connect();
    const before = frames.length;
    const out = await client.createMany([
      { spec: { image: { base: 'busybox' }, labels: { a: 'b' } }, id: 'sb-a' },
      { spec: { image: { base: 'busybox' }, labels: { fail: 'internal' } }, id: 'sb-b' },
      { spec: { image: { base: 'busybox' } }, id: 'sb-c' },
    ]);
    assert.equal(frames.length - before, 2, 'one call frame and one result frame');
    assert.deepEqual(
      out.map((r) => ('sandbox' in r ? r.sandbox.id : r.error.code)),
      ['sb-a', 'INTERNAL', 'sb-c'],
    );
    const failed = out[1]!;
    assert.ok('error' in failed && failed.error instanceof DsecError && failed.error.message === INTERNAL_MESSAGE);
    assert.ok('sandbox' in out[0]! && out[0].sandbox.spec.labels?.['a'] === 'b');
    await assert.rejects(client.createMany([]), (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT') && e.details.field === 'items');
    await assert.rejects(
      client.createMany([{ spec: { image: { base: 'NOT A REF' } }, id: 'x' }]),
      (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT') && String(e.details.field).startsWith('items.0.spec'),
    );
    client.close();
  });

  test('a frame that is not one, a method that does not exist or an upload chunk without its bytes gets INVALID_ARGUMENT', async () => {
    const fake = new FakeEdge();
    const [c, s] = loopbackTransport();
    serveEdge(fake, s, { heartbeatMs: 0 });
    const got: unknown[] = [];
    c.onFrame((f) => got.push(JSON.parse(f)));
    c.send('{"t":"call","id":7,"method":"create"}');
    c.send('{"t":"call","id":8,"method":"format","args":[]}');
    c.send('not json');
    c.send('{"t":"chunk","id":9}');
    await tick();
    const errors = got.filter((f): f is { t: 'error'; id: number; error: { code: string } } => (f as { t: string }).t === 'error');
    assert.deepEqual(
      errors.map((e) => [e.id, e.error.code]),
      [
        [7, 'INVALID_ARGUMENT'],
        [8, 'INVALID_ARGUMENT'],
        [9, 'INVALID_ARGUMENT'],
      ],
    );
    c.close();
  });

  test('a bad chunk of an upload under way ends the upload and its call, answered once with the refusal', async () => {
    const fake = new FakeEdge();
    const [c, s] = loopbackTransport();
    serveEdge(fake, s, { heartbeatMs: 0 });
    const got: Array<{ t: string; id?: number; error?: { code: string } }> = [];
    c.onFrame((f) => got.push(JSON.parse(f)));
    c.send('{"t":"call","id":10,"method":"layers.build","args":[{"type":"tar","upload":true},{}],"upload":true}');
    await tick();
    c.send('{"t":"chunk","id":10}');
    for (let i = 0; i < 20 && !got.some((f) => f.id === 10 && f.t !== 'credit'); i++) await tick();
    const answers = got.filter((f) => f.id === 10 && f.t !== 'credit');
    assert.deepEqual(
      answers.map((f) => [f.t, f.error?.code]),
      [['error', 'INVALID_ARGUMENT']],
    );
    c.close();
  });

  test('exec output reaches onOutput in order, before the result', async () => {
    const { client } = await connect();
    const seen: OutputEvent[] = [];
    const r = await client.exec('sb', { cmd: 'x' }, { onOutput: (ev) => seen.push(ev) });
    assert.equal(r.exitCode, 0);
    assert.deepEqual(
      seen.map((e) => [e.kind, e.stream, e.offset]),
      [
        ['data', 'stdout', 0],
        ['data', 'stderr', 7],
        ['data', 'stdout', 14],
        ['gap', 'stdout', 21],
      ],
    );
    const first = seen[0];
    assert.ok(first?.kind === 'data' && first.data instanceof Uint8Array && text(first.data) === 'line 0\n');
    client.close();
  });

  test('a process stream delivers its output in order and stops pulling while nobody reads', async () => {
    const { fake, client } = await connect();
    const stream = await client.spawn('sb', { cmd: 'yes', env: { CHUNKS: '1000' } });
    assert.equal(stream.osPid, stream.pid + 1000);
    await tick(20);
    const proc = fake.procs.get(stream.pid) as FakeProcess;
    assert.ok(proc.pulled <= STREAM_WINDOW_EVENTS + 1, `pulled ${proc.pulled} with nobody reading`);
    let i = 0;
    for await (const ev of stream) {
      assert.ok(ev.kind === 'data');
      assert.equal(text(ev.data), `line ${i}\n`);
      i++;
    }
    assert.equal(i, 1000);
    assert.deepEqual(await stream.exited, proc.exit);
    client.close();
  });

  test('stdin, close and kill reach the process; kill after the exit is a no-op', async () => {
    const { fake, client } = await connect();
    const stream = await client.spawn('sb', { cmd: 'cat', env: { CHUNKS: '100' } });
    const proc = fake.procs.get(stream.pid) as FakeProcess;
    await stream.write('abc');
    await stream.write(new Uint8Array([1, 2, 3]), false);
    await stream.closeStdin();
    await assert.rejects(stream.write('late'), (e: unknown) => isDsecError(e, 'CONFLICT'));
    assert.deepEqual(plain(proc.stdin), ['abc', new Uint8Array([1, 2, 3])]);
    await stream.kill('SIGTERM');
    assert.equal(proc.killedWith, 'SIGTERM');
    assert.equal((await stream.exited).signal, 'SIGTERM');
    let n = 0;
    for await (const _ of stream) n++;
    assert.equal(n, 100, 'the output produced before the kill still arrives');
    await stream.kill();
    client.close();
  });

  test('detach stops the stream and leaves the process running; attach picks it up again', async () => {
    const { fake, client } = await connect();
    const stream = await client.spawn('sb', { cmd: 'yes', env: { CHUNKS: '1000' } });
    const proc = fake.procs.get(stream.pid) as FakeProcess;
    let detachedCalls = 0;
    stream.onDetach(() => detachedCalls++);
    const it = stream[Symbol.asyncIterator]();
    const first = await it.next();
    assert.ok(!first.done && first.value.kind === 'data' && first.value.offset === 0);
    await stream.detach();
    let rest = 0;
    while (!(await it.next()).done) rest++;
    assert.ok(rest <= STREAM_WINDOW_EVENTS, `what the edge held when it was detached (${rest}), then the end`);
    assert.equal(proc.detached, 1);
    assert.equal(proc.killedWith, undefined);
    assert.equal(proc.exit, undefined, 'the process still runs');
    await assert.rejects(stream.exited, (e: unknown) => isDsecError(e, 'CANCELLED'));
    assert.equal(detachedCalls, 1);
    const again = await client.attach('sb', stream.pid, { stdout: 999 });
    const events: OutputEvent[] = [];
    for await (const ev of again) events.push(ev);
    assert.equal(events.length, 1);
    const offset999 = [...Array(999).keys()].reduce((n, i) => n + FakeProcess.chunk(i).byteLength, 0);
    assert.equal(events[0]?.offset, offset999, 'from the offset asked for');
    client.close();
  });

  test('breaking out of the loop detaches', async () => {
    const { fake, client } = await connect();
    const stream = await client.spawn('sb', { cmd: 'yes', env: { CHUNKS: '1000' } });
    for await (const _ of stream) break;
    await tick();
    const proc = fake.procs.get(stream.pid) as FakeProcess;
    assert.equal(proc.detached, 1);
    assert.equal(proc.exit, undefined);
    client.close();
  });

  test('an aborted signal cancels the call on the edge, and the caller sees its own reason', async () => {
    const { fake, client } = await connect();
    const ac = new AbortController();
    const p = client.create({ image: { base: 'busybox' }, labels: { hold: '1' } }, { signal: ac.signal });
    await tick();
    const held = fake.held[0];
    assert.ok(held?.signal, 'the edge got a signal');
    const reason = new Error('caller went away');
    ac.abort(reason);
    await assert.rejects(p, (e: unknown) => e === reason);
    assert.ok(isDsecError(await held.aborted, 'CANCELLED'), 'the edge saw the cancel');
    // Already aborted: nothing is sent.
    await assert.rejects(client.exec('sb', { cmd: 'hang' }, { signal: AbortSignal.abort(reason) }), (e: unknown) => e === reason);
    assert.equal(fake.held.length, 1);
    // A call without a signal gives the edge none.
    const q = client.calls.run({ runtime: 'sh', code: 'hang' });
    await tick();
    assert.equal(fake.held[1]?.signal, undefined);
    client.close();
    await assert.rejects(q, (e: unknown) => isDsecError(e, 'UNAVAILABLE'));
  });

  test('a cancelled diff, file read or pause reaches the edge as its signal, and the caller sees its own reason', async () => {
    const { fake, client } = await connect();
    const calls: Array<(signal: AbortSignal) => Promise<unknown>> = [
      (signal) => client.diff('sb', { paths: ['/hold'] }, { signal }),
      (signal) => client.readFile('sb', '/hold', { offset: 1, signal }),
      (signal) => client.pause('sb', { reason: 'hold', signal }),
    ];
    for (const [i, call] of calls.entries()) {
      const ac = new AbortController();
      const p = call(ac.signal);
      await tick();
      const held = fake.held[i];
      assert.ok(held?.signal, `call ${i}: the edge got a signal`);
      assert.equal(held.signal.aborted, false);
      const reason = new Error(`caller ${i} went away`);
      ac.abort(reason);
      await assert.rejects(p, (e: unknown) => e === reason);
      assert.ok(isDsecError(await held.aborted, 'CANCELLED'), `call ${i}: the edge saw the cancel`);
    }
    // The signal never travels as an argument: the same calls without one still work.
    fake.files.set('/f', new Uint8Array([1, 2, 3]));
    assert.deepEqual([...(await client.readFile('sb', '/f', { offset: 1, signal: new AbortController().signal }))], [2, 3]);
    assert.equal((await client.pause('sb', { reason: 'ab', signal: new AbortController().signal })).durationMs, 2);
    assert.equal((await client.diff('sb', { paths: ['/x'] }, { signal: new AbortController().signal })).entries[0]?.path, '/x');
    client.close();
  });

  test('a lost connection rejects pending calls, ends streams with an error and detaches them on the edge', async () => {
    const { fake, client, clientEnd } = await connect();
    const pending = client.exec('sb', { cmd: 'hang' }, { signal: new AbortController().signal });
    const stream = await client.spawn('sb', { cmd: 'yes', env: { CHUNKS: '1000' } });
    const proc = fake.procs.get(stream.pid) as FakeProcess;
    let ended = false;
    stream.onDetach(() => (ended = true));
    const it = stream[Symbol.asyncIterator]();
    await it.next();
    await tick();
    clientEnd.close(new Error('network unreachable'));
    await assert.rejects(pending, (e: unknown) => isDsecError(e, 'UNAVAILABLE') && /network unreachable/.test(e.message));
    await assert.rejects(
      (async () => {
        for (;;) if ((await it.next()).done) return;
      })(),
      (e: unknown) => isDsecError(e, 'UNAVAILABLE'),
    );
    await assert.rejects(stream.exited, (e: unknown) => isDsecError(e, 'UNAVAILABLE'));
    assert.ok(ended);
    await tick();
    assert.ok(isDsecError(await fake.held[0]?.aborted, 'UNAVAILABLE'), 'the edge aborted the call');
    assert.equal(proc.detached, 1, 'the edge detached the stream');
    assert.equal(proc.killedWith, undefined);
    await assert.rejects(client.list(), (e: unknown) => isDsecError(e, 'UNAVAILABLE'));
  });

  test('events reach the subscriber until it unsubscribes', async () => {
    const { fake, client } = await connect();
    const got: RaisedEvent[] = [];
    const unsubscribe = client.onEvent((ev) => got.push(ev));
    await tick();
    assert.equal(fake.sinks.size, 1);
    fake.raise({ kind: 'oom.kill', severity: 'warning', sandboxId: 'sb', message: 'killed', data: { pid: 3 } });
    await tick();
    assert.deepEqual(got, [{ kind: 'oom.kill', severity: 'warning', sandboxId: 'sb', message: 'killed', data: { pid: 3 } }]);
    unsubscribe();
    await tick();
    assert.equal(fake.sinks.size, 0);
    fake.raise({ kind: 'oom.kill', severity: 'warning', message: 'again' });
    await tick();
    assert.equal(got.length, 1);
    client.close();
  });

  test('an upload crosses in order with back-pressure; progress lines arrive; a failing body fails the build', async () => {
    const { fake, client } = await connect();
    const chunks = [new Uint8Array(1_048_576).fill(7), ...Array.from({ length: 40 }, (_, i) => new Uint8Array(65_536).fill(i))];
    let pulled = 0;
    let maxAhead = 0;
    async function* body(): AsyncGenerator<Uint8Array> {
      for (const c of chunks) {
        pulled++;
        yield c;
        maxAhead = Math.max(maxAhead, pulled - fake.uploaded.length);
      }
    }
    const sha = (parts: Uint8Array[]): string => parts.reduce((h, p) => h.update(p), createHash('sha256')).digest('hex');
    const info = await client.layers.build({ type: 'tar', stream: body() }, { kind: 'workspace', name: 'ws' });
    assert.equal(info.contentBytes, 1_048_576 + 40 * 65_536);
    assert.equal(sha(fake.uploaded), sha(chunks));
    assert.ok(maxAhead <= UPLOAD_WINDOW_CHUNKS + 1, `the body ran ${maxAhead} chunks ahead of the edge`);

    const lines: string[] = [];
    await client.layers.build({ type: 'debian', packages: ['curl', 'git'] }, { kind: 'toolkit', onProgress: (l) => lines.push(l) });
    assert.deepEqual(lines, ['unpacking curl', 'unpacking git']);

    async function* tooLarge(): AsyncGenerator<Uint8Array> {
      yield new Uint8Array(10);
      throw new DsecError('PAYLOAD_TOO_LARGE', 'body over 1 GiB');
    }
    await assert.rejects(
      client.layers.build({ type: 'oci-archive', stream: tooLarge() }, { kind: 'base' }),
      (e: unknown) => isDsecError(e, 'PAYLOAD_TOO_LARGE') && e.message === 'body over 1 GiB',
    );
    client.close();
  });

  test('only text crosses: loopbackEdge works on its own', async () => {
    const fake = new FakeEdge();
    const edge = await loopbackEdge(fake, { heartbeatMs: 0 });
    assert.equal(edge.nodeName, 'fake-node');
    const r = await edge.exec('sb', { cmd: 'x', stdin: new Uint8Array([9]) });
    assert.equal(r.stdout, 'x|bytes:9');
    edge.close();
  });

  test('edgeThroughWire: off is the edge itself, loopback a wire client that closes', async () => {
    const fake = new FakeEdge();
    const off = await edgeThroughWire(fake, 'off');
    assert.equal(off.client, fake);
    const on = await edgeThroughWire(fake, 'loopback', { heartbeatMs: 0 });
    assert.ok(on.client instanceof WireEdgeClient);
    assert.equal((await on.client.stats('abc')).cpuUsageMs, 3);
    on.close();
    await assert.rejects(on.client.stats('abc'), (e: unknown) => isDsecError(e, 'UNAVAILABLE'));
  });

  test('frames are JSON text; bytes travel beside it as parts', async () => {
    const { client, frames } = await connect();
    await client.writeFile('sb', '/x', new Uint8Array([1, 2]));
    assert.ok(frames.length >= 3);
    for (const [f] of frames) assert.equal(typeof JSON.parse(f), 'object');
    const call = frames.find(([f]) => f.includes('"writeFile"'));
    assert.ok(call?.[0].includes('{"$p":0}'), call?.[0]);
    assert.deepEqual([...(call?.[1][0] ?? [])], [1, 2]);
    client.close();
  });
});
