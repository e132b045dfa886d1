// dsec call: run a snippet once in a fresh sandbox; prints its output, exits with its exit code.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import type { Command } from 'commander';
import { InvalidArgumentError } from 'commander';
import type { CallRequest } from '@dsec/sdk';
import { clientFor } from '../connection.js';
import type { ConnectionFlags } from '../connection.js';
import { keyValue, number, repeated } from '../parse.js';
import { exitCodeOf } from './exec.js';

/** How each runtime runs a file when neither -c nor a command is given. */
const INTERPRETERS: Record<string, string> = { sh: '/bin/sh', bash: 'bash', python3: 'python3', node: 'node' };

interface CallFlags {
  runtime?: string;
  image?: string;
  toolkit?: string[];
  code?: string;
  file?: string[];
  stdin?: boolean;
  env?: Record<string, string>;
  timeout?: number;
  memory?: number;
  outputLimit?: number;
  json?: boolean;
}

/** `[dest=]local`: the file's content under /work/dest (default: its base name). */
function readCallFile(spec: string): [string, string] {
  const eq = spec.indexOf('=');
  const [dest, local] = eq > 0 ? [spec.slice(0, eq), spec.slice(eq + 1)] : [path.basename(spec), spec];
  return [dest, readFileSync(local, 'utf8')];
}

/** Registers `dsec call`. */
export function registerCall(program: Command): void {
  program
    .command('call')
    .description('run code once in a fresh, stateless sandbox; exits with its exit code (128+signal when killed)')
    .argument('[argv...]', 'command to run instead of -c (after --)')
    .option('--runtime <name>', 'runtime: sh, bash, python3, node, c, cpp, go or java (c, cpp, go, java compile -c code first)')
    .option('--image <base>', 'base layer instead of a runtime')
    .option('--toolkit <layer>', 'toolkit layer on top of --image (repeatable)', repeated)
    .option('-c, --code <code>', 'source text for the runtime')
    .option('--file <[dest=]path>', 'local file written to /work/dest before the call (repeatable)', repeated)
    .option('--stdin', "send this process's stdin to the call")
    .option('--env <K=V>', 'environment variable (repeatable)', keyValue)
    .option('--timeout <ms>', 'time limit of the call', number(true))
    .option('--memory <MiB>', 'memory limit of the call', number(true))
    .option('--output-limit <bytes>', 'cap on stdout and stderr (each)', number(true))
    .option('--json', 'print the whole result as JSON')
    .action(async (rawArgv: string[], flags: CallFlags, cmd: Command) => {
      const argv = rawArgv[0] === '--' ? rawArgv.slice(1) : rawArgv;
      if ((flags.runtime === undefined) === (flags.image === undefined)) throw new InvalidArgumentError('give exactly one of --runtime or --image');
      const files = Object.fromEntries((flags.file ?? []).map(readCallFile));
      const req: CallRequest = {};
      if (flags.runtime !== undefined) req.runtime = flags.runtime as NonNullable<CallRequest['runtime']>;
      if (flags.image !== undefined) req.image = { base: flags.image, ...(flags.toolkit ? { toolkits: flags.toolkit } : {}) };
      if (flags.code !== undefined) req.code = flags.code;
      else if (argv.length > 0) req.argv = argv;
      else {
        const first = Object.keys(files)[0];
        const interpreter = flags.runtime !== undefined ? INTERPRETERS[flags.runtime] : '/bin/sh';
        if (first === undefined || interpreter === undefined) throw new InvalidArgumentError('give -c <code>, a command after --, or a --file to run');
        req.argv = [interpreter, first];
      }
      if (Object.keys(files).length > 0) req.files = files;
      if (flags.stdin) {
        const chunks: Buffer[] = [];
        for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
        req.stdin = Buffer.concat(chunks).toString('utf8');
      }
      if (flags.env) req.env = flags.env;
      if (flags.timeout !== undefined) req.timeoutMs = flags.timeout;
      if (flags.memory !== undefined) req.memoryMiB = flags.memory;
      if (flags.outputLimit !== undefined) req.outputLimitBytes = flags.outputLimit;
      const result = await clientFor(cmd.optsWithGlobals<ConnectionFlags>()).calls.run(req);
      const compile = result.compile;
      if (flags.json) process.stdout.write(JSON.stringify(result, null, 2) + '\n');
      else if (compile && compile.exitCode !== 0) {
        // The compile step failed: nothing ran; its output and status are the call's.
        process.stdout.write(compile.stdout);
        process.stderr.write(compile.stderr);
        process.stderr.write(compile.timedOut ? 'dsec: compile timed out\n' : 'dsec: compile failed\n');
      } else {
        process.stdout.write(result.stdout);
        process.stderr.write(result.stderr);
        if (result.timedOut) process.stderr.write('dsec: call timed out\n');
        if (result.oomKilled) process.stderr.write('dsec: call ran out of memory\n');
        if (result.truncated) process.stderr.write('dsec: output truncated at the limit\n');
      }
      process.exitCode = exitCodeOf(compile && compile.exitCode !== 0 ? compile : result);
    });
}
