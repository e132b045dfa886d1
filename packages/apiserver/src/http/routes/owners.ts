// /v1/owners
import { CreateOwnerRequestSchema } from '@dsec/protocol';
import { router } from '../env.js';
import type { RouterDeps } from '../env.js';
import { jsonBody } from '../validate.js';

/** Owner sessions. */
export function ownerRoutes({ services: { owners } }: RouterDeps) {
  return router()
    .post('/owners', jsonBody(CreateOwnerRequestSchema), async (c) => c.json(await owners.create(c.get('principal'), c.get('body')), 201))
    .get('/owners/:id', async (c) => c.json(await owners.get(c.get('principal'), c.req.param('id'))))
    .post('/owners/:id/heartbeat', async (c) => c.json(await owners.heartbeat(c.get('principal'), c.req.param('id'))))
    .delete('/owners/:id', async (c) => {
      await owners.close(c.get('principal'), c.req.param('id'));
      return c.body(null, 204);
    });
}
