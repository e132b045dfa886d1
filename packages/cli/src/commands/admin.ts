// dsec keys | projects | nodes
import type { Command } from 'commander';
import type { Role } from '@dsec/protocol';
import { clientFor } from '../connection.js';
import type { ConnectionFlags } from '../connection.js';
import { formatAge, printJson, printTable } from '../output.js';
import { number } from '../parse.js';

/** Registers `dsec keys ...`. */
export function registerKeys(program: Command): void {
  const keys = program.command('keys').description('API keys');
  keys
    .command('create')
    .description('create a key and print its secret (shown only this once)')
    .requiredOption('--name <name>', 'a name for the key')
    .requiredOption('--role <role>', 'admin, member or viewer')
    .option('--project <id>', 'project the key acts in (default: yours)')
    .option('--json', 'print the key as JSON (secret included)')
    .action(async (flags: { name: string; role: string; project?: string; json?: boolean }, cmd: Command) => {
      const client = clientFor(cmd.optsWithGlobals<ConnectionFlags>());
      const key = await client.keys.create({ name: flags.name, role: flags.role as Role, ...(flags.project ? { project: flags.project } : {}) });
      if (flags.json) return printJson(key);
      process.stderr.write(`key ${key.id} (${key.role} in ${key.project}); the secret is shown only now:\n`);
      process.stdout.write(`${key.key}\n`);
    });
  keys
    .command('ls')
    .alias('list')
    .description('list keys (no secrets)')
    .option('--json', 'print JSON')
    .action(async (flags: { json?: boolean }, cmd: Command) => {
      const items = await clientFor(cmd.optsWithGlobals<ConnectionFlags>()).keys.list();
      if (flags.json) return printJson(items);
      printTable(
        ['id', 'name', 'role', 'project', 'age', 'revoked'],
        items.map((k) => [k.id, k.name, k.role, k.project, formatAge(k.createdAt), k.revokedAt ? formatAge(k.revokedAt) + ' ago' : '-']),
      );
    });
  keys
    .command('revoke')
    .description('revoke a key')
    .argument('<id>')
    .action(async (id: string, _flags: object, cmd: Command) => {
      await clientFor(cmd.optsWithGlobals<ConnectionFlags>()).keys.revoke(id);
    });
}

/** Registers `dsec projects ...`. */
export function registerProjects(program: Command): void {
  const projects = program.command('projects').description('projects and quotas');
  projects
    .command('create')
    .description('create a sub-project and print its id')
    .argument('<name>')
    .option('--parent <id>', 'parent project (default: yours)')
    .option('--sandboxes <n>', 'quota: sandboxes', number(true))
    .option('--cpu <cores>', 'quota: CPU cores', number(false))
    .option('--memory <MiB>', 'quota: memory in MiB', number(true))
    .option('--json', 'print JSON')
    .action(async (name: string, flags: { parent?: string; sandboxes?: number; cpu?: number; memory?: number; json?: boolean }, cmd: Command) => {
      const quota = {
        ...(flags.sandboxes !== undefined ? { sandboxes: flags.sandboxes } : {}),
        ...(flags.cpu !== undefined ? { cpu: flags.cpu } : {}),
        ...(flags.memory !== undefined ? { memoryMiB: flags.memory } : {}),
      };
      const project = await clientFor(cmd.optsWithGlobals<ConnectionFlags>()).projects.create({
        name,
        ...(flags.parent ? { parent: flags.parent } : {}),
        ...(Object.keys(quota).length ? { quota } : {}),
      });
      if (flags.json) printJson(project);
      else process.stdout.write(`${project.id}\n`);
    });
  projects
    .command('ls')
    .alias('list')
    .description('list your project and its descendants, with quota and usage')
    .option('--json', 'print JSON')
    .action(async (flags: { json?: boolean }, cmd: Command) => {
      const items = await clientFor(cmd.optsWithGlobals<ConnectionFlags>()).projects.list();
      if (flags.json) return printJson(items);
      printTable(
        ['id', 'name', 'parent', 'sandboxes', 'cpu', 'memory'],
        items.map((p) => [
          p.id,
          p.name,
          p.parent ?? '-',
          `${p.usage.sandboxes}/${p.quota.sandboxes}`,
          `${p.usage.cpu}/${p.quota.cpu}`,
          `${p.usage.memoryMiB}/${p.quota.memoryMiB}Mi`,
        ]),
      );
    });
}

/** Registers `dsec nodes`. */
export function registerNodes(program: Command): void {
  program
    .command('nodes')
    .description('list nodes with capacity and allocation')
    .option('--json', 'print JSON')
    .action(async (flags: { json?: boolean }, cmd: Command) => {
      const items = await clientFor(cmd.optsWithGlobals<ConnectionFlags>()).nodes.list();
      if (flags.json) return printJson(items);
      printTable(
        ['name', 'healthy', 'backends', 'sandboxes', 'cpu', 'memory'],
        items.map((n) => [
          n.name,
          n.healthy ? 'yes' : 'no',
          n.backends.join(','),
          `${n.allocated.sandboxes}/${n.capacity.sandboxes}`,
          `${n.allocated.cpu}/${n.allocatable.cpu}`,
          `${n.allocated.memoryMiB}/${n.allocatable.memoryMiB}Mi`,
        ]),
      );
    });
}
