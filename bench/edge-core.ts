// Edge-level measurements: create to first exec, exec round trip, host memory per idle sandbox.
// Usage: node bench/dist/edge-core.js [--sandboxes N] [--iterations N]
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { Edge, mountsUnder, umount, MNT } from '@dsec/edge';

const { values } = parseArgs({ options: { sandboxes: { type: 'string', default: '200' }, iterations: { type: 'string', default: '200' } } });
const N = Number(values.sandboxes);
const ITER = Number(values.iterations);
const agentBinary = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../chronus/build/chronus');

function pct(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? NaN;
}
const fmt = (xs: number[]): string => `p50 ${pct(xs, 50).toFixed(2)} ms  p90 ${pct(xs, 90).toFixed(2)} ms  p99 ${pct(xs, 99).toFixed(2)} ms`;
const now = (): number => Number(process.hrtime.bigint()) / 1e6;

async function memAvailableKiB(): Promise<number> {
  const m = /MemAvailable:\s+(\d+)/.exec(await readFile('/proc/meminfo', 'utf8'));
  return Number(m?.[1] ?? 0);
}

const home = await mkdtemp(path.join(os.tmpdir(), 'dsec-bench-'));
const edge = await Edge.open({ home, agentBinary, nodeName: 'bench', cgroupParent: 'dsec-bench' });
try {
  await edge.layers.build({ type: 'busybox' }, { kind: 'base', name: 'busybox' });
  // warm-up
  for (let i = 0; i < 5; i++) {
    const sb = await edge.create({ image: { base: 'busybox' } });
    await edge.exec(sb.id, { argv: ['true'] });
    await edge.destroy(sb.id);
  }
  const create: number[] = [];
  const destroy: number[] = [];
  for (let i = 0; i < Math.min(ITER, 100); i++) {
    const t0 = now();
    const sb = await edge.create({ image: { base: 'busybox' } });
    await edge.exec(sb.id, { argv: ['true'] });
    create.push(now() - t0);
    const t1 = now();
    await edge.destroy(sb.id);
    destroy.push(now() - t1);
  }
  console.log(`create to first exec (true):  ${fmt(create)}`);
  console.log(`destroy:                      ${fmt(destroy)}`);

  const sb = await edge.create({ image: { base: 'busybox' } });
  const rt: number[] = [];
  for (let i = 0; i < ITER; i++) {
    const t0 = now();
    await edge.exec(sb.id, { argv: ['true'] });
    rt.push(now() - t0);
  }
  console.log(`exec round trip (true):       ${fmt(rt)}`);
  await edge.destroy(sb.id);

  const before = await memAvailableKiB();
  const ids: string[] = [];
  for (let i = 0; i < N; i += 8) {
    const batch = await Promise.all(Array.from({ length: Math.min(8, N - i) }, () => edge.create({ image: { base: 'busybox' }, resources: { memoryMiB: 64, diskMiB: 16 } })));
    ids.push(...batch.map((s) => s.id));
  }
  await new Promise((r) => setTimeout(r, 2000));
  const after = await memAvailableKiB();
  let cgroupBytes = 0;
  for (const id of ids) cgroupBytes += (await edge.stats(id)).memoryBytes;
  console.log(`idle sandboxes:               ${N}`);
  console.log(`host memory per sandbox:      ${((before - after) / N / 1024).toFixed(2)} MiB (MemAvailable delta)`);
  console.log(`cgroup memory per sandbox:    ${(cgroupBytes / N / 1048576).toFixed(2)} MiB (memory.usage_in_bytes)`);
  const t0 = now();
  for (const id of ids) await edge.destroy(id);
  console.log(`destroy all:                  ${((now() - t0) / 1000).toFixed(1)} s`);
} finally {
  await edge.shutdown();
  for (const m of await mountsUnder(home)) umount(m, MNT.DETACH);
  await rm(home, { recursive: true, force: true });
}
