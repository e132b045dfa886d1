// Creating, finding, listing and removing sandboxes: what the static methods of Sandbox do.
import { randomUUID } from 'node:crypto';
import {
  CreateSandboxBatchRequestSchema,
  CreateSandboxRequestSchema,
  DEFAULT_ADMISSION_WAIT_MS,
  DsecError,
  IDEMPOTENCY_KEY_HEADER,
  IdempotencyKeySchema,
  ListSandboxesQuerySchema,
} from '@dsec/protocol';
import type { BatchEvent } from '@dsec/protocol';
import { clientFrom } from './client.js';
import type { CallOptions, ConnectionOptions, DsecClient } from './client.js';
import { streamedError } from './layers.js';
import { readNdjson } from './ndjson.js';
import type { Sandbox } from './sandbox.js';
import type { Page, SandboxBatchRequest, SandboxCreateOptions, SandboxInfo, SandboxListOptions } from './types.js';
import { checkSandboxId, defined, validate } from './validate.js';

/** Makes the Sandbox object of a sandbox (the class's private constructor, handed in). */
export type SandboxFactory = (client: DsecClient, id: string, info?: SandboxInfo) => Sandbox;

/** Options of `Sandbox.create` beyond the sandbox's spec. */
export interface CreateOptions extends CallOptions {
  /**
   * Makes the create idempotent (`Idempotency-Key`): a retry with the same key and spec gets the
   * same sandbox, even while the first request is still creating it. Keys live 24 h per project.
   * Default: a random key per call, so that the client's failover to another API URL never
   * creates twice.
   */
  idempotencyKey?: string | undefined;
}

/** Options of `Sandbox.createBatch`. */
export interface BatchCreateOptions extends CallOptions {
  /** Makes the batch idempotent: a retry creates only the items that were not created. Default: a random key per call. */
  idempotencyKey?: string | undefined;
  /** Called with each item as it finishes (in completion order). */
  onItem?: ((item: BatchItem) => void) | undefined;
}

/** One item of a batch: its sandbox, or the error that kept it from being created. */
export interface BatchItem {
  /** Position in the request (0 to count-1). */
  index: number;
  sandbox?: Sandbox;
  error?: DsecError;
}

/** What `Sandbox.createBatch` returns: one item per requested sandbox, in request order. */
export interface BatchCreateResult {
  items: BatchItem[];
  created: number;
  failed: number;
  /** The created sandboxes, in request order. */
  sandboxes: Sandbox[];
}

/** A listing that fetches pages as it is iterated. */
export class SandboxPaginator implements AsyncIterable<SandboxInfo> {
  constructor(
    private readonly client: DsecClient,
    private readonly opts: SandboxListOptions,
  ) {}

  /** Every sandbox of every page. */
  async toArray(): Promise<SandboxInfo[]> {
    const all: SandboxInfo[] = [];
    for await (const s of this) all.push(s);
    return all;
  }

  async *[Symbol.asyncIterator](): AsyncIterator<SandboxInfo> {
    let cursor: string | undefined;
    do {
      const page = await listPage({ ...this.opts, ...(cursor ? { cursor } : {}) }, { client: this.client });
      yield* page.items;
      cursor = page.nextCursor ?? undefined;
    } while (cursor);
  }
}

/**
 * The create's `Idempotency-Key`: the caller's, else a new random one, so that the SDK's own
 * retry on another API URL never creates twice.
 */
function idempotencyHeaders(key: string | undefined): Record<string, string> {
  return { [IDEMPOTENCY_KEY_HEADER]: key === undefined ? `auto-${randomUUID()}` : validate(IdempotencyKeySchema, key, 'idempotencyKey') };
}

/** See {@link Sandbox.create}. */
export async function create(make: SandboxFactory, opts: SandboxCreateOptions & CreateOptions, conn: ConnectionOptions = {}): Promise<Sandbox> {
  const { signal, requestTimeoutMs, idempotencyKey, ...spec } = opts;
  const client = clientFrom(conn);
  const owner = spec.owner ?? (client.ownerSession ? await client.ownerSession.id(defined({ signal, requestTimeoutMs })) : undefined);
  const body = validate(CreateSandboxRequestSchema, defined({ ...spec, owner }));
  const waitMs = body.admission?.wait ? (body.admission.timeoutMs ?? DEFAULT_ADMISSION_WAIT_MS) : 0;
  const timeoutMs = requestTimeoutMs ?? (waitMs > 0 && client.requestTimeoutMs > 0 ? client.requestTimeoutMs + waitMs : undefined);
  const info = await client.json<SandboxInfo>(
    { method: 'POST', path: '/v1/sandboxes', body, headers: idempotencyHeaders(idempotencyKey), ...(timeoutMs !== undefined ? { timeoutMs } : {}) },
    defined({ signal }),
  );
  return make(client, info.id, info);
}

/** See {@link Sandbox.createBatch}. */
export async function createBatch(
  make: SandboxFactory,
  request: SandboxBatchRequest,
  opts: BatchCreateOptions = {},
  conn: ConnectionOptions = {},
): Promise<BatchCreateResult> {
  const client = clientFrom(conn);
  let body = validate(CreateSandboxBatchRequestSchema, request);
  if (client.ownerSession) {
    // This client's owner session owns the batch's sandboxes too, unless they name one.
    const owner = await client.ownerSession.id(defined({ signal: opts.signal, requestTimeoutMs: opts.requestTimeoutMs }));
    body = {
      ...body,
      ...(body.spec ? { spec: { owner, ...body.spec } } : {}),
      ...(body.items ? { items: body.items.map((it) => (it && typeof it === 'object' ? { owner, ...it } : it)) } : {}),
    };
  }
  const reply = await client.stream(
    { method: 'POST', path: '/v1/sandboxes:batch', body, accept: 'application/x-ndjson', headers: idempotencyHeaders(opts.idempotencyKey) },
    defined({ signal: opts.signal, requestTimeoutMs: opts.requestTimeoutMs }),
  );
  const count = body.items?.length ?? body.count ?? 0;
  const items: BatchItem[] = new Array<BatchItem>(count);
  let summary: { created: number; failed: number } | undefined;
  try {
    for await (const ev of readNdjson<BatchEvent>(reply.body)) {
      if (ev.type === 'error') throw streamedError(ev.error);
      if (ev.type === 'summary') {
        summary = ev;
        continue;
      }
      const item: BatchItem = { index: ev.index };
      if (ev.sandbox) item.sandbox = make(client, ev.sandbox.id, ev.sandbox);
      if (ev.error) item.error = streamedError(ev.error);
      items[ev.index] = item;
      opts.onItem?.(item);
    }
  } finally {
    reply.body.destroy();
  }
  if (!summary) throw new DsecError('UNAVAILABLE', 'batch: the stream ended before its summary');
  return { items, created: summary.created, failed: summary.failed, sandboxes: items.flatMap((i) => (i?.sandbox ? [i.sandbox] : [])) };
}

/** See {@link Sandbox.connect}. */
export async function connect(make: SandboxFactory, id: string, conn: ConnectionOptions & CallOptions & { claim?: boolean } = {}): Promise<Sandbox> {
  const client = clientFrom(conn);
  const sandbox = make(client, checkSandboxId(id));
  const call = defined({ signal: conn.signal, requestTimeoutMs: conn.requestTimeoutMs });
  if (client.ownerSession && conn.claim !== false) await sandbox.setOwner(await client.ownerSession.id(call), call);
  else await sandbox.info(call);
  return sandbox;
}

/** See {@link Sandbox.find}. */
export async function find(make: SandboxFactory, opts: SandboxListOptions, conn: ConnectionOptions & { claim?: boolean } = {}): Promise<Sandbox[]> {
  const client = clientFrom(conn);
  const out: Sandbox[] = [];
  for await (const info of list(opts, { client })) {
    const sandbox = make(client, info.id, info);
    if (client.ownerSession && conn.claim !== false)
      await sandbox.setOwner(await client.ownerSession.id(defined({ signal: opts.signal })), defined({ signal: opts.signal }));
    out.push(sandbox);
  }
  return out;
}

/** See {@link Sandbox.list}. */
export function list(opts: SandboxListOptions = {}, conn: ConnectionOptions = {}): SandboxPaginator {
  const client = clientFrom(conn);
  listQuery(opts);
  return new SandboxPaginator(client, opts);
}

/** See {@link Sandbox.listPage}. */
export async function listPage(opts: SandboxListOptions & { cursor?: string } = {}, conn: ConnectionOptions = {}): Promise<Page<SandboxInfo>> {
  const client = clientFrom(conn);
  const query = listQuery(opts);
  return client.json<Page<SandboxInfo>>({ method: 'GET', path: '/v1/sandboxes', query }, defined({ signal: opts.signal }));
}

function listQuery(opts: SandboxListOptions & { cursor?: string }): Record<string, string | number | string[] | undefined> {
  const label = opts.labels ? Object.entries(opts.labels).map(([k, v]) => `${k}=${v}`) : undefined;
  const q = validate(ListSandboxesQuerySchema, defined({ label, state: opts.state, limit: opts.limit, cursor: opts.cursor }), 'query');
  return { label: q.label, state: q.state, limit: q.limit, cursor: q.cursor };
}
