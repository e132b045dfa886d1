// Spike probe of pre-created generic sandboxes (issue 15; docs/benchmarks.md, "create path
// (eighth wave)"): REPO=<checkout, built> node bench/scripts/generic-switch-ab.mjs N. Under the
// node's e2e lock. Builds bench/scripts/generic-switch-spike.c, then, per iteration, alternating:
// `crun run` of `true` (the bench's bundle: crun's default spec, the busybox layer read-only),
// an edge create + exec `true`, and a sandbox created beforehand (untimed) switched into a fresh
// overlay of the busybox layer by the spike's helper + exec `true`. Prints the p50 of each, the
// helper's steps, what a switched sandbox sees (root, hostname, mountinfo, capabilities), then
// the p50 of three rounds of 8 at once of each path.
import { execFile as execFileCb } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { promisify } from 'node:util';

const execFile = promisify(execFileCb);
const repo = path.resolve(process.env.REPO ?? '.');
const n = Number(process.argv[2] ?? 15);
const { startNode } = await import(path.join(repo, 'test/dist/helpers/node.js'));
const tmp = mkdtempSync(path.join(os.tmpdir(), 'dsec-generic-switch-'));
const helper = path.join(tmp, 'generic-switch-spike');
await execFile('gcc', ['-D_GNU_SOURCE', '-O2', '-static', '-o', helper, path.join(repo, 'bench/scripts/generic-switch-spike.c')]);
const node = await startNode();
const p50 = (a) => (a.length ? +[...a].sort((x, y) => x - y)[a.length >> 1].toFixed(2) : null);
try {
  await node.edge.layers.build({ type: 'busybox' }, { kind: 'base', name: 'busybox' });
  // The container backend's internals (its paths, crun, options): a probe, not an API.
  const be = node.edge.backends.get('container');
  const precreate = async () => {
    const sb = await node.edge.create({ image: { base: 'busybox' } });
    const p = be.paths(sb.id);
    const record = JSON.parse(readFileSync(p.record, 'utf8'));
    const lowers = [];
    for (const l of record.layers) lowers.unshift(await node.edge.layers.acquire(l.digest));
    const init = await be.crun.initProcess(sb.id);
    const rw = `${p.rw}-switched`;
    mkdirSync(rw);
    return { sb, record, lowers, init, rw };
  };
  const sw = async (g) => {
    const ids = `${g.record.idRange.uid}:${g.record.idRange.gid}`;
    const args = [be.o.runtimeNsFile, g.rw, 'size=256m,nr_inodes=65536,mode=0700', g.lowers.join(':'), ids, String(g.init.pid), be.o.nodeMark, 'claimed'];
    return (await execFile(helper, args)).stderr;
  };
  const discard = async (g) => {
    await node.edge.destroy(g.sb.id);
    await execFile('umount', ['-l', g.rw]).catch(() => undefined);
    for (const l of g.record.layers) await node.edge.layers.release(l.digest);
  };
  const sh = async (id, cmd) => (await node.edge.exec(id, { argv: ['sh', '-c', cmd] })).stdout;

  const bundle = path.join(tmp, 'bundle');
  const crunRoot = path.join(tmp, 'crun');
  mkdirSync(bundle);
  mkdirSync(crunRoot);
  {
    const g = await precreate();
    await execFile('sh', ['-c', `cd '${bundle}' && crun spec`]);
    const config = JSON.parse(readFileSync(path.join(bundle, 'config.json'), 'utf8'));
    config.process.terminal = false;
    config.process.args = ['true'];
    config.root = { path: g.lowers.at(-1), readonly: true };
    writeFileSync(path.join(bundle, 'config.json'), JSON.stringify(config));
    console.log('before:', await sh(g.sb.id, 'grep " / / " /proc/self/mountinfo; hostname'));
    console.log(await sw(g));
    console.log(
      'after:',
      await sh(g.sb.id, 'cat /GENERIC_ROOT; hostname; ls -a /; cat /proc/self/mountinfo; grep -E "Cap|NoNewPrivs|Seccomp" /proc/self/status'),
    );
    await discard(g);
  }
  let seq = 0;
  const [prefix, ...prefixArgs] = be.o.runtimePrefix;
  const crunRun = () => execFile(prefix, [...prefixArgs, 'crun', '--root', crunRoot, 'run', '--bundle', bundle, `generic-switch-${process.pid}-${seq++}`]);
  const edgeCreate = async () => {
    const sb = await node.edge.create({ image: { base: 'busybox' } });
    await node.edge.exec(sb.id, { argv: ['true'] });
    return sb.id;
  };
  const timed = async (fn) => {
    const t0 = performance.now();
    const value = await fn();
    return [performance.now() - t0, value];
  };
  const crun = [];
  const edge = [];
  const switched = [];
  const steps = {};
  for (let i = 0; i < n + 2; i++) {
    const [a] = await timed(crunRun);
    const [b, id] = await timed(edgeCreate);
    await node.edge.destroy(id);
    const g = await precreate();
    const [c, stderr] = await timed(async () => {
      const out = await sw(g);
      await node.edge.exec(g.sb.id, { argv: ['true'] });
      return out;
    });
    await discard(g);
    if (i < 2) continue;
    crun.push(a);
    edge.push(b);
    switched.push(c);
    let prev = 0;
    for (const m of stderr.matchAll(/step (.+?)\s+([\d.]+) ms/g)) {
      (steps[m[1]] ??= []).push(Number(m[2]) - prev);
      prev = Number(m[2]);
    }
  }
  const stepP50 = Object.fromEntries(Object.entries(steps).map(([k, v]) => [k, p50(v)]));
  console.log(JSON.stringify({ c1: { crunRun: p50(crun), edgeCreateExec: p50(edge), switchExec: p50(switched) }, steps: stepP50 }));
  const c8 = { crunRun: [], switchExec: [], edgeCreateExec: [] };
  for (let r = 0; r < 3; r++) {
    c8.crunRun.push(p50((await Promise.all(Array.from({ length: 8 }, () => timed(crunRun)))).map((t) => t[0])));
    const gs = [];
    for (let k = 0; k < 8; k++) gs.push(await precreate());
    const sws = await Promise.all(gs.map((g) => timed(() => sw(g).then(() => node.edge.exec(g.sb.id, { argv: ['true'] })))));
    c8.switchExec.push(p50(sws.map((t) => t[0])));
    for (const g of gs) await discard(g);
    const creates = await Promise.all(Array.from({ length: 8 }, () => timed(edgeCreate)));
    c8.edgeCreateExec.push(p50(creates.map((t) => t[0])));
    for (const [, id] of creates) await node.edge.destroy(id);
  }
  console.log(JSON.stringify({ c8 }));
} finally {
  await node.cleanup();
  rmSync(tmp, { recursive: true, force: true });
}
