// dsec network get | set | patch | log | apply: sandbox network policies.
import type { Command } from 'commander';
import { InvalidArgumentError } from 'commander';
import { Sandbox } from '@dsec/sdk';
import type { NetworkPolicy, NetworkPolicyPatch, SandboxNetworkInfo } from '@dsec/sdk';
import { clientFor } from '../connection.js';
import type { ConnectionFlags } from '../connection.js';
import { formatBytes, printJson, printTable } from '../output.js';
import { keyValue, number, repeated } from '../parse.js';

/** One `--allow` value: `host` or `host:port[,port...]`. */
export function allowRule(value: string): { host: string; ports?: number[] } {
  const colon = value.lastIndexOf(':');
  if (colon < 0) return { host: value };
  const ports = value
    .slice(colon + 1)
    .split(',')
    .map((p) => {
      const n = Number(p);
      if (p.trim() === '' || !Number.isInteger(n)) throw new InvalidArgumentError(`not a port list: "${value.slice(colon + 1)}"`);
      return n;
    });
  return { host: value.slice(0, colon), ports };
}

/** The policy flags of `create` and `set`. */
export interface PolicyFlags {
  allow?: string[];
  preset?: string[];
  allowAddress?: string[];
  none?: boolean;
  policy?: string;
}

/** Builds a policy from flags: `--policy JSON`, `--none`, or rules (any rule means allowlist). */
export function policyFrom(flags: PolicyFlags): NetworkPolicy | undefined {
  if (flags.policy !== undefined) {
    try {
      return JSON.parse(flags.policy) as NetworkPolicy;
    } catch {
      throw new InvalidArgumentError('--policy: not valid JSON');
    }
  }
  if (flags.none) return { mode: 'none' };
  if (!flags.allow && !flags.preset && !flags.allowAddress) return undefined;
  return {
    mode: 'allowlist',
    ...(flags.allow ? { allow: flags.allow.map(allowRule) } : {}),
    ...(flags.preset ? { presets: flags.preset as NonNullable<NetworkPolicy['presets']> } : {}),
    ...(flags.allowAddress ? { allowAddresses: flags.allowAddress } : {}),
  };
}

/** Adds the policy flags to a command. */
export function withPolicyFlags(cmd: Command): Command {
  return cmd
    .option('--allow <host[:ports]>', 'allow a host (exact, *.suffix or IPv4), optionally on ports 80,443 (repeatable)', repeated)
    .option('--preset <name>', 'allow a preset: npm, pypi, debian, github, ... (repeatable)', repeated)
    .option('--allow-address <cidr>', 'a loopback/private range allowed names may resolve to (repeatable)', repeated)
    .option('--none', 'no network (loopback only)')
    .option('--policy <json>', 'the whole policy as JSON');
}

interface PatchFlags {
  allow?: string[];
  deny?: string[];
  addPreset?: string[];
  removePreset?: string[];
  addAddress?: string[];
  removeAddress?: string[];
  none?: boolean;
  patch?: string;
}

function patchFrom(flags: PatchFlags): NetworkPolicyPatch {
  if (flags.patch !== undefined) {
    try {
      return JSON.parse(flags.patch) as NetworkPolicyPatch;
    } catch {
      throw new InvalidArgumentError('--patch: not valid JSON');
    }
  }
  if (flags.none) return { mode: 'none' };
  const addRemove = <T>(add: T[] | undefined, remove: string[] | undefined): { add?: T[]; remove?: string[] } | undefined =>
    add || remove ? { ...(add ? { add } : {}), ...(remove ? { remove } : {}) } : undefined;
  const patch: NetworkPolicyPatch = {};
  const allow = addRemove(flags.allow?.map(allowRule), flags.deny);
  if (allow) patch.allow = allow;
  const presets = addRemove(flags.addPreset, flags.removePreset);
  if (presets) patch.presets = presets as NetworkPolicyPatch['presets'];
  const addrs = addRemove(flags.addAddress, flags.removeAddress);
  if (addrs) patch.allowAddresses = addrs;
  if (Object.keys(patch).length === 0)
    throw new InvalidArgumentError(
      'nothing to change: give --allow, --deny, --add-preset, --remove-preset, --add-address, --remove-address, --none or --patch',
    );
  return patch;
}

function withPatchFlags(cmd: Command): Command {
  return cmd
    .option('--allow <host[:ports]>', 'add (or replace) a rule (repeatable)', repeated)
    .option('--deny <host>', 'remove the rule for this host pattern (repeatable)', repeated)
    .option('--add-preset <name>', 'add a preset (repeatable)', repeated)
    .option('--remove-preset <name>', 'remove a preset (repeatable)', repeated)
    .option('--add-address <cidr>', 'add an allowed address range (repeatable)', repeated)
    .option('--remove-address <cidr>', 'remove an allowed address range (repeatable)', repeated)
    .option('--none', 'drop everything: mode none')
    .option('--patch <json>', 'the patch as JSON');
}

function printNetwork(n: SandboxNetworkInfo): void {
  const p = n.policy;
  const rules = (p.allow ?? []).map((r) => (r.ports ? `${r.host}:${r.ports.join(',')}` : r.host));
  const rows: Array<[string, string]> = [
    ['mode', p.mode],
    ['allow', rules.join(' ') || '-'],
    ['presets', (p.presets ?? []).join(',') || '-'],
    ['addresses', (p.allowAddresses ?? []).join(',') || '-'],
    ['mirrors', Object.keys(p.mirrors ?? {}).join(',') || '-'],
    ['address', n.address ?? '-'],
    ['proxy', n.proxy ?? '-'],
    ['traffic', `in ${formatBytes(n.stats.bytesIn)}, out ${formatBytes(n.stats.bytesOut)}, ${n.stats.connections} open, ${n.stats.totalConnections} total`],
    ['attempts', `${n.stats.allowed} allowed, ${n.stats.denied} denied`],
  ];
  for (const [k, v] of rows) process.stdout.write(`${`${k}:`.padEnd(11)}${v}\n`);
}

/** Registers `dsec network ...`. */
export function registerNetwork(program: Command): void {
  const network = program.command('network').alias('net').description("show and change sandboxes' network policies");
  const conn = (cmd: Command): { client: ReturnType<typeof clientFor> } => ({ client: clientFor(cmd.optsWithGlobals<ConnectionFlags>()) });
  const sandboxOf = async (id: string, cmd: Command): Promise<Sandbox> => Sandbox.connect(id, conn(cmd));

  network
    .command('get')
    .description("show a sandbox's network policy and counters")
    .argument('<id>')
    .option('--json', 'print JSON')
    .action(async (id: string, flags: { json?: boolean }, cmd: Command) => {
      const n = await (await sandboxOf(id, cmd)).network();
      if (flags.json) printJson(n);
      else printNetwork(n);
    });

  withPolicyFlags(network.command('set').description("replace a sandbox's network policy").argument('<id>'))
    .option('--json', 'print JSON')
    .action(async (id: string, flags: PolicyFlags & { json?: boolean }, cmd: Command) => {
      const policy = policyFrom(flags);
      if (!policy) throw new InvalidArgumentError('give a policy: --allow, --preset, --allow-address, --none or --policy');
      const n = await (await sandboxOf(id, cmd)).setNetwork(policy);
      if (flags.json) printJson(n);
      else printNetwork(n);
    });

  withPatchFlags(network.command('patch').description("change part of a sandbox's network policy").argument('<id>'))
    .option('--json', 'print JSON')
    .action(async (id: string, flags: PatchFlags & { json?: boolean }, cmd: Command) => {
      const n = await (await sandboxOf(id, cmd)).patchNetwork(patchFrom(flags));
      if (flags.json) printJson(n);
      else printNetwork(n);
    });

  network
    .command('log')
    .description("a sandbox's latest egress attempts and their verdicts")
    .argument('<id>')
    .option('--limit <n>', 'how many (1-1000, default 100)', number(true))
    .option('--json', 'print JSON')
    .action(async (id: string, flags: { limit?: number; json?: boolean }, cmd: Command) => {
      const items = await (await sandboxOf(id, cmd)).networkLog(flags.limit !== undefined ? { limit: flags.limit } : {});
      if (flags.json) return printJson(items);
      printTable(
        ['time', 'via', 'destination', 'verdict', 'rule / reason'],
        items.map((e) => [
          e.at ?? '',
          e.via,
          `${e.host}:${e.port}${e.protocol && e.protocol !== 'tcp' ? `/${e.protocol}` : ''}`,
          e.verdict,
          e.verdict === 'allowed' ? (e.rule ?? '') : (e.reason ?? ''),
        ]),
      );
    });

  withPatchFlags(
    network
      .command('apply')
      .description('replace (--policy) or patch (--allow, --deny, --add-preset, ..., --patch) the policy of every sandbox with these labels'),
  )
    .requiredOption('--selector <k=v>', 'label the sandboxes carry (repeatable)', keyValue)
    .option('--policy <json>', 'replace with this whole policy (JSON)')
    .option('--json', 'print JSON')
    .action(async (flags: PatchFlags & { selector: Record<string, string>; policy?: string; json?: boolean }, cmd: Command) => {
      const { client } = conn(cmd);
      const change = flags.policy !== undefined ? { policy: policyFrom({ policy: flags.policy }) as NetworkPolicy } : { patch: patchFrom(flags) };
      const res = await client.applyNetwork({ selector: { labels: flags.selector }, ...change });
      if (flags.json) return printJson(res);
      process.stdout.write(`matched ${res.matched}, applied ${res.applied.length}, failed ${res.failed.length}\n`);
      for (const f of res.failed) process.stderr.write(`dsec: ${f.error.code}: ${f.id}: ${f.error.message}\n`);
      if (res.failed.length) process.exitCode = 1;
    });
}
