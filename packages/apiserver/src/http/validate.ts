// Input at the HTTP boundary: bounded bodies, query strings, and validation middleware that
// parses a body, a query or a path parameter once with the protocol's schemas, so that handlers
// get typed values (`c.get('body')`, `c.get('query')`).
import type { Context } from 'hono';
import { createMiddleware } from 'hono/factory';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { DsecError, invalidArgument, MAX_UPLOAD_BYTES, parseOrThrow } from '@dsec/protocol';
import type { z } from 'zod';

/** Largest JSON request body. */
export const MAX_JSON_BYTES = 32 * 1024 * 1024;
export { MAX_UPLOAD_BYTES };

/** Node's request and response under a context (none under `app.request()`, as in tests). */
function nodeOf(c: Context): { incoming?: IncomingMessage; outgoing?: ServerResponse } {
  return (c.env as { incoming?: IncomingMessage; outgoing?: ServerResponse } | undefined) ?? {};
}

/**
 * A request header, as `c.req.header(name)` gives it (repeated ones joined by `, `). Read from
 * Node's request where there is one: `c.req.header` builds a fetch `Headers` of the whole
 * request first, about a twentieth of a millisecond per request.
 */
export function requestHeader(c: Context, name: string): string | undefined {
  // node:http's requests have `headersDistinct`; anything else (an HTTP/2 request) goes the fetch way.
  const distinct = nodeOf(c).incoming?.headersDistinct as Record<string, string[] | undefined> | undefined;
  if (!distinct) return c.req.header(name);
  return distinct[name.toLowerCase()]?.join(', ');
}

const signals = new WeakMap<ServerResponse, AbortSignal>();

/**
 * The request's abort signal, as `c.req.raw.signal`: aborted when the client goes before its
 * answer is sent (or its request failed). Made from Node's response where there is one:
 * `c.req.raw` builds a whole fetch `Request` (headers, body stream, signal), about a fifth of a
 * millisecond per request.
 */
export function requestSignal(c: Context): AbortSignal {
  const { incoming, outgoing } = nodeOf(c);
  if (!incoming || !outgoing) return c.req.raw.signal;
  let signal = signals.get(outgoing);
  if (signal) return signal;
  const controller = new AbortController();
  signal = controller.signal;
  signals.set(outgoing, signal);
  const settle = (): void => {
    if (incoming.errored) controller.abort(incoming.errored.toString());
    else if (!outgoing.writableFinished) controller.abort('Client connection prematurely closed.');
  };
  if (outgoing.closed) settle();
  else outgoing.once('close', settle);
  return signal;
}

/** Reads a JSON body of at most {@link MAX_JSON_BYTES}; an empty body is `{}`. */
export async function readJson(c: Context): Promise<unknown> {
  const incoming = nodeOf(c).incoming;
  // Node's request read directly: the web-stream view of it costs a quarter of a millisecond per request.
  if (incoming) return readIncomingJson(incoming);
  const chunks: Buffer[] = [];
  for await (const chunk of limitedBody(c, MAX_JSON_BYTES, 'JSON bodies')) chunks.push(chunk);
  return parseJsonText(Buffer.concat(chunks).toString('utf8'));
}

/** Reads a JSON body of at most {@link MAX_JSON_BYTES} from Node's request; an empty body is `{}`. */
export async function readIncomingJson(incoming: IncomingMessage): Promise<unknown> {
  const tooLarge = (): DsecError => new DsecError('PAYLOAD_TOO_LARGE', `JSON bodies are limited to ${MAX_JSON_BYTES} bytes`);
  if (Number(incoming.headers['content-length'] ?? 0) > MAX_JSON_BYTES) throw tooLarge();
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of incoming) {
    size += (chunk as Buffer).byteLength;
    if (size > MAX_JSON_BYTES) throw tooLarge();
    chunks.push(chunk as Buffer);
  }
  return parseJsonText(chunks.length === 1 ? chunks[0]!.toString('utf8') : Buffer.concat(chunks).toString('utf8'));
}

function parseJsonText(text: string): unknown {
  if (text.trim() === '') return {};
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw invalidArgument('body', 'not valid JSON');
  }
  // Only a `\u` escape makes a NUL or an unpaired surrogate (raw bytes decode to U+FFFD): a body
  // without one needs no walk.
  if (text.includes('\\u')) refuseUnstorableStrings(value);
  return value;
}

/** A NUL character, or a UTF-16 surrogate without its pair. */
// eslint-disable-next-line no-control-regex -- NUL is what it looks for
const UNSTORABLE = /\u0000|[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/**
 * Refuses a body with a string (or key) that holds a NUL character or an unpaired UTF-16
 * surrogate: PostgreSQL keeps neither in text nor in JSON, and no command, path, label or
 * variable needs one. 400 naming where it is (`env.A`, `labels`...).
 */
function refuseUnstorableStrings(root: unknown): void {
  // Iterative: a body may nest deeper than the stack.
  const stack: Array<{ value: unknown; path: string }> = [{ value: root, path: '' }];
  for (let next = stack.pop(); next; next = stack.pop()) {
    const { value, path } = next;
    const at = path === '' ? 'body' : path;
    if (typeof value === 'string') {
      if (UNSTORABLE.test(value)) throw invalidArgument(at, 'holds a NUL character or an unpaired UTF-16 surrogate');
    } else if (Array.isArray(value)) {
      value.forEach((v, i) => stack.push({ value: v, path: `${path}[${i}]` }));
    } else if (value !== null && typeof value === 'object') {
      for (const [k, v] of Object.entries(value)) {
        const kPath = path === '' ? k : `${path}.${k}`;
        if (UNSTORABLE.test(k)) throw invalidArgument(path === '' ? 'body' : path, 'has a key that holds a NUL character or an unpaired UTF-16 surrogate');
        stack.push({ value: v, path: kPath });
      }
    }
  }
}

/** The request body as chunks, refused past `limit` bytes whether or not a length was sent. */
export async function* limitedBody(c: Context, limit: number, what: string): AsyncGenerator<Buffer> {
  const tooLarge = (): DsecError => new DsecError('PAYLOAD_TOO_LARGE', `${what} are limited to ${limit} bytes`);
  if (Number(requestHeader(c, 'content-length') ?? 0) > limit) throw tooLarge();
  const body = c.req.raw.body as unknown as AsyncIterable<Uint8Array> | null;
  if (!body) return;
  let size = 0;
  for await (const chunk of body) {
    size += chunk.byteLength;
    if (size > limit) throw tooLarge();
    yield Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  }
}

/** An upload body, refused past `limit` bytes. */
export function uploadBody(c: Context, limit = MAX_UPLOAD_BYTES): AsyncIterable<Uint8Array> {
  return limitedBody(c, limit, 'uploads');
}

/** The query string; keys in `repeatable` keep every value, the others their last. */
export function queryObject(c: Context, repeatable: readonly string[] = ['label']): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  const url = new URL(c.req.url);
  for (const key of new Set(url.searchParams.keys())) {
    const all = url.searchParams.getAll(key);
    out[key] = repeatable.includes(key) ? all : (all[all.length - 1] ?? '');
  }
  return out;
}

/** True when the client asked for an ndjson stream. */
export function wantsNdjson(c: Context): boolean {
  return (requestHeader(c, 'accept') ?? '').includes('application/x-ndjson');
}

/** Parses the JSON body with `schema`; the handler reads it as `c.get('body')`. */
export function jsonBody<S extends z.ZodType>(schema: S, prefix = '') {
  return createMiddleware<{ Variables: { body: z.output<S> } }>(async (c, next) => {
    c.set('body', parseOrThrow(schema, await readJson(c), prefix));
    await next();
  });
}

/** Parses the query string with `schema` (errors name `query.<field>`); read as `c.get('query')`. */
export function query<S extends z.ZodType>(schema: S, repeatable: readonly string[] = ['label']) {
  return createMiddleware<{ Variables: { query: z.output<S> } }>(async (c, next) => {
    c.set('query', parseOrThrow(schema, queryObject(c, repeatable), 'query'));
    await next();
  });
}

/** A process handle in the path (`:pid`): a non-negative integer. */
export function pidParam(c: Context): number {
  const raw = c.req.param('pid') ?? '';
  if (!/^\d{1,15}$/.test(raw)) throw invalidArgument('pid', 'must be a process handle (a non-negative integer)');
  return Number(raw);
}
