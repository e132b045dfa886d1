// dsec sandbox create | ls | get | rm
import type { Command } from 'commander';
import { Sandbox } from '@dsec/sdk';
import type { SandboxCreateOptions, SandboxInfo } from '@dsec/sdk';
import type { SandboxState } from '@dsec/protocol';
import { clientFor } from '../connection.js';
import type { ConnectionFlags } from '../connection.js';
import { formatAge, printJson, printTable } from '../output.js';
import { keyValue, number, repeated } from '../parse.js';
import { policyFrom, withPolicyFlags } from './network.js';
import type { PolicyFlags } from './network.js';

function labelsText(labels: Record<string, string>): string {
  return Object.entries(labels)
    .map(([k, v]) => `${k}=${v}`)
    .join(',');
}

function imageText(s: SandboxInfo): string {
  return [s.image.base, s.image.workspace, ...(s.image.toolkits ?? [])].filter(Boolean).join('+');
}

/** Registers `dsec sandbox ...`. */
export function registerSandbox(program: Command): void {
  const sandbox = program.command('sandbox').alias('sb').description('create, list, inspect and remove sandboxes');

  withPolicyFlags(sandbox.command('create'))
    .description('create a sandbox and print its id')
    .requiredOption('--base <layer>', 'base layer (name[:tag] or sha256:...)')
    .option('--workspace <layer>', 'workspace layer')
    .option('--toolkit <layer>', 'toolkit layer (repeatable, lowest first)', repeated)
    .option('--cpu <cores>', 'CPU cores', number(false))
    .option('--memory <MiB>', 'memory limit in MiB', number(true))
    .option('--disk <MiB>', 'writable layer size in MiB', number(true))
    .option('--best-effort', 'best-effort CPU class (SCHED_IDLE)')
    .option('--label <k=v>', 'label (repeatable)', keyValue)
    .option('--env <K=V>', 'environment variable (repeatable)', keyValue)
    .option('--timeout <ms>', 'lifetime in ms', number(true))
    .option('--json', 'print the sandbox as JSON')
    .action(async (flags: PolicyFlags & { base: string; workspace?: string; toolkit?: string[]; cpu?: number; memory?: number; disk?: number; bestEffort?: boolean; label?: Record<string, string>; env?: Record<string, string>; timeout?: number; json?: boolean }, cmd: Command) => {
      const resources = {
        ...(flags.cpu !== undefined ? { cpu: flags.cpu } : {}),
        ...(flags.memory !== undefined ? { memoryMiB: flags.memory } : {}),
        ...(flags.disk !== undefined ? { diskMiB: flags.disk } : {}),
        ...(flags.bestEffort ? { cpuClass: 'best-effort' as const } : {}),
      };
      const spec: SandboxCreateOptions = {
        image: { base: flags.base, ...(flags.workspace ? { workspace: flags.workspace } : {}), ...(flags.toolkit ? { toolkits: flags.toolkit } : {}) },
        ...(Object.keys(resources).length ? { resources } : {}),
        ...(flags.label ? { labels: flags.label } : {}),
        ...(flags.env ? { env: flags.env } : {}),
        ...(flags.timeout !== undefined ? { timeoutMs: flags.timeout } : {}),
      };
      const network = policyFrom(flags);
      if (network) spec.network = network;
      const sb = await Sandbox.create(spec, { client: clientFor(cmd.optsWithGlobals<ConnectionFlags>()) });
      if (flags.json) printJson(sb.lastInfo);
      else process.stdout.write(`${sb.id}\n`);
    });

  sandbox
    .command('ls')
    .alias('list')
    .description('list sandboxes')
    .option('--label <k=v>', 'only sandboxes with this label (repeatable)', keyValue)
    .option('--state <state>', 'only sandboxes in this state')
    .option('--json', 'print JSON')
    .action(async (flags: { label?: Record<string, string>; state?: string; json?: boolean }, cmd: Command) => {
      const client = clientFor(cmd.optsWithGlobals<ConnectionFlags>());
      const items = await Sandbox.list({ ...(flags.label ? { labels: flags.label } : {}), ...(flags.state ? { state: flags.state as SandboxState } : {}) }, { client }).toArray();
      if (flags.json) return printJson(items);
      printTable(
        ['id', 'state', 'image', 'cpu', 'memory', 'age', 'labels'],
        items.map((s) => [s.id, s.state, imageText(s), String(s.resources.cpu), `${s.resources.memoryMiB}Mi`, formatAge(s.createdAt), labelsText(s.labels)]),
      );
    });

  sandbox
    .command('get')
    .description('show one sandbox')
    .argument('<id>')
    .option('--json', 'print JSON')
    .action(async (id: string, flags: { json?: boolean }, cmd: Command) => {
      const sb = await Sandbox.connect(id, { client: clientFor(cmd.optsWithGlobals<ConnectionFlags>()) });
      const s = sb.lastInfo as SandboxInfo;
      if (flags.json) return printJson(s);
      const r = s.resources;
      const rows: Array<[string, string]> = [
        ['id', s.id],
        ['state', s.state],
        ['project', s.project],
        ['node', s.node],
        ['backend', s.backend],
        ['image', imageText(s)],
        ['resources', `cpu ${r.cpu} (${r.cpuClass}), memory ${r.memoryMiB}Mi, disk ${r.diskMiB}Mi, pids ${r.pids}`],
        ['labels', labelsText(s.labels) || '-'],
        ['env', s.envKeys.join(',') || '-'],
        ['network', s.network.mode === 'none' ? 'none' : `allowlist (${(s.network.allow ?? []).length} rules, presets ${(s.network.presets ?? []).join(',') || '-'})`],
        ['created', s.createdAt],
        ['expires', s.expiresAt],
      ];
      for (const [k, v] of rows) process.stdout.write(`${`${k}:`.padEnd(11)}${v}\n`);
    });

  sandbox
    .command('rm')
    .alias('kill')
    .description('destroy sandboxes')
    .argument('<id...>')
    .action(async (ids: string[], _flags: object, cmd: Command) => {
      const client = clientFor(cmd.optsWithGlobals<ConnectionFlags>());
      let failed = 0;
      for (const id of ids) {
        try {
          await Sandbox.kill(id, { client });
          process.stdout.write(`${id}\n`);
        } catch (err) {
          failed++;
          const e = err as { code?: string; message?: string };
          process.stderr.write(`dsec: ${e.code ?? 'ERROR'}: ${id}: ${e.message ?? String(err)}\n`);
        }
      }
      if (failed) process.exitCode = 1;
    });
}
