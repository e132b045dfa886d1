// The live view of a VM: GET /v1/sandboxes/{id}/vnc upgraded to a WebSocket whose binary
// messages are the bytes of the VM's VNC connection (RFB 3.8), both ways, as websockify and
// noVNC carry them. The node's connection is a process stream (EdgeClient.screen.connect): its
// output goes out as messages (one send at a time, so a slow viewer back-pressures the node),
// and each message is written to it in order.
import type { WebSocket } from 'ws';
import type { ProcessStream } from '@dsec/protocol';

/** Viewer bytes queued towards the node before the socket stops being read. */
const MAX_QUEUED_BYTES = 1024 * 1024;

/** Serves one VNC connection over `ws` until either side closes. */
export function serveVnc(ws: WebSocket, stream: ProcessStream, log?: (line: string) => void): void {
  let chain = Promise.resolve();
  let queued = 0;
  let paused = false;
  ws.on('message', (raw: Buffer | ArrayBuffer | Buffer[]) => {
    const data = Array.isArray(raw) ? Buffer.concat(raw) : Buffer.isBuffer(raw) ? raw : Buffer.from(raw);
    queued += data.length;
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
