// Create -> first command -> kill through the real `e2b` SDK (2.51.0, unmodified) against dsec's
// E2B API, side by side with the same through dsec's own SDK, on one image. Only with `--only e2b`.
import { cp, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { Sandbox as E2bSandbox } from 'e2b-v2-51';
import { Sandbox } from '@dsec/sdk';
import { retryRateLimited } from '../lib/platform.js';
import { latencyRow } from '../lib/report.js';
import type { Scenario, ScenarioContext } from '../lib/scenario.js';
import { nowMs, progress, summarize } from '../lib/stats.js';

const WARMUP = 3;
const IMAGE = 'bench-e2b';

export const e2bScenario: Scenario = {
  name: 'e2b',
  title: '15. E2B SDK against dsec, next to the dsec SDK',
  method: [
    'Time from the create call to the exit of `true` run in the new sandbox, then its kill (timed apart), alternating the two',
    "clients on one image: the bench's busybox base plus `/bin/bash` as a shell script running busybox `sh` (the E2B SDK always",
    "runs `/bin/bash -l -c <cmd>`). E2B: the `e2b` npm package 2.51.0 unmodified, `Sandbox.create(template)` + `commands.run('true')`",
    '(control plane `POST /v2/sandboxes`, then envd `process.Process/Start` as a Connect stream, routed by `E2b-Sandbox-Id`),',
    "`sandbox.kill()`; dsec: `Sandbox.create({ image })` + `sb.exec(['true'])`, `sb.kill()`. Both over loopback HTTP, no pool.",
  ].join(' '),
  onlyWhenNamed: true,
  async run(ctx: ScenarioContext) {
    const { bench } = ctx;
    const client = await bench.newClient();
    const key = (await bench.admin.keys.create({ name: 'bench-e2b', role: 'member', format: 'e2b' })).key ?? '';
    const rootfs = path.join(ctx.dir, 'e2b-rootfs');
    await cp(path.join(ctx.dir, 'rootfs'), rootfs, { recursive: true, verbatimSymlinks: true });
    await writeFile(path.join(rootfs, 'bin', 'bash'), '#!/bin/sh\nexec /bin/sh "$@"\n', { mode: 0o755 });
    await bench.admin.layers.uploadDir(rootfs, { kind: 'base', name: IMAGE });
    const opts = { apiKey: key, apiUrl: bench.url, sandboxUrl: bench.url, timeoutMs: 120_000, requestTimeoutMs: 60_000 };
    const e2b = async (kills: number[]): Promise<number> => {
      const t0 = nowMs();
      const sbx = await E2bSandbox.create(IMAGE, opts);
      const r = await sbx.commands.run('true');
      const ms = nowMs() - t0;
      const t1 = nowMs();
      await sbx.kill();
      kills.push(nowMs() - t1);
      if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}`);
      return ms;
    };
    const dsec = async (kills: number[]): Promise<number> => {
      const t0 = nowMs();
      const sb = await retryRateLimited(() => Sandbox.create({ image: { base: IMAGE } }, { client }));
      const r = await sb.exec(['true']);
      const ms = nowMs() - t0;
      const t1 = nowMs();
      await sb.kill();
      kills.push(nowMs() - t1);
      if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}`);
      return ms;
    };
    const systems: Array<[string, (kills: number[]) => Promise<number>]> = [
      ['e2b SDK 2.51.0 -> dsec', e2b],
      ['dsec SDK', dsec],
    ];
    for (let i = 0; i < WARMUP; i++) for (const [, fn] of systems) await fn([]);
    const iterations = ctx.quick ? 5 : 30;
    const times = new Map<string, { create: number[]; kill: number[] }>(systems.map(([n]) => [n, { create: [], kill: [] }]));
    for (let i = 0; i < iterations; i++) {
      for (const [name, fn] of systems) {
        const t = times.get(name)!;
        t.create.push(await fn(t.kill));
      }
      if ((i + 1) % 10 === 0) progress(`e2b: ${i + 1}/${iterations}`);
    }
    for (const [name] of systems) {
      const t = times.get(name)!;
      ctx.record(latencyRow('e2b', 'create -> first command', name, summarize(t.create)));
      ctx.record(latencyRow('e2b', 'kill', name, summarize(t.kill)));
    }
    const p50 = (name: string): number => summarize(times.get(name)!.create).p50;
    ctx.note(`create -> first command, p50 ratio e2b SDK / dsec SDK: ${(p50(systems[0]![0]) / p50(systems[1]![0])).toFixed(2)}`);
  },
};
