// dsec exec: run a command in a sandbox, streaming its output, exiting with its exit code.
import { constants } from 'node:os';
import type { Command } from 'commander';
import { InvalidArgumentError } from 'commander';
import { Sandbox } from '@dsec/sdk';
import type { ExecHandle, ExitInfo } from '@dsec/sdk';
import { clientFor } from '../connection.js';
import type { ConnectionFlags } from '../connection.js';
import { keyValue, number } from '../parse.js';

/** The shell convention: the exit code, or 128 + the signal's number. */
export function exitCodeOf(exit: Pick<ExitInfo, 'exitCode' | 'signal'>): number {
  if (exit.exitCode !== null) return exit.exitCode;
  const signum = exit.signal ? (constants.signals as Record<string, number>)[exit.signal] : undefined;
  return 128 + (signum ?? 9);
}

/** Writes a chunk and waits for the stream to take it (so that big outputs do not pile up). */
function writeOut(stream: NodeJS.WriteStream, data: Buffer): Promise<void> | undefined {
  if (stream.write(data)) return undefined;
  return new Promise((resolve) => stream.once('drain', resolve));
}

async function forwardStdin(handle: ExecHandle, done: Promise<unknown>): Promise<void> {
  const stdin = process.stdin;
  const finished = done.then(() => 'done' as const);
  const it = stdin[Symbol.asyncIterator]();
  for (;;) {
    const next = await Promise.race([it.next(), finished]);
    if (next === 'done') break;
    if (next.done) {
      await handle.closeStdin().catch(() => undefined);
      return;
    }
    await handle.writeStdin(next.value as Buffer);
  }
  stdin.destroy();
}

/** Registers `dsec exec`. */
export function registerExec(program: Command): void {
  program
    .command('exec')
    .description('run a command in a sandbox; exits with its exit code (128+signal when killed)')
    .argument('<id>', 'sandbox id')
    .argument('<cmd...>', 'command and arguments (after --)')
    .option('--cwd <dir>', 'working directory')
    .option('--env <K=V>', 'environment variable (repeatable)', keyValue)
    .option('--timeout <ms>', 'kill the command after this long', number(true))
    .option('-i, --interactive', "forward this process's stdin")
    .option('-t, --tty', 'run under a terminal (with -i, when stdin is a terminal)')
    .action(
      async (
        id: string,
        rawArgv: string[],
        flags: { cwd?: string; env?: Record<string, string>; timeout?: number; interactive?: boolean; tty?: boolean },
        cmd: Command,
      ) => {
        // Defensive: a `--` left in the operands is the end of dsec's options, not the command.
        const argv = rawArgv[0] === '--' ? rawArgv.slice(1) : rawArgv;
        if (argv.length === 0) throw new InvalidArgumentError('missing the command to run');
        const client = clientFor(cmd.optsWithGlobals<ConnectionFlags>());
        const sandbox = await Sandbox.connect(id, { client });
        const tty = Boolean(flags.tty && process.stdin.isTTY && process.stdout.isTTY);
        const handle = await sandbox.spawn(argv, {
          ...(flags.cwd ? { cwd: flags.cwd } : {}),
          // A terminal program needs to know the terminal, as with ssh and docker exec -t.
          ...(flags.env || tty ? { env: { ...(tty ? { TERM: process.env.TERM || 'xterm' } : {}), ...flags.env } } : {}),
          ...(flags.timeout !== undefined ? { timeoutMs: flags.timeout } : {}),
          ...(flags.interactive ? { stdin: true } : {}),
          ...(tty ? { pty: { rows: process.stdout.rows || 24, cols: process.stdout.columns || 80 } } : {}),
        });

        // Without a terminal, ^C is passed on as SIGINT (a terminal passes it as a byte itself).
        const onSigint = (): void => void handle.kill('SIGINT').catch(() => undefined);
        const onSigterm = (): void => void handle.kill('SIGTERM').catch(() => undefined);
        const onResize = (): void => void handle.resize(process.stdout.rows, process.stdout.columns).catch(() => undefined);
        process.on('SIGINT', onSigint);
        process.on('SIGTERM', onSigterm);
        if (tty) {
          process.stdin.setRawMode(true);
          process.stdout.on('resize', onResize);
        }
        try {
          const output = (async () => {
            for await (const ev of handle) {
              await writeOut(ev.stream === 'stdout' ? process.stdout : process.stderr, ev.data);
            }
          })();
          const stdin = flags.interactive ? forwardStdin(handle, output) : Promise.resolve();
          await output;
          const exit = await handle.wait();
          await stdin;
          process.exitCode = exitCodeOf(exit);
        } finally {
          process.off('SIGINT', onSigint);
          process.off('SIGTERM', onSigterm);
          if (tty) {
            process.stdin.setRawMode(false);
            process.stdout.off('resize', onResize);
          }
        }
      },
    );
}
