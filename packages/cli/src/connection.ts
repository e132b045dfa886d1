// Where the CLI finds the API and its key: flags, then the environment, then the local admin key.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { DsecClient } from '@dsec/sdk';

/** Home of a local platform when `DSEC_HOME` is not set. */
export const DEFAULT_DSEC_HOME = '/var/lib/dsec';

/** Global connection flags. */
export interface ConnectionFlags {
  apiUrl?: string;
  apiKey?: string;
}

/** The key from the flag, `$DSEC_API_KEY`, or `$DSEC_HOME/admin.key` when readable. */
export function resolveApiKey(flags: ConnectionFlags, env: NodeJS.ProcessEnv = process.env): string | undefined {
  if (flags.apiKey) return flags.apiKey;
  if (env.DSEC_API_KEY) return env.DSEC_API_KEY;
  const file = path.join(env.DSEC_HOME || DEFAULT_DSEC_HOME, 'admin.key');
  try {
    return readFileSync(file, 'utf8').trim() || undefined;
  } catch {
    return undefined;
  }
}

/** A client for the global flags. */
export function clientFor(flags: ConnectionFlags): DsecClient {
  const apiKey = resolveApiKey(flags);
  return new DsecClient({ ...(flags.apiUrl ? { apiUrl: flags.apiUrl } : {}), ...(apiKey ? { apiKey } : {}) });
}
