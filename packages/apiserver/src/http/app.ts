// The HTTP API (docs/api.md) on Hono: one router per resource under `/v1`, each validating its
// input with the protocol's schemas (middleware) and handing typed values to the services.
import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import { Hono } from 'hono';
import { DsecError } from '@dsec/protocol';
import type { Metrics } from '../metrics.js';
import { openApiDocument } from '../openapi.js';
import type { Services } from '../services/index.js';
import type { WatchService } from '../watch.js';
import type { Env, RouterDeps } from './env.js';
import { errorResponse } from './errors.js';
import { callRoutes } from './routes/calls.js';
import { commandRoutes } from './routes/commands.js';
import { fileRoutes } from './routes/files.js';
import { iamRoutes } from './routes/iam.js';
import { nodeRoutes } from './routes/nodes.js';
import { layerRoutes } from './routes/layers.js';
import { networkRoutes } from './routes/networks.js';
import { ownerRoutes } from './routes/owners.js';
import { poolRoutes } from './routes/pools.js';
import { sandboxRoutes } from './routes/sandboxes.js';
import { screenRoutes } from './routes/screens.js';
import { snapshotRoutes } from './routes/snapshots.js';
import { watchRoutes } from './routes/watch.js';
import { endpointTokenRoutes } from '../compat/endpoint-tokens.js';
import { sandboxFusionRoutes } from '../compat/sandboxfusion.js';
import { swerexRoutes } from '../compat/swerex.js';
import { authAndAudit } from './audit.js';
import type { AuthFailureOptions } from './audit.js';
import { TrustedProxies } from './client-address.js';
import { routePath } from 'hono/route';
import { uiRoutes } from './ui.js';
import { sessionRoutes } from './routes/session.js';
import { mountE2b } from '../e2b/index.js';
import { SandboxPorts } from '../e2b/ports.js';
import type { E2bOptions } from '../e2b/index.js';
import { execFastPath } from './exec-fast-path.js';
import { LiveStreams } from './streams.js';
import type { LiveStreamOptions } from './streams.js';
import type { RawRequestHandler } from './exec-fast-path.js';
import { requestHeader } from './validate.js';

export { MAX_JSON_BYTES, MAX_UPLOAD_BYTES } from './validate.js';

/** Options of {@link createApp}. */
export interface AppOptions {
  /** Resolves when the state store answers; `/healthz` is 503 while it rejects or hangs. */
  health?: () => Promise<void>;
  /** Proxies (addresses or CIDR ranges) whose `X-Forwarded-For` names the client. Default none. */
  trustedProxies?: readonly string[];
  /** Failed authentications rate-limited by source and collapsed in the audit (tenant limits). */
  failures?: AuthFailureOptions;
  /** The E2B-compatible API's options (e2b/index.ts). */
  e2b?: Pick<E2bOptions, 'buildBase' | 'buildOnDemand' | 'baseFrom' | 'domain'>;
  /** Registers work to do when the server stops (the E2B base build is stopped). */
  onClose?: (fn: () => Promise<void>) => void;
  /** Registers an HTTP upgrade handler tried before the WebSocket routes (true: it took the request). */
  onUpgrade?: (fn: (req: IncomingMessage, socket: Duplex, head: Buffer) => boolean) => void;
  /** Registers a handler of Node's requests tried before the app (exec-fast-path.ts); without it, the app serves every route. */
  onRequest?: (fn: RawRequestHandler) => void;
  /** Live streams' re-check and follow intervals (streams.ts). */
  streams?: LiveStreamOptions;
}

/** How long `/healthz` waits for the store before it answers 503 (ms). */
export const HEALTH_TIMEOUT_MS = 2000;

/** Builds the Hono app; with `watch`, every call is audited and the events, audit and rules routes exist. */
export function createApp(services: Services, metrics: Metrics, log: (line: string) => void, watch?: WatchService, opts: AppOptions = {}): Hono<Env> {
  const app = new Hono<Env>();
  app.onError((err) => errorResponse(err, log));
  app.notFound(() => errorResponse(new DsecError('NOT_FOUND', 'no such route')));

  app.use('*', async (c, next) => {
    const start = performance.now();
    await next();
    // hono types the context of a '*' middleware with `any` inside; routePath takes it as it is.
    // eslint-disable-next-line @typescript-eslint/no-unsafe-argument
    metrics.observeRequest(c.req.method, routePath(c), c.res.status, performance.now() - start);
  });

  const trusted = new TrustedProxies(opts.trustedProxies ?? []);
  app.use('*', async (c, next) => {
    const incoming = (c.env as { incoming?: IncomingMessage } | undefined)?.incoming;
    // As above: the context of a '*' middleware is typed with `any` inside.
    // eslint-disable-next-line @typescript-eslint/no-unsafe-argument
    c.set('clientAddress', trusted.clientAddress(incoming?.socket.remoteAddress ?? '', requestHeader(c, 'x-forwarded-for')));
    await next();
  });

  // E2B's per-sandbox host names (`<port>-<id>.<domain>`, e2b/ports.ts) before every route: any path on such a host is the sandbox's.
  const e2bPorts = new SandboxPorts(services, opts.e2b?.domain ?? null, log, watch);
  app.use('*', e2bPorts.middleware());
  opts.onUpgrade?.((req, socket, head) =>
    e2bPorts.upgrade(req, socket, head, trusted.clientAddress(req.socket.remoteAddress ?? '', [req.headers['x-forwarded-for']].flat()[0])),
  );

  app.get('/healthz', async (c) => {
    const health = opts.health;
    if (health) {
      let timer: NodeJS.Timeout | undefined;
      const timeout = new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`no answer within ${HEALTH_TIMEOUT_MS} ms`)), HEALTH_TIMEOUT_MS);
      });
      try {
        await Promise.race([health(), timeout]);
      } catch (err) {
        return c.json({ status: 'unavailable', store: (err as Error).message }, 503);
      } finally {
        clearTimeout(timer);
      }
    }
    return c.json({ status: 'ok' });
  });
  app.get('/metrics', async (c) => c.text(await metrics.render(), 200, { 'content-type': 'text/plain; version=0.0.4' }));
  app.get('/v1/openapi.json', (c) => c.json(openApiDocument()));
  app.route('/ui', uiRoutes());

  app.use(
    '/v1/*',
    authAndAudit((header, cachedOnly, req) => services.iam.authenticate(header, cachedOnly, req), watch, opts.failures),
  );

  // Live streams: each principal re-checked after a key or project change; followed answers read again after writes.
  const streams = new LiveStreams(services.slots, (p) => services.iam.recheck(p), opts.streams);
  const unwatchPrincipals = services.iam.onPrincipalsChanged(() => streams.recheckNow());
  opts.onClose?.(async () => {
    unwatchPrincipals();
    streams.close();
  });
  app.use('/v1/*', async (c, next) => {
    await next();
    if (c.req.method !== 'GET' && c.req.method !== 'HEAD' && c.res.status < 400) streams.changed(c.get('principal')?.tenantId);
  });
  const deps: RouterDeps = { services, metrics, log, streams };
  app.route('/v1', iamRoutes(deps));
  app.route('/v1', nodeRoutes(deps));
  app.route('/v1', sandboxRoutes(deps));
  app.route('/v1', ownerRoutes(deps));
  app.route('/v1', poolRoutes(deps));
  app.route('/v1', networkRoutes(deps));
  app.route('/v1', commandRoutes(deps));
  app.route('/v1', fileRoutes(deps));
  app.route('/v1', snapshotRoutes(deps));
  app.route('/v1', callRoutes(deps));
  app.route('/v1', layerRoutes(deps));
  app.route('/v1', endpointTokenRoutes(deps));
  app.route('/v1', sandboxFusionRoutes(deps));
  app.route('/v1', swerexRoutes(deps));
  app.route('/v1', sessionRoutes(deps));
  app.route('/v1', screenRoutes(deps));
  if (watch) app.route('/v1', watchRoutes(watch, streams));
  opts.onRequest?.(execFastPath({ deps, watch, trusted, gate: opts.failures?.gate, e2bDomain: opts.e2b?.domain ?? null }));
  const e2b = mountE2b(app, deps, { watch, failures: opts.failures, ...opts.e2b });
  opts.onClose?.(() => e2b.templates.close());
  opts.onClose?.(async () => e2b.envd.close());
  return app;
}
