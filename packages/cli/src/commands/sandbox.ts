// dsec sandbox create | ls | get | rm
import type { Command } from 'commander';
import { Sandbox } from '@dsec/sdk';
import type { BatchItem, SandboxCreateOptions, SandboxInfo } from '@dsec/sdk';
import type { SandboxState } from '@dsec/protocol';
import { clientFor } from '../connection.js';
import type { ConnectionFlags } from '../connection.js';
import { formatAge, printJson, printTable } from '../output.js';
import { keyValue, number, repeated } from '../parse.js';

function labelsText(labels: Record<string, string>): string {
  return Object.entries(labels)
    .map(([k, v]) => `${k}=${v}`)
    .join(',');
}

function imageText(s: SandboxInfo): string {
  return [s.image.base, s.image.workspace, ...(s.image.toolkits ?? [])].filter(Boolean).join('+');
}

/** Flags that describe a sandbox (`sandbox create`, `pools put`). */
export interface SpecFlags {
  base: string;
  workspace?: string;
  toolkit?: string[];
  cpu?: number;
  memory?: number;
  disk?: number;
  bestEffort?: boolean;
}

/** Adds the flags of {@link SpecFlags} to a command. */
export function withSpecFlags(cmd: Command): Command {
  return cmd
    .requiredOption('--base <layer>', 'base layer (name[:tag] or sha256:...)')
    .option('--workspace <layer>', 'workspace layer')
    .option('--toolkit <layer>', 'toolkit layer (repeatable, lowest first)', repeated)
    .option('--cpu <cores>', 'CPU cores', number(false))
    .option('--memory <MiB>', 'memory limit in MiB', number(true))
    .option('--disk <MiB>', 'writable layer size in MiB', number(true))
    .option('--best-effort', 'best-effort CPU class (SCHED_IDLE)');
}

/** The image and resources the flags describe. */
export function specOf(flags: SpecFlags): Pick<SandboxCreateOptions, 'image' | 'resources'> {
  const resources = {
    ...(flags.cpu !== undefined ? { cpu: flags.cpu } : {}),
    ...(flags.memory !== undefined ? { memoryMiB: flags.memory } : {}),
    ...(flags.disk !== undefined ? { diskMiB: flags.disk } : {}),
    ...(flags.bestEffort ? { cpuClass: 'best-effort' as const } : {}),
  };
  return {
    image: { base: flags.base, ...(flags.workspace ? { workspace: flags.workspace } : {}), ...(flags.toolkit ? { toolkits: flags.toolkit } : {}) },
    ...(Object.keys(resources).length ? { resources } : {}),
  };
}

type CreateFlags = SpecFlags & { label?: Record<string, string>; env?: Record<string, string>; timeout?: number; json?: boolean; count?: number; wait?: number | true; idempotencyKey?: string };

/** Registers `dsec sandbox ...`. */
export function registerSandbox(program: Command): void {
  const sandbox = program.command('sandbox').alias('sb').description('create, list, inspect and remove sandboxes');

  withSpecFlags(sandbox.command('create').description('create a sandbox (or --count of them) and print the ids'))
    .option('--label <k=v>', 'label (repeatable)', keyValue)
    .option('--env <K=V>', 'environment variable (repeatable)', keyValue)
    .option('--timeout <ms>', 'lifetime in ms', number(true))
    .option('--count <n>', 'create n sandboxes in one batch (up to 10000); ids print as they are created', number(true))
    .option('--wait [ms]', 'wait for quota or capacity (default 30000 ms) instead of failing at once', number(true))
    .option('--idempotency-key <key>', 'a retry with the same key creates nothing new')
    .option('--json', 'print the sandbox (or the batch result) as JSON')
    .action(async (flags: CreateFlags, cmd: Command) => {
      const client = clientFor(cmd.optsWithGlobals<ConnectionFlags>());
      const spec: SandboxCreateOptions = {
        ...specOf(flags),
        ...(flags.label ? { labels: flags.label } : {}),
        ...(flags.env ? { env: flags.env } : {}),
        ...(flags.timeout !== undefined ? { timeoutMs: flags.timeout } : {}),
      };
      const admission = flags.wait === undefined ? undefined : { wait: true, ...(flags.wait === true ? {} : { timeoutMs: flags.wait }) };
      const key = flags.idempotencyKey !== undefined ? { idempotencyKey: flags.idempotencyKey } : {};
      if (flags.count === undefined) {
        const sb = await Sandbox.create({ ...spec, ...(admission ? { admission } : {}), ...key }, { client });
        if (flags.json) printJson(sb.lastInfo);
        else process.stdout.write(`${sb.id}\n`);
        return;
      }
      const onItem = (item: BatchItem): void => {
        if (flags.json) return;
        if (item.sandbox) process.stdout.write(`${item.sandbox.id}\n`);
        else process.stderr.write(`dsec: ${item.error?.code ?? 'ERROR'}: item ${item.index}: ${item.error?.message ?? 'failed'}\n`);
      };
      const result = await Sandbox.createBatch({ spec, count: flags.count, ...(admission ? { admission } : {}) }, { onItem, ...key }, { client });
      if (flags.json) printJson({ created: result.created, failed: result.failed, items: result.items.map((i) => ({ index: i.index, ...(i.sandbox ? { sandbox: i.sandbox.lastInfo } : {}), ...(i.error ? { error: i.error.toJSON().error } : {}) })) });
      if (result.failed > 0) process.exitCode = 1;
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
