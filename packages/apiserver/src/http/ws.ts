// Interactive commands over WebSocket: GET /v1/sandboxes/{id}/exec/ws. The first client
// message says what to run; later ones carry stdin, EOF, resizes and signals. The server sends
// the same events as the ndjson stream, one per message, and waits for each send to complete
// (so a slow client back-pressures the command).
import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import { WebSocketServer } from 'ws';
import type { WebSocket } from 'ws';
import { DsecError, WsClientMessageSchema, WsExecRequestSchema, parseOrThrow } from '@dsec/protocol';
import type { Principal } from '../auth.js';
import type { SettlingExit } from './audit.js';
import { jsonEvent } from '../services/commands.js';
import { clientAddress } from '../tenant-limits.js';
import type { AuthFailureGate } from '../tenant-limits.js';
import type { CommandTarget, RunningCommand } from '../services/commands.js';
import type { Services } from '../services/index.js';
import { publicError, toDsecError } from './errors.js';
import { WS_PROTOCOL, ticketFromProtocols } from '../ws-tickets.js';
import { serveVnc } from './vnc-ws.js';

const ROUTE = /^\/v1\/sandboxes\/([a-z0-9-]{1,128})\/exec\/ws$/;
const VNC_ROUTE = /^\/v1\/sandboxes\/([a-z0-9-]{1,128})\/vnc$/;
const VNC_ROUTE_PATTERN = '/v1/sandboxes/:id/vnc';
/** Largest WebSocket message accepted. */
const MAX_MESSAGE_BYTES = 4 * 1024 * 1024;

function reject(socket: Duplex, err: unknown, log?: (line: string) => void): void {
  const e = toDsecError(err, log);
  const body = JSON.stringify(e.toJSON());
  socket.end(
    `HTTP/1.1 ${e.status} ${e.code}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
  );
}

/** Records a command started over the WebSocket route in the audit trail (exit settles later). */
export type WsAudit = (
  principal: Principal,
  sandboxId: string,
  spec: { argv?: string[] | undefined; cmd?: string | undefined } | undefined,
  exit: SettlingExit,
  /** The route (default the exec route; the VNC route has no command). */
  route?: string,
) => void;

/** The exit of a route that runs no command (the VNC view). */
const NO_EXIT: SettlingExit = { onSettled: (fn) => fn(null) };

/** Handles HTTP upgrades for the WebSocket route (other paths are refused with 404). */
export function createWsHandler(
  services: Services,
  audit?: WsAudit,
  log?: (line: string) => void,
  /** Failed authentications gated by source, as on the HTTP routes (tenant limits). */
  authFailures?: { gate: AuthFailureGate; trustedProxies: ReadonlySet<string> },
): { handle(req: IncomingMessage, socket: Duplex, head: Buffer): void; close(): void } {
  const wss = new WebSocketServer({
    noServer: true,
    maxPayload: MAX_MESSAGE_BYTES,
    // Browsers offer `dsec.v1` with their ticket (ws-tickets.ts) and need one of theirs back.
    handleProtocols: (offered) => (offered.has(WS_PROTOCOL) ? WS_PROTOCOL : false),
  });
  return {
    handle(req, socket, head) {
      const pathname = new URL(req.url ?? '/', 'http://x').pathname;
      const vnc = VNC_ROUTE.exec(pathname);
      const m = vnc ?? ROUTE.exec(pathname);
      if (!m) return reject(socket, new DsecError('NOT_FOUND', 'no such route'));
      const id = m[1]!;
      const source = authFailures ? clientAddress(req.socket.remoteAddress, headerText(req.headers['x-forwarded-for']), authFailures.trustedProxies) : '';
      const gate = authFailures?.gate;
      const cachedOnly = gate?.blocked(source) ? { refuse: () => gate.refusal(source) } : undefined;
      // A browser's single-use ticket (ws-tickets.ts) in place of the Authorization header.
      const ticket = ticketFromProtocols(req.headers['sec-websocket-protocol']);
      const principal = (
        ticket !== undefined ? services.iam.authenticateTicket(ticket, cachedOnly) : services.iam.authenticate(req.headers.authorization, cachedOnly)
      ).catch((err: unknown) => {
        const code = toDsecError(err).code;
        if (gate && (code === 'UNAUTHENTICATED' || code === 'LIMIT_EXCEEDED')) {
          gate.failed(source, { method: 'GET', route: vnc ? VNC_ROUTE_PATTERN : '/v1/sandboxes/:id/exec/ws', status: toDsecError(err).status });
        }
        throw err;
      });
      // The client may go while it is authenticated and routed (seconds: a ticket is redeemed in
      // the store, a VM resumed). Its 'close' has fired by then and ws never completes the
      // upgrade, so what was taken for it is let go here, once the route resolves.
      let gone = false;
      socket.once('close', () => {
        gone = true;
      });
      const isGone = (): boolean => gone || socket.destroyed;
      if (vnc) {
        principal
          .then(async (p) => ({ p, ...(await services.screens.connect(p, id)) }))
          .then(({ p, sandboxId, stream, release }) => {
            const end = (): void => {
              release();
              void stream.detach().catch(() => undefined);
            };
            if (isGone()) return end();
            audit?.(p, sandboxId, undefined, NO_EXIT, VNC_ROUTE_PATTERN);
            socket.once('close', end);
            // Watching is not activity (a dashboard never keeps a VM awake); the viewer's input is.
            wss.handleUpgrade(req, socket, head, (ws) => serveVnc(ws, stream, log, () => void services.activity.touch(sandboxId)));
          })
          .catch((err: unknown) => reject(socket, err, log));
        return;
      }
      principal
        .then(async (p) => ({ p, ...(await services.lifecycle.route(p, id)) }))
        .then(({ p, edge, row }) => {
          if (isGone()) return;
          const onStart = audit
            ? (cmd: RunningCommand, spec: { argv?: string[] | undefined; cmd?: string | undefined }) => audit(p, row.id, spec, cmd)
            : undefined;
          // The session's command holds one of its tenant's (and node's) command slots.
          const release = services.slots.acquire('exec', p.tenantId, row.node);
          let upgraded = false;
          socket.once('close', () => {
            if (!upgraded) release();
          });
          wss.handleUpgrade(req, socket, head, (ws) => {
            upgraded = true;
            // An open session counts as the sandbox's activity until it closes.
            ws.once('close', services.activity.hold(row.id));
            serve(ws, services, { sandboxId: row.id, edge }, release, onStart, log);
          });
        })
        .catch((err: unknown) => reject(socket, err, log));
    },
    close() {
      for (const c of wss.clients) c.terminate();
      wss.close();
    },
  };
}

function serve(
  ws: WebSocket,
  services: Services,
  target: CommandTarget,
  releaseSlot: () => void,
  onStart?: (cmd: RunningCommand, spec: { argv?: string[] | undefined; cmd?: string | undefined }) => void,
  log?: (line: string) => void,
): void {
  const send = (obj: unknown): Promise<void> =>
    new Promise((resolve) => {
      if (ws.readyState !== ws.OPEN) return resolve();
      ws.send(JSON.stringify(obj), () => resolve());
    });
  // Messages are handled strictly in order, including those that arrive while the command is
  // still starting: each one waits for the previous (and for the spawn).
  let chain: Promise<RunningCommand | undefined> = Promise.resolve(undefined);
  let first = true;
  // Back-pressure: past the limit of queued bytes the socket is no longer read (TCP pushes
  // back on the client) until the queue has drained to half of it.
  const maxQueued = services.limits.wsStdinBufferBytes;
  let queued = 0;
  let paused = false;
  // Without a command (it failed to start, or never will) nothing holds the slot.
  let started = false;
  ws.once('close', () => {
    if (!started) releaseSlot();
  });
  ws.on('message', (raw) => {
    const isFirst = first;
    first = false;
    const size = rawSize(raw);
    queued += size;
    if (!paused && queued > maxQueued) {
      paused = true;
      ws.pause();
    }
    chain = chain.then(async (cmd) => {
      try {
        if (isFirst) return await start(rawText(raw));
        if (!cmd) return cmd;
        const msg = parseOrThrow(WsClientMessageSchema, parseJson(rawText(raw)));
        if (msg.type === 'stdin') await cmd.write(Buffer.from(msg.data, 'base64'));
        else if (msg.type === 'eof') await cmd.closeStdin();
        else if (msg.type === 'resize') await cmd.resize(msg.rows, msg.cols);
        else await cmd.kill(msg.signal);
      } catch (err) {
        const error = publicError(err, log);
        if (isFirst) void send({ type: 'error', error }).then(() => ws.close(1011, error.code));
        else await send({ type: 'error', error });
      } finally {
        queued -= size;
        if (paused && queued <= maxQueued / 2) {
          paused = false;
          ws.resume();
        }
      }
      return cmd;
    });
  });
  const start = async (text: string): Promise<RunningCommand> => {
    const spec = parseOrThrow(WsExecRequestSchema, parseJson(text));
    const cmd = await services.commands.spawn(target, { ...spec, keepStdinOpen: true, stdin: '' }, 'ws');
    started = true;
    void cmd.exitCode.finally(releaseSlot);
    onStart?.(cmd, spec);
    // The client may have gone while the command started: nobody can end it then.
    if (ws.readyState !== ws.OPEN) {
      cmd.stop();
      return cmd;
    }
    // The command outlives a closed socket: its recording reads on alone.
    ws.on('close', () => void cmd.leave());
    void pump(cmd);
    return cmd;
  };
  const pump = async (cmd: RunningCommand): Promise<void> => {
    for await (const ev of cmd.events()) await send(jsonEvent(ev));
    ws.close(1000, 'exited');
  };
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    throw new DsecError('INVALID_ARGUMENT', 'body: not valid JSON', { field: 'body' });
  }
}

/** One header's text (the first of repeated ones). */
function headerText(v: string | string[] | undefined): string | undefined {
  return Array.isArray(v) ? v[0] : v;
}

/** The size in bytes of one WebSocket message. */
function rawSize(raw: Buffer | ArrayBuffer | Buffer[]): number {
  if (Array.isArray(raw)) return raw.reduce((n, b) => n + b.length, 0);
  return raw.byteLength;
}

/** The text of one WebSocket message, whichever of its three forms the library hands over. */
function rawText(raw: Buffer | ArrayBuffer | Buffer[]): string {
  if (Array.isArray(raw)) return Buffer.concat(raw).toString();
  return Buffer.isBuffer(raw) ? raw.toString() : Buffer.from(raw).toString();
}
