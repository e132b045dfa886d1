// dsec db copy: moves the state of a one-machine home (SQLite) into the PostgreSQL database of a
// cluster, before its replicas start.
import type { Command } from 'commander';
import { ConfigError } from '../config.js';

/** Registers `dsec db`. */
export function registerDb(program: Command): void {
  const db = program.command('db').description('the state store');
  db.command('copy')
    .description("copy a home's SQLite state into an empty PostgreSQL database (both migrated to this release first)")
    .requiredOption('--from <file>', 'SQLite state file of a home ($DSEC_HOME/dsec.db)')
    .requiredOption('--to <url>', 'postgres:// URL of an empty database')
    .action(async (flags: { from: string; to: string }) => {
      const { copySqliteToPostgres, isPostgresUrl, redactUrl } = await import('@dsec/apiserver');
      if (!isPostgresUrl(flags.to)) throw new ConfigError(`db copy: --to: ${redactUrl(flags.to)} is not a postgres:// URL`);
      const report = await copySqliteToPostgres(flags.from, flags.to, (line) => process.stderr.write(`${line}\n`));
      const total = Object.values(report).reduce((a, b) => a + b, 0);
      process.stdout.write(`copied ${total} rows from ${flags.from} to ${redactUrl(flags.to)}\n`);
    });
}
