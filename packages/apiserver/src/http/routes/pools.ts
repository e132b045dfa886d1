// /v1/pools
import { createMiddleware } from 'hono/factory';
import { PoolNameSchema, PutPoolRequestSchema, parseOrThrow } from '@dsec/protocol';
import { router } from '../env.js';
import type { RouterDeps } from '../env.js';
import { followOr } from '../streams.js';
import { jsonBody } from '../validate.js';

/** The `:name` of a pool, validated; read as `c.get('pool')`. */
const poolName = createMiddleware<{ Variables: { pool: string } }>(async (c, next) => {
  c.set('pool', parseOrThrow(PoolNameSchema, c.req.param('name'), 'name'));
  await next();
});

/** Warm pools. */
export function poolRoutes({ services: { pools }, streams }: RouterDeps) {
  return router()
    .put('/pools/:name', poolName, jsonBody(PutPoolRequestSchema), async (c) => c.json(await pools.put(c.get('principal'), c.get('pool'), c.get('body'))))
    .get('/pools', async (c) => followOr(c, streams, async () => ({ items: await pools.list(c.get('principal')), nextCursor: null })))
    .get('/pools/:name', poolName, async (c) => c.json(await pools.get(c.get('principal'), c.get('pool'))))
    .delete('/pools/:name', poolName, async (c) => {
      await pools.remove(c.get('principal'), c.get('pool'));
      return c.body(null, 204);
    });
}
