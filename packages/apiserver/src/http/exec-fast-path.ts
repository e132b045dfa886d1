// `POST /v1/sandboxes/{id}/exec` on Node's own request and response: no fetch-style Request or
// Response, no web streams, no routing table (issue 15: they were a fifth of an exec's cost in
// the apiserver). It does what the app's route does, through the same code (`runExec`, the
// authenticator, the audit, the metrics, the error replies); whatever it does not take (another
// route, a query string, an ndjson stream, a per-sandbox E2B host, an id the app would decode,
// a failed authentication, a source the failure gate holds back) goes to the app unread.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { EXEC_FRAMES_MEDIA_TYPE, ExecRequestSchema, encodeExecFrame, parseOrThrow } from '@dsec/protocol';
import type { Principal } from '../auth.js';
import { hostTarget } from '../e2b/ports.js';
import type { RunningCommand } from '../services/commands.js';
import type { AuthFailureGate } from '../tenant-limits.js';
import type { WatchService } from '../watch.js';
import { auditedSandboxId, recordCall } from './audit.js';
import type { AuditExec } from './audit.js';
import type { TrustedProxies } from './client-address.js';
import type { RouterDeps } from './env.js';
import { errorReply } from './errors.js';
import { runExec } from './routes/commands.js';
import { wantsExecFrames } from './streams.js';
import { readIncomingJson } from './validate.js';

/** A handler tried before the app: it takes the request, or calls `next` to leave it to the app. */
export type RawRequestHandler = (req: IncomingMessage, res: ServerResponse, next: () => void) => void;

/** A request listener trying `handlers` in order (each passing on what it does not take), then `app`. */
export function withRawHandlers(
  handlers: readonly RawRequestHandler[],
  app: (req: IncomingMessage, res: ServerResponse) => unknown,
): (req: IncomingMessage, res: ServerResponse) => void {
  return (req, res) => {
    const tryFrom = (i: number): void => {
      if (i < handlers.length) handlers[i]!(req, res, () => tryFrom(i + 1));
      else void app(req, res);
    };
    tryFrom(0);
  };
}

/** The route pattern the metrics and the audit name. */
const EXEC_ROUTE = '/v1/sandboxes/:id/exec';
/** The exec path with an id the app would take as it is (no percent-encoding to decode). */
const EXEC_PATH = /^\/v1\/sandboxes\/([A-Za-z0-9_-]{1,128})\/exec$/;

/** What {@link execFastPath} is built from (the app's own collaborators). */
export interface ExecFastPathOptions {
  deps: RouterDeps;
  watch: WatchService | undefined;
  trusted: TrustedProxies;
  /** Failed authentications' gate: a source it holds back goes to the app, which refuses it. */
  gate: AuthFailureGate | undefined;
  /** The E2B per-sandbox host names' domain (requests to those hosts are the app's). */
  e2bDomain: string | null;
}

/** The raw handler of exec requests answered as JSON or as binary frames. */
export function execFastPath(o: ExecFastPathOptions): RawRequestHandler {
  return (req, res, next) => {
    const m = req.method === 'POST' && req.url !== undefined ? EXEC_PATH.exec(req.url) : null;
    if (!m) return next();
    const accept = req.headers.accept;
    const frames = wantsExecFrames(accept);
    if ((!frames && (accept ?? '').includes('application/x-ndjson')) || hostTarget(req.headers.host, o.e2bDomain)) return next();
    serve(o, req, res, m[1]!, frames, next).catch((err: unknown) => {
      // Nothing may escape as an unhandled rejection (it would end the process): a failure
      // after the reply began ends the response.
      o.deps.log(`dsec: exec fast path: ${(err as Error).message}`);
      if (!res.headersSent) {
        const reply = errorReply(err, o.deps.log);
        res.writeHead(reply.status, reply.headers);
        res.end(reply.body);
      } else res.destroy();
    });
  };
}

function header(req: IncomingMessage, name: string): string | undefined {
  const v = req.headers[name];
  return Array.isArray(v) ? v[0] : v;
}

async function serve(o: ExecFastPathOptions, req: IncomingMessage, res: ServerResponse, id: string, frames: boolean, next: () => void): Promise<void> {
  const start = performance.now();
  const { services, metrics, log } = o.deps;
  if (o.gate?.blocked(o.trusted.clientAddress(req.socket.remoteAddress ?? '', header(req, 'x-forwarded-for')))) return next();
  let principal: Principal;
  try {
    principal = await services.iam.authenticate(req.headers.authorization, undefined, { path: req.url!, header: (n) => header(req, n.toLowerCase()) });
  } catch {
    // The app authenticates again and answers: the failure gate and the audit of failures are its.
    return next();
  }
  let audit: AuditExec | undefined;
  let status = 200;
  let cmd: RunningCommand | undefined;
  try {
    const body = parseOrThrow(ExecRequestSchema, await readIncomingJson(req), '');
    // A client that goes away takes a plain exec with it (as the app's request signal does).
    const gone = new AbortController();
    res.once('close', () => {
      if (!res.writableFinished) gone.abort(new Error('the client went away'));
    });
    const started = await runExec(o.deps, principal, id, body, frames, (a) => (audit = a), gone.signal);
    if ('result' in started) {
      // Encoded once: measuring the text and then writing it walked a 16 MiB output twice.
      const body = Buffer.from(JSON.stringify(started.result));
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length });
      res.end(body);
    } else {
      cmd = started.cmd;
      res.writeHead(200, { 'content-type': EXEC_FRAMES_MEDIA_TYPE, 'cache-control': 'no-store' });
    }
  } catch (err) {
    const reply = errorReply(err, log);
    status = reply.status;
    if (!res.headersSent) {
      res.writeHead(reply.status, reply.headers);
      res.end(reply.body);
    } else res.destroy();
  }
  // As in the app, a streamed call is measured and audited once its headers are out.
  metrics.observeRequest('POST', EXEC_ROUTE, status, performance.now() - start);
  if (o.watch)
    recordCall(o.watch, {
      principal,
      method: 'POST',
      route: EXEC_ROUTE,
      sandboxId: auditedSandboxId(id),
      status,
      durationMs: performance.now() - start,
      exec: audit,
    });
  if (cmd) await writeFrames(res, cmd);
}

/**
 * Writes a command's events to the response as binary frames, one event at a time: a slow client
 * back-pressures the command's output. A client that leaves early leaves the command running
 * (its recording reads on alone), as the app's stream does when it is cancelled.
 */
async function writeFrames(res: ServerResponse, cmd: RunningCommand): Promise<void> {
  const it = cmd.events();
  let gone = false;
  let wake: (() => void) | undefined;
  const onDrain = (): void => wake?.();
  const onClose = (): void => {
    if (res.writableFinished) return;
    gone = true;
    wake?.();
    void cmd.leave();
  };
  res.on('drain', onDrain);
  res.once('close', onClose);
  try {
    for (let next = await it.next(); !next.done && !gone; next = await it.next()) {
      res.cork();
      let room = true;
      for (const piece of encodeExecFrame(next.value)) room = res.write(piece) && room;
      res.uncork();
      if (!room && !gone) await new Promise<void>((r) => (wake = r));
      wake = undefined;
    }
    if (gone) await it.return(undefined);
    else res.end();
  } catch {
    // The command's stream failed (its node went away): the client sees the body cut short.
    res.destroy();
  } finally {
    res.off('drain', onDrain);
    res.off('close', onClose);
  }
}
