// /v1/sandboxes/{id}/network (get, replace, patch, egress log: read or followed) and /v1/network:apply.
import { ApplyNetworkRequestSchema, DEFAULT_NETWORK_LOG_LIMIT, NetworkLogQuerySchema, NetworkPolicyPatchSchema, NetworkPolicySchema } from '@dsec/protocol';
import { router } from '../env.js';
import type { RouterDeps } from '../env.js';
import { followOr } from '../streams.js';
import { jsonBody, query } from '../validate.js';

/** Sandbox networks. */
export function networkRoutes({ services: { networks }, streams }: RouterDeps) {
  return router()
    .get('/sandboxes/:id/network', async (c) => c.json(await networks.get(c.get('principal'), c.req.param('id'))))
    .put('/sandboxes/:id/network', jsonBody(NetworkPolicySchema, 'network'), async (c) =>
      c.json(await networks.change(c.get('principal'), c.req.param('id'), { replace: c.get('body') })),
    )
    .patch('/sandboxes/:id/network', jsonBody(NetworkPolicyPatchSchema, 'network'), async (c) =>
      c.json(await networks.change(c.get('principal'), c.req.param('id'), { patch: c.get('body') })),
    )
    .get('/sandboxes/:id/network/log', query(NetworkLogQuerySchema), async (c) =>
      followOr(c, streams, async () => ({
        items: await networks.log(c.get('principal'), c.req.param('id'), c.get('query').limit ?? DEFAULT_NETWORK_LOG_LIMIT),
        nextCursor: null,
      })),
    )
    .post('/network:apply', jsonBody(ApplyNetworkRequestSchema), async (c) => c.json(await networks.apply(c.get('principal'), c.get('body'))));
}
