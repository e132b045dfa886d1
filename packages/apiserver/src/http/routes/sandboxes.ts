// /v1/sandboxes: create (one, or a batch as JSON or ndjson), read, list, update, destroy,
// pause, resume, stats (once, or as a stream).
import { createMiddleware } from 'hono/factory';
import {
  CreateSandboxBatchRequestSchema,
  CreateSandboxRequestSchema,
  IDEMPOTENCY_KEY_HEADER,
  IdempotencyKeySchema,
  ListSandboxesQuerySchema,
  ResumeRequestSchema,
  PauseRequestSchema,
  SandboxRequestSchema,
  UpdateSandboxRequestSchema,
  UsageStreamQuerySchema,
  DEFAULT_USAGE_STREAM_INTERVAL_MS,
  parseOrThrow,
} from '@dsec/protocol';
import type { BatchEvent, CreateSandboxBatchRequest, CreateSandboxBatchResult } from '@dsec/protocol';
import type { Principal } from '../../auth.js';
import type { CreateBatchOptions, SandboxService } from '../../services/sandboxes.js';
import { refuseReservedLabels } from '../../e2b/sandboxes.js';
import { router } from '../env.js';
import type { RouterDeps } from '../env.js';
import { toDsecError } from '../errors.js';
import { ndjsonResponse } from '../streams.js';
import { jsonBody, query, queryObject, requestHeader, requestSignal, wantsNdjson } from '../validate.js';

/** The `Idempotency-Key` header, validated when sent; read as `c.get('idempotencyKey')`. */
const idempotencyKey = createMiddleware<{ Variables: { idempotencyKey: string | undefined } }>(async (c, next) => {
  const raw = requestHeader(c, IDEMPOTENCY_KEY_HEADER);
  c.set('idempotencyKey', raw === undefined ? undefined : parseOrThrow(IdempotencyKeySchema, raw, IDEMPOTENCY_KEY_HEADER));
  await next();
});

/** Items of a batch that fail their schema fail alone: parsed here, refusals passed on by index. */
function batchItems(batch: CreateSandboxBatchRequest): { batch: CreateSandboxBatchRequest; invalid: Map<number, unknown> } {
  const invalid = new Map<number, unknown>();
  if (!batch.items) return { batch, invalid };
  const items = batch.items.map((raw, i) => {
    try {
      const item = parseOrThrow(SandboxRequestSchema, raw, `items.${i}`);
      refuseReservedLabels(item.labels, `items.${i}.labels`);
      return item;
    } catch (err) {
      invalid.set(i, err);
      return raw;
    }
  });
  return { batch: { ...batch, items }, invalid };
}

/** Sandboxes. */
export function sandboxRoutes({ services: { sandboxes, lifecycle }, log, streams }: RouterDeps) {
  return (
    router()
      .post('/sandboxes', idempotencyKey, jsonBody(CreateSandboxRequestSchema), async (c) => {
        let replayed = false;
        refuseReservedLabels(c.get('body').labels);
        const opts = { signal: requestSignal(c), idempotencyKey: c.get('idempotencyKey'), onReplay: () => (replayed = true) };
        const sandbox = await sandboxes.create(c.get('principal'), c.get('body'), opts);
        return c.json(sandbox, 201, replayed ? { 'idempotent-replayed': 'true' } : {});
      })
      // `:batch` is a custom method on the collection (the AIP-136 form); Hono matches it literally.
      .post('/sandboxes:batch', idempotencyKey, jsonBody(CreateSandboxBatchRequestSchema), async (c) => {
        const p = c.get('principal');
        refuseReservedLabels(c.get('body').spec?.labels, 'spec.labels');
        const { batch, invalid } = batchItems(c.get('body'));
        const opts = { signal: requestSignal(c), idempotencyKey: c.get('idempotencyKey') };
        if (!wantsNdjson(c)) return c.json(await sandboxes.createBatch(p, batch, opts, invalid));
        return ndjsonResponse(await batchEvents(sandboxes, p, batch, invalid, opts, log));
      })
      .get('/sandboxes', query(ListSandboxesQuerySchema), async (c) => c.json(await sandboxes.list(c.get('principal'), c.get('query'))))
      .get('/sandboxes/:id', async (c) => c.json(await sandboxes.get(c.get('principal'), c.req.param('id'))))
      .delete('/sandboxes/:id', async (c) => {
        // `Prefer: respond-async` (RFC 7240): 202 once the row is durably `stopping`, the
        // teardown behind the answer; without it, 204 once the sandbox is gone.
        const respondAsync = prefersRespondAsync(requestHeader(c, 'prefer'));
        await lifecycle.destroy(c.get('principal'), c.req.param('id'), { wait: !respondAsync });
        return respondAsync ? c.body(null, 202, { 'preference-applied': 'respond-async' }) : c.body(null, 204);
      })
      .patch('/sandboxes/:id', jsonBody(UpdateSandboxRequestSchema), async (c) =>
        c.json(await sandboxes.update(c.get('principal'), c.req.param('id'), c.get('body'))),
      )
      .post('/sandboxes/:id/pause', jsonBody(PauseRequestSchema), async (c) =>
        c.json(await lifecycle.pause(c.get('principal'), c.req.param('id'), c.get('body'))),
      )
      .post('/sandboxes/:id/resume', jsonBody(ResumeRequestSchema), async (c) =>
        c.json(await lifecycle.resume(c.get('principal'), c.req.param('id'), c.get('body'))),
      )
      .get('/sandboxes/:id/stats', async (c) => {
        if (!wantsNdjson(c)) return c.json(await sandboxes.stats(c.get('principal'), c.req.param('id')));
        const { intervalMs } = parseOrThrow(UsageStreamQuerySchema, queryObject(c), 'query');
        return streams.samples(c.get('principal'), requestSignal(c), (signal) =>
          sandboxes.statsStream(c.get('principal'), c.req.param('id'), intervalMs ?? DEFAULT_USAGE_STREAM_INTERVAL_MS, signal),
        );
      })
  );
}

/**
 * A batch as ndjson: one line per item as it finishes, then a summary. Resolves once the batch
 * is accepted, so that a refusal of the whole batch (a bad spec) is still a plain error reply.
 */
async function batchEvents(
  sandboxes: SandboxService,
  p: Principal,
  batch: CreateSandboxBatchRequest,
  invalid: Map<number, unknown>,
  opts: CreateBatchOptions,
  log: (line: string) => void,
): Promise<AsyncGenerator<BatchEvent>> {
  const t0 = performance.now();
  const lines: BatchEvent[] = [];
  let wake: (() => void) | undefined;
  let outcome: { result: CreateSandboxBatchResult } | { error: unknown } | undefined;
  let started: () => void = () => undefined;
  const validated = new Promise<void>((resolve) => (started = resolve));
  const run = sandboxes.createBatch(
    p,
    batch,
    {
      ...opts,
      onStart: started,
      onItem: (item) => {
        lines.push({ type: 'item', ...item });
        wake?.();
      },
    },
    invalid,
  );
  run.then(
    (result) => {
      outcome = { result };
      wake?.();
    },
    (error: unknown) => {
      outcome = { error };
      wake?.();
    },
  );
  await Promise.race([validated, run]);
  return (async function* () {
    for (;;) {
      const line = lines.shift();
      if (line) yield line;
      else if (outcome) break;
      else await new Promise<void>((r) => (wake = r));
    }
    if ('error' in outcome) yield { type: 'error', error: toDsecError(outcome.error, log).toJSON().error };
    else yield { type: 'summary', created: outcome.result.created, failed: outcome.result.failed, durationMs: performance.now() - t0 };
  })();
}

/** True when a `Prefer` header (RFC 7240) asks for `respond-async`. */
export function prefersRespondAsync(prefer: string | undefined): boolean {
  return (prefer ?? '').split(',').some((p) => p.split(';')[0]!.trim().toLowerCase() === 'respond-async');
}
