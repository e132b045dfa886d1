// A QMP client (QEMU's machine protocol: JSON lines over a unix socket): the greeting, capability
// negotiation, commands answered in order, and asynchronous events.
import { EventEmitter } from 'node:events';
import net from 'node:net';
import { DsecError } from '@dsec/protocol';
import { withTimeout } from '../../abortable.js';

/** An asynchronous QMP event (`STOP`, `RESUME`, `SHUTDOWN`, `MIGRATION`, ...). */
export interface QmpEvent {
  event: string;
  data?: Record<string, unknown>;
  timestamp?: { seconds: number; microseconds: number };
}

interface Waiter {
  resolve: (v: unknown) => void;
  reject: (e: Error) => void;
  what: string;
}

/** Longest line QMP may send (a `query-*` answer is a few KiB). */
const MAX_LINE_BYTES = 1 << 20;

/** One QMP connection. Emits `event` (QmpEvent) and `close`. */
export class QmpClient extends EventEmitter {
  private buf = '';
  private readonly waiting: Waiter[] = [];
  private closedError: Error | undefined;
  private greeted: ((v: unknown) => void) | undefined;

  private constructor(private readonly sock: net.Socket) {
    super();
    sock.setEncoding('utf8');
    sock.on('data', (d: string) => this.onData(d));
    sock.on('error', (err) => this.shutdown(err));
    sock.on('close', () => this.shutdown(new DsecError('UNAVAILABLE', 'QMP connection closed')));
  }

  /** Connects, reads the greeting and leaves capability negotiation mode. */
  static async connect(path: string, timeoutMs = 10_000): Promise<QmpClient> {
    const sock = await new Promise<net.Socket>((resolve, reject) => {
      const s = net.createConnection({ path });
      const timer = setTimeout(() => {
        s.destroy();
        reject(new DsecError('TIMEOUT', `QMP at ${path}: no connection in ${timeoutMs} ms`));
      }, timeoutMs);
      s.once('error', (err) => {
        clearTimeout(timer);
        reject(new DsecError('UNAVAILABLE', `QMP at ${path}: ${err.message}`));
      });
      s.once('connect', () => {
        clearTimeout(timer);
        resolve(s);
      });
    });
    const client = new QmpClient(sock);
    try {
      await withTimeout(new Promise((resolve) => (client.greeted = resolve)), timeoutMs, `QMP greeting: no answer in ${timeoutMs} ms`);
      await client.execute('qmp_capabilities', undefined, timeoutMs);
    } catch (err) {
      client.close();
      throw err;
    }
    return client;
  }

  get connected(): boolean {
    return this.closedError === undefined;
  }

  /** Runs a command and returns its `return` value; an `error` answer rejects with its description. */
  execute<T = unknown>(command: string, args?: Record<string, unknown>, timeoutMs = 30_000): Promise<T> {
    if (this.closedError) return Promise.reject(this.closedError);
    const p = new Promise<unknown>((resolve, reject) => this.waiting.push({ resolve, reject, what: command }));
    this.sock.write(JSON.stringify(args ? { execute: command, arguments: args } : { execute: command }) + '\n');
    return withTimeout(p, timeoutMs, `QMP ${command}: no answer in ${timeoutMs} ms`) as Promise<T>;
  }

  /** Waits for the next event of that name (or the connection's end, which rejects). */
  nextEvent(name: string, timeoutMs: number): Promise<QmpEvent> {
    return withTimeout(
      new Promise<QmpEvent>((resolve, reject) => {
        const onEvent = (e: QmpEvent): void => {
          if (e.event !== name) return;
          this.off('event', onEvent);
          this.off('close', onClose);
          resolve(e);
        };
        const onClose = (): void => {
          this.off('event', onEvent);
          reject(this.closedError ?? new DsecError('UNAVAILABLE', 'QMP connection closed'));
        };
        this.on('event', onEvent);
        this.once('close', onClose);
      }),
      timeoutMs,
      `QMP event ${name}: no answer in ${timeoutMs} ms`,
    );
  }

  close(): void {
    this.sock.destroy();
    this.shutdown(new DsecError('UNAVAILABLE', 'QMP connection closed'));
  }

  private onData(chunk: string): void {
    this.buf += chunk;
    if (this.buf.length > MAX_LINE_BYTES && !this.buf.includes('\n')) {
      this.shutdown(new DsecError('INTERNAL', 'QMP sent an oversized line'));
      this.sock.destroy();
      return;
    }
    let nl: number;
    while ((nl = this.buf.indexOf('\n')) >= 0) {
      const line = this.buf.slice(0, nl).trim();
      this.buf = this.buf.slice(nl + 1);
      if (!line) continue;
      let msg: Record<string, unknown>;
      try {
        msg = JSON.parse(line) as Record<string, unknown>;
      } catch {
        this.shutdown(new DsecError('INTERNAL', 'QMP sent a line that is not JSON'));
        this.sock.destroy();
        return;
      }
      if ('QMP' in msg) {
        this.greeted?.(msg);
        this.greeted = undefined;
      } else if ('event' in msg) {
        this.emit('event', msg);
      } else if ('return' in msg || 'error' in msg) {
        const w = this.waiting.shift();
        if (!w) continue;
        if ('error' in msg) {
          const e = msg.error as { class?: string; desc?: string };
          w.reject(new DsecError('BACKEND_FAILED', `QMP ${w.what}: ${e.desc ?? e.class ?? 'error'}`));
        } else w.resolve(msg.return);
      }
    }
  }

  private shutdown(err: Error): void {
    if (this.closedError) return;
    this.closedError = err;
    for (const w of this.waiting.splice(0)) w.reject(err);
    this.emit('close');
  }
}
