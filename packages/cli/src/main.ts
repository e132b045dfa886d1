#!/usr/bin/env node
// dsec: the command line of the dsec sandbox platform.
import { Command, CommanderError } from 'commander';
import { isDsecError } from '@dsec/sdk';
import { ConfigError } from './config.js';
import { registerKeys, registerNodes, registerProjects } from './commands/admin.js';
import { registerCall } from './commands/call.js';
import { registerCp } from './commands/cp.js';
import { registerDb } from './commands/db.js';
import { registerEdge } from './commands/edge.js';
import { registerEndpointTokens } from './commands/endpoint-tokens.js';
import { registerExec } from './commands/exec.js';
import { registerImage } from './commands/image.js';
import { registerPools } from './commands/pools.js';
import { registerNetwork } from './commands/network.js';
import { registerSandbox } from './commands/sandbox.js';
import { registerUp } from './commands/up.js';

/** Exit status of a usage error (bad flag, missing argument). */
export const EXIT_USAGE = 2;
/** Exit status of a failed request. */
export const EXIT_FAILURE = 1;

/** The whole command tree. */
export function buildProgram(): Command {
  const program = new Command('dsec')
    .description('dsec: disposable, isolated Linux sandboxes for training and evaluating AI agents')
    .version('0.1.0')
    .option('--api-url <url>', 'API URL (default $DSEC_API_URL or http://127.0.0.1:7878)')
    .option('--api-key <key>', 'API key (default $DSEC_API_KEY, else $DSEC_HOME/admin.key)')
    .showHelpAfterError('(run with --help for usage)')
    .enablePositionalOptions()
    .exitOverride()
    .configureOutput({ outputError: (text, write) => write(`dsec: ${text.replace(/^error: /, '')}`) });
  registerUp(program);
  registerEdge(program);
  registerSandbox(program);
  registerNetwork(program);
  registerExec(program);
  registerCall(program);
  registerCp(program);
  registerImage(program);
  registerPools(program);
  registerEndpointTokens(program);
  registerKeys(program);
  registerProjects(program);
  registerNodes(program);
  registerDb(program);
  for (const cmd of program.commands) {
    cmd.exitOverride();
    for (const sub of cmd.commands) sub.exitOverride();
  }
  return program;
}

/** Runs the CLI with `argv` (process.argv form) and returns the exit status. */
export async function main(argv: string[]): Promise<number> {
  try {
    await buildProgram().parseAsync(argv);
    return typeof process.exitCode === 'number' ? process.exitCode : 0;
  } catch (err) {
    if (err instanceof CommanderError) {
      if (err.code === 'commander.helpDisplayed' || err.code === 'commander.version' || err.code === 'commander.help') return 0;
      // Errors thrown by actions have not been printed by commander yet.
      if (err.code === 'commander.invalidArgument' && !err.message.startsWith('error:')) process.stderr.write(`dsec: ${err.message}\n`);
      return err.exitCode === 0 ? 0 : EXIT_USAGE;
    }
    if (err instanceof ConfigError) {
      process.stderr.write(`dsec: ${err.message}\n`);
      return EXIT_USAGE;
    }
    if (isDsecError(err)) {
      process.stderr.write(`dsec: ${err.code}: ${err.message}\n`);
      return EXIT_FAILURE;
    }
    const e = err as NodeJS.ErrnoException;
    process.stderr.write(`dsec: ${e.code ?? 'ERROR'}: ${e.message ?? String(err)}\n`);
    return EXIT_FAILURE;
  }
}

process.exitCode = await main(process.argv);
