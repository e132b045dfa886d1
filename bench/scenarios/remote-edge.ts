// A joined edge against the in-process one: the same control plane reaches its own edge
// directly and a second edge (`dsec edge --join`, its own process and home on this machine)
// through the node port: the edge wire protocol over HTTP/2 in mutual TLS, on loopback. Exec
// round trips and output streaming through the SDK on a sandbox of each, alternating.
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Sandbox } from '@dsec/sdk';
import { onCleanup } from '../lib/cleanup.js';
import { AGENT_BINARY } from '../lib/platform.js';
import { latencyRow } from '../lib/report.js';
import type { Scenario, ScenarioContext } from '../lib/scenario.js';
import { nowMs, progress, sleep, summarize } from '../lib/stats.js';

const CLI = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../packages/cli/dist/main.js');
const REMOTE = 'bench-remote';
const IN_PROCESS = 'in-process edge';
const JOINED = 'joined edge (mTLS)';

export const remoteEdgeScenario: Scenario = {
  name: 'remote-edge',
  title: 'Remote edge: exec and streaming through a joined node',
  onlyWhenNamed: true,
  method: [
    'The platform (`dsec up` in-process) takes a second node: `dsec edge --join` in its own process and home on this',
    'machine, joined with a single-use token, reached over the node port (the edge wire protocol over HTTP/2 in mutual',
    "TLS 1.3, loopback). One busybox sandbox is placed on each node (the other cordoned). Exec: `sb.exec(['true'])`",
    'round trips through the SDK, alternating between the two sandboxes after a warm-up. Streaming: `head -c <size>',
    '/dev/zero` through `sb.spawn`, bytes counted as they arrive, alternating. Targets (issue 16): exec through a joined',
    'edge <= in-process + 1 ms at the p50; streaming >= 80% of in-process.',
  ].join(' '),
  async run(ctx: ScenarioContext) {
    const { bench } = ctx;
    const nodeUrl = bench.platform.nodeUrl;
    if (!nodeUrl) throw new Error('the bench platform has no node port');
    const admin = bench.admin;
    const local = (await admin.nodes.list())[0]!.name;
    const token = (await admin.nodes.joinToken()).token;
    const home = path.join(ctx.dir, 'remote-edge');
    const child = spawn(process.execPath, [CLI, 'edge', '--join', nodeUrl, '--token', token, '--name', REMOTE, '--home', home, '--clean'], {
      env: { PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin', DSEC_AGENT: AGENT_BINARY },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (err = (err + d.toString()).slice(-8000)));
    const exited = new Promise<void>((r) => child.once('exit', () => r()));
    const stopEdge = onCleanup('remote edge', async () => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), 60_000);
      await exited;
      clearTimeout(t);
      await admin.nodes.remove(REMOTE).catch(() => undefined);
    });
    const sandboxes: Sandbox[] = [];
    try {
      const deadline = Date.now() + 180_000;
      while (!/joined/.test(out) || (await admin.nodes.list()).find((n) => n.name === REMOTE)?.state !== 'ready') {
        if (child.exitCode !== null) throw new Error(`dsec edge --join exited ${child.exitCode}: ${err}`);
        if (Date.now() > deadline) throw new Error(`dsec edge --join did not become ready: ${err}`);
        await sleep(200);
      }
      progress('remote-edge: the edge joined');
      const client = await bench.newClient();
      const on = async (node: string, other: string): Promise<Sandbox> => {
        await admin.nodes.cordon(other);
        try {
          const sb = await Sandbox.create({ image: { base: 'busybox' } }, { client });
          sandboxes.push(sb);
          const row = await admin.nodes.get(node);
          if (row.state !== 'ready') throw new Error(`node ${node} is ${row.state}`);
          return sb;
        } finally {
          await admin.nodes.uncordon(other);
        }
      };
      const systems: Array<[string, Sandbox]> = [
        [IN_PROCESS, await on(local, REMOTE)],
        [JOINED, await on(REMOTE, local)],
      ];
      for (const [name, sb] of systems) {
        const where = (await sb.info()).node;
        if (where !== (name === IN_PROCESS ? local : REMOTE)) throw new Error(`${name}: the sandbox is on ${where}`);
      }

      // Exec round trips.
      const n = ctx.quick ? 30 : 300;
      const times = new Map<string, number[]>(systems.map(([s]) => [s, []]));
      for (let i = 0; i < n + 10; i++) {
        for (const [name, sb] of systems) {
          const t0 = nowMs();
          const r = await sb.exec(['true']);
          const ms = nowMs() - t0;
          if (r.exitCode !== 0) throw new Error(`${name}: true exited ${r.exitCode}`);
          if (i >= 10) times.get(name)!.push(ms);
        }
      }
      for (const [name, xs] of times) ctx.record(latencyRow('remote-edge', 'exec round trip (true)', name, summarize(xs)));

      // Streaming.
      const size = ctx.quick ? 32 * 2 ** 20 : 256 * 2 ** 20;
      const reps = ctx.quick ? 1 : 3;
      const totals = new Map<string, { bytes: number; ms: number }>(systems.map(([s]) => [s, { bytes: 0, ms: 0 }]));
      for (let r = 0; r < reps; r++) {
        for (const [name, sb] of systems) {
          const t0 = nowMs();
          const h = await sb.spawn(['head', '-c', String(size), '/dev/zero']);
          let bytes = 0;
          for await (const ev of h) if (ev.stream === 'stdout') bytes += ev.data.length;
          const exit = await h.wait();
          const ms = nowMs() - t0;
          if (exit.exitCode !== 0 || bytes !== size) throw new Error(`${name}: head exited ${exit.exitCode} after ${bytes} of ${size} bytes`);
          const t = totals.get(name)!;
          t.bytes += bytes;
          t.ms += ms;
          progress(`remote-edge: ${name}: ${(bytes / 1e3 / ms).toFixed(0)} MB/s`);
        }
      }
      for (const [name, t] of totals) {
        ctx.record({
          scenario: 'remote-edge',
          metric: `stdout of ${size / 2 ** 20} MiB`,
          system: name,
          unit: 'MB/s',
          value: t.bytes / 1e3 / t.ms,
          higherIsBetter: true,
          n: reps,
        });
      }
      const local50 = summarize(times.get(IN_PROCESS)!).p50;
      const remote50 = summarize(times.get(JOINED)!).p50;
      const localRate = totals.get(IN_PROCESS)!.bytes / totals.get(IN_PROCESS)!.ms;
      const remoteRate = totals.get(JOINED)!.bytes / totals.get(JOINED)!.ms;
      ctx.note(
        `Exec through the joined edge: p50 ${remote50.toFixed(2)} ms vs ${local50.toFixed(2)} ms in-process (+${(remote50 - local50).toFixed(2)} ms; target <= +1 ms: ${remote50 - local50 <= 1 ? 'met' : '**missed**'}). Streaming: ${((100 * remoteRate) / localRate).toFixed(0)}% of in-process (target >= 80%: ${remoteRate >= 0.8 * localRate ? 'met' : '**missed**'}).`,
      );
    } finally {
      for (const sb of sandboxes) await sb.kill().catch(() => undefined);
      await stopEdge();
    }
  },
};
