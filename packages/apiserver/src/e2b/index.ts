// The E2B-compatible API (docs/e2b.md) on the apiserver's origin, beside `/v1`: E2B's control
// plane (X-API-KEY, `{code, message}` errors) and envd's data plane (REST + Connect-RPC, routed
// by `E2b-Sandbox-Id`), so that `E2B_API_URL=E2B_SANDBOX_URL=<dsec>` runs E2B code unchanged.
import type { Context, Hono } from 'hono';
import type { Env, RouterDeps } from '../http/env.js';
import { auditCall, authAndAudit } from '../http/audit.js';
import type { AuthFailureOptions } from '../http/audit.js';
import type { WatchService } from '../watch.js';
import { streamReply, streamRequest, unaryError, unaryReply, unaryRequest } from './connect.js';
import {
  ConnectBodySchema,
  E2bControl,
  ForkBodySchema,
  NetworkUpdateSchema,
  NewSandboxSchema,
  PauseBodySchema,
  SnapshotBodySchema,
  TimeoutBodySchema,
  e2bBody,
} from './control.js';
import { E2bError, e2bErrorResponse } from './errors.js';
import { Envd } from './envd.js';
import { TemplateResolver } from './templates.js';
import { requestHeader, requestSignal } from '../http/validate.js';

/** Options of {@link mountE2b}. */
export interface E2bOptions {
  watch?: WatchService | undefined;
  failures?: AuthFailureOptions | undefined;
  /** Build the `base` template in the background now (default: on the first request for it). */
  buildBase?: boolean;
  /** Build `base` on its first request (default true). */
  buildOnDemand?: boolean;
  /** A layer to use as the Debian part of `base` instead of building it (templates.ts). */
  baseFrom?: string;
  /** The `domain` returned to clients, or null (default). */
  domain?: string | null;
}

/** Mounts the E2B routes on the app (one line in http/app.ts). */
export function mountE2b(app: Hono<Env>, deps: RouterDeps, opts: E2bOptions = {}): { templates: TemplateResolver; envd: Envd } {
  const { services, log } = deps;
  const templates = new TemplateResolver(services, {
    log,
    ...(opts.buildOnDemand !== undefined ? { buildOnDemand: opts.buildOnDemand } : {}),
    ...(opts.baseFrom !== undefined ? { baseFrom: opts.baseFrom } : {}),
  });
  const envd = new Envd(services, log, opts.domain ?? null);
  const control = new E2bControl({ services, templates, domain: opts.domain ?? null });
  if (opts.buildBase) templates.start();

  // Control plane: the key in X-API-KEY (or Authorization: Bearer), audited as /v1 calls are.
  const auth = async (c: Context<Env>, next: () => Promise<void>): Promise<Response | void> => {
    const key = requestHeader(c, 'x-api-key');
    const mw = authAndAudit(
      (header, cachedOnly) => services.iam.authenticate(key !== undefined ? `Bearer ${key}` : header, cachedOnly),
      opts.watch,
      opts.failures,
    );
    try {
      await mw(c, next);
    } catch (err) {
      return e2bErrorResponse(err, log);
    }
  };
  const wrap =
    (fn: (c: Context<Env>) => Promise<Response>) =>
    async (c: Context<Env>): Promise<Response> => {
      try {
        return await fn(c);
      } catch (err) {
        return e2bErrorResponse(err, log);
      }
    };
  const p = (c: Context<Env>) => c.get('principal');
  const id = (c: Context<Env>): string => c.req.param('id') ?? '';
  const json = (body: unknown, status = 200, headers: Record<string, string> = {}): Response =>
    new Response(JSON.stringify(body), { status, headers: { 'content-type': 'application/json', ...headers } });
  const q = (c: Context<Env>) => new URL(c.req.url).searchParams;

  for (const route of ['/sandboxes', '/sandboxes/*', '/v2/sandboxes', '/v2/sandboxes/*', '/snapshots', '/templates/*']) app.use(route, auth);
  const create = wrap(async (c) => {
    const body = await control.create(p(c), await e2bBody(c.req.raw, NewSandboxSchema), requestSignal(c));
    envd.remember(body.sandboxID as string, body.envdAccessToken as string | null);
    return json(body, 201);
  });
  app.post('/sandboxes', create);
  app.post('/v2/sandboxes', create);
  const list = (legacy: boolean) =>
    wrap(async (c) => {
      const r = await control.list(p(c), q(c), legacy);
      return json(r.items, 200, r.nextToken ? { 'x-next-token': r.nextToken } : {});
    });
  app.get('/v2/sandboxes', list(false));
  app.get('/sandboxes', list(true));
  app.get(
    '/sandboxes/:id',
    wrap(async (c) => json(await control.get(p(c), id(c)))),
  );
  app.delete(
    '/sandboxes/:id',
    wrap(async (c) => {
      await control.kill(p(c), id(c));
      envd.forget(id(c));
      return new Response(null, { status: 204 });
    }),
  );
  app.post(
    '/sandboxes/:id/timeout',
    wrap(async (c) => {
      await control.timeout(p(c), id(c), (await e2bBody(c.req.raw, TimeoutBodySchema)).timeout);
      return new Response(null, { status: 204 });
    }),
  );
  const connect = wrap(async (c) => {
    const body = await e2bBody(c.req.raw, ConnectBodySchema);
    const r = await control.connect(p(c), id(c), body.timeout);
    envd.remember(r.body.sandboxID as string, r.body.envdAccessToken as string | null);
    return json(r.body, r.status);
  });
  app.post('/sandboxes/:id/connect', connect);
  app.post('/v2/sandboxes/:id/connect', connect);
  app.post('/sandboxes/:id/resume', connect);
  app.put(
    '/sandboxes/:id/network',
    wrap(async (c) => {
      await control.updateNetwork(p(c), id(c), await e2bBody(c.req.raw, NetworkUpdateSchema));
      return new Response(null, { status: 204 });
    }),
  );
  app.post(
    '/sandboxes/:id/pause',
    wrap(async (c) => {
      await e2bBody(c.req.raw, PauseBodySchema);
      await control.pause(p(c), id(c));
      return new Response(null, { status: 204 });
    }),
  );
  app.post(
    '/sandboxes/:id/snapshots',
    wrap(async (c) => json(await control.snapshot(p(c), id(c), (await e2bBody(c.req.raw, SnapshotBodySchema)).name, requestSignal(c)), 201)),
  );
  app.get(
    '/snapshots',
    wrap(async (c) => {
      const r = await control.snapshots(p(c), q(c));
      return json(r.items, 200, r.nextToken ? { 'x-next-token': r.nextToken } : {});
    }),
  );
  app.delete(
    '/templates/:id',
    wrap(async (c) => {
      await control.deleteTemplate(p(c), id(c));
      return new Response(null, { status: 204 });
    }),
  );
  app.post(
    '/sandboxes/:id/fork',
    wrap(async (c) => json(await control.fork(p(c), id(c), await e2bBody(c.req.raw, ForkBodySchema), requestSignal(c)), 201)),
  );
  app.get(
    '/sandboxes/:id/metrics',
    wrap(async (c) => json(await control.metrics(p(c), id(c)))),
  );

  // Data plane (envd). Authorised per sandbox by its access token, not by an API key. Once the
  // token is checked (envd.target sets the sandbox's principal and takes its tenant's rate), each
  // call is audited as a /v1 call is: the route pattern and status, never the token or the URL.
  const audited =
    (fn: (c: Context<Env>) => Promise<Response>) =>
    async (c: Context<Env>): Promise<Response> => {
      const start = performance.now();
      const res = await fn(c);
      const principal = c.get('principal') as Context<Env>['var']['principal'] | undefined;
      if (opts.watch && principal) auditCall(opts.watch, c, principal, res.status, performance.now() - start);
      return res;
    };
  app.get(
    '/health',
    audited(
      wrap(async (c) => {
        await envd.target(c);
        return new Response(null, { status: 204 });
      }),
    ),
  );
  app.get('/files', audited(wrap(async (c) => envd.download(c))));
  app.post('/files', audited(wrap(async (c) => envd.upload(c))));
  const rpc = (service: 'process.Process' | 'filesystem.Filesystem') => async (c: Context<Env>) => {
    const method = c.req.param('method') ?? '';
    const streaming = service === 'process.Process' ? method === 'Start' || method === 'Connect' : method === 'WatchDir';
    try {
      const t = await envd.target(c);
      if (streaming) {
        const req = await streamRequest(c);
        const events =
          method === 'Start' ? await envd.start(c, t, req) : method === 'Connect' ? await envd.connectProcess(c, t, req) : await envd.watchDir(c, t, req);
        return streamReply(events, log);
      }
      const req = await unaryRequest(c);
      return unaryReply(service === 'process.Process' ? await envd.processUnary(method, t, req) : await envd.filesystemUnary(c, method, t, req));
    } catch (err) {
      // Sandbox-level refusals (not running: 502, bad token: 401) are the proxy's, in E2B's shape.
      if (err instanceof E2bError) return e2bErrorResponse(err, log);
      return unaryError(err, log);
    }
  };
  app.post('/process.Process/:method', audited(rpc('process.Process')));
  app.post('/filesystem.Filesystem/:method', audited(rpc('filesystem.Filesystem')));
  return { templates, envd };
}
