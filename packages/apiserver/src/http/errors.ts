// The one place where errors become HTTP responses.
import { DsecError } from '@dsec/protocol';

/** Converts any thrown value to a DsecError (unknown errors become INTERNAL). */
export function toDsecError(err: unknown): DsecError {
  if (err instanceof DsecError) return err;
  return new DsecError('INTERNAL', 'internal error', {}, { cause: err });
}

/** HTTP response of an error: JSON body, status of its code, Retry-After when it applies. */
export function errorResponse(err: unknown, log?: (line: string) => void): Response {
  const e = toDsecError(err);
  if (e.code === 'INTERNAL') log?.(`internal error: ${(e.cause as Error | undefined)?.stack ?? e.message}`);
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  const retry = e.details.retryAfterMs;
  if (typeof retry === 'number') headers['retry-after'] = String(Math.max(1, Math.ceil(retry / 1000)));
  return new Response(JSON.stringify(e.toJSON()), { status: e.status, headers });
}
