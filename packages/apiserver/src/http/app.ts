// The HTTP API (docs/api.md) on Hono. Handlers parse input with the protocol's schemas, call
// the control plane, and route sandbox work to the sandbox's node.
import { Hono } from 'hono';
import type { Context } from 'hono';
import type { IncomingMessage } from 'node:http';
import { Readable } from 'node:stream';
import {
  VerifyRequestSchema,
  DebianLayerRequestSchema,
  DiffQuerySchema,
  DsecError,
  IDEMPOTENCY_KEY_HEADER,
  ExecRequestSchema,
  FilePathQuerySchema,
  OutputQuerySchema,
  RenameRequestSchema,
  SignalRequestSchema,
  UploadLayerQuerySchema,
  LayerKindSchema,
  invalidArgument,
} from '@dsec/protocol';
import type { BatchEvent, CreateSandboxBatchResult, ExecEvent, LayerInfo, ReplayEvent, TrajectoryStep, TrajectoryStepKind } from '@dsec/protocol';
import type { Principal } from '../auth.js';
import { requireRole } from '../auth.js';
import type { ControlPlane } from '../control-plane.js';
import { parseInput } from '../control-plane.js';
import type { Metrics } from '../metrics.js';
import { openApiDocument } from '../openapi.js';
import type { FileRecording } from '../trajectory.js';
import type { WatchService } from '../watch.js';
import { commandSummary } from '@dsec/watcher';
import { errorResponse, toDsecError } from './errors.js';
import { attachmentEvents, ndjsonResponse } from './streams.js';
import { downloadTar, uploadTar, writeStreamToFile } from './tar-files.js';
import { authAndAudit, registerWatchRoutes } from './watch-routes.js';
import type { AuditExec } from './watch-routes.js';

/** Largest JSON request body. */
export const MAX_JSON_BYTES = 32 * 1024 * 1024;
/** Largest upload (file, tar, layer). */
export const MAX_UPLOAD_BYTES = 1024 * 1024 * 1024;

type Env = { Variables: { principal: Principal; auditExec: AuditExec | undefined } };

async function readJson(c: Context): Promise<unknown> {
  let text: string;
  const length = c.req.header('content-length');
  const incoming = (c.env as { incoming?: IncomingMessage } | undefined)?.incoming;
  if (incoming && length !== undefined && Number(length) <= MAX_JSON_BYTES) {
    // A declared length within the limit: the body cannot be longer. Read it from Node's
    // request directly; the web-stream view of it costs a quarter of a millisecond per request.
    const chunks: Buffer[] = [];
    for await (const chunk of incoming) chunks.push(chunk as Buffer);
    text = Buffer.concat(chunks).toString('utf8');
  } else {
    const chunks: Buffer[] = [];
    for await (const chunk of limitedBody(c, MAX_JSON_BYTES, 'JSON bodies')) chunks.push(chunk);
    text = Buffer.concat(chunks).toString('utf8');
  }
  if (text.trim() === '') return {};
  try {
    return JSON.parse(text);
  } catch {
    throw invalidArgument('body', 'not valid JSON');
  }
}

/** The request body as chunks, refused past `limit` bytes whether or not a length was sent. */
async function* limitedBody(c: Context, limit: number, what: string): AsyncGenerator<Buffer> {
  const tooLarge = (): DsecError => new DsecError('PAYLOAD_TOO_LARGE', `${what} are limited to ${limit} bytes`);
  if (Number(c.req.header('content-length') ?? 0) > limit) throw tooLarge();
  const body = c.req.raw.body as unknown as AsyncIterable<Uint8Array> | null;
  if (!body) return;
  let size = 0;
  for await (const chunk of body) {
    size += chunk.byteLength;
    if (size > limit) throw tooLarge();
    yield Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  }
}

/** The query string; keys in `repeatable` keep every value, the others their last. */
function query(c: Context, repeatable: readonly string[] = ['label']): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  const url = new URL(c.req.url);
  for (const key of new Set(url.searchParams.keys())) {
    const all = url.searchParams.getAll(key);
    out[key] = repeatable.includes(key) ? all : (all[all.length - 1] ?? '');
  }
  return out;
}

function bodyStream(c: Context, limit = MAX_UPLOAD_BYTES): AsyncIterable<Uint8Array> {
  return limitedBody(c, limit, 'uploads');
}

function wantsNdjson(c: Context): boolean {
  return (c.req.header('accept') ?? '').includes('application/x-ndjson');
}

function procParam(c: Context): number {
  const raw = c.req.param('pid') ?? '';
  if (!/^\d{1,15}$/.test(raw)) throw invalidArgument('pid', 'must be a process handle (a non-negative integer)');
  return Number(raw);
}

/** Builds the Hono app; with `watch`, every call is audited and the events, audit and rules routes exist. */
export function createApp(cp: ControlPlane, metrics: Metrics, log: (line: string) => void, watch?: WatchService): Hono<Env> {
  const app = new Hono<Env>();

  /** Runs a file change, recorded as a trajectory step (with its error when it fails). */
  const recorded = async <T>(sandboxId: string, kind: Exclude<TrajectoryStepKind, 'exec'>, fields: Partial<TrajectoryStep>, run: (rec: FileRecording) => Promise<T>): Promise<T> => {
    const rec = await cp.trajectory.beginFile(sandboxId, kind, fields);
    const out = await run(rec).catch(rec.failed);
    rec.ok();
    return out;
  };

  app.onError((err) => errorResponse(err, log));
  app.notFound(() => errorResponse(new DsecError('NOT_FOUND', 'no such route')));

  app.use('*', async (c, next) => {
    const start = performance.now();
    await next();
    metrics.observeRequest(c.req.method, c.req.routePath, c.res.status, performance.now() - start);
  });

  app.get('/healthz', (c) => c.json({ status: 'ok' }));
  app.get('/metrics', async (c) => c.text(await metrics.render(), 200, { 'content-type': 'text/plain; version=0.0.4' }));
  app.get('/v1/openapi.json', (c) => c.json(openApiDocument()));

  app.use('/v1/*', authAndAudit((header) => cp.auth.authenticate(header), watch));

  // ---- identity ----
  app.post('/v1/keys', async (c) => c.json(await cp.createKey(c.get('principal'), await readJson(c)), 201));
  app.get('/v1/keys', async (c) => c.json({ items: await cp.listKeys(c.get('principal')), nextCursor: null }));
  app.delete('/v1/keys/:id', async (c) => {
    await cp.revokeKey(c.get('principal'), c.req.param('id'));
    return c.body(null, 204);
  });
  app.post('/v1/projects', async (c) => c.json(await cp.createProject(c.get('principal'), await readJson(c)), 201));
  app.get('/v1/projects', async (c) => c.json({ items: await cp.listProjects(c.get('principal')), nextCursor: null }));
  app.get('/v1/projects/:id', async (c) => c.json(await cp.getProject(c.get('principal'), c.req.param('id'))));

  // ---- nodes ----
  app.get('/v1/nodes', (c) => c.json({ items: cp.listNodes(c.get('principal')), nextCursor: null }));

  // ---- sandboxes ----
  app.post('/v1/sandboxes', async (c) => {
    let replayed = false;
    const opts = { idempotencyKey: c.req.header(IDEMPOTENCY_KEY_HEADER), onReplay: () => (replayed = true) };
    const sandbox = await cp.createSandbox(c.get('principal'), await readJson(c), c.req.raw.signal, opts);
    return c.json(sandbox, 201, replayed ? { 'idempotent-replayed': 'true' } : {});
  });
  // `:batch` is a custom method on the collection (the AIP-136 form); Hono matches it literally.
  app.post('/v1/sandboxes:batch', async (c) => {
    const p = c.get('principal');
    const body = await readJson(c);
    const opts = { signal: c.req.raw.signal, idempotencyKey: c.req.header(IDEMPOTENCY_KEY_HEADER) };
    if (!wantsNdjson(c)) return c.json(await cp.createSandboxes(p, body, opts));
    return ndjsonResponse(await batchEvents(cp, p, body, opts), () => undefined);
  });
  app.get('/v1/sandboxes', async (c) => c.json(await cp.listSandboxes(c.get('principal'), query(c))));
  app.get('/v1/sandboxes/:id', async (c) => c.json(await cp.getSandbox(c.get('principal'), c.req.param('id'))));
  app.delete('/v1/sandboxes/:id', async (c) => {
    await cp.deleteSandbox(c.get('principal'), c.req.param('id'));
    return c.body(null, 204);
  });
  app.patch('/v1/sandboxes/:id', async (c) => c.json(await cp.updateSandbox(c.get('principal'), c.req.param('id'), await readJson(c))));
  app.post('/v1/sandboxes/:id/pause', async (c) => c.json(await cp.pauseSandbox(c.get('principal'), c.req.param('id'))));
  app.post('/v1/sandboxes/:id/resume', async (c) => c.json(await cp.resumeSandbox(c.get('principal'), c.req.param('id'), await readJson(c))));
  app.get('/v1/sandboxes/:id/stats', async (c) => {
    // Reads cgroups on the host: a paused sandbox is measured as it is, not resumed.
    const { edge, row } = await cp.route(c.get('principal'), c.req.param('id'), 'viewer', { paused: 'allow' });
    return c.json(await edge.stats(row.id));
  });

  // ---- owners ----
  app.post('/v1/owners', async (c) => c.json(await cp.createOwner(c.get('principal'), await readJson(c)), 201));
  app.get('/v1/owners/:id', async (c) => c.json(await cp.getOwner(c.get('principal'), c.req.param('id'))));
  app.post('/v1/owners/:id/heartbeat', async (c) => c.json(await cp.heartbeatOwner(c.get('principal'), c.req.param('id'))));
  app.delete('/v1/owners/:id', async (c) => {
    await cp.closeOwner(c.get('principal'), c.req.param('id'));
    return c.body(null, 204);
  });

  // ---- warm pools ----
  app.put('/v1/pools/:name', async (c) => c.json(await cp.putPool(c.get('principal'), c.req.param('name'), await readJson(c))));
  app.get('/v1/pools', async (c) => c.json({ items: await cp.listPools(c.get('principal')), nextCursor: null }));
  app.get('/v1/pools/:name', async (c) => c.json(await cp.getPool(c.get('principal'), c.req.param('name'))));
  app.delete('/v1/pools/:name', async (c) => {
    await cp.deletePool(c.get('principal'), c.req.param('name'));
    return c.body(null, 204);
  });

  // What the sandbox changed against its layers, and the graders' integrity check. Both read
  // the writable layer on the host: a paused sandbox is read as it is (consistent, `frozen`),
  // not resumed, and the read is not activity.
  app.get('/v1/sandboxes/:id/diff', async (c) => {
    const { edge, row } = await cp.route(c.get('principal'), c.req.param('id'), 'viewer', { paused: 'allow' });
    const q = parseInput(DiffQuerySchema, query(c, ['path']), 'query');
    return c.json(
      await edge.diff(row.id, {
        ...(q.path ? { paths: q.path } : {}),
        ...(q.hash ? { hash: q.hash === 'true' } : {}),
        ...(q.limit !== undefined ? { limit: q.limit } : {}),
        ...(q.cursor !== undefined ? { cursor: q.cursor } : {}),
      }),
    );
  });
  app.post('/v1/sandboxes/:id/verify', async (c) => {
    const { edge, row } = await cp.route(c.get('principal'), c.req.param('id'), 'viewer', { paused: 'allow' });
    return c.json(await edge.verify(row.id, parseInput(VerifyRequestSchema, await readJson(c))));
  });

  // ---- networks ----
  app.get('/v1/sandboxes/:id/network', async (c) => c.json(await cp.getNetwork(c.get('principal'), c.req.param('id'))));
  app.put('/v1/sandboxes/:id/network', async (c) => c.json(await cp.changeNetwork(c.get('principal'), c.req.param('id'), await readJson(c), 'replace')));
  app.patch('/v1/sandboxes/:id/network', async (c) => c.json(await cp.changeNetwork(c.get('principal'), c.req.param('id'), await readJson(c), 'patch')));
  app.get('/v1/sandboxes/:id/network/log', async (c) => c.json({ items: await cp.networkLog(c.get('principal'), c.req.param('id'), query(c)), nextCursor: null }));
  app.post('/v1/network:apply', async (c) => c.json(await cp.applyNetwork(c.get('principal'), await readJson(c))));

  // ---- commands ----
  app.post('/v1/sandboxes/:id/exec', async (c) => {
    const { edge, row } = await cp.route(c.get('principal'), c.req.param('id'));
    const req = parseInput(ExecRequestSchema, await readJson(c));
    const { stdinBase64, ...rest } = req;
    const spec = stdinBase64 !== undefined ? { ...rest, stdin: Buffer.from(stdinBase64, 'base64') } : rest;
    const audit: AuditExec = { command: commandSummary(req), exitCode: null };
    c.set('auditExec', audit);
    if (wantsNdjson(c)) {
      const rec = await cp.trajectory.beginExec(row.id, spec, 'stream');
      const att = await edge.spawn(row.id, spec).catch(rec.failed);
      rec.started(att.pid, edge);
      metrics.execs++;
      // The audit entry gets the exit status when the stream ends (null if it ends first).
      audit.exitCode = new Promise<number | null>((resolve) => {
        void att.exited.then(
          (e) => resolve(e.exitCode),
          () => resolve(null),
        );
        att.onDetach(() => resolve(null));
      });
      // A reader that leaves early leaves the command running: the recording reads on alone.
      return ndjsonResponse(heldEvents(cp, row.id, attachmentEvents(edge, row.id, att, true, rec)), () => {
        void att.detach().finally(rec.follow);
      });
    }
    // A client that goes away takes its command with it. Waiting for it counts as activity.
    const release = cp.activity.hold(row.id);
    try {
      const rec = await cp.trajectory.beginExec(row.id, spec, 'exec', c.req.raw.signal);
      const start = performance.now();
      const result = await edge.exec(row.id, spec, { signal: c.req.raw.signal, onOutput: rec.onOutput }).then(rec.exited, rec.failed);
      metrics.observeExec(performance.now() - start);
      audit.exitCode = result.exitCode;
      return c.json(result);
    } finally {
      release();
    }
  });

  app.get('/v1/sandboxes/:id/processes', async (c) => {
    const { edge, row } = await cp.route(c.get('principal'), c.req.param('id'), 'viewer');
    const items = await edge.processes(row.id);
    return c.json({ items, nextCursor: null });
  });

  app.get('/v1/sandboxes/:id/processes/:pid/output', async (c) => {
    const { edge, row } = await cp.route(c.get('principal'), c.req.param('id'), 'viewer');
    const proc = procParam(c);
    const q = parseInput(OutputQuerySchema, query(c), 'query');
    const att = await edge.attach(row.id, proc, { stdout: q.from ?? 0, stderr: q.fromStderr ?? 0 }).catch((err: unknown) => {
      if (err instanceof DsecError && err.code === 'FILE_NOT_FOUND') throw new DsecError('PROCESS_NOT_FOUND', `process ${proc} not found`, { pid: proc });
      throw err;
    });
    return ndjsonResponse(heldEvents(cp, row.id, attachmentEvents(edge, row.id, att, false)), () => void att.detach());
  });

  app.post('/v1/sandboxes/:id/processes/:pid/stdin', async (c) => {
    const { edge, row } = await cp.route(c.get('principal'), c.req.param('id'));
    const proc = procParam(c);
    const chunks: Buffer[] = [];
    for await (const chunk of limitedBody(c, MAX_JSON_BYTES, 'stdin writes')) chunks.push(chunk);
    const data = Buffer.concat(chunks);
    await edge.writeStdin(row.id, proc, data, c.req.query('eof') === 'true').catch(mapProcessError(proc));
    if (data.length > 0) cp.trajectory.noteStdin(row.id, proc, data);
    return c.body(null, 204);
  });

  app.post('/v1/sandboxes/:id/processes/:pid/signal', async (c) => {
    const { edge, row } = await cp.route(c.get('principal'), c.req.param('id'));
    const proc = procParam(c);
    const { signal } = parseInput(SignalRequestSchema, await readJson(c));
    await edge.signal(row.id, proc, signal).catch(mapProcessError(proc));
    return c.body(null, 204);
  });

  // ---- files ----
  const fileQuery = (c: Context) => parseInput(FilePathQuerySchema, query(c), 'query');

  app.put('/v1/sandboxes/:id/files', async (c) => {
    const { edge, row } = await cp.route(c.get('principal'), c.req.param('id'));
    const q = fileQuery(c);
    const mode = q.mode ? parseInt(q.mode, 8) : undefined;
    const append = q.append === 'true';
    await recorded(row.id, 'write', { path: q.path, ...(mode !== undefined ? { mode } : {}), ...(append ? { append } : {}) }, (rec) =>
      writeStreamToFile(edge, row.id, q.path, rec.tap(bodyStream(c)), { ...(mode !== undefined ? { mode } : {}), append, limitBytes: MAX_UPLOAD_BYTES }),
    );
    return c.body(null, 204);
  });
  app.get('/v1/sandboxes/:id/files', async (c) => {
    const { edge, row } = await cp.route(c.get('principal'), c.req.param('id'), 'viewer');
    const q = fileQuery(c);
    const data = await edge.readFile(row.id, q.path, { ...(q.offset !== undefined ? { offset: q.offset } : {}), ...(q.length !== undefined ? { length: q.length } : {}) });
    return c.body(new Uint8Array(data), 200, { 'content-type': 'application/octet-stream' });
  });
  app.delete('/v1/sandboxes/:id/files', async (c) => {
    const { edge, row } = await cp.route(c.get('principal'), c.req.param('id'));
    const q = fileQuery(c);
    const recursive = q.recursive === 'true';
    await recorded(row.id, 'remove', { path: q.path, ...(recursive ? { recursive } : {}) }, () => edge.remove(row.id, q.path, { recursive }));
    return c.body(null, 204);
  });
  app.get('/v1/sandboxes/:id/files/list', async (c) => {
    const { edge, row } = await cp.route(c.get('principal'), c.req.param('id'), 'viewer');
    return c.json({ items: await edge.listDir(row.id, fileQuery(c).path), nextCursor: null });
  });
  app.get('/v1/sandboxes/:id/files/stat', async (c) => {
    const { edge, row } = await cp.route(c.get('principal'), c.req.param('id'), 'viewer');
    return c.json(await edge.stat(row.id, fileQuery(c).path));
  });
  app.post('/v1/sandboxes/:id/files/mkdir', async (c) => {
    const { edge, row } = await cp.route(c.get('principal'), c.req.param('id'));
    const dir = fileQuery(c).path;
    await recorded(row.id, 'mkdir', { path: dir }, () => edge.mkdir(row.id, dir));
    return c.body(null, 204);
  });
  app.post('/v1/sandboxes/:id/files/rename', async (c) => {
    const { edge, row } = await cp.route(c.get('principal'), c.req.param('id'));
    const { from, to } = parseInput(RenameRequestSchema, await readJson(c));
    await recorded(row.id, 'rename', { from, to }, () => edge.rename(row.id, from, to));
    return c.body(null, 204);
  });
  app.put('/v1/sandboxes/:id/files/tar', async (c) => {
    const { edge, row } = await cp.route(c.get('principal'), c.req.param('id'));
    const dir = fileQuery(c).path;
    await recorded(row.id, 'tar', { path: dir }, (rec) => uploadTar(edge, row.id, dir, rec.tap(bodyStream(c)), MAX_UPLOAD_BYTES));
    return c.body(null, 204);
  });
  app.get('/v1/sandboxes/:id/files/tar', async (c) => {
    const { edge, row } = await cp.route(c.get('principal'), c.req.param('id'), 'viewer');
    const dir = fileQuery(c).path;
    if ((await edge.stat(row.id, dir)).type !== 'dir') throw invalidArgument('query.path', `${dir} is not a directory`);
    const stream = downloadTar(edge, row.id, dir);
    return new Response(Readable.toWeb(stream) as ReadableStream, { status: 200, headers: { 'content-type': 'application/x-tar' } });
  });

  // ---- snapshots, forks, trajectories, replay ----
  app.post('/v1/sandboxes/:id/snapshot', async (c) => c.json(await cp.snapshot(c.get('principal'), c.req.param('id'), await readJson(c), c.req.raw.signal), 201));
  app.post('/v1/sandboxes/:id/fork', async (c) => c.json(await cp.fork(c.get('principal'), c.req.param('id'), await readJson(c), c.req.raw.signal), 201));
  app.get('/v1/sandboxes/:id/trajectory', async (c) => c.json(await cp.getTrajectory(c.get('principal'), c.req.param('id'), query(c))));
  app.post('/v1/sandboxes/:id/replay', async (c) => {
    const p = c.get('principal');
    const body = await readJson(c);
    if (!wantsNdjson(c)) return c.json(await cp.replay(p, c.req.param('id'), body, c.req.raw.signal), 201);
    // Progress as it happens: the new sandbox first, then each step, then the result.
    const events = new AsyncQueue<ReplayEvent>();
    const done = new AbortController();
    cp.replay(p, c.req.param('id'), body, done.signal, (ev) => events.push(ev))
      .then((result) => events.push({ type: 'done', result }))
      .catch((err: unknown) => {
        const e = err instanceof DsecError ? err : new DsecError('INTERNAL', String(err));
        events.push({ type: 'error', error: { code: e.code, message: e.message } });
      })
      .finally(() => events.end());
    return lineStream(events, () => done.abort(), 201);
  });

  // ---- function calls ----
  app.post('/v1/calls', async (c) => {
    const result = await cp.runCall(c.get('principal'), await readJson(c), c.req.raw.signal);
    metrics.calls++;
    return c.json(result);
  });
  app.post('/v1/calls/batch', async (c) => {
    const reply = await cp.runCalls(c.get('principal'), await readJson(c), c.req.raw.signal);
    metrics.calls += reply.results.length;
    return c.json(reply);
  });

  // ---- layers ----
  app.post('/v1/layers', async (c) => {
    const p = c.get('principal');
    requireRole(p, 'member');
    const q = parseInput(UploadLayerQuerySchema, query(c), 'query');
    const edge = cp.anyEdge();
    let info: LayerInfo;
    if (q.format === 'oci') {
      info = await edge.layers.build({ type: 'oci-archive', stream: bodyStream(c) }, { kind: q.kind });
    } else {
      info = await edge.layers.build({ type: 'tar', stream: bodyStream(c) }, { kind: q.kind });
    }
    return c.json(await cp.registerLayer(p.projectId, info, q.name ?? null), 201);
  });

  app.post('/v1/layers/debian', async (c) => {
    const p = c.get('principal');
    requireRole(p, 'member');
    const req = parseInput(DebianLayerRequestSchema, await readJson(c));
    const edge = cp.anyEdge();
    const build = (onProgress: (m: string) => void) =>
      edge.layers.build({ type: 'debian', packages: req.packages, ...(req.suite ? { suite: req.suite } : {}) }, { kind: req.kind, onProgress, signal: c.req.raw.signal });
    if (!wantsNdjson(c)) return c.json(await cp.registerLayer(p.projectId, await build(() => undefined), req.name ?? null), 201);
    const queue: string[] = [];
    let wake: (() => void) | undefined;
    let done = false;
    const push = (line: object): void => {
      queue.push(JSON.stringify(line) + '\n');
      wake?.();
    };
    build((message) => push({ type: 'progress', message }))
      .then(async (info) => push({ type: 'layer', layer: await cp.registerLayer(p.projectId, info, req.name ?? null) }))
      .catch((err: unknown) => {
        const e = err instanceof DsecError ? err : new DsecError('INTERNAL', String(err));
        push({ type: 'error', error: { code: e.code, message: e.message } });
      })
      .finally(() => {
        done = true;
        wake?.();
      });
    const encoder = new TextEncoder();
    const body = new ReadableStream<Uint8Array>({
      async pull(controller) {
        while (queue.length === 0 && !done) await new Promise<void>((r) => (wake = r));
        const line = queue.shift();
        if (line !== undefined) controller.enqueue(encoder.encode(line));
        else controller.close();
      },
    });
    return new Response(body, { status: 201, headers: { 'content-type': 'application/x-ndjson' } });
  });

  app.get('/v1/layers', async (c) => {
    const kind = c.req.query('kind');
    const parsed = kind === undefined ? undefined : parseInput(LayerKindSchema, kind, 'query.kind');
    return c.json({ items: await cp.listLayers(c.get('principal'), parsed), nextCursor: null });
  });
  app.get('/v1/layers/:ref{.+}', async (c) => c.json(await cp.getLayer(c.get('principal'), c.req.param('ref'))));
  app.delete('/v1/layers/:ref{.+}', async (c) => {
    await cp.deleteLayer(c.get('principal'), c.req.param('ref'));
    return c.body(null, 204);
  });

  if (watch) registerWatchRoutes(app, watch, readJson);

  return app;
}

/** A stream of events that holds its sandbox active (no idle timeout) until it ends. */
async function* heldEvents(cp: ControlPlane, id: string, events: AsyncGenerator<ExecEvent>): AsyncGenerator<ExecEvent> {
  const release = cp.activity.hold(id);
  try {
    yield* events;
  } finally {
    release();
  }
}

/**
 * A batch as ndjson: one line per item as it finishes, then a summary. Resolves once the batch
 * is validated, so that a bad request (a count over the limit) is still a plain 400.
 */
async function batchEvents(cp: ControlPlane, p: Principal, body: unknown, opts: { signal: AbortSignal; idempotencyKey: string | undefined }): Promise<AsyncGenerator<BatchEvent>> {
  const t0 = performance.now();
  const lines: BatchEvent[] = [];
  let wake: (() => void) | undefined;
  let outcome: { result: CreateSandboxBatchResult } | { error: unknown } | undefined;
  let started: () => void = () => undefined;
  const validated = new Promise<void>((resolve) => (started = resolve));
  const run = cp.createSandboxes(p, body, {
    ...opts,
    onStart: started,
    onItem: (item) => {
      lines.push({ type: 'item', ...item });
      wake?.();
    },
  });
  run.then(
    (result) => {
      outcome = { result };
      wake?.();
    },
    (error: unknown) => {
      outcome = { error };
      wake?.();
    },
  );
  await Promise.race([validated, run]);
  return (async function* () {
    for (;;) {
      const line = lines.shift();
      if (line) yield line;
      else if (outcome) break;
      else await new Promise<void>((r) => (wake = r));
    }
    if ('error' in outcome) yield { type: 'error', error: toDsecError(outcome.error).toJSON().error };
    else yield { type: 'summary', created: outcome.result.created, failed: outcome.result.failed, durationMs: performance.now() - t0 };
  })();
}

/** A queue of events read by one consumer as they come. */
class AsyncQueue<T> implements AsyncIterable<T> {
  private readonly items: T[] = [];
  private wake: (() => void) | undefined;
  private closed = false;

  push(item: T): void {
    this.items.push(item);
    this.wake?.();
  }

  end(): void {
    this.closed = true;
    this.wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    for (;;) {
      const item = this.items.shift();
      if (item !== undefined) {
        yield item;
        continue;
      }
      if (this.closed) return;
      await new Promise<void>((r) => (this.wake = r));
      this.wake = undefined;
    }
  }
}

/** An ndjson response of events; a reader that leaves runs `onCancel`. */
function lineStream(events: AsyncIterable<object>, onCancel: () => void, status = 200): Response {
  const encoder = new TextEncoder();
  const it = events[Symbol.asyncIterator]();
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      const next = await it.next();
      if (next.done) controller.close();
      else controller.enqueue(encoder.encode(JSON.stringify(next.value) + '\n'));
    },
    cancel() {
      onCancel();
    },
  });
  return new Response(body, { status, headers: { 'content-type': 'application/x-ndjson', 'cache-control': 'no-store' } });
}

function mapProcessError(proc: number) {
  return (err: unknown): never => {
    if (err instanceof DsecError && err.code === 'FILE_NOT_FOUND') throw new DsecError('PROCESS_NOT_FOUND', `process ${proc} not found`, { pid: proc });
    throw err;
  };
}

export type { ExecEvent };
