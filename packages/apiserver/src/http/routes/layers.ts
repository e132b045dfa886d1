// /v1/layers: upload (a layer tar or an OCI image archive), Debian builds (JSON, or ndjson with
// progress), list, get, delete.
import { DebianLayerRequestSchema, LayerKindSchema, UploadLayerQuerySchema, parseOrThrow } from '@dsec/protocol';
import { router } from '../env.js';
import type { RouterDeps } from '../env.js';
import { publicError } from '../errors.js';
import { AsyncQueue, ndjsonResponse } from '../streams.js';
import { jsonBody, query, uploadBody, wantsNdjson } from '../validate.js';

/** Layers. */
export function layerRoutes({ services: { layers }, log }: RouterDeps) {
  return router()
    .post('/layers', query(UploadLayerQuerySchema), async (c) => {
      const q = c.get('query');
      const stream = uploadBody(c);
      const source = q.format === 'oci' ? { type: 'oci-archive' as const, stream } : { type: 'tar' as const, stream };
      return c.json(await layers.build(c.get('principal'), source, { kind: q.kind }, q.name ?? null), 201);
    })
    .post('/layers/debian', jsonBody(DebianLayerRequestSchema), async (c) => {
      const p = c.get('principal');
      const req = c.get('body');
      const source = { type: 'debian' as const, packages: req.packages, ...(req.suite ? { suite: req.suite } : {}) };
      const build = (onProgress: (m: string) => void) => layers.build(p, source, { kind: req.kind, onProgress, signal: c.req.raw.signal }, req.name ?? null);
      if (!wantsNdjson(c)) return c.json(await build(() => undefined), 201);
      const events = new AsyncQueue<object>();
      build((message) => events.push({ type: 'progress', message }))
        .then((layer) => events.push({ type: 'layer', layer }))
        .catch((err: unknown) => events.push({ type: 'error', error: publicError(err, log) }))
        .finally(() => events.end());
      return ndjsonResponse(events, () => undefined, 201);
    })
    .get('/layers', async (c) => {
      const kind = c.req.query('kind');
      const parsed = kind === undefined ? undefined : parseOrThrow(LayerKindSchema, kind, 'query.kind');
      return c.json({ items: await layers.list(c.get('principal'), parsed), nextCursor: null });
    })
    .get('/layers/:ref{.+}', async (c) => c.json(await layers.get(c.get('principal'), c.req.param('ref'))))
    .delete('/layers/:ref{.+}', async (c) => {
      await layers.remove(c.get('principal'), c.req.param('ref'));
      return c.body(null, 204);
    });
}
