// dsec keys | projects | nodes
import type { Command } from 'commander';
import type { Role } from '@dsec/protocol';
import { clientFor } from '../connection.js';
import type { ConnectionFlags } from '../connection.js';
import { printCredentials, printJson, printTable } from '../output.js';
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
    .option('--e2b', 'issue the key in the form E2B clients accept (e2b_<hex>; docs/e2b.md)')
    .action(async (flags: { name: string; role: string; project?: string; json?: boolean; e2b?: boolean }, cmd: Command) => {
      const client = clientFor(cmd.optsWithGlobals<ConnectionFlags>());
      const key = await client.keys.create({
        name: flags.name,
        role: flags.role as Role,
        ...(flags.project ? { project: flags.project } : {}),
        ...(flags.e2b ? { format: 'e2b' as const } : {}),
      });
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
      printCredentials({ header: 'role', of: (k) => k.role }, items);
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

/** The node table of `dsec nodes` and `dsec nodes ls`. */
async function listNodes(flags: { json?: boolean }, cmd: Command): Promise<void> {
  const items = await clientFor(cmd.optsWithGlobals<ConnectionFlags>()).nodes.list();
  if (flags.json) return printJson(items);
  printTable(
    ['name', 'state', 'healthy', 'cordoned', 'backends', 'sandboxes', 'cpu', 'memory'],
    items.map((n) => [
      n.name,
      n.state ?? '-',
      n.healthy ? 'yes' : 'no',
      n.cordoned ? 'yes' : 'no',
      n.backends.join(','),
      // A key outside the root project gets no allocation (null): the capacity alone.
      `${n.allocated?.sandboxes ?? '-'}/${n.capacity.sandboxes}`,
      `${n.allocated?.cpu ?? '-'}/${n.allocatable?.cpu ?? n.capacity.cpu}`,
      `${n.allocated?.memoryMiB ?? '-'}/${n.allocatable?.memoryMiB ?? n.capacity.memoryMiB}Mi`,
    ]),
  );
}

/** Registers `dsec nodes [ls|get|join-token|cordon|uncordon|drain|rm]`. */
export function registerNodes(program: Command): void {
  const nodes = program
    .command('nodes')
    .description('nodes: capacity and state; join tokens, cordon, drain, rm (admin)')
    .option('--json', 'print JSON')
    .action(listNodes);
  const api = (cmd: Command) => clientFor(cmd.optsWithGlobals<ConnectionFlags>()).nodes;
  nodes.command('ls').alias('list').description('list nodes with state, capacity and allocation').option('--json', 'print JSON').action(listNodes);
  nodes
    .command('get')
    .description('one node in full (JSON)')
    .argument('<name>')
    .action(async (name: string, _f: object, cmd: Command) => printJson(await api(cmd).get(name)));
  nodes
    .command('join-token')
    .description('print a single-use token for `dsec edge --join <url> --token <token>`')
    .option('--ttl <ms>', 'lifetime of the token in ms (default one hour)', number(true))
    .option('--json', 'print JSON (id, token, expiresAt)')
    .action(async (flags: { ttl?: number; json?: boolean }, cmd: Command) => {
      const t = await api(cmd).joinToken(flags.ttl !== undefined ? { ttlMs: flags.ttl } : {});
      if (flags.json) return printJson(t);
      process.stderr.write(`join token ${t.id}, single use, expires ${t.expiresAt}:\n`);
      process.stdout.write(`${t.token}\n`);
    });
  for (const [verb, what] of [
    ['cordon', 'stop placing sandboxes on a node'],
    ['uncordon', 'place sandboxes on a node again'],
  ] as const) {
    nodes
      .command(verb)
      .description(what)
      .argument('<name>')
      .action(async (name: string, _f: object, cmd: Command) => {
        const n = verb === 'cordon' ? await api(cmd).cordon(name) : await api(cmd).uncordon(name);
        process.stderr.write(`node ${n.name}: ${n.cordoned ? 'cordoned' : 'uncordoned'}\n`);
      });
  }
  nodes
    .command('drain')
    .description('cordon a node; with --replay, recreate its sandboxes on other nodes from their trajectories')
    .argument('<name>')
    .option('--replay', 'recreate each sandbox elsewhere and destroy the original')
    .option('--json', 'print JSON')
    .action(async (name: string, flags: { replay?: boolean; json?: boolean }, cmd: Command) => {
      const r = await api(cmd).drain(name, flags.replay ? { replay: true } : {});
      if (flags.json) return printJson(r);
      for (const m of r.replayed) process.stdout.write(`${m.from} -> ${m.to}\n`);
      for (const f of r.failed) process.stderr.write(`${f.sandboxId}: ${f.error}\n`);
      process.stderr.write(`node ${r.node}: drained (${r.replayed.length} replayed, ${r.failed.length} failed)\n`);
      if (r.failed.length > 0) process.exitCode = 1;
    });
  nodes
    .command('rm')
    .alias('remove')
    .description('remove a joined node: revoke its certificate; its sandboxes are lost (or replayed)')
    .argument('<name>')
    .action(async (name: string, _f: object, cmd: Command) => {
      await api(cmd).remove(name);
      process.stderr.write(`node ${name}: removed\n`);
    });
}
