// Routes of the watcher (events, audit, rules) and the audit of every API call.
import type { Context, Hono } from 'hono';
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

type WatchEnv = { Variables: { principal: Principal; auditExec: AuditExec | undefined } };

const SANDBOX_ID_RE = /^[a-z0-9][a-z0-9-]{0,127}$/;

function queryOf(c: Context): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of new URL(c.req.url).searchParams) out[k] = v;
  return out;
}

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

/** GET /v1/events, GET /v1/audit, POST/GET/DELETE /v1/rules; `readJson` reads a bounded JSON body. */
export function registerWatchRoutes<E extends WatchEnv>(app: Hono<E>, watch: WatchService, readJson: (c: Context) => Promise<unknown>): void {
  app.get('/v1/events', async (c) => {
    const p = c.get('principal');
    if ((c.req.header('accept') ?? '').includes('text/event-stream')) {
      return watch.streamEvents(p, queryOf(c), c.req.header('last-event-id'), c.req.raw.signal);
    }
    return c.json(await watch.listEvents(p, queryOf(c)));
  });
  app.get('/v1/audit', async (c) => {
    const p = c.get('principal');
    if ((c.req.header('accept') ?? '').includes('application/x-ndjson')) return watch.exportAudit(p, queryOf(c));
    return c.json(await watch.listAudit(p, queryOf(c)));
  });
  app.post('/v1/rules', async (c) => c.json(await watch.createRule(c.get('principal'), await readJson(c)), 201));
  app.get('/v1/rules', async (c) => c.json({ items: await watch.listRules(c.get('principal')), nextCursor: null }));
  app.delete('/v1/rules/:id', async (c) => {
    await watch.deleteRule(c.get('principal'), c.req.param('id'));
    return c.body(null, 204);
  });
}
