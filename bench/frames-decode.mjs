// JavaScript time to decode 1 GiB of 64 KiB exec output frames read in 64 KiB pieces (the SDK's
// ExecFrameDecoder), best of 5, for one checkout's builds: node bench/frames-decode.mjs <checkout>
import { Buffer } from 'node:buffer';
import { performance } from 'node:perf_hooks';
const { encodeExecFrame, ExecFrameDecoder } = await import(`${process.argv[2]}/packages/protocol/dist/index.js`);
const data = new Uint8Array(65536).fill(7);
const frames = [];
for (let i = 0; i < 64; i++) frames.push(...encodeExecFrame({ type: 'output', stream: 'stdout', offset: i * 65536, data }));
const all = Buffer.concat(frames);
const chunks = [];
for (let i = 0; i < all.length; i += 65536) chunks.push(all.subarray(i, i + 65536));
let best = Infinity;
for (let r = 0; r < 5; r++) {
  const t = performance.now();
  let bytes = 0;
  for (let k = 0; k < 256; k++) {
    const d = new ExecFrameDecoder();
    for (const c of chunks) for (const ev of d.push(c)) bytes += ev.data.length;
  }
  if (bytes !== 2 ** 30) throw new Error(`decoded ${bytes} bytes`);
  best = Math.min(best, performance.now() - t);
}
console.log(process.argv[2], `decode 1 GiB in 64 KiB socket reads: ${best.toFixed(0)} ms`);
