// A VM's memory and device state to a file and back, for any QEMU backend (microVM, full VM).
// QEMU 7.2 has no `file:` migration, `exec:` is refused by `-sandbox spawn=deny` and `fd:` needs a
// descriptor passed over QMP (SCM_RIGHTS, which Node cannot send): the stream goes over a unix
// socket in the VM's run directory instead. Saving, the edge listens and QEMU connects (QMP
// `migrate unix:`); restoring, QEMU listens (`-incoming defer`, then `migrate-incoming unix:`) and
// the edge connects and streams the file in. The file is checksummed; a manifest beside it says
// its size and digest, and a restore checks both before the guest runs again.
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { chmod, chown, open, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import { promisify } from 'node:util';
import { DsecError } from '@dsec/protocol';
import { untilAborted } from '../../abortable.js';
import type { QmpClient } from './qmp.js';

/** Extra QEMU arguments of a process that will receive a saved state (`migrate-incoming` later). */
export const INCOMING_ARGS: readonly string[] = ['-incoming', 'defer'];

/** Default bound of a save or a restore, ms. */
export const DEFAULT_MIGRATION_TIMEOUT_MS = 120_000;

/** Migration bandwidth: QEMU's default (32 MiB/s) is meant for live migration over a network. */
const UNLIMITED_BANDWIDTH_BYTES = 2 ** 40;

/** How often a save or restore polls QEMU's migration status, ms. */
const POLL_MS = 25;

/** Name of the unix socket the stream passes through, inside the VM's run directory. */
const MIGRATION_SOCKET = 'migration.sock';

/** A saved state: the file and what its manifest (`<file>.json`) says of it. */
export interface SavedState {
  file: string;
  bytes: number;
  /** Hex SHA-256 of the file. */
  sha256: string;
  /** Wall time of the save (the stream and the file's sync), ms. */
  durationMs: number;
  savedAt: string;
}

/** Options of {@link saveState}. */
export interface SaveStateOptions {
  /** QMP of the running (or stopped) VM; it is stopped first and left stopped. */
  qmp: QmpClient;
  /** A directory QEMU can reach (its run directory): the socket is made there. */
  socketDir: string;
  /** QEMU's uid and gid: the socket is theirs (0600), nobody else's. */
  owner: { uid: number; gid: number };
  /** Where the state goes; written as `<file>.part` and renamed once complete. */
  file: string;
  /** Larger streams are refused (guest RAM plus a margin). Default unbounded. */
  maxBytes?: number;
  /** Default {@link DEFAULT_MIGRATION_TIMEOUT_MS}. */
  timeoutMs?: number;
  signal?: AbortSignal;
}

/** Options of {@link restoreState}. */
export interface RestoreStateOptions {
  /** QMP of a QEMU started with the VM's own arguments plus {@link INCOMING_ARGS}. */
  qmp: QmpClient;
  /** A directory QEMU can write (its run directory): QEMU makes its listening socket there. */
  socketDir: string;
  /** The saved state (`readSavedState(file)`). */
  state: SavedState;
  /** Settles (rejects) when the QEMU process exits: QEMU 7.2 exits on a stream it cannot load. */
  exited?: Promise<never>;
  /** Default {@link DEFAULT_MIGRATION_TIMEOUT_MS}. */
  timeoutMs?: number;
  signal?: AbortSignal;
}

/** What {@link restoreState} did. */
export interface RestoreStateResult {
  durationMs: number;
}

/**
 * Stops the VM and writes its RAM and device state to `file` through a unix socket QEMU connects
 * to. Resolves once QEMU reports the migration completed and the file is synced, with its
 * manifest written; the VM is left stopped (`quit` frees its memory, `cont` goes on). On any
 * failure, timeout or abort the migration is cancelled and no file (nor part of one) is left.
 */
export async function saveState(o: SaveStateOptions): Promise<SavedState> {
  const t0 = performance.now();
  const timeoutMs = o.timeoutMs ?? DEFAULT_MIGRATION_TIMEOUT_MS;
  const signal = combine(o.signal, timeoutMs, `saving the VM's state to ${o.file}`);
  const sock = path.join(o.socketDir, MIGRATION_SOCKET);
  const part = `${o.file}.part`;
  await rm(sock, { force: true });
  const out = await open(part, 'w', 0o600);
  const server = net.createServer();
  let migrating = false;
  try {
    const hash = createHash('sha256');
    let bytes = 0;
    const received = new Promise<void>((resolve, reject) => {
      server.once('connection', (conn) => {
        server.close();
        // Written in order: each chunk waits for the previous write (the socket is paused meanwhile).
        let writing = Promise.resolve();
        conn.on('data', (chunk: Buffer) => {
          bytes += chunk.length;
          if (o.maxBytes !== undefined && bytes > o.maxBytes) {
            conn.destroy(new DsecError('BACKEND_FAILED', `the VM's state exceeds ${o.maxBytes} bytes`));
            return;
          }
          hash.update(chunk);
          conn.pause();
          writing = writing.then(() => out.write(chunk)).then(() => void conn.resume(), reject);
        });
        conn.once('error', reject);
        conn.once('end', () => void writing.then(resolve, reject));
      });
      server.once('error', reject);
    });
    received.catch(() => undefined);
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(sock, () => resolve());
    });
    await chown(sock, o.owner.uid, o.owner.gid);
    await chmod(sock, 0o600);
    await o.qmp.execute('stop');
    await o.qmp.execute('migrate-set-parameters', { 'max-bandwidth': UNLIMITED_BANDWIDTH_BYTES });
    await o.qmp.execute('migrate', { uri: `unix:${sock}` });
    migrating = true;
    await untilAborted(Promise.all([received, migrationDone(o.qmp, 'query-migrate', signal)]), signal);
    migrating = false;
    await out.sync();
    await out.close();
    const state: SavedState = {
      file: o.file,
      bytes,
      sha256: hash.digest('hex'),
      durationMs: Math.round(performance.now() - t0),
      savedAt: new Date().toISOString(),
    };
    await rename(part, o.file);
    await writeSavedManifest(state);
    return state;
  } catch (err) {
    if (migrating) await o.qmp.execute('migrate_cancel', undefined, 5000).catch(() => undefined);
    await out.close().catch(() => undefined);
    await rm(part, { force: true });
    await rm(`${o.file}.json.tmp`, { force: true });
    throw err;
  } finally {
    server.close();
    await rm(sock, { force: true });
  }
}

/**
 * Reads a saved state's manifest and checks the file's size against it; a missing or damaged
 * state is BACKEND_FAILED naming the file (the caller keeps the sandbox paused).
 */
export async function readSavedState(file: string): Promise<SavedState> {
  const manifest = await readFile(`${file}.json`, 'utf8').then(
    (t) => JSON.parse(t) as Omit<SavedState, 'file'>,
    (err: unknown) => {
      throw new DsecError('BACKEND_FAILED', `saved VM state ${file}: no readable manifest (${errText(err)})`);
    },
  );
  const st = await stat(file).catch((err: unknown) => {
    throw new DsecError('BACKEND_FAILED', `saved VM state ${file} is missing (${errText(err)})`);
  });
  if (typeof manifest.bytes !== 'number' || typeof manifest.sha256 !== 'string' || st.size !== manifest.bytes) {
    throw new DsecError('BACKEND_FAILED', `saved VM state ${file} is damaged: ${st.size} bytes, its manifest says ${manifest.bytes}`);
  }
  return { ...manifest, file };
}

/**
 * Writes a saved state's manifest (atomically): with it the file is the VM's state (a restarted
 * edge keeps the sandbox paused to it); without it the file counts for nothing.
 */
export async function writeSavedManifest(state: SavedState): Promise<void> {
  const { file, ...manifest } = state;
  await writeFile(`${file}.json.tmp`, JSON.stringify(manifest), { mode: 0o600 });
  await rename(`${file}.json.tmp`, `${file}.json`);
}

/** Removes a saved state's manifest (the file no longer is the VM's state), then the file. */
export async function removeSavedState(file: string, keepFile = false): Promise<void> {
  await rm(`${file}.json`, { force: true });
  if (!keepFile) await rm(file, { force: true });
}

/**
 * Copies a file sparse (holes stay holes), as a reflink where the file system shares blocks
 * (btrfs, XFS): a VM's disk of diskMiB costs what it holds, or nothing until written.
 */
export async function copySparse(from: string, to: string): Promise<void> {
  await promisify(execFile)('cp', ['--reflink=auto', '--sparse=always', '--', from, to]);
}

/** Copies a saved state (checked against its manifest) to `to`, its manifest written last. */
export async function copySavedState(state: SavedState, to: string): Promise<SavedState> {
  await copySparse(state.file, to);
  const copy = { ...state, file: to };
  await writeSavedManifest(copy);
  return copy;
}

/**
 * Streams a saved state into a QEMU started with {@link INCOMING_ARGS} and waits until QEMU has
 * loaded it; the VM is left paused (`cont` runs it). The file's digest is computed as it streams
 * and checked before this resolves: a damaged file rejects (and the caller ends that QEMU, the
 * file stays). Bounded by `timeoutMs`, abortable.
 */
export async function restoreState(o: RestoreStateOptions): Promise<RestoreStateResult> {
  const t0 = performance.now();
  const timeoutMs = o.timeoutMs ?? DEFAULT_MIGRATION_TIMEOUT_MS;
  const signal = combine(o.signal, timeoutMs, `restoring the VM's state from ${o.state.file}`);
  const sock = path.join(o.socketDir, MIGRATION_SOCKET);
  await rm(sock, { force: true });
  const exited = o.exited ?? new Promise<never>(() => undefined);
  exited.catch(() => undefined);
  await o.qmp.execute('migrate-incoming', { uri: `unix:${sock}` });
  const conn = await connectUnix(sock);
  const hash = createHash('sha256');
  const sent = new Promise<void>((resolve, reject) => {
    const input = createReadStream(o.state.file);
    input.on('data', (chunk) => hash.update(chunk));
    input.once('error', reject);
    conn.once('error', reject);
    input.pipe(conn);
    input.once('end', () => resolve());
  });
  sent.catch(() => undefined);
  try {
    await untilAborted(Promise.race([Promise.all([sent, loaded(o.qmp, signal)]), exited]), signal);
  } catch (err) {
    conn.destroy();
    throw await explain(o.state, err);
  } finally {
    await rm(sock, { force: true }).catch(() => undefined);
  }
  const digest = hash.digest('hex');
  if (digest !== o.state.sha256) {
    throw new DsecError('BACKEND_FAILED', `saved VM state ${o.state.file} is damaged: its digest is ${digest}, its manifest says ${o.state.sha256}`);
  }
  return { durationMs: Math.round(performance.now() - t0) };
}

/** A failed load: damage of the file, when its digest says so, is the clearer reason. */
async function explain(state: SavedState, err: unknown): Promise<Error> {
  const digest = await fileDigest(state.file).catch(() => undefined);
  if (digest !== undefined && digest !== state.sha256) {
    return new DsecError('BACKEND_FAILED', `saved VM state ${state.file} is damaged (digest ${digest}, its manifest says ${state.sha256})`);
  }
  return err instanceof Error ? err : new Error(String(err));
}

async function fileDigest(file: string): Promise<string> {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(file)) hash.update(chunk as Buffer);
  return hash.digest('hex');
}

/** Polls `query-migrate` until the migration completed; a failed or cancelled one rejects. */
async function migrationDone(qmp: QmpClient, command: string, signal: AbortSignal): Promise<void> {
  for (;;) {
    signal.throwIfAborted();
    const info = await qmp.execute<{ status?: string; 'error-desc'?: string }>(command);
    if (info.status === 'completed') return;
    if (info.status === 'failed' || info.status === 'cancelled') {
      throw new DsecError('BACKEND_FAILED', `QEMU's migration ${info.status}${info['error-desc'] ? `: ${info['error-desc']}` : ''}`);
    }
    await sleep(POLL_MS);
  }
}

/** Polls `query-status` until the incoming state is loaded (no longer `inmigrate`). */
async function loaded(qmp: QmpClient, signal: AbortSignal): Promise<void> {
  for (;;) {
    signal.throwIfAborted();
    const { status } = await qmp.execute<{ status: string }>('query-status');
    if (status === 'paused' || status === 'running') return;
    if (status !== 'inmigrate') throw new DsecError('BACKEND_FAILED', `QEMU did not load the saved state (status ${status})`);
    await sleep(POLL_MS);
  }
}

function combine(signal: AbortSignal | undefined, timeoutMs: number, what: string): AbortSignal {
  const timeout = new AbortController();
  const t = setTimeout(() => timeout.abort(new DsecError('TIMEOUT', `${what}: not done in ${timeoutMs} ms`)), timeoutMs);
  t.unref();
  return signal ? AbortSignal.any([signal, timeout.signal]) : timeout.signal;
}

function connectUnix(file: string): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.createConnection({ path: file });
    s.once('error', (err) => reject(new DsecError('BACKEND_FAILED', `QEMU's incoming migration socket ${file}: ${err.message}`)));
    s.once('connect', () => {
      s.removeAllListeners('error');
      resolve(s);
    });
  });
}

function errText(err: unknown): string {
  return (err as NodeJS.ErrnoException).code ?? (err instanceof Error ? err.message : String(err));
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
