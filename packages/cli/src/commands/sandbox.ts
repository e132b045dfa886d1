// dsec sandbox create | ls | get | rm | pause | resume | lease
import type { Command } from 'commander';
import { Sandbox } from '@dsec/sdk';
import type { LeaseOptions, PauseResult, SandboxCreateOptions, SandboxInfo } from '@dsec/sdk';
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

/** Lease flags shared by `create` and `lease`. */
interface LeaseFlags {
  idleTimeout?: number;
  maxLifetime?: number;
  onIdle?: string;
  onOwnerLost?: string;
  ownerGrace?: number;
  autoResume?: boolean;
}

function leaseOptions(cmd: Command): Command {
  return cmd
    .option('--idle-timeout <ms>', 'pause or kill after this long without API activity (0: never)', number(true))
    .option('--max-lifetime <ms>', 'destroy this long after creation', number(true))
    .option('--on-idle <action>', 'pause (default) or kill when idle')
    .option('--on-owner-lost <action>', 'pause (default) or kill when the owner session is lost')
    .option('--owner-grace <ms>', 'time without owner heartbeats before --on-owner-lost', number(true))
    .option('--auto-resume', 'requests resume a paused sandbox (default)')
    .option('--no-auto-resume', 'requests to a paused sandbox fail with SANDBOX_NOT_RUNNING');
}

/** The lease in the flags (the API validates the values and names a bad field). */
function leaseFrom(flags: LeaseFlags): LeaseOptions | undefined {
  const lease = {
    ...(flags.idleTimeout !== undefined ? { idleTimeoutMs: flags.idleTimeout } : {}),
    ...(flags.maxLifetime !== undefined ? { maxLifetimeMs: flags.maxLifetime } : {}),
    ...(flags.onIdle !== undefined ? { onIdle: flags.onIdle as 'pause' | 'kill' } : {}),
    ...(flags.onOwnerLost !== undefined ? { onOwnerLost: flags.onOwnerLost as 'pause' | 'kill' } : {}),
    ...(flags.ownerGrace !== undefined ? { ownerGraceMs: flags.ownerGrace } : {}),
    ...(flags.autoResume !== undefined ? { autoResume: flags.autoResume } : {}),
  };
  return Object.keys(lease).length ? lease : undefined;
}

function pauseText(r: PauseResult): string {
  const mib = (b: number): string => (b / 1048576).toFixed(1);
  return `${r.sandbox.id} ${r.sandbox.state} in ${r.durationMs.toFixed(1)} ms (memory ${mib(r.memoryBeforeBytes)} -> ${mib(r.memoryAfterBytes)} MiB, swap ${mib(r.swapBytes)} MiB)\n`;
}

/** Registers `dsec sandbox ...`. */
export function registerSandbox(program: Command): void {
  const sandbox = program.command('sandbox').alias('sb').description('create, list, inspect and remove sandboxes');

  leaseOptions(sandbox
    .command('create')
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
    .option('--timeout <ms>', 'lifetime in ms (the same as --max-lifetime)', number(true))
    .option('--json', 'print the sandbox as JSON'))
    .action(async (flags: LeaseFlags & { base: string; workspace?: string; toolkit?: string[]; cpu?: number; memory?: number; disk?: number; bestEffort?: boolean; label?: Record<string, string>; env?: Record<string, string>; timeout?: number; json?: boolean }, cmd: Command) => {
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
      const lease = leaseFrom(flags);
      if (lease) spec.lease = lease;
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
        ['created', s.createdAt],
        ['expires', s.expiresAt],
        ['lease', `idle ${s.lease.idleTimeoutMs} ms -> ${s.lease.onIdle}, owner lost -> ${s.lease.onOwnerLost}${s.lease.ownerGraceMs !== null ? ` after ${s.lease.ownerGraceMs} ms` : ''}, autoResume ${s.lease.autoResume}`],
        ['owner', s.owner ?? '-'],
        ['active', s.lastActiveAt],
        ...(s.pausedAt ? ([['paused', `${s.pausedAt} (${s.pauseReason ?? '?'})`]] as Array<[string, string]>) : []),
      ];
      for (const [k, v] of rows) process.stdout.write(`${`${k}:`.padEnd(11)}${v}\n`);
    });

  sandbox
    .command('pause')
    .description('pause sandboxes: freeze their processes and reclaim their memory')
    .argument('<id...>')
    .option('--json', 'print the results as JSON')
    .action(async (ids: string[], flags: { json?: boolean }, cmd: Command) => {
      const client = clientFor(cmd.optsWithGlobals<ConnectionFlags>());
      await eachSandbox(ids, flags, async (id) => (await Sandbox.connect(id, { client, claim: false })).pause());
    });

  sandbox
    .command('resume')
    .description('resume paused sandboxes')
    .argument('<id...>')
    .option('--no-prefetch', 'do not read swapped-out memory back in before answering')
    .option('--json', 'print the results as JSON')
    .action(async (ids: string[], flags: { json?: boolean; prefetch?: boolean }, cmd: Command) => {
      const client = clientFor(cmd.optsWithGlobals<ConnectionFlags>());
      await eachSandbox(ids, flags, async (id) => (await Sandbox.connect(id, { client, claim: false })).resume(flags.prefetch === false ? { prefetch: false } : {}));
    });

  leaseOptions(sandbox
    .command('lease')
    .description("change a sandbox's lease (only the flags given change)")
    .argument('<id>')
    .option('--json', 'print the sandbox as JSON'))
    .action(async (id: string, flags: LeaseFlags & { json?: boolean }, cmd: Command) => {
      const client = clientFor(cmd.optsWithGlobals<ConnectionFlags>());
      const lease = leaseFrom(flags) ?? {};
      const s = await (await Sandbox.connect(id, { client, claim: false })).setLease(lease);
      if (flags.json) return printJson(s);
      process.stdout.write(`${JSON.stringify(s.lease)}\n`);
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

/** Runs `fn` for each id, printing each result; failures are reported and set exit code 1. */
async function eachSandbox(ids: string[], flags: { json?: boolean }, fn: (id: string) => Promise<PauseResult>): Promise<void> {
  const results: PauseResult[] = [];
  for (const id of ids) {
    try {
      const r = await fn(id);
      results.push(r);
      if (!flags.json) process.stdout.write(pauseText(r));
    } catch (err) {
      process.exitCode = 1;
      const e = err as { code?: string; message?: string };
      process.stderr.write(`dsec: ${e.code ?? 'ERROR'}: ${id}: ${e.message ?? String(err)}\n`);
    }
  }
  if (flags.json) printJson(results);
}
