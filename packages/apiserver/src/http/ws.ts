// Interactive commands over WebSocket: GET /v1/sandboxes/{id}/exec/ws. The first client
// message says what to run; later ones carry stdin, EOF, resizes and signals. The server sends
// the same events as the ndjson stream, one per message, and waits for each send to complete
// (so a slow client back-pressures the command).
import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import { WebSocketServer } from 'ws';
import type { WebSocket } from 'ws';
import { DsecError, WsClientMessageSchema, WsExecRequestSchema } from '@dsec/protocol';
import type { ProcessStream as Attachment } from '@dsec/protocol';
import type { Principal } from '../auth.js';
import type { ControlPlane } from '../control-plane.js';
import { parseInput } from '../control-plane.js';
import { toDsecError } from './errors.js';
import { attachmentEvents } from './streams.js';
import type { ExecRecording, TrajectoryLog } from '../trajectory.js';

const ROUTE = /^\/v1\/sandboxes\/([a-z0-9-]{1,128})\/exec\/ws$/;
/** Largest WebSocket message accepted. */
const MAX_MESSAGE_BYTES = 4 * 1024 * 1024;

function reject(socket: Duplex, err: unknown): void {
  const e = toDsecError(err);
  const body = JSON.stringify(e.toJSON());
  socket.end(`HTTP/1.1 ${e.status} ${e.code}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
}

/** Records a command started over the WebSocket route in the audit trail (exit settles later). */
export type WsAudit = (principal: Principal, sandboxId: string, spec: { argv?: string[] | undefined; cmd?: string | undefined }, exitCode: Promise<number | null>) => void;

/** Handles HTTP upgrades for the WebSocket route; returns false for other paths. */
export function createWsHandler(cp: ControlPlane, audit?: WsAudit): { handle(req: IncomingMessage, socket: Duplex, head: Buffer): void; close(): void } {
  const wss = new WebSocketServer({ noServer: true, maxPayload: MAX_MESSAGE_BYTES });
  return {
    handle(req, socket, head) {
      const m = ROUTE.exec(new URL(req.url ?? '/', 'http://x').pathname);
      if (!m) return reject(socket, new DsecError('NOT_FOUND', 'no such route'));
      const id = m[1]!;
      cp.auth
        .authenticate(req.headers.authorization)
        .then(async (p) => ({ p, ...(await cp.route(p, id)) }))
        .then(({ p, edge, row }) => {
          const onStart = audit ? (spec: { argv?: string[] | undefined; cmd?: string | undefined }, exit: Promise<number | null>) => audit(p, row.id, spec, exit) : undefined;
          wss.handleUpgrade(req, socket, head, (ws) => {
            // An open session counts as the sandbox's activity until it closes.
            ws.once('close', cp.activity.hold(row.id));
            serve(ws, edge, row.id, cp.trajectory, onStart);
          });
        })
        .catch((err: unknown) => reject(socket, err));
    },
    close() {
      for (const c of wss.clients) c.terminate();
      wss.close();
    },
  };
}

type Edge = Awaited<ReturnType<ControlPlane['route']>>['edge'];

function serve(ws: WebSocket, edge: Edge, id: string, trajectory: TrajectoryLog, onStart?: (spec: { argv?: string[] | undefined; cmd?: string | undefined }, exit: Promise<number | null>) => void): void {
  let rec: ExecRecording | undefined;
  const send = (obj: unknown): Promise<void> =>
    new Promise((resolve) => {
      if (ws.readyState !== ws.OPEN) return resolve();
      ws.send(JSON.stringify(obj), () => resolve());
    });
  const fail = (err: unknown): void => {
    const e = toDsecError(err);
    void send({ type: 'error', error: { code: e.code, message: e.message } }).then(() => ws.close(1011, e.code));
  };
  // Messages are handled strictly in order, including those that arrive while the command is
  // still starting: each one waits for the previous (and for the spawn).
  let chain: Promise<Attachment | undefined> = Promise.resolve(undefined);
  let first = true;
  ws.on('message', (raw) => {
    const isFirst = first;
    first = false;
    chain = chain.then(async (att) => {
      try {
        if (isFirst) {
          let body: unknown;
          try {
            body = JSON.parse(raw.toString());
          } catch {
            throw new DsecError('INVALID_ARGUMENT', 'body: not valid JSON', { field: 'body' });
          }
          const spec = parseInput(WsExecRequestSchema, body);
          rec = await trajectory.beginExec(id, spec, 'ws');
          const started = await edge.spawn(id, { ...spec, keepStdinOpen: true, stdin: '' }).catch(rec.failed);
          rec.started(started.pid, edge);
          onStart?.(
            spec,
            new Promise<number | null>((resolve) => {
              void started.exited.then(
                (e) => resolve(e.exitCode),
                () => resolve(null),
              );
              started.onDetach(() => resolve(null));
            }),
          );
          const stop = (): void => {
            void started.kill('SIGKILL').catch(() => undefined);
            void started.detach().catch(() => undefined);
          };
          // The client may have gone while the command started: nobody can end it then.
          if (ws.readyState !== ws.OPEN) {
            stop();
            rec.follow();
            return started;
          }
          const recording = rec;
          // The command outlives a closed socket: its recording reads on alone.
          ws.on('close', () => void started.detach().catch(() => undefined).finally(recording.follow));
          void pump(started);
          return started;
        }
        if (!att) return att;
        const msg = parseInput(WsClientMessageSchema, JSON.parse(raw.toString()));
        if (msg.type === 'stdin') {
          const data = Buffer.from(msg.data, 'base64');
          await att.write(data);
          rec?.addStdin(data);
        }
        else if (msg.type === 'eof') await att.closeStdin();
        else if (msg.type === 'resize') await edge.resize(id, att.pid, msg.rows, msg.cols);
        else await att.kill(msg.signal);
      } catch (err) {
        if (isFirst) fail(err);
        else await send({ type: 'error', error: { code: toDsecError(err).code, message: toDsecError(err).message } });
      }
      return att;
    });
  });
  const pump = async (att: Attachment): Promise<void> => {
    for await (const ev of attachmentEvents(edge, id, att, true, rec)) await send(ev);
    ws.close(1000, 'exited');
  };
}
