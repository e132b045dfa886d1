import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ExecFrameDecoder, MAX_EXEC_FRAME_BYTES, encodeExecFrame, readExecFrames } from './exec-frames.js';
import type { ExecStreamEvent } from './exec-frames.js';

const events: ExecStreamEvent[] = [
  { type: 'start', pid: 3, osPid: 41 },
  { type: 'output', stream: 'stdout', offset: 0, data: new Uint8Array([0, 1, 2, 255, 10]) },
  { type: 'output', stream: 'stderr', offset: 2 ** 40 + 7, data: new TextEncoder().encode('é€\n') },
  { type: 'output', stream: 'stdout', offset: 5, data: new Uint8Array(0) },
  { type: 'gap', stream: 'stdout', offset: 5, bytes: 1024 },
  {
    type: 'exit',
    pid: 3,
    exitCode: 0,
    signal: null,
    timedOut: false,
    oomKilled: false,
    durationMs: 1,
    cpuUserMs: 0,
    cpuSysMs: 0,
    peakMemoryKiB: 0,
    stdoutBytes: 5,
    stderrBytes: 6,
  },
  { type: 'error', error: { code: 'UNAVAILABLE', message: 'gone' } },
];

function bytesOf(evs: ExecStreamEvent[]): Uint8Array {
  return Buffer.concat(evs.flatMap((e) => encodeExecFrame(e)));
}

/**
 * Events with their output copied into plain arrays, for deepEqual; output events that continue
 * the one before them (same stream, next offset: a frame handed on in pieces) joined into it.
 */
function plain(evs: ExecStreamEvent[]): unknown[] {
  const out: Array<Exclude<ExecStreamEvent, { type: 'output' }> | { type: 'output'; stream: string; offset: number; data: number[] }> = [];
  for (const e of evs) {
    const last = out[out.length - 1];
    if (e.type !== 'output') out.push(e);
    else if (last?.type === 'output' && last.stream === e.stream && last.offset + last.data.length === e.offset && e.data.length > 0 && last.data.length > 0)
      last.data.push(...e.data);
    else out.push({ ...e, data: Array.from(e.data) });
  }
  return out;
}

test('events come back the same from a stream cut at every byte', () => {
  const all = bytesOf(events);
  for (let cut = 0; cut <= all.length; cut++) {
    const d = new ExecFrameDecoder();
    const got = [...d.push(all.subarray(0, cut)), ...d.push(all.subarray(cut))];
    d.end();
    assert.deepEqual(plain(got), plain(events), `cut at ${cut}`);
  }
  // One byte at a time.
  const d = new ExecFrameDecoder();
  const got: ExecStreamEvent[] = [];
  for (const b of all) got.push(...d.push(new Uint8Array([b])));
  d.end();
  assert.deepEqual(plain(got), plain(events));
});

test('an output frame cut across reads comes out in pieces, never joined: views of the reads, at their offsets', () => {
  const data = new Uint8Array(10_000).map((_, i) => i % 251);
  const bytes = Buffer.concat(encodeExecFrame({ type: 'output', stream: 'stderr', offset: 100, data }));
  const reads = [bytes.subarray(0, 20), bytes.subarray(20, 6000), bytes.subarray(6000)];
  const d = new ExecFrameDecoder();
  const got = reads.flatMap((r) => d.push(r));
  d.end();
  assert.deepEqual(
    got.map((e) => (e.type === 'output' ? [e.stream, e.offset, e.data.byteLength] : e.type)),
    [
      ['stderr', 100, 7],
      ['stderr', 107, 5980],
      ['stderr', 6087, 4013],
    ],
  );
  const second = got[1];
  assert.ok(second?.type === 'output' && second.data.buffer === reads[1]!.buffer, 'a view of the read, not a copy');
  assert.deepEqual(Buffer.concat(got.map((e) => (e.type === 'output' ? e.data : new Uint8Array(0)))), Buffer.from(data));
});

test('output bytes are sent as they are: a frame is 13 bytes of header plus the data', () => {
  const data = new Uint8Array(1000).fill(7);
  const pieces = encodeExecFrame({ type: 'output', stream: 'stdout', offset: 0, data });
  assert.equal(
    pieces.reduce((n, p) => n + p.byteLength, 0),
    1013,
  );
  assert.equal(pieces[1], data, 'the data is not copied');
});

test('malformed streams are refused', async () => {
  assert.throws(() => new ExecFrameDecoder().push(new Uint8Array([9, 0, 0, 0, 0])), /unknown frame kind 9/);
  const big = new Uint8Array(5);
  new DataView(big.buffer).setUint32(1, MAX_EXEC_FRAME_BYTES + 1);
  assert.throws(() => new ExecFrameDecoder().push(big), /a frame of/);
  assert.throws(() => new ExecFrameDecoder().push(new Uint8Array([1, 0, 0, 0, 3, 0, 0, 0])), /without its offset/);
  const cut = bytesOf(events.slice(0, 2));
  const d = new ExecFrameDecoder();
  d.push(cut.subarray(0, cut.length - 1));
  assert.throws(() => d.end(), /ended inside a frame/);
  async function* chunks() {
    yield cut.subarray(0, 3);
    yield cut.subarray(3, cut.length - 2);
  }
  const seen: string[] = [];
  await assert.rejects(async () => {
    for await (const ev of readExecFrames(chunks())) seen.push(ev.type);
  }, /ended inside a frame/);
  // The output that did arrive was handed on (3 of its 5 bytes) before the end was found short.
  assert.deepEqual(seen, ['start', 'output']);
});
