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

/** Events with their output copied into plain Uint8Arrays, for deepEqual. */
function plain(evs: ExecStreamEvent[]): unknown[] {
  return evs.map((e) => (e.type === 'output' ? { ...e, data: Array.from(e.data) } : e));
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
  assert.deepEqual(seen, ['start']);
});
