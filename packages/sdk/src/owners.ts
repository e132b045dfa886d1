// Owner sessions: a client that owns sandboxes heartbeats; when it stops (crash, pre-emption)
// its sandboxes are paused after the grace period, not killed, and resumed when it or a new
// client comes back.
import { CreateOwnerRequestSchema, DsecError, OwnerIdSchema, isDsecError } from '@dsec/protocol';
import type { CallOptions, DsecClient } from './client.js';
import type { OwnerCreateOptions, OwnerInfo } from './types.js';
import { validate } from './validate.js';

function ownerPath(id: string): string {
  return `/v1/owners/${encodeURIComponent(validate(OwnerIdSchema, id, 'id'))}`;
}

/** Owner sessions of the caller's project (the low-level API; `new DsecClient({owner: true})` runs one for you). */
export class OwnersApi {
  constructor(private readonly client: DsecClient) {}

  /** Opens an owner session. */
  async create(req: OwnerCreateOptions = {}, opts: CallOptions = {}): Promise<OwnerInfo> {
    const body = validate(CreateOwnerRequestSchema, req);
    return this.client.json({ method: 'POST', path: '/v1/owners', body }, opts);
  }

  /** One owner session. */
  async get(id: string, opts: CallOptions = {}): Promise<OwnerInfo> {
    return this.client.json({ method: 'GET', path: ownerPath(id) }, opts);
  }

  /** Keeps a session alive (a lost one becomes active again, resuming what its loss paused). */
  async heartbeat(id: string, opts: CallOptions = {}): Promise<OwnerInfo> {
    return this.client.json({ method: 'POST', path: `${ownerPath(id)}/heartbeat` }, opts);
  }

  /** Closes a session: its sandboxes get their `onOwnerLost` action (pause by default). */
  async close(id: string, opts: CallOptions = {}): Promise<void> {
    await this.client.request({ method: 'DELETE', path: ownerPath(id) }, opts);
  }
}

/**
 * The owner session a client keeps: opened on first use, heartbeated on an unref'd timer (it
 * never keeps the process alive), closed by `client.close()`.
 */
export class OwnerSession {
  #opening: Promise<OwnerInfo> | undefined;
  #timer: NodeJS.Timeout | undefined;
  #closed = false;
  /** The last error a heartbeat met (a transient one is retried on the next beat). */
  lastError: unknown;

  constructor(
    private readonly api: OwnersApi,
    private readonly options: OwnerCreateOptions,
  ) {}

  /** The session's id, opening it on first use. */
  async id(opts: CallOptions = {}): Promise<string> {
    if (this.#closed) throw new DsecError('CONFLICT', 'the owner session of this client is closed', { field: 'owner' });
    this.#opening ??= this.api.create(this.options, opts).then((info) => {
      this.#schedule(info.id, info.heartbeatIntervalMs);
      return info;
    });
    this.#opening.catch(() => (this.#opening = undefined));
    return (await this.#opening).id;
  }

  #schedule(id: string, intervalMs: number): void {
    if (this.#closed) return;
    this.#timer = setTimeout(() => {
      this.api.heartbeat(id, { requestTimeoutMs: Math.max(intervalMs, 1000) }).then(
        (info) => {
          this.lastError = undefined;
          this.#schedule(id, info.heartbeatIntervalMs);
        },
        (err: unknown) => {
          this.lastError = err;
          // A closed or unknown session is over; anything else is retried on the next beat.
          if (!(isDsecError(err, 'CONFLICT') || isDsecError(err, 'NOT_FOUND'))) this.#schedule(id, intervalMs);
        },
      );
    }, intervalMs);
    this.#timer.unref();
  }

  /** Stops heartbeating and closes the session on the server. */
  async close(opts: CallOptions = {}): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearTimeout(this.#timer);
    const opening = this.#opening;
    if (!opening) return;
    const info = await opening.catch(() => undefined);
    if (info) await this.api.close(info.id, opts);
  }
}
