// dsec pools put | ls | get | rm
import type { Command } from 'commander';
import type { PoolInfo } from '@dsec/sdk';
import { clientFor } from '../connection.js';
import type { ConnectionFlags } from '../connection.js';
import { formatAge, printJson, printTable } from '../output.js';
import { number } from '../parse.js';
import { specOf, withSpecFlags } from './sandbox.js';
import type { SpecFlags } from './sandbox.js';

function imageText(p: PoolInfo): string {
  const image = p.spec.image;
  if (!image) return `snapshot ${p.spec.snapshot ?? '?'}`;
  return [image.base, image.workspace, ...(image.toolkits ?? [])].filter(Boolean).join('+');
}

/** Registers `dsec pools ...`. */
export function registerPools(program: Command): void {
  const pools = program.command('pools').alias('pool').description('warm pools: sandboxes kept ready for creates of the same spec');

  withSpecFlags(pools.command('put').description('create or resize a pool').argument('<name>'))
    .requiredOption('--size <n>', 'sandboxes kept ready (they count against the quota)', number(true))
    .option('--idle-timeout <ms>', 'drop the ready sandboxes after this long without a claim', number(true))
    .option('--json', 'print the pool as JSON')
    .action(async (name: string, flags: SpecFlags & { size: number; idleTimeout?: number; json?: boolean }, cmd: Command) => {
      const client = clientFor(cmd.optsWithGlobals<ConnectionFlags>());
      const pool = await client.pools.put(name, {
        spec: specOf(flags),
        size: flags.size,
        ...(flags.idleTimeout !== undefined ? { idleTimeoutMs: flags.idleTimeout } : {}),
      });
      if (flags.json) printJson(pool);
      else process.stdout.write(`${pool.name}\n`);
    });

  pools
    .command('ls')
    .alias('list')
    .description('list pools')
    .option('--json', 'print JSON')
    .action(async (flags: { json?: boolean }, cmd: Command) => {
      const items = await clientFor(cmd.optsWithGlobals<ConnectionFlags>()).pools.list();
      if (flags.json) return printJson(items);
      printTable(
        ['name', 'project', 'image', 'size', 'ready', 'creating', 'idle', 'last used'],
        items.map((p) => [
          p.name,
          p.project,
          imageText(p),
          String(p.size),
          String(p.ready),
          String(p.creating),
          p.idle ? 'yes' : 'no',
          formatAge(p.lastUsedAt) + ' ago',
        ]),
      );
    });

  pools
    .command('get')
    .description('show one pool')
    .argument('<name>')
    .option('--json', 'print JSON')
    .action(async (name: string, flags: { json?: boolean }, cmd: Command) => {
      const p = await clientFor(cmd.optsWithGlobals<ConnectionFlags>()).pools.get(name);
      if (flags.json) return printJson(p);
      const r = p.spec.resources ?? {};
      const rows: Array<[string, string]> = [
        ['name', p.name],
        ['project', p.project],
        ['image', imageText(p)],
        ['resources', `cpu ${r.cpu ?? 'default'}, memory ${r.memoryMiB ?? 'default'}, disk ${r.diskMiB ?? 'default'}`],
        ['size', String(p.size)],
        ['ready', String(p.ready)],
        ['creating', String(p.creating)],
        ['idle', `${p.idle ? 'yes' : 'no'} (timeout ${p.idleTimeoutMs} ms)`],
        ['last used', p.lastUsedAt],
        ['last error', p.lastError ?? '-'],
      ];
      for (const [k, v] of rows) process.stdout.write(`${`${k}:`.padEnd(12)}${v}\n`);
    });

  pools
    .command('rm')
    .alias('delete')
    .description('delete pools and their ready sandboxes')
    .argument('<name...>')
    .action(async (names: string[], _flags: object, cmd: Command) => {
      const client = clientFor(cmd.optsWithGlobals<ConnectionFlags>());
      for (const name of names) {
        await client.pools.delete(name);
        process.stdout.write(`${name}\n`);
      }
    });
}
