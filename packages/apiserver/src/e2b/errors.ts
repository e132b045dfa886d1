// E2B-shaped errors: the control plane and envd's REST answer `{code, message}` with the HTTP
// status as `code`; envd's Connect-RPC answers `{code: "<connect code>", message}`.
import type { DsecError } from '@dsec/protocol';
import { toDsecError } from '../http/errors.js';

/** An error with an E2B status of its own (409 already paused, 503 template not ready, 502 not running). */
export class E2bError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly retryAfterS?: number,
    readonly extra: Record<string, unknown> = {},
  ) {
    super(message);
  }
}

/** The control plane's and envd REST's error response (`{code: <status>, message}`). */
export function e2bErrorResponse(err: unknown, log?: (line: string) => void): Response {
  if (err instanceof E2bError) {
    const headers: Record<string, string> = { 'content-type': 'application/json' };
    if (err.retryAfterS !== undefined) headers['retry-after'] = String(err.retryAfterS);
    return new Response(JSON.stringify({ code: err.status, message: err.message, ...err.extra }), { status: err.status, headers });
  }
  const e = toDsecError(err, log);
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  const retry = e.details.retryAfterMs;
  if (typeof retry === 'number') headers['retry-after'] = String(Math.max(1, Math.ceil(retry / 1000)));
  // E2B's SDK reads 409 as "already paused" and 404 as "not found"; dsec's codes map onto them.
  return new Response(JSON.stringify({ code: e.status, message: e.message }), { status: e.status, headers });
}

/** The Connect code of a dsec error (https://connectrpc.com/docs/protocol#error-codes). */
export function connectCode(e: DsecError): string {
  switch (e.code) {
    case 'INVALID_ARGUMENT':
    case 'PAYLOAD_TOO_LARGE':
      return 'invalid_argument';
    case 'UNAUTHENTICATED':
      return 'unauthenticated';
    case 'PERMISSION_DENIED':
      return 'permission_denied';
    case 'SANDBOX_NOT_FOUND':
    case 'PROCESS_NOT_FOUND':
    case 'FILE_NOT_FOUND':
    case 'NOT_FOUND':
    case 'LAYER_NOT_FOUND':
      return 'not_found';
    case 'CONFLICT':
      return e.details.errno === 'EEXIST' ? 'already_exists' : 'failed_precondition';
    case 'SANDBOX_NOT_RUNNING':
    case 'UNAVAILABLE':
    case 'CAPACITY_EXHAUSTED':
      return 'unavailable';
    case 'RATE_LIMITED':
    case 'LIMIT_EXCEEDED':
    case 'QUOTA_EXCEEDED':
    case 'ADMISSION_QUEUE_FULL':
      return 'resource_exhausted';
    case 'TIMEOUT':
      return 'deadline_exceeded';
    case 'CANCELLED':
      return 'canceled';
    default:
      return 'internal';
  }
}

/** HTTP status of a Connect code (the Connect protocol's table). */
export const CONNECT_STATUS: Record<string, number> = {
  canceled: 499,
  unknown: 500,
  invalid_argument: 400,
  deadline_exceeded: 504,
  not_found: 404,
  already_exists: 409,
  permission_denied: 403,
  resource_exhausted: 429,
  failed_precondition: 400,
  aborted: 409,
  out_of_range: 400,
  unimplemented: 501,
  internal: 500,
  unavailable: 503,
  data_loss: 500,
  unauthenticated: 401,
};

/** An error with an explicit Connect code (e.g. `already_exists`, `deadline_exceeded`). */
export class ConnectError extends Error {
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

/** `{code, message}` of any error as Connect sends it. */
export function connectErrorBody(err: unknown, log?: (line: string) => void): { code: string; message: string } {
  if (err instanceof ConnectError) return { code: err.code, message: err.message };
  const e = toDsecError(err, log);
  return { code: connectCode(e), message: e.message };
}
