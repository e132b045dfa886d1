// The desktop screen helpers on screenshots made here: pixel counts in a rectangle (clipped to
// the screen), differences inside and outside one, and polling with a deadline.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { deflateSync } from 'node:zlib';
import { countPixels, diffPixels, isBlack, isWhite, pollUntil } from './desktop.js';

/** An 8-bit RGB PNG of `w` x `h` whose pixel (x, y) is `at(x, y)` (CRCs left zero: the decoder does not read them). */
function png(w: number, h: number, at: (x: number, y: number) => [number, number, number]): Buffer {
  const chunk = (type: string, data: Buffer): Buffer => {
    const len = Buffer.alloc(4);
    len.writeUInt32BE(data.length);
    return Buffer.concat([len, Buffer.from(type, 'latin1'), data, Buffer.alloc(4)]);
  };
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(w, 0);
  ihdr.writeUInt32BE(h, 4);
  ihdr[8] = 8;
  ihdr[9] = 2;
  const raw = Buffer.alloc(h * (1 + w * 3));
  for (let y = 0; y < h; y++) for (let x = 0; x < w; x++) raw.set(at(x, y), y * (1 + w * 3) + 1 + x * 3);
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk('IHDR', ihdr),
    chunk('IDAT', deflateSync(raw)),
    chunk('IEND', Buffer.alloc(0)),
  ]);
}

describe('desktop screen helpers', () => {
  const white = png(8, 6, () => [255, 255, 255]);
  // Black at x 2..3, y 1..2 (4 pixels), white elsewhere.
  const dotted = png(8, 6, (x, y) => (x >= 2 && x < 4 && y >= 1 && y < 3 ? [0, 0, 0] : [255, 255, 255]));

  test('pixels counted inside a rectangle, clipped to the screen', () => {
    assert.equal(countPixels(dotted, { x: 0, y: 0, w: 8, h: 6 }, isBlack), 4);
    assert.equal(countPixels(dotted, { x: 3, y: 0, w: 100, h: 100 }, isBlack), 2);
    // Clipped to x 0..2, y 0..1: six pixels, one of them black.
    assert.equal(countPixels(dotted, { x: -5, y: -5, w: 8, h: 7 }, isWhite), 5);
  });

  test('differences inside and outside a rectangle', () => {
    assert.deepEqual(diffPixels(white, dotted, { x: 0, y: 0, w: 3, h: 6 }), { inside: 2, outside: 2 });
    assert.deepEqual(diffPixels(white, dotted), { inside: 0, outside: 4 });
    assert.deepEqual(diffPixels(dotted, dotted), { inside: 0, outside: 0 });
    assert.throws(
      () =>
        diffPixels(
          white,
          png(4, 4, () => [0, 0, 0]),
        ),
      /different sizes/,
    );
  });

  test('polling ends with the first value, or names what did not happen and the last error', async () => {
    let n = 0;
    assert.equal(await pollUntil('three', 5000, async () => (++n === 3 ? n : undefined), 1), 3);
    await assert.rejects(
      pollUntil(
        'never',
        20,
        async () => {
          throw new Error('nope');
        },
        5,
      ),
      /never: not within 20 ms \(last error: nope\)/,
    );
  });
});
