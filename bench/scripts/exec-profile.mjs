// CPU profile of execs of `true` through the SDK (client, apiserver and edge in this process),
// and its self time summed per function and per package.
// Root, under the e2e lock: flock /tmp/dsec-e2e.lock node bench/scripts/exec-profile.mjs <checkout> <n> <out.cpuprofile>
import path from 'node:path';
import { writeFile } from 'node:fs/promises';
import { Session } from 'node:inspector/promises';
const [checkout, nArg, out] = process.argv.slice(2);
const d = (p) => path.join(checkout, p);
const { startBenchPlatform, benchTempDir } = await import(d('bench/dist/lib/platform.js'));
const { cleanupAll } = await import(d('bench/dist/lib/cleanup.js'));
const { Sandbox } = await import(d('packages/sdk/dist/index.js'));
try {
  const dir = await benchTempDir();
  const bench = await startBenchPlatform(path.join(dir, 'home'));
  const client = await bench.newClient();
  const sb = await Sandbox.create({ image: { base: 'busybox' } }, { client });
  for (let i = 0; i < 50; i++) await sb.exec(['true']);
  const session = new Session();
  session.connect();
  await session.post('Profiler.enable');
  await session.post('Profiler.setSamplingInterval', { interval: 100 });
  await session.post('Profiler.start');
  const n = Number(nArg ?? 1000);
  const c0 = process.cpuUsage();
  for (let i = 0; i < n; i++) await sb.exec(['true']);
  const c = process.cpuUsage(c0);
  const { profile } = await session.post('Profiler.stop');
  if (out) await writeFile(out, JSON.stringify(profile));
  console.log(`CPU us/exec ${((c.user + c.system) / n).toFixed(0)} (user ${(c.user / n).toFixed(0)} sys ${(c.system / n).toFixed(0)})`);
  const self = new Map();
  const byFile = new Map();
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
    const pk = file.startsWith('nm:')
      ? file
          .split('/')
          .slice(0, file.startsWith('nm:@') ? 2 : 1)
          .join('/')
      : file.split('/').slice(0, 4).join('/') || f.functionName;
    byFile.set(pk, (byFile.get(pk) ?? 0) + t);
  }
  const top = (m, k) =>
    [...m]
      .sort((a, b) => b[1] - a[1])
      .slice(0, k)
      .map(([name, t]) => `${((100 * t) / total).toFixed(1).padStart(5)}% ${(t / n).toFixed(0).padStart(5)}us ${name}`)
      .join('\n');
  console.log('BY PACKAGE\n' + top(byFile, 25));
  console.log('BY FUNCTION\n' + top(self, 45));
  await sb.kill();
} finally {
  await cleanupAll();
}
process.exit(0);
