// dsec edge --join: a node on this machine that joins a control plane elsewhere (docs/deploy.md).
import { hostname } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Command } from 'commander';
import { DEFAULT_RUNTIME_CACHE } from '@dsec/protocol';
import { repeated } from '../parse.js';

/** Name of the built-in base layer every node builds for itself (the same bytes, the same digest). */
const BUILTIN_BASE = 'busybox';

function defaultAgentBinary(): string {
  return path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../../chronus/build/chronus');
}

interface EdgeFlags {
  join: string;
  token?: string;
  name?: string;
  home?: string;
  agent?: string;
  networkPool?: string;
  nameserver?: string[];
  userns?: boolean;
  runtimeCache?: string;
  quiet?: boolean;
  clean?: boolean;
}

/** Registers `dsec edge`. */
export function registerEdge(program: Command): void {
  program
    .command('edge')
    .description('run a node on this machine that joins the control plane at --join, until SIGINT/SIGTERM')
    .requiredOption('--join <url>', "the control plane's node port, https://host:port (dsec up --node-addr)")
    .option('--token <token>', 'a join token (dsec nodes join-token); needed only on the first start')
    .option('--name <name>', 'node name, lowercase letters, digits and - (default: the host name)')
    .option('--home <dir>', 'state directory of this node (default $DSEC_HOME or /var/lib/dsec)')
    .option('--agent <path>', 'chronus binary (default $DSEC_AGENT, else the one built in this checkout)')
    .option('--network-pool <cidr>', 'IPv4 range of sandbox addresses (default $DSEC_NETWORK_POOL)')
    .option('--nameserver <ip>', "resolver for sandboxes, repeatable (default the host's)", repeated)
    .option('--no-userns', 'run container sandboxes without a user namespace of their own')
    .option(
      '--runtime-cache <dir>',
      `machine-wide cache of built layers (function-call runtimes, E2B's base), shared with dsec up on this machine (default $DSEC_RUNTIME_CACHE or ${DEFAULT_RUNTIME_CACHE})`,
    )
    .option('-q, --quiet', 'do not print the node log')
    .option('--clean', 'on stop, destroy every sandbox of this node and leave nothing of it behind')
    .action(async (flags: EdgeFlags) => {
      const { Edge, NodeAgent, nodeNameOf } = await import('@dsec/edge');
      const log = flags.quiet ? () => undefined : (line: string) => process.stderr.write(`${line}\n`);
      const name = nodeNameOf(flags.name ?? hostname());
      const home = path.resolve(flags.home ?? process.env.DSEC_HOME ?? '/var/lib/dsec');
      const pool = flags.networkPool ?? process.env.DSEC_NETWORK_POOL;
      const edge = await Edge.open({
        home,
        nodeName: name,
        // Host objects carry the node's name: several nodes on one host never touch each other's.
        cgroupParent: `dsec-${name}`,
        agentBinary: flags.agent ?? process.env.DSEC_AGENT ?? defaultAgentBinary(),
        userNamespaces: flags.userns !== false,
        network: { ...(pool ? { pool } : {}), ...(flags.nameserver?.length ? { nameservers: flags.nameserver } : {}) },
        // As the platform's own node: `base` and runtime layers built once per machine, not per store.
        machineCacheDir: path.resolve(flags.runtimeCache ?? process.env.DSEC_RUNTIME_CACHE ?? DEFAULT_RUNTIME_CACHE),
      });
      let agent: Awaited<ReturnType<typeof NodeAgent.start>> | undefined;
      try {
        if (!(await edge.layers.resolve(BUILTIN_BASE).catch(() => undefined))) {
          log(`edge: building the built-in ${BUILTIN_BASE} base layer`);
          await edge.layers.build({ type: 'busybox' }, { kind: 'base', name: BUILTIN_BASE });
        }
        agent = await NodeAgent.start({ edge, url: flags.join, home, name, ...(flags.token ? { token: flags.token } : {}), log });
        await Promise.race([agent.ready, agent.done]);
        const refused = agent.done.then(
          () => undefined,
          (err: unknown) => (err instanceof Error ? err : new Error(String(err))),
        );
        const stopped = new Promise<undefined>((resolve) => {
          const stop = (sig: NodeJS.Signals): void => {
            process.stderr.write(`dsec edge: ${sig}, stopping\n`);
            process.off('SIGINT', stop);
            process.off('SIGTERM', stop);
            resolve(undefined);
          };
          process.on('SIGINT', stop);
          process.on('SIGTERM', stop);
        });
        // Said once the signals are listened for: whoever reads it may signal at once.
        process.stdout.write(`node ${name} joined ${flags.join}\n`);
        const err = await Promise.race([refused, stopped]);
        if (err) throw err;
      } finally {
        await agent?.close();
        if (flags.clean) await edge.shutdown();
        else await edge.close();
      }
    });
}
