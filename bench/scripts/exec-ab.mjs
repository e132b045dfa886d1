// A/B of exec through the SDK against the in-process edge, and of streamed stdout against
// `crun exec`'s pipe, for one checkout's builds (run it for two checkouts in turn, alternating).
// Root, under the e2e lock: flock /tmp/dsec-e2e.lock node bench/scripts/exec-ab.mjs <checkout> exec 400
//                       flock /tmp/dsec-e2e.lock node bench/scripts/exec-ab.mjs <checkout> stream 512
// (stream also prints the CPU this process spent per MiB streamed through the SDK.)
import path from 'node:path';
import { cp } from 'node:fs/promises';
import { performance } from 'node:perf_hooks';
const [checkout, mode, nArg] = process.argv.slice(2);
const d = (p) => path.join(checkout, p);
const { startBenchPlatform, benchTempDir } = await import(d('bench/dist/lib/platform.js'));
const { cleanupAll } = await import(d('bench/dist/lib/cleanup.js'));
const { Peers } = await import(d('bench/dist/lib/peers.js'));
const { Sandbox } = await import(d('packages/sdk/dist/index.js'));
const q = (a, p) => {
  const s = [...a].sort((x, y) => x - y);
  return s[Math.floor(p * (s.length - 1))];
};
try {
  const dir = await benchTempDir();
  const bench = await startBenchPlatform(path.join(dir, 'home'));
  const client = await bench.newClient();
  const sb = await Sandbox.create({ image: { base: 'busybox' } }, { client });
  const edge = bench.platform.edge;
  if (mode === 'exec') {
    const n = Number(nArg ?? 300);
    const sdk = [],
      ed = [];
    for (let i = 0; i < 30; i++) {
      await sb.exec(['true']);
      await edge.exec(sb.id, { argv: ['true'] });
    }
    for (let i = 0; i < n; i++) {
      let t = performance.now();
      await sb.exec(['true']);
      sdk.push(performance.now() - t);
      t = performance.now();
      await edge.exec(sb.id, { argv: ['true'] });
      ed.push(performance.now() - t);
    }
    // CPU per exec, in blocks (client and server are in this process).
    const cpu = { sdk: 0, edge: 0 };
    for (let r = 0; r < 3; r++) {
      let c = process.cpuUsage();
      for (let i = 0; i < 200; i++) await sb.exec(['true']);
      c = process.cpuUsage(c);
      cpu.sdk += c.user + c.system;
      c = process.cpuUsage();
      for (let i = 0; i < 200; i++) await edge.exec(sb.id, { argv: ['true'] });
      c = process.cpuUsage(c);
      cpu.edge += c.user + c.system;
    }
    console.log(
      `CPU ${checkout} us/exec sdk ${(cpu.sdk / 600).toFixed(0)} edge ${(cpu.edge / 600).toFixed(0)} diff ${((cpu.sdk - cpu.edge) / 600).toFixed(0)}`,
    );
    const f = (a) => `p10 ${q(a, 0.1).toFixed(3)} p50 ${q(a, 0.5).toFixed(3)} p90 ${q(a, 0.9).toFixed(3)}`;
    console.log(`RESULT ${checkout} exec sdk ${f(sdk)} | edge ${f(ed)} | diff p50 ${(q(sdk, 0.5) - q(ed, 0.5)).toFixed(3)}`);
  } else {
    const size = Number(nArg ?? 1024) * 2 ** 20;
    const argv = ['head', '-c', String(size), '/dev/zero'];
    const busybox = await edge.layers.resolve('busybox');
    const rootfs = path.join(dir, 'rootfs');
    const mounted = await edge.layers.acquire(busybox.digest);
    try {
      await cp(mounted, rootfs, { recursive: true, verbatimSymlinks: true });
    } finally {
      await edge.layers.release(busybox.digest);
    }
    const peers = await Peers.open(path.join(dir, 'peers'), rootfs);
    const crunId = await peers.crunStartIdle();
    const res = { dsec: [], crun: [] };
    // CPU of this process (client, apiserver and edge; not the agent) per MiB streamed through the SDK.
    let cpuUs = 0;
    for (let r = 0; r < 3; r++) {
      let t = performance.now();
      let bytes = 0;
      const c = process.cpuUsage();
      const h = await sb.spawn(argv);
      for await (const ev of h) if (ev.stream === 'stdout') bytes += ev.data.length;
      await h.wait();
      const used = process.cpuUsage(c);
      cpuUs += used.user + used.system;
      if (bytes !== size) throw new Error('dsec bytes ' + bytes);
      res.dsec.push(size / 1e3 / (performance.now() - t));
      t = performance.now();
      bytes = 0;
      await peers.crunExec(crunId, argv, { onStdout: (x) => (bytes += x.length) });
      if (bytes !== size) throw new Error('crun bytes ' + bytes);
      res.crun.push(size / 1e3 / (performance.now() - t));
    }
    console.log(
      `RESULT ${checkout} stream MB/s dsec ${res.dsec.map((x) => x.toFixed(0)).join(',')} crun ${res.crun.map((x) => x.toFixed(0)).join(',')} ratio ${(q(res.dsec, 0.5) / q(res.crun, 0.5)).toFixed(2)} | CPU us/MiB dsec ${(cpuUs / (3 * (size / 2 ** 20))).toFixed(0)}`,
    );
    await peers.crunDelete(crunId);
  }
  await sb.kill();
} finally {
  await cleanupAll();
}
process.exit(0);
