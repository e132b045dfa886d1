// /v1/layers: upload (a layer tar or an OCI image archive), Debian builds and image pulls (JSON,
// or ndjson with progress), list, get, delete.
import { Readable } from 'node:stream';
import type { Context } from 'hono';
import { z } from 'zod';
import {
  DebianLayerRequestSchema,
  LayerKindSchema,
  PullLayerRequestSchema,
  UpdateLayerRequestSchema,
  UploadLayerQuerySchema,
  VmLayerRequestSchema,
  invalidArgument,
  parseOrThrow,
} from '@dsec/protocol';
import type { BuildableLayerKind, LayerBuildSource } from '@dsec/protocol';
import { router } from '../env.js';
import type { Env, RouterDeps } from '../env.js';
import { publicError } from '../errors.js';
import { AsyncQueue, followOr, ndjsonResponse } from '../streams.js';
import { jsonBody, query, requestSignal, uploadBody, wantsNdjson } from '../validate.js';

/** Layers. */
export function layerRoutes({ services: { layers }, log, streams }: RouterDeps) {
  /** A long build (Debian, image pull): the layer as JSON, or with `Accept: application/x-ndjson` its progress lines first. */
  const buildResponse = async <E extends Env>(c: Context<E>, source: LayerBuildSource, kind: BuildableLayerKind, name: string | undefined) => {
    const p = c.get('principal');
    const build = (onProgress: (m: string) => void) => layers.build(p, source, { kind, onProgress, signal: requestSignal(c) }, name ?? null);
    if (!wantsNdjson(c)) return c.json(await build(() => undefined), 201);
    const events = new AsyncQueue<object>();
    build((message) => events.push({ type: 'progress', message }))
      .then((layer) => events.push({ type: 'layer', layer }))
      .catch((err: unknown) => events.push({ type: 'error', error: publicError(err, log) }))
      .finally(() => events.end());
    return ndjsonResponse(events, () => undefined, 201);
  };
  return (
    router()
      .post('/layers', query(UploadLayerQuerySchema), async (c) => {
        const q = c.get('query');
        // A disk image is a `disk` layer whatever the kind; a tar or OCI upload names its kind.
        if (q.format !== 'disk' && q.kind === undefined) throw invalidArgument('query.kind', 'required (base, workspace or toolkit)');
        const stream = uploadBody(c);
        const source: LayerBuildSource =
          q.format === 'disk' ? { type: 'disk', stream } : q.format === 'oci' ? { type: 'oci-archive', stream } : { type: 'tar', stream };
        return c.json(await layers.build(c.get('principal'), source, { kind: q.kind ?? 'base' }, q.name ?? null), 201);
      })
      .post('/layers/vm', jsonBody(VmLayerRequestSchema), async (c) => {
        const req = c.get('body');
        const source = {
          type: 'vm' as const,
          ...(req.packages ? { packages: req.packages } : {}),
          ...(req.suite ? { suite: req.suite } : {}),
          ...(req.desktop ? { desktop: true } : {}),
        };
        return buildResponse(c, source, 'base', req.name);
      })
      .post('/layers/debian', jsonBody(DebianLayerRequestSchema), async (c) => {
        const req = c.get('body');
        const source = { type: 'debian' as const, packages: req.packages, ...(req.suite ? { suite: req.suite } : {}) };
        return buildResponse(c, source, req.kind, req.name);
      })
      .post('/layers/pull', jsonBody(PullLayerRequestSchema), async (c) => {
        const req = c.get('body');
        return buildResponse(c, { type: 'image', ref: req.ref }, req.kind, req.name);
      })
      .get('/layers', async (c) => {
        const kind = c.req.query('kind');
        const parsed = kind === undefined ? undefined : parseOrThrow(LayerKindSchema, kind, 'query.kind');
        return followOr(c, streams, async () => ({ items: await layers.list(c.get('principal'), parsed), nextCursor: null }));
      })
      // Not `/layers/{ref}/disk`: a ref may hold `/`, so that path would hide a layer named `x/disk`.
      .get('/disk-images/:ref{.+}', async (c) => {
        const format = parseOrThrow(z.enum(['raw', 'qcow2']).default('raw'), c.req.query('format'), 'query.format');
        const chunks = await layers.exportDisk(c.get('principal'), c.req.param('ref'), format, requestSignal(c));
        return new Response(Readable.toWeb(Readable.from(chunks)) as ReadableStream, {
          status: 200,
          headers: { 'content-type': 'application/octet-stream', 'content-disposition': `attachment; filename="disk.${format === 'raw' ? 'img' : 'qcow2'}"` },
        });
      })
      .get('/layers/:ref{.+}', async (c) => c.json(await layers.get(c.get('principal'), c.req.param('ref'))))
      .patch('/layers/:ref{.+}', jsonBody(UpdateLayerRequestSchema), async (c) =>
        c.json(await layers.update(c.get('principal'), c.req.param('ref'), c.get('body'))),
      )
      .delete('/layers/:ref{.+}', async (c) => {
        await layers.remove(c.get('principal'), c.req.param('ref'));
        return c.body(null, 204);
      })
  );
}
