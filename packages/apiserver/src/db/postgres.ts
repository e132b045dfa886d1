// The PostgreSQL side of the state store: Kysely's PostgreSQL dialect on a `pg` pool, every
// session with `synchronous_commit = on`, and a listening connection for LISTEN/NOTIFY that
// reconnects by itself. Replicas of the apiserver share one database through this.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { CompiledQuery, PostgresDialect } from 'kysely';
import type { Dialect } from 'kysely';

/** Connections each replica keeps to the database. */
export const DEFAULT_POSTGRES_POOL_SIZE = 16;
/** How long a query waits for a free connection or a new one before it fails (ms). */
export const POSTGRES_CONNECT_TIMEOUT_MS = 5000;
/** Wait between reconnection attempts of the listening connection (ms). */
const LISTEN_RETRY_MS = 1000;
/** The advisory lock every running replica holds shared on its listening connection (see {@link PostgresListener.joinReplicas}). */
const REPLICAS_LOCK = 'dsec:replicas';

/** True for a `postgres://` or `postgresql://` URL. */
export function isPostgresUrl(url: string): boolean {
  return /^postgres(ql)?:\/\//i.test(url);
}

/** The URL with its password hidden, for logs and errors. */
export function redactUrl(url: string): string {
  return url.replace(/^(postgres(?:ql)?:\/\/[^:/@]*:)[^@]*@/i, '$1***@');
}

/** A pool and the Kysely dialect over it. */
export interface PostgresConnection {
  dialect: Dialect;
  pool: pg.Pool;
  /** This process's sessions carry it in their `application_name` (see {@link PostgresListener.joinReplicas}). */
  tag: string;
}

/** How long a replica that took the replicas' lock alone waits for other dsec sessions to go (ms). */
const ALONE_CHECK_MS = 3_000;
const ALONE_CHECK_STEP_MS = 200;

/** A tag for one replica's sessions, unique enough to tell its own sessions from another's. */
export function sessionTag(): string {
  return randomUUID().slice(0, 8);
}

/** Options of {@link postgresDialect}. */
export interface PostgresOptions {
  /** Connections in the pool. Default {@link DEFAULT_POSTGRES_POOL_SIZE}. */
  poolSize?: number;
  /** Where connection errors go. Default: nowhere. */
  log?: (line: string) => void;
}

/** A pool on `url` and the dialect that uses it; every session commits synchronously. */
export function postgresDialect(url: string, opts: PostgresOptions = {}): PostgresConnection {
  const tag = sessionTag();
  const pool = new pg.Pool({
    connectionString: url,
    max: opts.poolSize ?? DEFAULT_POSTGRES_POOL_SIZE,
    connectionTimeoutMillis: POSTGRES_CONNECT_TIMEOUT_MS,
    application_name: `dsec-apiserver ${tag}`,
  });
  // An idle connection whose server went away errors on the pool: without a listener that would
  // be an uncaught exception. The next query opens a new connection (or fails, and /healthz says so).
  pool.on('error', (err) => opts.log?.(`dsec: postgres connection lost: ${err.message}`));
  // The pool listens only on idle connections: one checked out (a query or a transaction under
  // way) that loses its server would emit an unheard error. Its queries fail; the pool drops it
  // on release (it is no longer queryable).
  pool.on('connect', (client) => client.on('error', () => undefined));
  const dialect = new PostgresDialect({
    pool,
    onCreateConnection: async (conn) => {
      await conn.executeQuery(CompiledQuery.raw('SET synchronous_commit = on'));
    },
  });
  return { dialect, pool, tag };
}

/**
 * A connection that LISTENs on channels and hands each notification's payload to its handler;
 * when the connection drops it reconnects (every second) and listens again. Once the replica has
 * joined the others ({@link joinReplicas}) the connection also holds the replicas' lock, shared,
 * for as long as the replica runs (taken again on each reconnection).
 */
export class PostgresListener {
  private client: pg.Client | undefined;
  /** What this replica holds of the replicas' lock: nothing yet, all of it (alone, starting), its share. */
  private presence: 'none' | 'alone' | 'shared' = 'none';
  private readonly handlers = new Map<string, (payload: string) => void>();
  private readonly connected: Array<() => void> = [];
  private closed = false;
  private retry: NodeJS.Timeout | undefined;
  private connecting: Promise<void> | undefined;

  constructor(
    private readonly url: string,
    private readonly log: (line: string) => void = () => undefined,
    /** The tag of this replica's pool sessions (`StateStore.sessionTag`): they are its own, not another replica's. */
    private readonly tag: string = sessionTag(),
  ) {}

  /** Listens on `channel` (a plain identifier); returns once the LISTEN took effect or failed. */
  async listen(channel: string, handler: (payload: string) => void): Promise<void> {
    if (!/^[a-z_][a-z0-9_]*$/.test(channel)) throw new Error(`bad channel name ${channel}`);
    this.handlers.set(channel, handler);
    if (this.client) await this.client.query(`LISTEN ${channel}`);
    else await this.connect();
  }

  /**
   * Calls `fn` each time the connection opens and listens again after it dropped (what was
   * notified meanwhile was missed: caches fed by notifications start again from the store).
   */
  onReconnect(fn: () => void): void {
    this.connected.push(fn);
  }

  /**
   * Joins the replicas of the store: true when no other replica runs (this one took the
   * replicas' lock exclusively: until {@link shareWithReplicas} no other replica starts, so what
   * the store shows in flight was cut short by a crash and the start-up reconcile may settle
   * it), false when others run (this one holds its share; it waits here while another is
   * starting alone). A replica holds its share on this connection: one that is killed, or whose
   * connection drops, lets it go with the session.
   */
  async joinReplicas(): Promise<boolean> {
    if (!this.client) await this.connect();
    const client = this.client;
    if (!client) throw new Error('the listening connection did not open');
    const got = await client.query<{ alone: boolean }>('SELECT pg_try_advisory_lock(hashtext($1)) AS alone', [REPLICAS_LOCK]);
    if (got.rows[0]?.alone) {
      // The lock alone does not prove it: a live replica whose listening connection dropped holds
      // no share until it reconnects (a second), but its pool's sessions are still there. The
      // sessions of a replica killed just before go within moments: looked at for a while.
      let others = 0;
      for (const until = Date.now() + ALONE_CHECK_MS; ; await sleep(ALONE_CHECK_STEP_MS)) {
        const r = await client.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM pg_stat_activity
            WHERE datname = current_database() AND pid <> pg_backend_pid()
              AND application_name LIKE 'dsec-%' AND application_name NOT LIKE '% ' || $1`,
          [this.tag],
        );
        others = r.rows[0]?.n ?? 0;
        if (others === 0) {
          this.presence = 'alone';
          return true;
        }
        if (Date.now() >= until) break;
      }
      this.log(`dsec: ${others} session(s) of other dsec processes on the database: starting beside them`);
      await client.query('SELECT pg_advisory_lock_shared(hashtext($1))', [REPLICAS_LOCK]);
      await client.query('SELECT pg_advisory_unlock(hashtext($1))', [REPLICAS_LOCK]);
      this.presence = 'shared';
      return false;
    }
    await client.query('SELECT pg_advisory_lock_shared(hashtext($1))', [REPLICAS_LOCK]);
    this.presence = 'shared';
    return false;
  }

  /** A replica that started alone lets others start: it keeps its share of the lock. */
  async shareWithReplicas(): Promise<void> {
    if (this.presence !== 'alone' || !this.client) return;
    await this.client.query('SELECT pg_advisory_lock_shared(hashtext($1))', [REPLICAS_LOCK]);
    await this.client.query('SELECT pg_advisory_unlock(hashtext($1))', [REPLICAS_LOCK]);
    this.presence = 'shared';
  }

  /** Closes the connection and stops reconnecting. */
  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.retry);
    await this.connecting?.catch(() => undefined);
    const c = this.client;
    this.client = undefined;
    await c?.end().catch(() => undefined);
  }

  private connect(): Promise<void> {
    this.connecting ??= this.open().finally(() => (this.connecting = undefined));
    return this.connecting;
  }

  private async open(): Promise<void> {
    if (this.closed) return;
    const client = new pg.Client({
      connectionString: this.url,
      connectionTimeoutMillis: POSTGRES_CONNECT_TIMEOUT_MS,
      application_name: `dsec-listen ${this.tag}`,
    });
    const lost = (err?: Error): void => {
      if (this.client !== client) return;
      this.client = undefined;
      if (err) this.log(`dsec: postgres listening connection lost: ${err.message}`);
      client.end().catch(() => undefined);
      this.schedule();
    };
    client.on('error', lost);
    client.on('end', () => lost());
    client.on('notification', (n) => {
      const h = this.handlers.get(n.channel);
      if (h && n.payload !== undefined) h(n.payload);
    });
    try {
      await client.connect();
      for (const channel of this.handlers.keys()) await client.query(`LISTEN ${channel}`);
      // A replica that had joined takes its share again (never all of it: others may have started meanwhile).
      if (this.presence !== 'none') {
        await client.query('SELECT pg_advisory_lock_shared(hashtext($1))', [REPLICAS_LOCK]);
        this.presence = 'shared';
      }
    } catch (err) {
      client.removeAllListeners('end');
      client.on('error', () => undefined);
      await client.end().catch(() => undefined);
      this.log(`dsec: postgres listening connection: ${(err as Error).message}`);
      this.schedule();
      return;
    }
    if (this.closed) {
      await client.end().catch(() => undefined);
      return;
    }
    const again = this.everConnected;
    this.everConnected = true;
    this.client = client;
    if (again) for (const fn of this.connected) fn();
  }
  private everConnected = false;

  private schedule(): void {
    if (this.closed || this.retry) return;
    this.retry = setTimeout(() => {
      this.retry = undefined;
      void this.connect();
    }, LISTEN_RETRY_MS);
    this.retry.unref();
  }
}
