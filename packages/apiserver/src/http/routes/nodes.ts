// /v1/nodes: the nodes of the cluster (list, their use as a stream, one in full, join tokens,
// cordon, drain, rm)
import { DEFAULT_USAGE_STREAM_INTERVAL_MS, DrainRequestSchema, JoinTokenRequestSchema, UsageStreamQuerySchema, parseOrThrow } from '@dsec/protocol';
import { router } from '../env.js';
import type { RouterDeps } from '../env.js';
import { jsonBody, queryObject, requestSignal, wantsNdjson } from '../validate.js';

/** Nodes. */
export function nodeRoutes({ services: { nodeAdmin }, streams }: RouterDeps) {
  return router()
    .get('/nodes', async (c) => {
      if (!wantsNdjson(c)) return c.json({ items: await nodeAdmin.list(c.get('principal')), nextCursor: null });
      // The nodes' allocation and use, pushed: one line now and one per interval.
      const { intervalMs } = parseOrThrow(UsageStreamQuerySchema, queryObject(c), 'query');
      return streams.samples(c.get('principal'), requestSignal(c), (signal) =>
        nodeAdmin.usageStream(c.get('principal'), intervalMs ?? DEFAULT_USAGE_STREAM_INTERVAL_MS, signal),
      );
    })
    .post('/nodes/join-tokens', jsonBody(JoinTokenRequestSchema), async (c) => c.json(await nodeAdmin.joinToken(c.get('principal'), c.get('body')), 201))
    .get('/nodes/:name', async (c) => c.json(await nodeAdmin.get(c.get('principal'), c.req.param('name'))))
    .post('/nodes/:name/cordon', async (c) => c.json(await nodeAdmin.cordon(c.get('principal'), c.req.param('name'), true)))
    .post('/nodes/:name/uncordon', async (c) => c.json(await nodeAdmin.cordon(c.get('principal'), c.req.param('name'), false)))
    .post('/nodes/:name/drain', jsonBody(DrainRequestSchema), async (c) =>
      c.json(await nodeAdmin.drain(c.get('principal'), c.req.param('name'), c.get('body').replay === true)),
    )
    .delete('/nodes/:name', async (c) => {
      await nodeAdmin.remove(c.get('principal'), c.req.param('name'));
      return c.body(null, 204);
    });
}
