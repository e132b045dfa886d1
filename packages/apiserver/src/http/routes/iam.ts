// /v1/keys (a list, or followed), /v1/projects (nodes: routes/nodes.ts)
import { CreateKeyRequestSchema, CreateProjectRequestSchema } from '@dsec/protocol';
import { router } from '../env.js';
import type { RouterDeps } from '../env.js';
import { followOr } from '../streams.js';
import { jsonBody } from '../validate.js';

/** Keys and projects. */
export function iamRoutes({ services: { iam }, streams }: RouterDeps) {
  return router()
    .post('/keys', jsonBody(CreateKeyRequestSchema), async (c) => c.json(await iam.createKey(c.get('principal'), c.get('body')), 201))
    .get('/keys', async (c) => followOr(c, streams, async () => ({ items: await iam.listKeys(c.get('principal')), nextCursor: null })))
    .delete('/keys/:id', async (c) => {
      await iam.revokeKey(c.get('principal'), c.req.param('id'));
      return c.body(null, 204);
    })
    .post('/projects', jsonBody(CreateProjectRequestSchema), async (c) => c.json(await iam.createProject(c.get('principal'), c.get('body')), 201))
    .get('/projects', async (c) => c.json({ items: await iam.listProjects(c.get('principal')), nextCursor: null }))
    .get('/projects/:id', async (c) => c.json(await iam.getProject(c.get('principal'), c.req.param('id'))));
}
