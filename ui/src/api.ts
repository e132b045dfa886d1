// The dashboard's only way to the API: every request carries the key header (the key lives in
// sessionStorage, never in a URL or a cookie); live streams are read with fetch (EventSource
// cannot send a header); WebSockets open with a single-use ticket from POST /v1/ws-tickets.

const KEY_ITEM = 'dsec.apiKey';

/** The key of this tab's session, if signed in. */
export function storedKey(): string | null {
  return sessionStorage.getItem(KEY_ITEM);
}

/** Keeps the key for this tab only (sessionStorage: gone when the tab closes). */
export function storeKey(key: string): void {
  sessionStorage.setItem(KEY_ITEM, key);
}

/** Signs out. */
export function forgetKey(): void {
  sessionStorage.removeItem(KEY_ITEM);
}

/** An error answer of the API. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

function headers(extra: Record<string, string> = {}): Record<string, string> {
  const key = storedKey();
  return key ? { authorization: `Bearer ${key}`, ...extra } : extra;
}

async function fail(res: Response): Promise<never> {
  let code = `HTTP_${res.status}`;
  let message = res.statusText;
  try {
    const body = (await res.json()) as { error?: { code?: string; message?: string } };
    code = body.error?.code ?? code;
    message = body.error?.message ?? message;
  } catch {
    // not JSON
  }
  throw new ApiError(res.status, code, message);
}

/** A raw request to the API with the key header; throws ApiError for a non-2xx answer. */
export async function request(method: string, path: string, body?: BodyInit, extra: Record<string, string> = {}, signal?: AbortSignal): Promise<Response> {
  const init: RequestInit = { method, headers: headers(extra), cache: 'no-store', credentials: 'omit' };
  if (body !== undefined) init.body = body;
  if (signal) init.signal = signal;
  const res = await fetch(path, init);
  if (!res.ok) await fail(res);
  return res;
}

/** A JSON request; the JSON answer (undefined for 204). */
export async function api<T>(method: string, path: string, body?: unknown): Promise<T> {
  const res = await request(
    method,
    path,
    body === undefined ? undefined : JSON.stringify(body),
    body === undefined ? {} : { 'content-type': 'application/json' },
  );
  if (res.status === 204) return undefined as T;
  return (await res.json()) as T;
}

/** GET of a JSON resource. */
export function get<T>(path: string): Promise<T> {
  return api<T>('GET', path);
}

/** Reads a streamed body line by line (ndjson, or the lines of an SSE stream). */
export async function readLines(res: Response, onLine: (line: string) => void): Promise<void> {
  const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += value;
    let i: number;
    while ((i = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, i).replace(/\r$/, '');
      buf = buf.slice(i + 1);
      onLine(line);
    }
  }
  if (buf) onLine(buf);
}

/** An ndjson request: each line parsed and handed to `onItem`. */
// eslint-disable-next-line @typescript-eslint/no-unnecessary-type-parameters -- the caller names the line type it expects
export async function ndjson<T>(method: string, path: string, body: unknown, onItem: (item: T) => void, signal?: AbortSignal): Promise<void> {
  const extra: Record<string, string> = { accept: 'application/x-ndjson' };
  if (body !== undefined) extra['content-type'] = 'application/json';
  const res = await request(method, path, body === undefined ? undefined : JSON.stringify(body), extra, signal);
  await readLines(res, (line) => {
    if (line.trim()) onItem(JSON.parse(line) as T);
  });
}

/** The media type that asks the API to follow a GET's answer: the answer now, then again each time it changes. */
export const FOLLOW_MEDIA_TYPE = 'application/vnd.dsec.follow+ndjson';

/**
 * The error of a stream's last line when the server ended it because the key no longer holds
 * (revoked, its project gone): the stream is not opened again.
 */
function endedBy(item: unknown): ApiError | undefined {
  const error = (item as { error?: { code?: unknown; message?: unknown } } | null)?.error;
  if (error?.code !== 'UNAUTHENTICATED' && error?.code !== 'PERMISSION_DENIED') return undefined;
  return new ApiError(error.code === 'UNAUTHENTICATED' ? 401 : 403, error.code, typeof error.message === 'string' ? error.message : '');
}

/**
 * A usage stream (GET with `Accept: application/x-ndjson`, the key in the header) or a followed
 * answer (`accept` {@link FOLLOW_MEDIA_TYPE}): each line to `onItem` as the server pushes it. A
 * dropped stream is opened again after 2 s; a refusal (4xx), or a last line saying the key no
 * longer holds, ends it with the error. `onState` says when the stream is up or down.
 */
// eslint-disable-next-line @typescript-eslint/no-unnecessary-type-parameters -- the caller names the line type it expects
export async function followNdjson<T>(
  path: string,
  onItem: (item: T) => void,
  signal: AbortSignal,
  onState?: (live: boolean) => void,
  accept = 'application/x-ndjson',
): Promise<void> {
  while (!signal.aborted) {
    try {
      const res = await request('GET', path, undefined, { accept }, signal);
      onState?.(true);
      let ended: ApiError | undefined;
      await readLines(res, (line) => {
        if (!line.trim()) return;
        const item = JSON.parse(line) as T;
        ended ??= endedBy(item);
        if (!ended) onItem(item);
      });
      if (ended) throw ended;
    } catch (err) {
      if (signal.aborted) return;
      if (err instanceof ApiError && err.status >= 400 && err.status < 500 && err.status !== 429) throw err;
    }
    onState?.(false);
    await new Promise((r) => setTimeout(r, 2000));
  }
}

/** An event of GET /v1/events. */
export interface DsecEvent {
  id: string;
  at: string;
  kind: string;
  severity: string;
  project: string | null;
  sandbox: string | null;
  node: string | null;
  message: string;
  data: unknown;
}

/**
 * Follows the live event stream (SSE over fetch, with the key header) until `signal` aborts;
 * reconnects after a drop from the last id seen.
 */
export async function followEvents(query: string, onEvent: (ev: DsecEvent) => void, signal: AbortSignal, onState?: (live: boolean) => void): Promise<void> {
  let last: string | undefined;
  while (!signal.aborted) {
    try {
      const extra: Record<string, string> = { accept: 'text/event-stream' };
      if (last) extra['last-event-id'] = last;
      const res = await request('GET', `/v1/events${query ? `?${query}` : ''}`, undefined, extra, signal);
      onState?.(true);
      let ended: ApiError | undefined;
      let data = '';
      let name = '';
      await readLines(res, (line) => {
        if (line === '') {
          if (data && name === 'ended') {
            // The server ended the stream: the key no longer holds. Not opened again.
            ended = endedBy(JSON.parse(data)) ?? new ApiError(401, 'UNAUTHENTICATED', 'the stream was ended');
          } else if (data && name !== 'dropped') {
            const ev = JSON.parse(data) as DsecEvent;
            last = ev.id;
            onEvent(ev);
          }
          data = '';
          name = '';
        } else if (line.startsWith('data:')) data += line.slice(5).trimStart();
        else if (line.startsWith('event:')) name = line.slice(6).trim();
      });
      if (ended) throw ended;
    } catch (err) {
      if (signal.aborted) return;
      if (err instanceof ApiError && (err.status === 401 || err.status === 403)) throw err;
    }
    onState?.(false);
    await new Promise((r) => setTimeout(r, 2000));
  }
}

/** The calling key. */
export interface Me {
  keyId: string;
  project: string;
  role: 'viewer' | 'member' | 'admin';
  tenant: string;
}

/** Opens a WebSocket to `path` with a fresh single-use ticket (never the key) as its sub-protocol. */
export async function openSocket(path: string): Promise<WebSocket> {
  const { ticket } = await api<{ ticket: string }>('POST', '/v1/ws-tickets');
  const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
  return new WebSocket(`${scheme}://${location.host}${path}`, ['dsec.v1', `dsec.ticket.${ticket}`]);
}

/** Bytes as base64 (WebSocket stdin). */
export function toBase64(bytes: Uint8Array): string {
  let s = '';
  for (const b of bytes) s += String.fromCharCode(b);
  return btoa(s);
}

/** base64 as bytes (command output). */
export function fromBase64(text: string): Uint8Array {
  const s = atob(text);
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out;
}

/** A path with a query built from pairs (values encoded). */
export function withQuery(path: string, params: Record<string, string | number | boolean | undefined | string[]>): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v === undefined || v === '') continue;
    if (Array.isArray(v)) for (const x of v) q.append(k, x);
    else q.set(k, String(v));
  }
  const s = q.toString();
  return s ? `${path}?${s}` : path;
}
