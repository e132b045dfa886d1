// dsec up: the whole platform (apiserver + edge + watcher) on this machine, in the foreground;
// dsec apiserver: one stateless API replica on a shared PostgreSQL store;
// dsec config: the effective operator configuration, and the schema of its file.
import type { Command } from 'commander';
import { configJsonSchema, DEFAULT_RUNTIME_CACHE, RUNTIME_LAYER_IDS } from '@dsec/protocol';
import { loadConfig, platformOptions, replicaOptions } from '../config.js';
import type { ConfigFlags } from '../config.js';
import { number, repeated } from '../parse.js';

/** The configuration flags shared by `dsec up` and `dsec config print`. */
function configOptions(cmd: Command): Command {
  return cmd
    .option('--config <file>', 'configuration file, JSON (default $DSEC_CONFIG; see docs/operations.md)')
    .option('--home <dir>', 'state directory (default $DSEC_HOME or /var/lib/dsec)')
    .option('--addr <host:port>', 'listen address (default $DSEC_ADDR or 127.0.0.1:7878)')
    .option('--agent <path>', 'chronus binary (default $DSEC_AGENT, else the one built in this checkout)')
    .option('--zram-swap <MiB>', 'swap paused sandboxes to a compressed zram device of this size (default $DSEC_ZRAM_SWAP_MIB, else none)', number(true))
    .option('--network-pool <cidr>', 'IPv4 range of sandbox addresses (default $DSEC_NETWORK_POOL)')
    .option('--nameserver <ip>', "resolver for sandboxes, repeatable (default $DSEC_NAMESERVERS, comma-separated, else the host's)", repeated)
    .option(
      '--allow-private-range <cidr>',
      'IPv4 range (private, loopback, link-local...) that allowed names may resolve to, repeatable (default $DSEC_ALLOWED_PRIVATE_RANGES, comma-separated, else none)',
      repeated,
    )
    .option('--limit <name=value>', 'a tenant limit, repeatable (default $DSEC_LIMIT_<NAME>; see docs/security.md)', repeated)
    .option('--userns', 'run each container sandbox in a user namespace of its own (the default; $DSEC_USERNS=0 turns it off)')
    .option('--no-userns', 'run container sandboxes without a user namespace of their own (root inside is root on the host)')
    .option('--db <url>', 'PostgreSQL URL of a state store shared with API replicas (default $DSEC_DB, else SQLite in the home)')
    .option('--trusted-proxy <addr|cidr>', 'reverse proxy whose X-Forwarded-For is believed, repeatable (default $DSEC_TRUSTED_PROXIES)', repeated)
    .option('--node-addr <host:port>', 'take nodes on other machines on this node port, mutual TLS (default $DSEC_NODE_ADDR, else none; docs/deploy.md)');
}

/**
 * Waits for SIGINT or SIGTERM, listening from the call on (a process without a listener dies of
 * the signal at once, so call it before saying the process is ready).
 */
function untilSignal(): Promise<void> {
  return new Promise<void>((resolve) => {
    const stop = (sig: NodeJS.Signals): void => {
      process.stderr.write(`dsec: ${sig}, shutting down\n`);
      process.off('SIGINT', stop);
      process.off('SIGTERM', stop);
      resolve();
    };
    process.on('SIGINT', stop);
    process.on('SIGTERM', stop);
  });
}

type RuntimeLayerId = (typeof RUNTIME_LAYER_IDS)[number];

/** The function-call options of `dsec up`: the configuration's, except that `--no-prebuild`
 * (`prebuild` false) builds nothing at start whatever the configuration's `prebuild` says. */
export function upCalls(
  calls: { runtimeCache?: string | undefined; prebuild?: RuntimeLayerId[] | undefined } | undefined,
  prebuild: boolean,
): { runtimeCache: string; prebuild: RuntimeLayerId[] } {
  return {
    runtimeCache: calls?.runtimeCache ?? DEFAULT_RUNTIME_CACHE,
    prebuild: prebuild ? (calls?.prebuild ?? [...RUNTIME_LAYER_IDS]) : [],
  };
}

/** Registers `dsec up` and `dsec config`. */
export function registerUp(program: Command): void {
  configOptions(program.command('up'))
    .description('run dsec on this machine (API, edge and watcher) until SIGINT/SIGTERM')
    .option('-q, --quiet', 'do not print the server log')
    .option('--clean', 'on stop, destroy every sandbox and leave no mount, cgroup or namespace of the node behind')
    .option('--no-e2b-base', 'do not build the E2B `base` template at start (it is then built on first use; docs/e2b.md)')
    .option(
      '--no-prebuild',
      'build nothing in the background at start (the E2B `base` template, the function-call runtimes): each is built when first asked for',
    )
    .action(async (flags: ConfigFlags & { quiet?: boolean; clean?: boolean; e2bBase?: boolean; prebuild?: boolean }) => {
      const { config } = await loadConfig({ flags });
      // Loaded here so that the other commands never load the server.
      const { startPlatform } = await import('@dsec/apiserver');
      const log = flags.quiet ? () => undefined : (line: string) => process.stderr.write(`${line}\n`);
      const opts = platformOptions(config);
      // dsec up builds the fncall language runtimes in the background into the machine-wide cache (docs/integrations.md).
      const prebuild = flags.prebuild !== false;
      const calls = upCalls(opts.calls, prebuild);
      const platform = await startPlatform({ ...opts, calls, e2b: { ...opts.e2b, buildBase: prebuild && flags.e2bBase !== false }, log });
      // Listened for before the line that says it listens: whoever reads it may signal at once.
      const signalled = untilSignal();
      process.stdout.write(`dsec is listening on ${platform.url}\n`);
      if (platform.nodeUrl) process.stdout.write(`nodes join on ${platform.nodeUrl}\n`);
      if (platform.adminKey) {
        process.stdout.write(`admin key (shown once, also written to ${platform.adminKeyFile}):\n${platform.adminKey}\n`);
      } else {
        process.stdout.write(`admin key: ${platform.adminKeyFile}\n`);
      }
      await signalled;
      // --clean removes everything; a plain stop leaves running sandboxes to the next start (and
      // the edge releases the node's mounts itself when none is left).
      if (flags.clean) await platform.shutdown();
      else await platform.close();
    });

  configOptions(program.command('apiserver'))
    .description('run a stateless API replica on a shared PostgreSQL store (--db) until SIGINT/SIGTERM; any number may run')
    .option('-q, --quiet', 'do not print the server log')
    .action(async (flags: ConfigFlags & { quiet?: boolean }) => {
      const { config } = await loadConfig({ flags });
      const options = replicaOptions(config);
      const { startApiserver } = await import('@dsec/apiserver');
      const log = flags.quiet ? () => undefined : (line: string) => process.stderr.write(`${line}\n`);
      const replica = await startApiserver({ ...options, log });
      const signalled = untilSignal();
      process.stdout.write(`dsec apiserver is listening on ${replica.url}\n`);
      if (replica.nodeUrl) process.stdout.write(`nodes join on ${replica.nodeUrl}\n`);
      if (replica.adminKey) {
        process.stdout.write(`admin key (shown once, also written to ${replica.adminKeyFile}):\n${replica.adminKey}\n`);
      }
      await signalled;
      await replica.close();
    });

  const config = program.command('config').description('the operator configuration of dsec up');
  configOptions(config.command('print'))
    .description('print the effective configuration (file, $DSEC_* variables and flags merged, defaults applied) as JSON')
    .action(async (flags: ConfigFlags) => {
      const { config: effective, sources } = await loadConfig({ flags });
      process.stderr.write(`dsec: configuration from ${sources.length > 0 ? sources.join(', ') : 'defaults only'}\n`);
      process.stdout.write(`${JSON.stringify(effective, null, 2)}\n`);
    });
  config
    .command('schema')
    .description('print the JSON Schema of the configuration file')
    .action(() => {
      process.stdout.write(`${JSON.stringify(configJsonSchema(), null, 2)}\n`);
    });
}
