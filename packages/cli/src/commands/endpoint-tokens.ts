// dsec endpoint-tokens: revocable tokens in URL paths, for clients that send no headers (verl's
// SandboxFusion client): `create` prints the URL path to give such a client.
import type { Command } from 'commander';
import { clientFor } from '../connection.js';
import type { ConnectionFlags } from '../connection.js';
import type { CredentialRow } from '../output.js';
import { printCredentials, printJson } from '../output.js';

interface EndpointToken extends CredentialRow {
  protocol: string;
  token?: string;
  path?: string;
}

/** Registers `dsec endpoint-tokens ...`. */
export function registerEndpointTokens(program: Command): void {
  const tokens = program.command('endpoint-tokens').description('tokens in URL paths for clients without headers (SandboxFusion)');
  tokens
    .command('create')
    .description('create a token and print the run_code URL that carries it (shown only this once)')
    .requiredOption('--name <name>', 'a name for the token')
    .option('--project <id>', 'project the token acts in (default: yours)')
    .option('--json', 'print the token as JSON (secret included)')
    .action(async (flags: { name: string; project?: string; json?: boolean }, cmd: Command) => {
      const client = clientFor(cmd.optsWithGlobals<ConnectionFlags>());
      const body = { name: flags.name, protocol: 'sandboxfusion', ...(flags.project ? { project: flags.project } : {}) };
      const t = await client.json<EndpointToken>({ method: 'POST', path: '/v1/endpoint-tokens', body });
      if (flags.json) return printJson(t);
      process.stderr.write(`endpoint token ${t.id} (member in ${t.project}); its URL is shown only now:\n`);
      process.stdout.write(`${client.target.apiUrl.origin}${t.path}/run_code\n`);
    });
  tokens
    .command('ls')
    .alias('list')
    .description('list endpoint tokens (no secrets)')
    .option('--json', 'print JSON')
    .action(async (flags: { json?: boolean }, cmd: Command) => {
      const { items } = await clientFor(cmd.optsWithGlobals<ConnectionFlags>()).json<{ items: EndpointToken[] }>({
        method: 'GET',
        path: '/v1/endpoint-tokens',
      });
      if (flags.json) return printJson(items);
      printCredentials({ header: 'protocol', of: (t) => t.protocol }, items);
    });
  tokens
    .command('revoke')
    .description('revoke an endpoint token (its URL stops working)')
    .argument('<id>')
    .action(async (id: string, _flags: object, cmd: Command) => {
      await clientFor(cmd.optsWithGlobals<ConnectionFlags>()).request({ method: 'DELETE', path: `/v1/endpoint-tokens/${encodeURIComponent(id)}` });
    });
}
