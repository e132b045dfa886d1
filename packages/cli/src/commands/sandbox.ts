// dsec sandbox create | ls | get | rm | pause | resume | lease | snapshot | fork | trajectory | replay | diff | verify
import type { Command } from 'commander';
import { InvalidArgumentError } from 'commander';
import { Sandbox } from '@dsec/sdk';
import type { BatchItem, LeaseOptions, PauseResult, ReplayStep, SandboxCreateOptions, SandboxInfo, TrajectoryStep } from '@dsec/sdk';
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
  const image = [s.image.base, s.image.workspace, ...(s.image.toolkits ?? [])].filter(Boolean).join('+');
  return s.snapshot ? `${image}+snapshot:${s.snapshot.slice(7, 19)}` : image;
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

/** One line of a trajectory listing: what ran or changed, and how it ended. */
function stepText(s: TrajectoryStep): string {
  if (s.kind === 'exec') {
    const what = s.command?.cmd ?? (s.command?.argv ?? []).join(' ');
    const how = s.error ? s.error.code : s.exit === null || s.exit === undefined ? 'running' : (s.exit.signal ?? `exit ${s.exit.exitCode}`);
    return `${what}  [${how}]`;
  }
  const target = s.kind === 'rename' ? `${s.from} -> ${s.to}` : (s.path ?? '');
  return s.error ? `${target}  [${s.error.code}]` : target;
}

function verdictText(v: ReplayStep): string {
  return v.reason ? `${v.verdict} (${v.reason})` : v.verdict;
}

/** Flags that describe a sandbox (`sandbox create`, `pools put`). */
export interface SpecFlags {
  base?: string;
  snapshot?: string;
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
    .option('--base <layer>', 'base layer (name[:tag] or sha256:...)')
    .option('--snapshot <layer>', 'start from a snapshot layer instead of an image')
    .option('--workspace <layer>', 'workspace layer')
    .option('--toolkit <layer>', 'toolkit layer (repeatable, lowest first)', repeated)
    .option('--cpu <cores>', 'CPU cores', number(false))
    .option('--memory <MiB>', 'memory limit in MiB', number(true))
    .option('--disk <MiB>', 'writable layer size in MiB', number(true))
    .option('--best-effort', 'best-effort CPU class (SCHED_IDLE)');
}

/** The image and resources the flags describe. */
export function specOf(flags: SpecFlags): Pick<SandboxCreateOptions, 'image' | 'snapshot' | 'resources'> {
  if ((flags.base === undefined) === (flags.snapshot === undefined)) throw new InvalidArgumentError('give exactly one of --base or --snapshot');
  if (flags.snapshot !== undefined && (flags.workspace !== undefined || flags.toolkit !== undefined))
    throw new InvalidArgumentError('--workspace and --toolkit go with --base');
  const resources = {
    ...(flags.cpu !== undefined ? { cpu: flags.cpu } : {}),
    ...(flags.memory !== undefined ? { memoryMiB: flags.memory } : {}),
    ...(flags.disk !== undefined ? { diskMiB: flags.disk } : {}),
    ...(flags.bestEffort ? { cpuClass: 'best-effort' as const } : {}),
  };
  return {
    ...(flags.base !== undefined
      ? { image: { base: flags.base, ...(flags.workspace ? { workspace: flags.workspace } : {}), ...(flags.toolkit ? { toolkits: flags.toolkit } : {}) } }
      : { snapshot: flags.snapshot }),
    ...(Object.keys(resources).length ? { resources } : {}),
  };
}

type CreateFlags = SpecFlags &
  PolicyFlags &
  LeaseFlags & {
    label?: Record<string, string>;
    env?: Record<string, string>;
    timeout?: number;
    readOnly?: string[];
    watch?: string[];
    allowPtrace?: boolean;
    json?: boolean;
    count?: number;
    wait?: number | true;
    idempotencyKey?: string;
  };

/** Registers `dsec sandbox ...`. */
export function registerSandbox(program: Command): void {
  const sandbox = program.command('sandbox').alias('sb').description('create, list, inspect and remove sandboxes');

  leaseOptions(withPolicyFlags(withSpecFlags(sandbox.command('create').description('create a sandbox (or --count of them) and print the ids'))))
    .option('--label <k=v>', 'label (repeatable)', keyValue)
    .option('--env <K=V>', 'environment variable (repeatable)', keyValue)
    .option('--timeout <ms>', 'lifetime in ms (the same as --max-lifetime)', number(true))
    .option('--read-only <path>', 'path the sandbox cannot change, not even as root (repeatable)', repeated)
    .option('--watch <path>', 'path whose changes raise protected-path.write events (repeatable)', repeated)
    .option('--allow-ptrace', 'allow ptrace and process_vm_* (debuggers)')
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
        ...(flags.readOnly || flags.watch
          ? { protect: { ...(flags.readOnly ? { readOnly: flags.readOnly } : {}), ...(flags.watch ? { watch: flags.watch } : {}) } }
          : {}),
        ...(flags.allowPtrace ? { security: { allowPtrace: true } } : {}),
      };
      const network = policyFrom(flags);
      if (network) spec.network = network;
      const lease = leaseFrom(flags);
      if (lease) spec.lease = lease;
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
      if (flags.json)
        printJson({
          created: result.created,
          failed: result.failed,
          items: result.items.map((i) => ({
            index: i.index,
            ...(i.sandbox ? { sandbox: i.sandbox.lastInfo } : {}),
            ...(i.error ? { error: i.error.toJSON().error } : {}),
          })),
        });
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
      const items = await Sandbox.list(
        { ...(flags.label ? { labels: flags.label } : {}), ...(flags.state ? { state: flags.state as SandboxState } : {}) },
        { client },
      ).toArray();
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
        [
          'network',
          s.network.mode === 'none' ? 'none' : `allowlist (${(s.network.allow ?? []).length} rules, presets ${(s.network.presets ?? []).join(',') || '-'})`,
        ],
        ['created', s.createdAt],
        ['expires', s.expiresAt],
        [
          'lease',
          `idle ${s.lease.idleTimeoutMs} ms -> ${s.lease.onIdle}, owner lost -> ${s.lease.onOwnerLost}${s.lease.ownerGraceMs !== null ? ` after ${s.lease.ownerGraceMs} ms` : ''}, autoResume ${s.lease.autoResume}`,
        ],
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
      await eachSandbox(ids, flags, async (id) =>
        (await Sandbox.connect(id, { client, claim: false })).resume(flags.prefetch === false ? { prefetch: false } : {}),
      );
    });

  leaseOptions(
    sandbox
      .command('lease')
      .description("change a sandbox's lease (only the flags given change)")
      .argument('<id>')
      .option('--json', 'print the sandbox as JSON'),
  ).action(async (id: string, flags: LeaseFlags & { json?: boolean }, cmd: Command) => {
    const client = clientFor(cmd.optsWithGlobals<ConnectionFlags>());
    const lease = leaseFrom(flags) ?? {};
    const s = await (await Sandbox.connect(id, { client, claim: false })).setLease(lease);
    if (flags.json) return printJson(s);
    process.stdout.write(`${JSON.stringify(s.lease)}\n`);
  });

  sandbox
    .command('snapshot')
    .description("pack a sandbox's writable layer into a snapshot layer and print its digest")
    .argument('<id>')
    .option('--name <name>', 'name[:tag] for the snapshot')
    .option('--json', 'print the layer as JSON')
    .action(async (id: string, flags: { name?: string; json?: boolean }, cmd: Command) => {
      const sb = await Sandbox.connect(id, { client: clientFor(cmd.optsWithGlobals<ConnectionFlags>()) });
      const layer = await sb.snapshot(flags.name !== undefined ? { name: flags.name } : {});
      if (flags.json) printJson(layer);
      else process.stdout.write(`${layer.digest}\n`);
    });

  sandbox
    .command('fork')
    .description('snapshot a sandbox and create sandboxes from it; prints their ids')
    .argument('<id>')
    .requiredOption('--count <n>', 'how many sandboxes', number(true))
    .option('--label <k=v>', 'label for the new sandboxes (repeatable)', keyValue)
    .option('--timeout <ms>', 'lifetime of each new sandbox in ms', number(true))
    .option('--memory', 'fork a VM with its memory: the new sandboxes resume where it is (no snapshot)')
    .option('--json', 'print the snapshot and the sandboxes as JSON')
    .action(async (id: string, flags: { count: number; label?: Record<string, string>; timeout?: number; memory?: boolean; json?: boolean }, cmd: Command) => {
      const sb = await Sandbox.connect(id, { client: clientFor(cmd.optsWithGlobals<ConnectionFlags>()) });
      const { snapshot, sandboxes } = await sb.fork(flags.count, {
        ...(flags.label ? { labels: flags.label } : {}),
        ...(flags.timeout !== undefined ? { timeoutMs: flags.timeout } : {}),
        ...(flags.memory ? { memory: true } : {}),
      });
      if (flags.json) return printJson({ snapshot, sandboxes: sandboxes.map((s) => s.lastInfo) });
      for (const s of sandboxes) process.stdout.write(`${s.id}\n`);
    });

  sandbox
    .command('trajectory')
    .alias('log')
    .description("list a sandbox's recorded steps (also after it is gone)")
    .argument('<id>')
    .option('--after <seq>', 'only steps after this seq', number(true))
    .option('--json', 'print the steps as JSON (with the bounded output copies)')
    .action(async (id: string, flags: { after?: number; json?: boolean }, cmd: Command) => {
      const client = clientFor(cmd.optsWithGlobals<ConnectionFlags>());
      // The sandbox may be gone: read its trajectory without looking it up first.
      const steps: TrajectoryStep[] = [];
      for await (const s of Sandbox.fromId(id, { client }).trajectory({
        ...(flags.after !== undefined ? { after: flags.after } : {}),
        content: flags.json === true,
      }))
        steps.push(s);
      if (flags.json) return printJson(steps);
      printTable(
        ['seq', 'kind', 'ms', 'step'],
        steps.map((s) => [String(s.seq), s.kind, s.durationMs === null ? '-' : String(Math.round(s.durationMs)), stepText(s)]),
      );
    });

  sandbox
    .command('replay')
    .description("re-run a sandbox's trajectory on a fresh sandbox and compare each step")
    .argument('<id>')
    .option('--up-to <seq>', 'replay steps up to this seq', number(true))
    .option('--snapshot <layer>', 'start from this snapshot of the sandbox (replays only later steps)')
    .option('--stop-on-divergence', 'stop at the first step that differs')
    .option('--json', 'print the result as JSON')
    .action(async (id: string, flags: { upTo?: number; snapshot?: string; stopOnDivergence?: boolean; json?: boolean }, cmd: Command) => {
      const client = clientFor(cmd.optsWithGlobals<ConnectionFlags>());
      const result = await Sandbox.fromId(id, { client }).replay({
        ...(flags.upTo !== undefined ? { upTo: flags.upTo } : {}),
        ...(flags.snapshot !== undefined ? { snapshot: flags.snapshot } : {}),
        ...(flags.stopOnDivergence ? { stopOnDivergence: true } : {}),
        ...(flags.json ? {} : { onStep: (v: ReplayStep) => process.stderr.write(`${v.seq}\t${v.kind}\t${verdictText(v)}\n`) }),
      });
      if (flags.json) return printJson({ ...result, sandbox: result.sandbox.lastInfo });
      const s = result.summary;
      process.stdout.write(`${result.sandbox.id}\n`);
      process.stderr.write(
        `same ${s.same}, exit differs ${s.exitDiffers}, output differs ${s.outputDiffers}, not replayable ${s.notReplayable}${result.error ? `; stopped: ${result.error.code}: ${result.error.message}` : ''}\n`,
      );
      if (result.error || s.exitDiffers + s.outputDiffers > 0) process.exitCode = 1;
    });

  sandbox
    .command('diff')
    .description('list the files a sandbox added, changed and deleted against its layers')
    .argument('<id>')
    .option('--path <path>', 'only at or below this path (repeatable)', repeated)
    .option('--no-hash', 'skip the sha256 of file contents')
    .option('--json', 'print JSON lines, one entry each')
    .action(async (id: string, flags: { path?: string[]; hash: boolean; json?: boolean }, cmd: Command) => {
      const sb = await Sandbox.connect(id, { client: clientFor(cmd.optsWithGlobals<ConnectionFlags>()) });
      const rows: string[][] = [];
      for await (const e of sb.diffEntries({ ...(flags.path ? { paths: flags.path } : {}), hash: flags.hash })) {
        if (flags.json) process.stdout.write(`${JSON.stringify(e)}\n`);
        else
          rows.push([
            e.change,
            e.type,
            e.sha256 ? e.sha256.slice(0, 12) : e.hashSkipped ? 'skipped' : '-',
            e.linkTarget ? `${e.path} -> ${e.linkTarget}` : e.path,
          ]);
      }
      if (!flags.json) printTable(['change', 'type', 'sha256', 'path'], rows);
    });

  sandbox
    .command('verify')
    .description('check that paths hold files with the given sha256 (exit 1 when one does not)')
    .argument('<id>')
    .argument('<path=sha256...>')
    .option('--json', 'print JSON')
    .action(async (id: string, pairs: string[], flags: { json?: boolean }, cmd: Command) => {
      let expected: Record<string, string> = {};
      for (const p of pairs) expected = keyValue(p, expected);
      const sb = await Sandbox.connect(id, { client: clientFor(cmd.optsWithGlobals<ConnectionFlags>()) });
      const res = await sb.verify(expected);
      if (flags.json) printJson(res);
      else
        printTable(
          ['ok', 'path', 'reason'],
          res.results.map((r) => [r.ok ? 'ok' : 'FAIL', r.path, r.reason ?? '']),
        );
      if (!res.ok) process.exitCode = 1;
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
