// /v1/calls
import { CallBatchRequestSchema, CallRequestSchema } from '@dsec/protocol';
import { router } from '../env.js';
import type { RouterDeps } from '../env.js';
import { jsonBody, requestSignal } from '../validate.js';

/** Function calls. */
export function callRoutes({ services: { calls }, metrics }: RouterDeps) {
  return router()
    .post('/calls', jsonBody(CallRequestSchema), async (c) => {
      const result = await calls.run(c.get('principal'), c.get('body'), requestSignal(c));
      metrics.calls++;
      return c.json(result);
    })
    .post('/calls/batch', jsonBody(CallBatchRequestSchema), async (c) => {
      const reply = await calls.runBatch(c.get('principal'), c.get('body'), requestSignal(c));
      metrics.calls += reply.results.length;
      return c.json(reply);
    });
}
