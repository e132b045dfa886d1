// The pixels of a screenshot, for tests and benchmarks that look at a VM's screen: QEMU's
// `screendump` writes 8-bit RGB, non-interlaced PNGs, the only kind decoded here.
import { inflateSync } from 'node:zlib';
import { pngSize } from '../backends/qemu/screen.js';

/** Width, height and the RGB bytes (3 per pixel, row after row) of an 8-bit RGB, non-interlaced PNG. */
export function decodePng(png: Uint8Array): { width: number; height: number; rgb: Buffer } {
  const b = Buffer.from(png.buffer, png.byteOffset, png.byteLength);
  const { width, height } = pngSize(b);
  if (b[24] !== 8 || b[25] !== 2 || b[28] !== 0) throw new Error(`not an 8-bit RGB non-interlaced PNG (depth ${b[24]}, colour type ${b[25]})`);
  const idat: Buffer[] = [];
  for (let at = 8; at + 8 <= b.length;) {
    const len = b.readUInt32BE(at);
    if (b.toString('latin1', at + 4, at + 8) === 'IDAT') idat.push(b.subarray(at + 8, at + 8 + len));
    at += 12 + len;
  }
  const raw = inflateSync(Buffer.concat(idat));
  const stride = width * 3;
  const rgb = Buffer.alloc(stride * height);
  let prev = Buffer.alloc(stride);
  for (let y = 0; y < height; y++) {
    const filter = raw[y * (stride + 1)]!;
    const line = Buffer.from(raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1)));
    for (let x = 0; x < stride; x++) {
      const a = x >= 3 ? line[x - 3]! : 0;
      const up = prev[x]!;
      const c = x >= 3 ? prev[x - 3]! : 0;
      line[x] = (line[x]! + predict(filter, a, up, c)) & 0xff;
    }
    line.copy(rgb, y * stride);
    prev = line;
  }
  return { width, height, rgb };
}

/** The PNG filter's prediction of a byte from its left (`a`), upper (`up`) and upper-left (`c`) neighbours. */
function predict(filter: number, a: number, up: number, c: number): number {
  switch (filter) {
    case 1:
      return a;
    case 2:
      return up;
    case 3:
      return (a + up) >> 1;
    case 4: {
      const p = a + up - c;
      const pa = Math.abs(p - a);
      const pb = Math.abs(p - up);
      const pc = Math.abs(p - c);
      return pa <= pb && pa <= pc ? a : pb <= pc ? up : c;
    }
    default:
      return 0;
  }
}
