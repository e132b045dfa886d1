// ndjson streams of command output, pulled from an attachment so that a slow HTTP client
// back-pressures the command instead of filling the server's memory.
import type { ExecEvent, ExitInfo, OutputEvent, ProcessStream } from '@dsec/protocol';
import type { EdgeClient } from '../nodes.js';
import { toDsecError } from './errors.js';

/** One output event as the API sends it. */
export function outputEvent(ev: OutputEvent): ExecEvent {
  return ev.kind === 'data'
    ? { type: 'output', stream: ev.stream, offset: ev.offset, data: Buffer.from(ev.data.buffer, ev.data.byteOffset, ev.data.byteLength).toString('base64') }
    : { type: 'gap', stream: ev.stream, offset: ev.offset, bytes: ev.bytes };
}

/** What watches a stream as it is sent (the trajectory recording of the command). */
export interface StreamTap {
  onOutput(ev: OutputEvent): void;
  exited(exit: ExitInfo): unknown;
  /** The stream broke before the exit (the command may still run). */
  interrupted(): void;
}

/** Events of an attachment: optional start, output, then exit (or an error event). */
export async function* attachmentEvents(edge: EdgeClient, sandboxId: string, att: ProcessStream, withStart: boolean, tap?: StreamTap): AsyncGenerator<ExecEvent> {
  if (withStart) yield { type: 'start', pid: att.pid, osPid: att.osPid };
  try {
    for await (const ev of att) {
      tap?.onOutput(ev);
      yield outputEvent(ev);
    }
    const exit = await att.exited;
    tap?.exited(exit);
    yield { type: 'exit', pid: att.pid, ...exit };
  } catch (err) {
    tap?.interrupted();
    const e = toDsecError(err);
    yield { type: 'error', error: { code: e.code, message: e.message } };
  }
}

/** An ndjson HTTP response from a generator of events; a disconnect runs `onCancel`. */
export function ndjsonResponse<T>(events: AsyncGenerator<T>, onCancel: () => void): Response {
  const encoder = new TextEncoder();
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      const next = await events.next();
      if (next.done) controller.close();
      else controller.enqueue(encoder.encode(JSON.stringify(next.value) + '\n'));
    },
    cancel() {
      onCancel();
      void events.return(undefined);
    },
  });
  return new Response(body, { status: 200, headers: { 'content-type': 'application/x-ndjson', 'cache-control': 'no-store' } });
}
