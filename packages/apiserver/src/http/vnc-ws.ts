// The live view of a VM: GET /v1/sandboxes/{id}/vnc upgraded to a WebSocket whose binary
// messages are the bytes of the VM's VNC connection (RFB 3.8), both ways, as websockify and
// noVNC carry them. The node's connection is a process stream (EdgeClient.screen.connect): its
// output goes out as messages (one send at a time, so a slow viewer back-pressures the node),
// and each message is written to it in order. Watching is not the VM's activity; the viewer's
// keys, pointer and clipboard are (`onInput`).
import type { WebSocket } from 'ws';
import type { ProcessStream } from '@dsec/protocol';

/** Viewer bytes queued towards the node before the socket stops being read. */
const MAX_QUEUED_BYTES = 1024 * 1024;

/** The RFB client message types that are the viewer's input. */
const VIEWER_INPUT = new Set([
  4, // KeyEvent
  5, // PointerEvent
  6, // ClientCutText
  255, // QEMU's extended key events and the like
]);

/** The lengths of the other RFB client messages (RFC 6143 section 7.5) from their first bytes. */
const OTHER_CLIENT_MESSAGES: ReadonlyMap<number, (b: Buffer) => number | undefined> = new Map([
  [0, () => 20], // SetPixelFormat
  [2, (b: Buffer) => (b.length >= 4 ? 4 + 4 * b.readUInt16BE(2) : undefined)], // SetEncodings
  [3, () => 10], // FramebufferUpdateRequest
]);

/**
 * True when a viewer's message carries input (a key, the pointer, the clipboard). A message is
 * read as a run of RFB client messages; the screen updates a watching viewer keeps asking for
 * are not input, nor is the handshake (whose bytes are no client message type above), so an
 * open live view alone never keeps its VM awake. Reading stops at a type it does not know.
 */
export function carriesInput(data: Buffer): boolean {
  let at = 0;
  while (at < data.length) {
    const type = data[at]!;
    if (VIEWER_INPUT.has(type)) return true;
    const length = OTHER_CLIENT_MESSAGES.get(type)?.(data.subarray(at));
    if (length === undefined) return false;
    at += length;
  }
  return false;
}

/**
 * Serves one VNC connection over `ws` until either side closes; `onInput` is called for each
 * viewer message that carries input ({@link carriesInput}).
 */
export function serveVnc(ws: WebSocket, stream: ProcessStream, log?: (line: string) => void, onInput?: () => void): void {
  let chain = Promise.resolve();
  let queued = 0;
  let paused = false;
  ws.on('message', (raw: Buffer | ArrayBuffer | Buffer[]) => {
    const data = Array.isArray(raw) ? Buffer.concat(raw) : Buffer.isBuffer(raw) ? raw : Buffer.from(raw);
    queued += data.length;
    if (onInput && carriesInput(data)) onInput();
    if (!paused && queued > MAX_QUEUED_BYTES) {
      paused = true;
      ws.pause();
    }
    chain = chain
      .then(() => stream.write(data))
      .catch(() => ws.close(1011, 'the VNC connection ended'))
      .finally(() => {
        queued -= data.length;
        if (paused && queued <= MAX_QUEUED_BYTES / 2) {
          paused = false;
          ws.resume();
        }
      });
  });
  ws.once('close', () => void stream.detach().catch(() => undefined));
  void (async () => {
    try {
      for await (const ev of stream) {
        if (ev.kind !== 'data') continue;
        if (ws.readyState !== ws.OPEN) break;
        await new Promise<void>((resolve) => ws.send(ev.data, { binary: true }, () => resolve()));
      }
      ws.close(1000, 'the VNC connection ended');
    } catch (err) {
      log?.(`vnc: ${err instanceof Error ? err.message : String(err)}`);
      ws.close(1011, 'the VNC connection failed');
    }
  })();
}
