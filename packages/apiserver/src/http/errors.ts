// The one place where errors become HTTP responses.
import { toDsecError } from '../errors.js';

export { publicError, toDsecError } from '../errors.js';

/** HTTP response of an error: JSON body, status of its code, Retry-After when it applies. */
export function errorResponse(err: unknown, log?: (line: string) => void): Response {
  const e = toDsecError(err, log);
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  const retry = e.details.retryAfterMs;
  if (typeof retry === 'number') headers['retry-after'] = String(Math.max(1, Math.ceil(retry / 1000)));
  return new Response(JSON.stringify(e.toJSON()), { status: e.status, headers });
}
