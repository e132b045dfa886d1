// The audit of every API call: who called which route, with what outcome.
import type { Context } from 'hono';
import { routePath } from 'hono/route';
import type { DsecError } from '@dsec/protocol';
import type { AuthRequest, Principal } from '../auth.js';
import type { AuthFailureEntry, AuthFailureGate } from '../tenant-limits.js';
import type { WatchService } from '../watch.js';
import { toDsecError } from './errors.js';
import { requestHeader } from './validate.js';

/** A streamed command's exit status, told once (null when its stream ends first). */
export interface SettlingExit {
  onSettled(fn: (code: number | null) => void): void;
}

/** What the exec route adds to its call's audit entry. */
export interface AuditExec {
  command: string;
  /**
   * Known at once for a plain exec; a streamed one settles as its exit event is handed on, so its
   * entry is recorded before a client has read the stream's end.
   */
  exitCode: number | null | SettlingExit;
}

const SANDBOX_ID_RE = /^[a-z0-9][a-z0-9-]{0,127}$/;

/** A sandbox id from a path as the audit keeps it: null unless it has the shape of one. */
export function auditedSandboxId(raw: string): string | null {
  return SANDBOX_ID_RE.test(raw) ? raw : null;
}

/** Records one API call in the audit trail: the route pattern, never the URL or the key. */
export function auditCall(watch: WatchService, c: Context, principal: Principal | undefined, status: number, durationMs: number): void {
  const route = routePath(c, -1) || '/v1/*';
  let sandboxId: string | null = null;
  if (route.startsWith('/v1/sandboxes/:id')) sandboxId = auditedSandboxId(c.req.path.split('/')[3] ?? '');
  recordCall(watch, { principal, method: c.req.method, route, sandboxId, status, durationMs, exec: c.get('auditExec') as AuditExec | undefined });
}

/** What one audit entry of an API call is made of. */
export interface CallRecord {
  principal: Principal | undefined;
  method: string;
  /** The route pattern (`/v1/sandboxes/:id/exec`), never the URL. */
  route: string;
  sandboxId: string | null;
  status: number;
  durationMs: number;
  exec: AuditExec | undefined;
}

/** Records one API call in the audit trail (a streamed command's once its exit is known). */
export function recordCall(watch: WatchService, call: CallRecord): void {
  const { principal, exec } = call;
  const entry = {
    keyId: principal?.keyId ?? null,
    projectId: principal?.projectId ?? null,
    method: call.method,
    route: call.route,
    sandboxId: call.sandboxId,
    status: call.status,
    durationMs: Math.round(call.durationMs * 1000) / 1000,
    command: exec?.command ?? null,
    exitCode: null as number | null,
  };
  const exitCode = exec?.exitCode ?? null;
  if (typeof exitCode === 'object' && exitCode !== null) {
    const at = new Date().toISOString();
    exitCode.onSettled((code) => watch.audit.record({ ...entry, at, exitCode: code }));
    return;
  }
  watch.audit.record({ ...entry, exitCode });
}

/** How failed authentications are gated: the gate, and the client address of a request. */
export interface AuthFailureOptions {
  gate: AuthFailureGate;
  /** The request's client address (the trusted-proxy-aware `clientAddress` the app sets). */
  source: (c: Context) => string;
}

/** Marks an error whose audit the failure gate took over. */
const AUDITED = Symbol('audited');

/** True for the errors of a failed authentication (counted by source, collapsed in the audit). */
function isAuthFailure(err: unknown): boolean {
  const code = toDsecError(err).code;
  return code === 'UNAUTHENTICATED' || (code === 'LIMIT_EXCEEDED' && (err as DsecError).details.limit === 'authFailuresPerSecond');
}

/**
 * Authenticates `/v1/*` calls and records each in the audit trail. Failed authentications go
 * through the gate when there is one: rate-limited by source before any audit, and collapsed
 * into one entry per source with a count.
 */
export function authAndAudit(
  authenticate: (header: string | undefined, cachedOnly?: { refuse: () => Error }, req?: AuthRequest) => Promise<Principal>,
  watch: WatchService | undefined,
  failures?: AuthFailureOptions,
) {
  return async (c: Context, next: () => Promise<void>): Promise<void> => {
    const start = performance.now();
    let principal: Principal | undefined;
    try {
      if (failures) {
        const source = failures.source(c);
        const gate = failures.gate;
        try {
          principal = await authenticate(
            requestHeader(c, 'authorization'),
            gate.blocked(source) ? { refuse: () => gate.refusal(source) } : undefined,
            authRequest(c),
          );
        } catch (err) {
          if (!isAuthFailure(err)) throw err;
          gate.failed(source, { method: c.req.method, route: routePath(c, -1) || '/v1/*', status: toDsecError(err).status });
          principal = undefined;
          (err as Record<symbol, unknown>)[AUDITED] = true;
          throw err;
        }
      } else principal = await authenticate(requestHeader(c, 'authorization'), undefined, authRequest(c));
      c.set('principal', principal);
      await next();
    } catch (err) {
      if (watch && !(err as Record<symbol, unknown>)[AUDITED]) auditCall(watch, c, principal, toDsecError(err).status, performance.now() - start);
      throw err;
    }
    if (watch) auditCall(watch, c, principal, c.res.status, performance.now() - start);
  };
}

/** The request as credential hooks see it. */
function authRequest(c: Context): AuthRequest {
  return { path: c.req.path, header: (name) => requestHeader(c, name) };
}

/** The audit entry of a source's collapsed failed authentications. */
export function authFailureAudit(watch: WatchService): (e: AuthFailureEntry) => void {
  return (e) =>
    watch.audit.record({
      keyId: null,
      projectId: null,
      method: e.method,
      route: e.route,
      sandboxId: null,
      status: e.status,
      durationMs: 0,
      command: null,
      exitCode: null,
      at: e.at,
      ...(e.count > 1 ? { count: e.count } : {}),
    });
}
