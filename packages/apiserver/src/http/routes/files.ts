// /v1/sandboxes/{id}/files (read, write, remove, list, stat, mkdir, rename, tar in and out),
// /diff and /verify.
import { Readable } from 'node:stream';
import { DiffQuerySchema, FilePathQuerySchema, RenameRequestSchema, VerifyRequestSchema } from '@dsec/protocol';
import type { Principal } from '../../auth.js';
import type { RouteOptions } from '../../services/lifecycle.js';
import { router } from '../env.js';
import type { RouterDeps } from '../env.js';
import { jsonBody, MAX_UPLOAD_BYTES, query, requestSignal, uploadBody } from '../validate.js';

/** Files of sandboxes. */
export function fileRoutes({ services: { lifecycle, files, slots } }: RouterDeps) {
  const target = async (p: Principal, id: string, role: 'viewer' | 'member' = 'member', opts: RouteOptions = {}) => {
    const { row, edge } = await lifecycle.route(p, id, role, opts);
    return { sandboxId: row.id, edge, node: row.node };
  };
  /** Runs a file transfer in one of its tenant's (and its node's) transfer slots. */
  const transfer = <T>(p: Principal, t: { node: string }, fn: () => Promise<T>): Promise<T> => slots.run('transfer', p.tenantId, t.node, fn);
  const path = query(FilePathQuerySchema);
  return (
    router()
      .put('/sandboxes/:id/files', path, async (c) => {
        const p = c.get('principal');
        const t = await target(p, c.req.param('id'));
        const q = c.get('query');
        await transfer(p, t, () =>
          files.write(
            t,
            q.path,
            uploadBody(c),
            {
              mode: q.mode ? parseInt(q.mode, 8) : undefined,
              append: q.append === 'true',
              limitBytes: MAX_UPLOAD_BYTES,
            },
            requestSignal(c),
          ),
        );
        return c.body(null, 204);
      })
      .get('/sandboxes/:id/files', path, async (c) => {
        const p = c.get('principal');
        const t = await target(p, c.req.param('id'), 'viewer');
        const q = c.get('query');
        const data = await transfer(p, t, () => files.read(t, q.path, { offset: q.offset, length: q.length }, requestSignal(c)));
        return c.body(new Uint8Array(data), 200, { 'content-type': 'application/octet-stream' });
      })
      .delete('/sandboxes/:id/files', path, async (c) => {
        const t = await target(c.get('principal'), c.req.param('id'));
        const q = c.get('query');
        await files.remove(t, q.path, q.recursive === 'true', requestSignal(c));
        return c.body(null, 204);
      })
      .get('/sandboxes/:id/files/list', path, async (c) => {
        const t = await target(c.get('principal'), c.req.param('id'), 'viewer');
        return c.json({ items: await files.list(t, c.get('query').path, requestSignal(c)), nextCursor: null });
      })
      .get('/sandboxes/:id/files/stat', path, async (c) => {
        const t = await target(c.get('principal'), c.req.param('id'), 'viewer');
        return c.json(await files.stat(t, c.get('query').path, requestSignal(c)));
      })
      .post('/sandboxes/:id/files/mkdir', path, async (c) => {
        const t = await target(c.get('principal'), c.req.param('id'));
        await files.mkdir(t, c.get('query').path, requestSignal(c));
        return c.body(null, 204);
      })
      .post('/sandboxes/:id/files/rename', jsonBody(RenameRequestSchema), async (c) => {
        const t = await target(c.get('principal'), c.req.param('id'));
        const { from, to } = c.get('body');
        await files.rename(t, from, to, requestSignal(c));
        return c.body(null, 204);
      })
      .put('/sandboxes/:id/files/tar', path, async (c) => {
        const p = c.get('principal');
        const t = await target(p, c.req.param('id'));
        await transfer(p, t, () => files.uploadTar(t, c.get('query').path, uploadBody(c), MAX_UPLOAD_BYTES, requestSignal(c)));
        return c.body(null, 204);
      })
      .get('/sandboxes/:id/files/tar', path, async (c) => {
        const p = c.get('principal');
        const t = await target(p, c.req.param('id'), 'viewer');
        // The slot is held until the tar stream ends (or its reader goes).
        const release = slots.acquire('transfer', p.tenantId, t.node);
        const stream = await files.downloadTar(t, c.get('query').path, requestSignal(c)).catch((err: unknown) => {
          release();
          throw err;
        });
        stream.once('close', release);
        return new Response(Readable.toWeb(stream) as ReadableStream, { status: 200, headers: { 'content-type': 'application/x-tar' } });
      })
      // What the sandbox changed against its layers, and the graders' integrity check. Both read
      // the writable layer on the host: a paused sandbox is read as it is (consistent, `frozen`),
      // not resumed, and the read is not activity.
      .get('/sandboxes/:id/diff', query(DiffQuerySchema, ['path']), async (c) => {
        const t = await target(c.get('principal'), c.req.param('id'), 'viewer', { paused: 'allow' });
        const q = c.get('query');
        return c.json(
          await files.diff(
            t,
            {
              ...(q.path ? { paths: q.path } : {}),
              ...(q.hash ? { hash: q.hash === 'true' } : {}),
              ...(q.limit !== undefined ? { limit: q.limit } : {}),
              ...(q.cursor !== undefined ? { cursor: q.cursor } : {}),
            },
            requestSignal(c),
          ),
        );
      })
      .post('/sandboxes/:id/verify', jsonBody(VerifyRequestSchema), async (c) => {
        const t = await target(c.get('principal'), c.req.param('id'), 'viewer', { paused: 'allow' });
        return c.json(await files.verify(t, c.get('body'), requestSignal(c)));
      })
  );
}
