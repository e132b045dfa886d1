/** Stable error codes shared by every dsec component; each maps to one HTTP status. */
export const ERROR_STATUS = {
  INVALID_ARGUMENT: 400,
  UNAUTHENTICATED: 401,
  PERMISSION_DENIED: 403,
  SANDBOX_NOT_FOUND: 404,
  LAYER_NOT_FOUND: 404,
  PROCESS_NOT_FOUND: 404,
  FILE_NOT_FOUND: 404,
  NOT_FOUND: 404,
  CONFLICT: 409,
  /** A replay of a trajectory whose recording a byte budget cut short (docs/security.md, "Tenants and crashes"). */
  TRAJECTORY_TRUNCATED: 409,
  SANDBOX_NOT_RUNNING: 409,
  PAYLOAD_TOO_LARGE: 413,
  LAYER_INVALID: 422,
  IDEMPOTENCY_KEY_REUSED: 422,
  QUOTA_EXCEEDED: 429,
  RATE_LIMITED: 429,
  ADMISSION_QUEUE_FULL: 429,
  /** A tenant limit (docs/security.md, "Tenants and crashes"); `limit` names it. */
  LIMIT_EXCEEDED: 429,
  CANCELLED: 499,
  INTERNAL: 500,
  BACKEND_FAILED: 502,
  CAPACITY_EXHAUSTED: 503,
  UNAVAILABLE: 503,
  TIMEOUT: 504,
  /** A command exited non-zero where the caller asked for a zero exit (the SDK's `check: true`); raised by clients, never sent by the API. */
  COMMAND_FAILED: 422,
} as const;

/** One of the stable error codes in {@link ERROR_STATUS}. */
export type ErrorCode = keyof typeof ERROR_STATUS;

/** Extra data a caller may need to act on an error. */
export interface ErrorDetails {
  field?: string;
  sandboxId?: string;
  layer?: string;
  path?: string;
  errno?: string;
  retryAfterMs?: number;
  [key: string]: unknown;
}

/** The one error type of dsec: a stable `code`, its HTTP `status`, and details. */
export class DsecError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly details: ErrorDetails;

  constructor(code: ErrorCode, message: string, details: ErrorDetails = {}, options?: ErrorOptions) {
    super(message, options);
    this.name = 'DsecError';
    this.code = code;
    this.status = ERROR_STATUS[code];
    this.details = details;
  }

  /** JSON body used on the wire: `{error: {code, message, ...details}}`. */
  toJSON(): { error: { code: ErrorCode; message: string } & ErrorDetails } {
    return { error: { ...this.details, code: this.code, message: this.message } };
  }
}

/** Shorthand for a 400 that names the offending field. */
export function invalidArgument(field: string, message: string): DsecError {
  return new DsecError('INVALID_ARGUMENT', `${field}: ${message}`, { field });
}

/** True when `err` is a DsecError with the given code. */
export function isDsecError(err: unknown, code?: ErrorCode): err is DsecError {
  return err instanceof DsecError && (code === undefined || err.code === code);
}
