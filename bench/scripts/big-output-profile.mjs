// Seconds per command that prints 15 MiB, recorded in its trajectory: run to its end through the
// SDK and the API (apiserver and edge in this process), streamed through the API (binary frames),
// and the same command on the edge alone (no API, no recording); a 1 MiB file write; then a CPU
// profile of the buffered execs with self time summed per function. TEXT=1 prints 'a's instead of
// random bytes (which are not UTF-8: each becomes U+FFFD in the JSON result).
// Root, under the e2e lock:
//   flock /tmp/dsec-e2e.lock node bench/scripts/big-output-profile.mjs <checkout> [n] [out.cpuprofile]
import { Buffer } from 'node:buffer';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { writeFile } from 'node:fs/promises';
import { Session } from 'node:inspector/promises';
const [checkout, nArg, out] = process.argv.slice(2);
const d = (p) => path.join(checkout, p);
const { startBenchPlatform, benchTempDir } = await import(d('bench/dist/lib/platform.js'));
const { cleanupAll } = await import(d('bench/dist/lib/cleanup.js'));
const { Sandbox } = await import(d('packages/sdk/dist/index.js'));
const MIB15 = 15 * 1024 * 1024;
const n = Number(nArg ?? 5);
/** Random bytes (not UTF-8: each invalid byte becomes U+FFFD in the JSON result), or text. */
const CMD = process.env.TEXT === '1' ? `head -c ${MIB15} /dev/zero | tr '\\0' a` : `head -c ${MIB15} /dev/urandom`;
try {
  const dir = await benchTempDir();
  const bench = await startBenchPlatform(path.join(dir, 'home'));
  const client = await bench.newClient();
  const sb = await Sandbox.create({ image: { base: 'busybox' }, resources: { cpu: 1, memoryMiB: 256, diskMiB: 64 } }, { client });
  const edge = bench.platform.edge;
  const seconds = async (label, run) => {
    const times = [];
    for (let i = 0; i < n; i++) {
      const t0 = performance.now();
      await run();
      times.push((performance.now() - t0) / 1000);
    }
    times.sort((a, b) => a - b);
    console.log(`${label.padEnd(34)} median ${times[n >> 1].toFixed(3)} s  (${times.map((t) => t.toFixed(2)).join(' ')})`);
  };
  const viaApi = async () => {
    const r = await sb.exec(['sh', '-c', CMD]);
    if (r.exitCode !== 0) throw new Error(`exit ${r.exitCode}`);
  };
  await viaApi();
  await seconds('edge exec, 15 MiB (no API)', async () => {
    const r = await edge.exec(sb.id, { argv: ['sh', '-c', CMD] }, { maxOutputBytes: 16 * 1024 * 1024 });
    if (r.exitCode !== 0) throw new Error(`exit ${r.exitCode}`);
  });
  await seconds('API exec, 15 MiB, recorded', viaApi);
  await seconds('API stream (frames), 15 MiB, rec.', async () => {
    const h = await sb.spawn(['sh', '-c', CMD]);
    for await (const ev of h) void ev;
    if ((await h.wait()).exitCode !== 0) throw new Error('exit');
  });
  await seconds('API exec, nothing printed', () => sb.exec(['true']));
  const mib = Buffer.alloc(1024 * 1024, 7);
  await seconds('API file write, 1 MiB, recorded', () => sb.files.write('/tmp/mib', mib));
  const session = new Session();
  session.connect();
  await session.post('Profiler.enable');
  await session.post('Profiler.setSamplingInterval', { interval: 200 });
  await session.post('Profiler.start');
  const c0 = process.cpuUsage();
  for (let i = 0; i < n; i++) await viaApi();
  const c = process.cpuUsage(c0);
  const { profile } = await session.post('Profiler.stop');
  if (out) await writeFile(out, JSON.stringify(profile));
  console.log(`CPU ms/exec ${((c.user + c.system) / n / 1000).toFixed(0)} (user ${(c.user / n / 1000).toFixed(0)} sys ${(c.system / n / 1000).toFixed(0)})`);
  const self = new Map();
  const dt = new Map();
  for (let i = 0; i < profile.samples.length; i++) dt.set(profile.samples[i], (dt.get(profile.samples[i]) ?? 0) + (profile.timeDeltas[i] ?? 0));
  let total = 0;
  for (const node of profile.nodes) {
    const t = dt.get(node.id) ?? 0;
    if (node.callFrame.functionName === '(idle)') continue;
    total += t;
    const f = node.callFrame;
    const file = f.url
      .replace(/^file:\/\//, '')
      .replace(checkout, '')
      .replace(/.*node_modules\//, 'nm:');
    const k = `${f.functionName || '(anon)'} ${file}:${f.lineNumber + 1}`;
    self.set(k, (self.get(k) ?? 0) + t);
  }
  console.log('BY FUNCTION (self time, % of busy, ms per exec)');
  for (const [name, t] of [...self].sort((a, b) => b[1] - a[1]).slice(0, 30))
    console.log(`${((100 * t) / total).toFixed(1).padStart(5)}% ${(t / n / 1000).toFixed(0).padStart(6)}ms ${name}`);
  await sb.kill();
} finally {
  await cleanupAll();
}
process.exit(0);
