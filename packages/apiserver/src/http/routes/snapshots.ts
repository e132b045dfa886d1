// /v1/sandboxes/{id}/snapshot, /fork, /trajectory and /replay (JSON, or ndjson as it runs).
import { ForkRequestSchema, ReplayRequestSchema, SnapshotRequestSchema, TrajectoryQuerySchema } from '@dsec/protocol';
import type { ReplayEvent } from '@dsec/protocol';
import { refuseReservedLabels } from '../../e2b/sandboxes.js';
import { router } from '../env.js';
import type { RouterDeps } from '../env.js';
import { publicError } from '../errors.js';
import { AsyncQueue, followOr, ndjsonResponse } from '../streams.js';
import { jsonBody, query, requestSignal, wantsNdjson } from '../validate.js';

/** Snapshots, forks, trajectories and replay. */
export function snapshotRoutes({ services: { snapshots, trajectories }, log, streams }: RouterDeps) {
  return router()
    .post('/sandboxes/:id/snapshot', jsonBody(SnapshotRequestSchema), async (c) =>
      c.json(await snapshots.snapshot(c.get('principal'), c.req.param('id'), c.get('body'), requestSignal(c)), 201),
    )
    .post('/sandboxes/:id/fork', jsonBody(ForkRequestSchema), async (c) => {
      refuseReservedLabels(c.get('body').labels);
      return c.json(await snapshots.fork(c.get('principal'), c.req.param('id'), c.get('body'), requestSignal(c)), 201);
    })
    .get('/sandboxes/:id/trajectory', query(TrajectoryQuerySchema), async (c) =>
      followOr(c, streams, () => trajectories.get(c.get('principal'), c.req.param('id'), c.get('query'))),
    )
    .post('/sandboxes/:id/replay', jsonBody(ReplayRequestSchema), async (c) => {
      const p = c.get('principal');
      const id = c.req.param('id');
      if (!wantsNdjson(c)) return c.json(await trajectories.replay(p, id, c.get('body'), requestSignal(c)), 201);
      // Progress as it happens: the new sandbox first, then each step, then the result.
      const events = new AsyncQueue<ReplayEvent>();
      const done = new AbortController();
      trajectories
        .replay(p, id, c.get('body'), done.signal, (ev) => events.push(ev))
        .then((result) => events.push({ type: 'done', result }))
        .catch((err: unknown) => events.push({ type: 'error', error: publicError(err, log) }))
        .finally(() => events.end());
      return ndjsonResponse(events, () => done.abort(), 201);
    });
}
