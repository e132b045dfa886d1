// dsec up: the whole platform (apiserver + edge + watcher) on this machine, in the foreground.
import type { Command } from 'commander';
import { number } from '../parse.js';

/** Registers `dsec up`. */
export function registerUp(program: Command): void {
  program
    .command('up')
    .description('run dsec on this machine (API, edge and watcher) until SIGINT/SIGTERM')
    .option('--home <dir>', 'state directory (default $DSEC_HOME or /var/lib/dsec)')
    .option('--addr <host:port>', 'listen address (default $DSEC_ADDR or 127.0.0.1:7878)')
    .option('--zram-swap <MiB>', 'swap paused sandboxes to a compressed zram device of this size (default $DSEC_ZRAM_SWAP_MIB, else none)', number(true))
    .option('-q, --quiet', 'do not print the server log')
    .option('--no-userns', 'run container sandboxes without a user namespace of their own (root inside is root on the host)')
    .action(async (flags: { home?: string; addr?: string; quiet?: boolean; zramSwap?: number; userns: boolean }) => {
      // Loaded here so that the other commands never load the server.
      const { startPlatform } = await import('@dsec/apiserver');
      const platform = await startPlatform({
        ...(flags.home ? { home: flags.home } : {}),
        ...(flags.addr ? { addr: flags.addr } : {}),
        ...(flags.zramSwap !== undefined ? { zramSwapMiB: flags.zramSwap } : {}),
        ...(!flags.userns ? { userNamespaces: false } : {}),
        ...(flags.quiet ? { log: () => undefined } : { log: (line: string) => process.stderr.write(`${line}\n`) }),
      });
      process.stdout.write(`dsec is listening on ${platform.url}\n`);
      if (platform.adminKey) {
        process.stdout.write(`admin key (shown once, also written to ${platform.adminKeyFile}):\n${platform.adminKey}\n`);
      } else {
        process.stdout.write(`admin key: ${platform.adminKeyFile}\n`);
      }
      await new Promise<void>((resolve) => {
        const stop = (sig: NodeJS.Signals): void => {
          process.stderr.write(`dsec: ${sig}, shutting down\n`);
          process.off('SIGINT', stop);
          process.off('SIGTERM', stop);
          resolve();
        };
        process.on('SIGINT', stop);
        process.on('SIGTERM', stop);
      });
      await platform.close();
    });
}
