// The audit of every API call: who called which route, with what outcome.
import type { Context } from 'hono';
import { routePath } from 'hono/route';
import type { Principal } from '../auth.js';
import type { WatchService } from '../watch.js';
import { toDsecError } from './errors.js';

/** What the exec route adds to its call's audit entry. */
export interface AuditExec {
  command: string;
  /** Known at once for a plain exec; a streamed one settles when its stream ends. */
  exitCode: number | null | Promise<number | null>;
}

const SANDBOX_ID_RE = /^[a-z0-9][a-z0-9-]{0,127}$/;

/** Records one API call in the audit trail: the route pattern, never the URL or the key. */
export function auditCall(watch: WatchService, c: Context, principal: Principal | undefined, status: number, durationMs: number): void {
  const route = routePath(c, -1) || '/v1/*';
  let sandboxId: string | null = null;
  if (route.startsWith('/v1/sandboxes/:id')) {
    const raw = c.req.path.split('/')[3] ?? '';
    if (SANDBOX_ID_RE.test(raw)) sandboxId = raw;
  }
  const exec = c.get('auditExec') as AuditExec | undefined;
  const entry = {
    keyId: principal?.keyId ?? null,
    projectId: principal?.projectId ?? null,
    method: c.req.method,
    route,
    sandboxId,
    status,
    durationMs: Math.round(durationMs * 1000) / 1000,
    command: exec?.command ?? null,
    exitCode: null as number | null,
  };
  if (exec && typeof exec.exitCode === 'object' && exec.exitCode !== null) {
    const at = new Date().toISOString();
    void exec.exitCode.then(
      (code) => watch.audit.record({ ...entry, at, exitCode: code }),
      () => watch.audit.record({ ...entry, at }),
    );
    return;
  }
  watch.audit.record({ ...entry, exitCode: (exec?.exitCode as number | null | undefined) ?? null });
}

/** Authenticates `/v1/*` calls and records each in the audit trail (failed ones too). */
export function authAndAudit(authenticate: (header: string | undefined) => Promise<Principal>, watch: WatchService | undefined) {
  return async (c: Context, next: () => Promise<void>): Promise<void> => {
    const start = performance.now();
    let principal: Principal | undefined;
    try {
      principal = await authenticate(c.req.header('authorization'));
      c.set('principal', principal);
      await next();
    } catch (err) {
      if (watch) auditCall(watch, c, principal, toDsecError(err).status, performance.now() - start);
      throw err;
    }
    if (watch) auditCall(watch, c, principal, c.res.status, performance.now() - start);
  };
}
