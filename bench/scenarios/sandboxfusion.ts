// SandboxFusion's run_code through dsec side by side with the plain fncall API it runs on: the
// same python snippet as a `POST /v1/sandboxfusion/run_code` (verl's request shape) and as a
// `client.calls.run` (python3 runtime), paced latency and rate. Only with `--only sandboxfusion`.
import { retryRateLimited, waitForRuntime } from '../lib/platform.js';
import { latencyRow } from '../lib/report.js';
import type { Scenario, ScenarioContext } from '../lib/scenario.js';
import { nowMs, progress, rateInFlight, summarize } from '../lib/stats.js';

const WARMUP = 10;
const PACE_MS = 20;
const RATE_CONCURRENCY = 8;
const CODE = 'print(sum(range(10)))';

function rate(durationMs: number, fn: () => Promise<unknown>): Promise<number> {
  return rateInFlight(RATE_CONCURRENCY, durationMs, fn);
}

export const sandboxFusionScenario: Scenario = {
  name: 'sandboxfusion',
  title: '14. SandboxFusion run_code against the fncall API',
  method: [
    `The python snippet \`${CODE}\` as SandboxFusion's \`run_code\` (the request verl sends: every field, memory_limit_MB 1024,`,
    'run_timeout 10 s, over fetch with the key in `Authorization`) and as the plain fncall API (`client.calls.run`, python3 runtime,',
    `1024 MiB). Both run on the fncall backend; run_code writes the code to a file and runs \`python3 main.py\`. Latency paced`,
    `(a call every ${PACE_MS} ms), alternating; rate with ${RATE_CONCURRENCY} in flight. The python runtime's Debian layer comes`,
    'from the bench cache (built there on the first run, before the measurement).',
  ].join(' '),
  onlyWhenNamed: true,
  async run(ctx: ScenarioContext) {
    const { bench } = ctx;
    const client = await bench.newClient();
    progress('sandboxfusion: waiting for the python runtime');
    await waitForRuntime(client, 'python3', 'pass');
    const key = (await bench.admin.keys.create({ name: 'bench-sandboxfusion', role: 'member' })).key ?? '';
    const body = JSON.stringify({
      code: CODE,
      language: 'python',
      compile_timeout: 10,
      run_timeout: 10,
      memory_limit_MB: 1024,
      stdin: null,
      files: {},
      fetch_files: [],
    });
    const runCode = async (): Promise<void> => {
      for (;;) {
        const res = await fetch(`${bench.url}/v1/sandboxfusion/run_code`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
          body,
        });
        const reply = (await res.json()) as { status?: string; message?: string; run_result?: { stdout?: string } };
        if (res.status === 429) continue;
        if (reply.status !== 'Success' || reply.run_result?.stdout !== '45\n') throw new Error(`run_code: ${JSON.stringify(reply)}`);
        return;
      }
    };
    const plain = async (): Promise<void> => {
      const r = await retryRateLimited(() => client.calls.run({ runtime: 'python3', code: CODE, memoryMiB: 1024 }));
      if (r.stdout !== '45\n') throw new Error(`calls.run: ${JSON.stringify(r)}`);
    };
    const systems: Array<[string, () => Promise<void>]> = [
      ['dsec run_code (SandboxFusion)', runCode],
      ['dsec calls.run', plain],
    ];
    for (let i = 0; i < WARMUP; i++) for (const [, fn] of systems) await fn();
    const iterations = ctx.quick ? 10 : 100;
    const paced = new Map<string, number[]>(systems.map(([n]) => [n, []]));
    for (let i = 0; i < iterations; i++) {
      for (const [name, fn] of systems) {
        const t0 = nowMs();
        await fn();
        paced.get(name)!.push(nowMs() - t0);
        await new Promise((r) => setTimeout(r, PACE_MS));
      }
      if ((i + 1) % 25 === 0) progress(`sandboxfusion: ${i + 1}/${iterations}`);
    }
    for (const [name] of systems) ctx.record(latencyRow('sandboxfusion', 'python snippet, paced', name, summarize(paced.get(name)!)));
    const seconds = ctx.quick ? 2 : 10;
    for (const [name, fn] of systems) {
      progress(`sandboxfusion: rate of ${name} for ${seconds} s`);
      ctx.record({
        scenario: 'sandboxfusion',
        metric: `python snippets per second, ${RATE_CONCURRENCY} in flight`,
        system: name,
        unit: 'calls/s',
        value: await rate(seconds * 1000, fn),
        higherIsBetter: true,
      });
    }
  },
};
