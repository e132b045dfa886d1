// Interactive processes over the WebSocket route: stdin, pty, resize and signals.
import WebSocket from 'ws';
import { DsecError } from '@dsec/protocol';
import type { ExecEvent, WsClientMessage } from '@dsec/protocol';
import type { DsecClient } from './client.js';
import type { EventSource, ProcessControl } from './exec-handle.js';
import { errorFromReply, networkError, readAll } from './http.js';
import { streamedError } from './layers.js';
import { PushQueue } from './push-queue.js';

/** An open exec WebSocket: its start event, its events and its control. */
export interface WsExec {
  pid: number;
  source: EventSource;
  control: ProcessControl;
}

/** Opens `/v1/sandboxes/{id}/exec/ws`, sends the request and waits for the start event. */
export async function openWsExec(
  client: DsecClient,
  sandboxId: string,
  request: object,
  opts: { signal?: AbortSignal | undefined; timeoutMs: number },
): Promise<WsExec> {
  opts.signal?.throwIfAborted();
  const target = client.target;
  const url = new URL(target.apiUrl.toString());
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  url.pathname = `${url.pathname.replace(/\/$/, '')}/v1/sandboxes/${encodeURIComponent(sandboxId)}/exec/ws`;
  const headers: Record<string, string> = {};
  if (target.apiKey) headers.authorization = `Bearer ${target.apiKey}`;
  const ws = new WebSocket(url, { headers, perMessageDeflate: false });
  const events = new PushQueue<ExecEvent>();
  const onAbort = (): void => ws.terminate();
  opts.signal?.addEventListener('abort', onAbort, { once: true });

  ws.on('message', (data, isBinary) => {
    if (isBinary) return;
    try {
      events.push(JSON.parse(textOf(data)) as ExecEvent);
    } catch (err) {
      events.fail(new DsecError('INTERNAL', `exec ws: bad message: ${(err as Error).message}`));
    }
  });
  ws.on('close', () => {
    opts.signal?.removeEventListener('abort', onAbort);
    events.end();
  });

  const start = await new Promise<{ pid: number }>((resolve, reject) => {
    const timer =
      opts.timeoutMs > 0
        ? setTimeout(() => (ws.terminate(), reject(new DsecError('TIMEOUT', `exec ws: no start within ${opts.timeoutMs} ms`))), opts.timeoutMs)
        : undefined;
    const fail = (err: unknown): void => {
      clearTimeout(timer);
      reject((opts.signal?.aborted ? opts.signal.reason : err) as Error);
    };
    // A refused upgrade carries the API's error body; read it before the socket goes.
    let refused = false;
    ws.once('unexpected-response', (_req, res) => {
      refused = true;
      readAll(res).then(
        (raw) => (fail(errorFromReply(res.statusCode ?? 0, raw, res.headers)), ws.terminate()),
        (err: unknown) => (fail(networkError(err, target.apiUrl)), ws.terminate()),
      );
    });
    ws.once('error', (err) => {
      if (!refused) fail(networkError(err, target.apiUrl));
    });
    ws.once('open', () => ws.send(JSON.stringify(request)));
    events
      .next()
      .then((r) => {
        clearTimeout(timer);
        if (r.done) return fail(new DsecError('UNAVAILABLE', 'exec ws: closed before the start event'));
        const ev = r.value;
        if (ev.type === 'start') return resolve({ pid: ev.pid });
        if (ev.type === 'error') return fail(streamedError(ev.error));
        return fail(new DsecError('INTERNAL', `exec ws: expected a start event, got ${ev.type}`));
      })
      .catch(fail);
  });
  ws.on('error', (err) => events.fail(networkError(err, target.apiUrl)));

  const sendMessage = (msg: WsClientMessage): Promise<void> =>
    new Promise((resolve, reject) => {
      if (ws.readyState !== WebSocket.OPEN) return reject(new DsecError('UNAVAILABLE', `process ${start.pid}: connection closed`));
      ws.send(JSON.stringify(msg), (err) => (err ? reject(networkError(err, target.apiUrl)) : resolve()));
    });

  return {
    pid: start.pid,
    source: { events, close: () => ws.close() },
    control: {
      async writeStdin(data) {
        // Messages are capped at 2 MiB of base64; send big writes in pieces.
        for (let i = 0; i < data.length || i === 0; i += 1 << 20) {
          await sendMessage({ type: 'stdin', data: data.subarray(i, i + (1 << 20)).toString('base64') });
          if (data.length === 0) break;
        }
      },
      closeStdin: () => sendMessage({ type: 'eof' }),
      signal: (name) => sendMessage({ type: 'signal', signal: name }),
      resize: (rows, cols) => sendMessage({ type: 'resize', rows, cols }),
    },
  };
}

/** The text of a WebSocket message (a Buffer, or fragments of one). */
function textOf(data: Buffer | ArrayBuffer | Buffer[]): string {
  if (Buffer.isBuffer(data)) return data.toString('utf8');
  return (Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data)).toString('utf8');
}
