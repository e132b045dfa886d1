// What per-sandbox networking costs: create to first exec with network `none` (the runtime's
// empty namespace, nothing else) vs `allowlist` (a veth link, the node's table, DNS stub and
// proxy), and the time a live policy change takes (link added, policy swapped, link removed).
import { Sandbox } from '@dsec/sdk';
import type { DsecClient } from '@dsec/sdk';
import type { Edge } from '@dsec/edge';
import type { NetworkPolicy } from '@dsec/protocol';
import { retryRateLimited } from '../lib/platform.js';
import { latencyRow } from '../lib/report.js';
import type { Scenario, ScenarioContext } from '../lib/scenario.js';
import { nowMs, progress, summarize } from '../lib/stats.js';

const WARMUP = 3;
/** A policy naming a host that nothing resolves: the benchmark sends no traffic anywhere. */
const ALLOWLIST: NetworkPolicy = { mode: 'allowlist', allow: [{ host: 'bench.invalid' }], presets: ['npm', 'pypi'] };
const OTHER_ALLOWLIST: NetworkPolicy = {
  mode: 'allowlist',
  allow: [{ host: 'bench.invalid' }, { host: '*.bench.invalid', ports: [443] }],
  presets: ['github'],
};

async function edgeCreate(edge: Edge, network: NetworkPolicy | undefined): Promise<number> {
  const t0 = nowMs();
  const sb = await edge.create({ image: { base: 'busybox' }, ...(network ? { network } : {}) });
  await edge.exec(sb.id, { argv: ['true'] });
  const ms = nowMs() - t0;
  await edge.destroy(sb.id);
  return ms;
}

async function sdkCreate(client: DsecClient, network: NetworkPolicy | undefined): Promise<number> {
  const t0 = nowMs();
  const sb = await retryRateLimited(() => Sandbox.create({ image: { base: 'busybox' }, ...(network ? { network } : {}) }, { client }));
  const r = await sb.exec(['true']);
  const ms = nowMs() - t0;
  await sb.kill();
  if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}`);
  return ms;
}

/** Create to first exec, network none vs allowlist, at the edge and through the API. */
export async function measureCreateWithNetwork(ctx: ScenarioContext): Promise<void> {
  const edge = ctx.bench.platform.edge;
  const client = await ctx.bench.newClient();
  const systems: Array<[string, () => Promise<number>]> = [
    ['dsec edge, network none', () => edgeCreate(edge, undefined)],
    ['dsec edge, network allowlist', () => edgeCreate(edge, ALLOWLIST)],
    ['dsec, network none', () => sdkCreate(client, undefined)],
    ['dsec, network allowlist', () => sdkCreate(client, ALLOWLIST)],
  ];
  progress('network: warm-up');
  for (let i = 0; i < WARMUP; i++) for (const [, fn] of systems) await fn();
  const rounds = ctx.quick ? 10 : 100;
  const samples = new Map<string, number[]>(systems.map(([name]) => [name, []]));
  for (let round = 0; round < rounds; round++) {
    for (const [name, fn] of systems) samples.get(name)!.push(await fn());
    if ((round + 1) % 20 === 0) progress(`network: create round ${round + 1}/${rounds}`);
  }
  for (const [name] of systems) ctx.record(latencyRow('network', 'create to first exec', name, summarize(samples.get(name)!)));
  const none = summarize(samples.get('dsec edge, network none')!).p50;
  const on = summarize(samples.get('dsec edge, network allowlist')!).p50;
  ctx.note(`A networked sandbox costs ${(on - none).toFixed(1)} ms more to create at the edge (p50 ${on.toFixed(1)} vs ${none.toFixed(1)} ms).`);
}

/** Live policy changes on one running sandbox, through the API: link added, policy replaced, link removed. */
export async function measureLiveChanges(ctx: ScenarioContext): Promise<void> {
  const client = await ctx.bench.newClient();
  const sb = await retryRateLimited(() => Sandbox.create({ image: { base: 'busybox' } }, { client }));
  const rounds = ctx.quick ? 10 : 100;
  const samples = { attach: [] as number[], replace: [] as number[], detach: [] as number[] };
  const time = async (fn: () => Promise<unknown>): Promise<number> => {
    const t0 = nowMs();
    await retryRateLimited(fn);
    return nowMs() - t0;
  };
  try {
    for (let i = 0; i < rounds + WARMUP; i++) {
      const attach = await time(() => sb.setNetwork(ALLOWLIST));
      const replace = await time(() => sb.setNetwork(OTHER_ALLOWLIST));
      const detach = await time(() => sb.setNetwork({ mode: 'none' }));
      if (i < WARMUP) continue;
      samples.attach.push(attach);
      samples.replace.push(replace);
      samples.detach.push(detach);
    }
  } finally {
    await sb.kill();
  }
  ctx.record(latencyRow('network', 'live policy change (API)', 'none -> allowlist (link added)', summarize(samples.attach)));
  ctx.record(latencyRow('network', 'live policy change (API)', 'allowlist -> allowlist (policy swapped)', summarize(samples.replace)));
  ctx.record(latencyRow('network', 'live policy change (API)', 'allowlist -> none (link removed)', summarize(samples.detach)));
}

export const networkScenario: Scenario = {
  name: 'network',
  title: 'Network: create with and without a network, live policy changes',
  method: [
    "Create to first exec (`true`) of a busybox sandbox with network `none` (loopback only: the runtime's empty",
    'namespace, nothing added) and `allowlist` (a veth link to the node gateway, resolv.conf, policy compiled;',
    "the node's table, DNS stub and proxy exist already), at the edge in-process and through the SDK, alternating",
    'round by round. Then the time `sandbox.setNetwork` (PUT /v1/sandboxes/{id}/network) takes on a running sandbox: none -> allowlist adds its link,',
    'allowlist -> allowlist swaps the compiled policy, allowlist -> none removes the link. No traffic is sent.',
  ].join(' '),
  async run(ctx) {
    await measureCreateWithNetwork(ctx);
    await measureLiveChanges(ctx);
  },
};
