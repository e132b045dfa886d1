// Connect-RPC over HTTP/1.1 with the JSON codec, as envd serves it and the e2b SDK speaks it
// (`createConnectTransport({ useBinaryFormat: false })`): unary calls are plain JSON bodies;
// server streams are enveloped (flag byte, 4-byte big-endian length, JSON) in both directions,
// ending with an end-of-stream envelope (flag 0x02) that carries `{}` or `{error}`.
import type { Context } from 'hono';
import { DsecError, invalidArgument } from '@dsec/protocol';
import { CONNECT_STATUS, connectErrorBody } from './errors.js';
import { requestHeader } from '../http/validate.js';

/** Most bytes of one request message (requests are small: paths, commands, stdin pieces). */
export const MAX_CONNECT_REQUEST_BYTES = 16 * 1024 * 1024;
const END_STREAM = 0x02;

/** Reads the request body, refused past {@link MAX_CONNECT_REQUEST_BYTES}. */
async function readBody(c: Context): Promise<Buffer> {
  if (Number(requestHeader(c, 'content-length') ?? 0) > MAX_CONNECT_REQUEST_BYTES) throw new DsecError('PAYLOAD_TOO_LARGE', 'request message too large');
  const body = c.req.raw.body as unknown as AsyncIterable<Uint8Array> | null;
  const chunks: Buffer[] = [];
  let size = 0;
  if (body) {
    for await (const chunk of body) {
      size += chunk.byteLength;
      if (size > MAX_CONNECT_REQUEST_BYTES) throw new DsecError('PAYLOAD_TOO_LARGE', 'request message too large');
      chunks.push(Buffer.from(chunk));
    }
  }
  return Buffer.concat(chunks);
}

function parseJson(text: string): Record<string, unknown> {
  let v: unknown;
  try {
    v = JSON.parse(text === '' ? '{}' : text);
  } catch {
    throw invalidArgument('body', 'not JSON');
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw invalidArgument('body', 'not a JSON object');
  return v as Record<string, unknown>;
}

/** The message of a unary request (`application/json`). */
export async function unaryRequest(c: Context): Promise<Record<string, unknown>> {
  const type = (requestHeader(c, 'content-type') ?? '').split(';')[0]!.trim();
  if (type !== 'application/json') throw invalidArgument('content-type', `unary calls take application/json (the JSON codec), not ${type || 'nothing'}`);
  return parseJson((await readBody(c)).toString('utf8'));
}

/** The one message of a server-streaming request (`application/connect+json`, enveloped). */
export async function streamRequest(c: Context): Promise<Record<string, unknown>> {
  const type = (requestHeader(c, 'content-type') ?? '').split(';')[0]!.trim();
  if (type !== 'application/connect+json') throw invalidArgument('content-type', `streaming calls take application/connect+json, not ${type || 'nothing'}`);
  const body = await readBody(c);
  if (body.length < 5) throw invalidArgument('body', 'no envelope');
  const len = body.readUInt32BE(1);
  if (body[0] !== 0 || body.length !== 5 + len) throw invalidArgument('body', 'not one uncompressed envelope');
  return parseJson(body.subarray(5).toString('utf8'));
}

/** A unary reply. */
export function unaryReply(message: object): Response {
  return new Response(JSON.stringify(message), { status: 200, headers: { 'content-type': 'application/json' } });
}

/** A unary error reply. */
export function unaryError(err: unknown, log?: (line: string) => void): Response {
  const body = connectErrorBody(err, log);
  return new Response(JSON.stringify(body), { status: CONNECT_STATUS[body.code] ?? 500, headers: { 'content-type': 'application/json' } });
}

function envelope(flags: number, message: object): Uint8Array {
  const json = Buffer.from(JSON.stringify(message), 'utf8');
  const out = Buffer.alloc(5 + json.length);
  out[0] = flags;
  out.writeUInt32BE(json.length, 1);
  json.copy(out, 5);
  return out;
}

/** Thrown by a stream's producer to cut the transport (as a dying sandbox does): no end frame. */
export class CutStream extends Error {}

/**
 * A server-streaming reply: each message `produce` yields is a data envelope; the stream closes
 * with an end envelope (`{}`, or `{error}` when `produce` throws). A {@link CutStream} error
 * aborts the response instead (the client sees a reset, not an end). `onClose` runs once when
 * the stream ends or its reader goes.
 */
export function streamReply(produce: AsyncGenerator<object>, log?: (line: string) => void, onClose?: () => void): Response {
  let closed = false;
  const close = (): void => {
    if (closed) return;
    closed = true;
    onClose?.();
  };
  const stream = new ReadableStream<Uint8Array>({
    async pull(controller) {
      if (closed) return;
      try {
        const next = await produce.next();
        if (closed) return;
        if (next.done) {
          controller.enqueue(envelope(END_STREAM, {}));
          controller.close();
          close();
        } else {
          controller.enqueue(envelope(0, next.value));
        }
      } catch (err) {
        if (closed) return;
        close();
        if (err instanceof CutStream) controller.error(err);
        else {
          controller.enqueue(envelope(END_STREAM, { error: connectErrorBody(err, log) }));
          controller.close();
        }
      }
    },
    async cancel() {
      close();
      await produce.return(undefined).catch(() => undefined);
    },
  });
  return new Response(stream, { status: 200, headers: { 'content-type': 'application/connect+json' } });
}

/** The call's deadline (`Connect-Timeout-Ms`), in ms; undefined when none. */
export function deadlineMs(c: Context): number | undefined {
  const raw = requestHeader(c, 'connect-timeout-ms');
  if (raw === undefined) return undefined;
  if (!/^\d{1,10}$/.test(raw)) throw invalidArgument('connect-timeout-ms', 'not a positive integer');
  const n = Number(raw);
  return n > 0 ? n : undefined;
}

/** The keepalive interval the client asks for (`Keepalive-Ping-Interval`, seconds), in ms. */
export function keepaliveMs(c: Context): number {
  const raw = Number(requestHeader(c, 'keepalive-ping-interval') ?? 50);
  return Number.isFinite(raw) && raw >= 1 ? Math.min(raw, 3600) * 1000 : 50_000;
}
