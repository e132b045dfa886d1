// Test fixture: a PostgreSQL cluster of its own, from Debian's package (initdb + postgres from
// /usr/lib/postgresql/<version>/bin), in a temp dir, on a free loopback port, run as the
// `postgres` system user (the server refuses root). Stopped and removed by close(), even when a
// test fails; killed with the test process if that dies first.
import { spawn, spawnSync } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { chown, mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import pg from 'pg';

/** Debian's PostgreSQL programs (the newest installed version). */
export function postgresBin(): string | undefined {
  const root = '/usr/lib/postgresql';
  if (!existsSync(root)) return undefined;
  const versions = readdirSync(root)
    .filter((v) => existsSync(path.join(root, v, 'bin', 'postgres')))
    .sort((a, b) => Number(b) - Number(a));
  return versions[0] ? path.join(root, versions[0], 'bin') : undefined;
}

/** Why a PostgreSQL test cannot run here, or undefined when it can. */
export function postgresSkipReason(): string | undefined {
  if (!postgresBin()) return 'PostgreSQL is not installed (scripts/install.sh installs it)';
  if (process.getuid?.() !== 0) return 'needs root (to run PostgreSQL as the postgres user)';
  if (!userIds('postgres')) return 'no postgres system user';
  return undefined;
}

function userIds(name: string): { uid: number; gid: number } | undefined {
  for (const line of readFileSync('/etc/passwd', 'utf8').split('\n')) {
    const f = line.split(':');
    if (f[0] === name) return { uid: Number(f[2]), gid: Number(f[3]) };
  }
  return undefined;
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const port = (srv.address() as net.AddressInfo).port;
      srv.close(() => resolve(port));
    });
  });
}

/** A running PostgreSQL cluster. */
export interface TestPostgres {
  /** Loopback port of the server. */
  port: number;
  /** URL of a database (default `postgres`) as the superuser `dsec`. */
  url(database?: string): string;
  /** Creates an empty database (collation C, as dsec needs) and returns its URL. */
  createDatabase(name: string): Promise<string>;
  /** Runs one statement in a database. */
  query(sql: string, database?: string): Promise<pg.QueryResult>;
  /** Stops the server (fast shutdown); start() starts it again on the same port and data. */
  stop(): Promise<void>;
  start(): Promise<void>;
  /** Stops the server and removes its files. */
  close(): Promise<void>;
}

const live = new Set<ChildProcess>();
process.once('exit', () => {
  for (const p of live) p.kill('SIGKILL');
});

/** Options of {@link startTestPostgres}. */
export interface TestPostgresOptions {
  /** More server settings (`-c name=value`), e.g. `shared_preload_libraries` for a profile. */
  settings?: Record<string, string>;
}

/** Starts a cluster; the caller must close() it (in `after`). */
export async function startTestPostgres(opts: TestPostgresOptions = {}): Promise<TestPostgres> {
  const extra = Object.entries(opts.settings ?? {}).flatMap(([k, v]) => ['-c', `${k}=${v}`]);
  const bin = postgresBin();
  const ids = userIds('postgres');
  if (!bin || !ids) throw new Error(postgresSkipReason() ?? 'no PostgreSQL');
  // Under /tmp, not $TMPDIR: the postgres user must be able to reach the directory, and a
  // TMPDIR below root's home would not let it.
  const dir = await mkdtemp(path.join(existsSync('/tmp') ? '/tmp' : os.tmpdir(), 'dsec-pg-'));
  const data = path.join(dir, 'data');
  const env = { PATH: '/usr/bin:/bin', HOME: dir, LANG: 'C', LC_ALL: 'C' };
  let proc: ChildProcess | undefined;
  let port = 0;
  let logTail = '';

  const start = async (): Promise<void> => {
    let lastErr: unknown;
    // A port found free can be taken before the server binds it: try another.
    for (let attempt = 0; attempt < 3; attempt++) {
      if (port === 0 || attempt > 0) port = await freePort();
      logTail = '';
      const p = spawn(
        path.join(bin, 'postgres'),
        ['-D', data, '-h', '127.0.0.1', '-p', String(port), '-k', dir, '-c', 'fsync=off', '-c', 'full_page_writes=off', '-c', 'max_connections=200', ...extra],
        { uid: ids.uid, gid: ids.gid, env, cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] },
      );
      live.add(p);
      p.stderr?.on('data', (b: Buffer) => (logTail = (logTail + b.toString()).slice(-4000)));
      const exited = new Promise<void>((resolve) => p.once('exit', () => resolve()));
      p.once('exit', () => live.delete(p));
      const deadline = Date.now() + 30_000;
      let ready = false;
      let gone = false;
      void exited.then(() => (gone = true));
      while (!ready && !gone && Date.now() < deadline) {
        const c = new pg.Client({ host: '127.0.0.1', port, user: 'dsec', database: 'postgres', connectionTimeoutMillis: 2000 });
        c.on('error', () => undefined);
        try {
          await c.connect();
          await c.query('SELECT 1');
          ready = true;
        } catch (err) {
          lastErr = err;
          await new Promise((r) => setTimeout(r, 100));
        } finally {
          await c.end().catch(() => undefined);
        }
      }
      if (ready) {
        proc = p;
        return;
      }
      p.kill('SIGKILL');
      await exited;
    }
    throw new Error(`PostgreSQL did not start: ${(lastErr as Error | undefined)?.message ?? 'unknown'}\n${logTail}`);
  };

  const stop = async (): Promise<void> => {
    const p = proc;
    proc = undefined;
    if (!p || p.exitCode !== null || p.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => p.once('exit', () => resolve()));
    p.kill('SIGINT'); // fast shutdown: clients are disconnected
    const timer = setTimeout(() => p.kill('SIGKILL'), 15_000);
    await exited;
    clearTimeout(timer);
  };

  try {
    await chown(dir, ids.uid, ids.gid);
    const init = spawnSync(path.join(bin, 'initdb'), ['-D', data, '-U', 'dsec', '--auth=trust', '--locale=C', '--encoding=UTF8', '--no-sync'], {
      uid: ids.uid,
      gid: ids.gid,
      env,
      cwd: dir,
      encoding: 'utf8',
      timeout: 120_000,
    });
    if (init.status !== 0) throw new Error(`initdb failed (${init.status ?? init.signal}): ${init.stderr}`);
    await start();
  } catch (err) {
    await stop();
    await rm(dir, { recursive: true, force: true });
    throw err;
  }

  const url = (database = 'postgres'): string => `postgres://dsec@127.0.0.1:${port}/${database}`;
  const query = async (text: string, database?: string): Promise<pg.QueryResult> => {
    const c = new pg.Client({ connectionString: url(database), connectionTimeoutMillis: 5000 });
    c.on('error', () => undefined);
    await c.connect();
    try {
      return await c.query(text);
    } finally {
      await c.end().catch(() => undefined);
    }
  };
  return {
    get port() {
      return port;
    },
    url,
    async createDatabase(name) {
      if (!/^[a-z_][a-z0-9_]*$/.test(name)) throw new Error(`bad database name ${name}`);
      await query(`CREATE DATABASE ${name} TEMPLATE template0 LOCALE 'C' ENCODING 'UTF8'`);
      return url(name);
    },
    query,
    stop,
    start,
    async close() {
      await stop();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/** Where a {@link CommitCutter} cuts a connection at a COMMIT. */
export type CommitCut = 'before-commit' | 'after-commit';

/** A loopback proxy in front of a server that can cut a connection at its next COMMIT. */
export interface CommitCutter {
  /** URL of `database` through the proxy. */
  url(database: string): string;
  /** The text of every statement the clients sent through the proxy, in order (a simple query or a parse); the test may empty it. */
  statements: string[];
  /**
   * Cuts the next COMMIT that passes: `before-commit` closes both ends instead of forwarding it
   * (the server rolls back); `after-commit` forwards it and closes both ends when the server
   * answers (committed, the answer lost). Resolves once it has cut.
   */
  arm(cut: CommitCut): Promise<void>;
  close(): Promise<void>;
}

/**
 * Starts a {@link CommitCutter} for the server at `port`. It reads the client's side of the
 * protocol (the startup message, then typed messages) to find a COMMIT: a simple query (`Q`) or
 * a parse (`P`) whose text is `commit`; the server's side passes as it is.
 */
export async function startCommitCutter(port: number): Promise<CommitCutter> {
  let armed: { cut: CommitCut; done: () => void } | undefined;
  const statements: string[] = [];
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const upstream = net.connect(port, '127.0.0.1');
    sockets.add(client).add(upstream);
    const cut = (): void => {
      client.destroy();
      upstream.destroy();
    };
    client.on('close', () => (sockets.delete(client), upstream.destroy()));
    upstream.on('close', () => (sockets.delete(upstream), client.destroy()));
    client.on('error', () => undefined);
    upstream.on('error', () => undefined);
    let pending = Buffer.alloc(0);
    let started = false;
    let dropAnswer: (() => void) | undefined;
    client.on('data', (chunk: Buffer) => {
      pending = Buffer.concat([pending, chunk]);
      for (;;) {
        const head = started ? 1 : 0;
        if (pending.length < head + 4) return;
        const size = head + pending.readInt32BE(head);
        if (pending.length < size) return;
        const message = pending.subarray(0, size);
        pending = pending.subarray(size);
        if (!started) {
          started = true;
          upstream.write(message);
          continue;
        }
        if (message[0] === 0x51 || message[0] === 0x50) {
          // `Q`: the query; `P`: the statement's name, then the query (each NUL-terminated).
          const body = message.subarray(5).toString('utf8');
          statements.push((message[0] === 0x51 ? body : body.slice(body.indexOf('\0') + 1)).split('\0')[0]!);
        }
        if (armed && (message[0] === 0x51 || message[0] === 0x50) && /^\0*\s*commit\b/i.test(message.subarray(5).toString('latin1'))) {
          const { cut: where, done } = armed;
          armed = undefined;
          if (where === 'before-commit') {
            cut();
            done();
            return;
          }
          dropAnswer = done;
        }
        upstream.write(message);
      }
    });
    upstream.on('data', (chunk: Buffer) => {
      if (dropAnswer) {
        const done = dropAnswer;
        dropAnswer = undefined;
        cut();
        done();
        return;
      }
      client.write(chunk);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const proxyPort = (server.address() as net.AddressInfo).port;
  return {
    url: (database) => `postgres://dsec@127.0.0.1:${proxyPort}/${database}`,
    statements,
    arm: (cut) => new Promise<void>((done) => (armed = { cut, done })),
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
