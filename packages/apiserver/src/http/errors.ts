// The one place where errors become HTTP responses.
import { toDsecError } from '../errors.js';

export { publicError, toDsecError } from '../errors.js';

/** HTTP response of an error: JSON body, status of its code, Retry-After when it applies. */
export function errorResponse(err: unknown, log?: (line: string) => void): Response {
  const { status, headers, body } = errorReply(err, log);
  return new Response(body, { status, headers });
}

/** An error's reply as status, headers and JSON text (for handlers that write Node's response themselves). */
export function errorReply(err: unknown, log?: (line: string) => void): { status: number; headers: Record<string, string>; body: string } {
  const e = toDsecError(err, log);
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  const retry = e.details.retryAfterMs;
  if (typeof retry === 'number') headers['retry-after'] = String(Math.max(1, Math.ceil(retry / 1000)));
  return { status: e.status, headers, body: JSON.stringify(e.toJSON()) };
}
