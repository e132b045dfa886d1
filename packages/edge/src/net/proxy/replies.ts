// What the proxy answers when it refuses: a short plain-text HTTP response on a raw socket (CONNECT,
// Upgrade) or on a request's response, naming the reason.
import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { formatDestination } from './address.js';
import type { ConnectionRecord, EgressReason } from './connections.js';

/** Answers a raw client socket with a short plain-text HTTP response and closes it. */
export function plainReply(socket: Socket, status: string, body: string, reason?: EgressReason): void {
  const extra = reason ? `X-Dsec-Egress: denied; reason=${reason}\r\n` : '';
  if (socket.writable)
    socket.end(
      `HTTP/1.1 ${status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\n${extra}Connection: close\r\n\r\n${body}`,
    );
  else socket.destroy();
}

/** The text a refused client reads. */
export function refusalText(r: ConnectionRecord): string {
  return `dsec egress: ${formatDestination(r)} denied (${r.reason ?? 'policy'}${r.detail ? `: ${r.detail}` : ''})\n`;
}

/** Refuses a plain-HTTP request with the record's reason, in the body and in `X-Dsec-Egress`. */
export function refuseHttp(res: ServerResponse, record: ConnectionRecord, status = 403): void {
  const body = refusalText(record);
  res.writeHead(status, {
    'content-type': 'text/plain; charset=utf-8',
    'content-length': Buffer.byteLength(body),
    'x-dsec-egress': `denied; reason=${record.reason ?? 'policy'}`,
  });
  res.end(body);
}
