// /v1/sandboxes/{id}/exec (JSON, or ndjson as it runs) and /processes: list, output from an
// offset, stdin, signals. Every command runs through the CommandService (recorded).
import { ExecRequestSchema, OutputQuerySchema, SignalRequestSchema } from '@dsec/protocol';
import type { ExecSpec } from '@dsec/protocol';
import { commandSummary } from '@dsec/watcher';
import { router } from '../env.js';
import type { RouterDeps } from '../env.js';
import { execStreamResponse, wantsExecFrames } from '../streams.js';
import type { AuditExec } from '../audit.js';
import { MAX_JSON_BYTES, jsonBody, limitedBody, pidParam, query, wantsNdjson } from '../validate.js';

/** Commands and processes. */
export function commandRoutes({ services: { lifecycle, commands, slots }, metrics }: RouterDeps) {
  const target = async (p: Parameters<typeof lifecycle.route>[0], id: string, role: 'viewer' | 'member' = 'member') => {
    const { row, edge } = await lifecycle.route(p, id, role);
    return { sandboxId: row.id, edge, node: row.node };
  };
  return router()
    .post('/sandboxes/:id/exec', jsonBody(ExecRequestSchema), async (c) => {
      const t = await target(c.get('principal'), c.req.param('id'));
      const req = c.get('body');
      const { stdinBase64, ...rest } = req;
      const spec: ExecSpec = stdinBase64 !== undefined ? { ...rest, stdin: Buffer.from(stdinBase64, 'base64') } : rest;
      const audit: AuditExec = { command: commandSummary(req), exitCode: null };
      c.set('auditExec', audit);
      // Each command holds one of its tenant's (and its node's) command slots while it runs.
      const release = slots.acquire('exec', c.get('principal').tenantId, t.node);
      if (wantsNdjson(c) || wantsExecFrames(c.req.header('accept'))) {
        const cmd = await commands.spawn(t, spec, 'stream').catch((err: unknown) => {
          release();
          throw err;
        });
        void cmd.exitCode.finally(release);
        metrics.execs++;
        // The audit entry gets the exit status as the stream hands on its exit (null if it ends first).
        audit.exitCode = cmd;
        // A reader that leaves early leaves the command running: the recording reads on alone.
        return execStreamResponse(c.req.header('accept'), cmd.events(), () => void cmd.leave());
      }
      // A client that goes away takes its command with it.
      const start = performance.now();
      const { result } = await commands.exec(t, spec, c.req.raw.signal).finally(release);
      metrics.observeExec(performance.now() - start);
      audit.exitCode = result.exitCode;
      return c.json(result);
    })
    .get('/sandboxes/:id/processes', async (c) => {
      const t = await target(c.get('principal'), c.req.param('id'), 'viewer');
      return c.json({ items: await commands.processes(t, c.req.raw.signal), nextCursor: null });
    })
    .get('/sandboxes/:id/processes/:pid/output', query(OutputQuerySchema), async (c) => {
      const t = await target(c.get('principal'), c.req.param('id'), 'viewer');
      const q = c.get('query');
      const out = await commands.output(t, pidParam(c), { stdout: q.from ?? 0, stderr: q.fromStderr ?? 0 }, c.req.raw.signal);
      return execStreamResponse(c.req.header('accept'), out.events, out.detach);
    })
    .post('/sandboxes/:id/processes/:pid/stdin', async (c) => {
      const t = await target(c.get('principal'), c.req.param('id'));
      const pid = pidParam(c);
      const chunks: Buffer[] = [];
      for await (const chunk of limitedBody(c, MAX_JSON_BYTES, 'stdin writes')) chunks.push(chunk);
      await commands.writeStdin(t, pid, Buffer.concat(chunks), c.req.query('eof') === 'true', c.req.raw.signal);
      return c.body(null, 204);
    })
    .post('/sandboxes/:id/processes/:pid/signal', jsonBody(SignalRequestSchema), async (c) => {
      const t = await target(c.get('principal'), c.req.param('id'));
      await commands.signal(t, pidParam(c), c.get('body').signal);
      return c.body(null, 204);
    });
}
