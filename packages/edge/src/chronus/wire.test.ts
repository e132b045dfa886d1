import assert from 'node:assert/strict';
import { test } from 'node:test';
import { F, FrameReader, T, encodeFrame } from './wire.js';

const frames = [
  encodeFrame(T.OUTPUT, 7, [
    [F.OFFSET, 0],
    [F.DATA, Buffer.alloc(70_000, 1)],
  ]),
  encodeFrame(T.OUTPUT, 7, [
    [F.OFFSET, 70_000],
    [F.DATA, Buffer.from('tail')],
  ]),
  encodeFrame(T.EXIT, 7, [[F.EXIT_CODE, 3]]),
];
const stream = Buffer.concat(frames);

function read(cuts: number[]): Array<{ type: number; id: number; data?: Buffer; offset?: number | undefined; code?: number | undefined }> {
  const reader = new FrameReader();
  const out: Array<{ type: number; id: number; data?: Buffer; offset?: number | undefined; code?: number | undefined }> = [];
  let at = 0;
  for (const cut of [...cuts, stream.length]) {
    for (const f of reader.push(stream.subarray(at, cut))) {
      const data = f.fields.bytes(F.DATA);
      out.push({ type: f.type, id: f.id, ...(data ? { data: Buffer.from(data), offset: f.fields.num(F.OFFSET) } : { code: f.fields.num(F.EXIT_CODE) }) });
    }
    at = cut;
  }
  return out;
}

test('frames come back the same from a stream cut anywhere (in headers, in data, many cuts per frame)', () => {
  const whole = read([]);
  assert.equal(whole.length, 3);
  assert.equal(whole[0]!.data!.length, 70_000);
  assert.equal(whole[1]!.data!.toString(), 'tail');
  assert.equal(whole[2]!.code, 3);
  const first = frames[0]!.length;
  const cutSets = [
    [1, 5, 11],
    [first - 1, first + 3, first + 13],
    [65_536, first + 6],
    [100, 200, 65_536, 65_540, first, first + 1],
    Array.from({ length: 200 }, (_, i) => i * 353 + 1),
  ];
  for (const cuts of cutSets) assert.deepEqual(read(cuts.filter((c) => c < stream.length)), whole, `cuts ${cuts.slice(0, 6).join(',')}`);
});
