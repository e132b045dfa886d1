// /v1/sandboxes/{id}/exec (JSON, or ndjson as it runs) and /processes: list, output from an
// offset, stdin, signals. Every command runs through the CommandService (recorded).
import { ExecRequestSchema, OutputQuerySchema, SignalRequestSchema } from '@dsec/protocol';
import type { ExecRequest, ExecResult, ExecSpec } from '@dsec/protocol';
import type { Principal } from '../../auth.js';
import type { RunningCommand } from '../../services/commands.js';
import { commandSummary } from '@dsec/watcher';
import { router } from '../env.js';
import type { RouterDeps } from '../env.js';
import { execStreamResponse, followOr, wantsExecFrames } from '../streams.js';
import type { AuditExec } from '../audit.js';
import { jsonBody, limitedBody, MAX_JSON_BYTES, pidParam, query, requestHeader, requestSignal, wantsNdjson } from '../validate.js';

/** Commands and processes. */
export function commandRoutes(deps: RouterDeps) {
  const { lifecycle, commands } = deps.services;
  const target = async (p: Parameters<typeof lifecycle.route>[0], id: string, role: 'viewer' | 'member' = 'member') => {
    const { row, edge } = await lifecycle.route(p, id, role);
    return { sandboxId: row.id, edge, node: row.node };
  };
  return router()
    .post('/sandboxes/:id/exec', jsonBody(ExecRequestSchema), async (c) => {
      const accept = requestHeader(c, 'accept');
      const streamed = wantsNdjson(c) || wantsExecFrames(accept);
      const started = await runExec(deps, c.get('principal'), c.req.param('id'), c.get('body'), streamed, (a) => c.set('auditExec', a), requestSignal(c));
      if ('result' in started) return c.json(started.result);
      const { cmd } = started;
      // A reader that leaves early leaves the command running: the recording reads on alone.
      return execStreamResponse(accept, cmd.events(), () => void cmd.leave());
    })
    .get('/sandboxes/:id/processes', async (c) => {
      // The sandbox is looked up at each read: a followed list ends once it is deleted, and
      // reaches its node through the node's current session.
      return followOr(c, deps.streams, async () => {
        const t = await target(c.get('principal'), c.req.param('id'), 'viewer');
        return { items: await commands.processes(t, requestSignal(c)), nextCursor: null };
      });
    })
    .get('/sandboxes/:id/processes/:pid/output', query(OutputQuerySchema), async (c) => {
      const t = await target(c.get('principal'), c.req.param('id'), 'viewer');
      const q = c.get('query');
      const out = await commands.output(t, pidParam(c), { stdout: q.from ?? 0, stderr: q.fromStderr ?? 0 }, requestSignal(c));
      return execStreamResponse(requestHeader(c, 'accept'), out.events, out.detach);
    })
    .post('/sandboxes/:id/processes/:pid/stdin', async (c) => {
      const t = await target(c.get('principal'), c.req.param('id'));
      const pid = pidParam(c);
      const chunks: Buffer[] = [];
      for await (const chunk of limitedBody(c, MAX_JSON_BYTES, 'stdin writes')) chunks.push(chunk);
      await commands.writeStdin(t, pid, Buffer.concat(chunks), c.req.query('eof') === 'true', requestSignal(c));
      return c.body(null, 204);
    })
    .post('/sandboxes/:id/processes/:pid/signal', jsonBody(SignalRequestSchema), async (c) => {
      const t = await target(c.get('principal'), c.req.param('id'));
      await commands.signal(t, pidParam(c), c.get('body').signal);
      return c.body(null, 204);
    });
}

/** What an exec request became: the finished command's result, or a started command whose events are streamed. */
export type StartedExec = { result: ExecResult } | { cmd: RunningCommand };

/**
 * Runs one exec request of `principal` (the route above and the raw Node handler of
 * `exec-fast-path.ts` both come here): the sandbox routed to, one command slot held while it
 * runs, the command recorded. `streamed` starts it and hands it back to be streamed; otherwise
 * it runs to its end, and `signal` (the client going away) takes it with it.
 */
export async function runExec(
  { services: { lifecycle, commands, slots }, metrics }: Pick<RouterDeps, 'services' | 'metrics'>,
  principal: Principal,
  id: string,
  req: ExecRequest,
  streamed: boolean,
  setAudit: (audit: AuditExec) => void,
  signal: AbortSignal,
): Promise<StartedExec> {
  const { row, edge } = await lifecycle.route(principal, id, 'member');
  const t = { sandboxId: row.id, edge, node: row.node };
  const { stdinBase64, ...rest } = req;
  const spec: ExecSpec = stdinBase64 !== undefined ? { ...rest, stdin: Buffer.from(stdinBase64, 'base64') } : rest;
  const audit: AuditExec = { command: commandSummary(req), exitCode: null };
  setAudit(audit);
  // Each command holds one of its tenant's (and its node's) command slots while it runs.
  const release = slots.acquire('exec', principal.tenantId, t.node);
  if (streamed) {
    const cmd = await commands.spawn(t, spec, 'stream').catch((err: unknown) => {
      release();
      throw err;
    });
    void cmd.exitCode.finally(release);
    metrics.execs++;
    // The audit entry gets the exit status as the stream hands on its exit (null if it ends first).
    audit.exitCode = cmd;
    return { cmd };
  }
  const start = performance.now();
  const { result } = await commands.exec(t, spec, signal).finally(release);
  metrics.observeExec(performance.now() - start);
  audit.exitCode = result.exitCode;
  return { result };
}
