// The lazy server of one layer: a process of its own (started detached by the edge, so that it
// outlives an edge restart) that runs dsec-lazyfs (the FUSE view of the layer's data blob) and
// answers its requests for missing chunks: an HTTP range request on the blob in the registry,
// checked against the chunk's sha256, written to the node-wide chunk cache (named by digest) and
// only then reported present. A fetch past the deadline or refused by the registry is answered
// EIO (the read in the sandbox fails, it never hangs) and raised as `layer.fetch-failed`; bytes
// that fail their digest are never stored or served and are raised as `layer.corrupt`.
//
// It opens /dev/fuse and mounts the FUSE view itself, and keeps that descriptor: dsec-lazyfs gets
// a copy (`/dev/fd/3`). When dsec-lazyfs dies on its own (a crash, a kill), the FUSE connection
// lives on in this process and a new dsec-lazyfs takes it over (`resume`: the requests the dead one
// had taken are queued again by the kernel), so the layer's EROFS mount and the sandboxes on it
// never see it; past MAX_RESTARTS within RESTART_WINDOW_MS it gives up and exits (the edge then
// takes the layer for lost).
//
// The edge keeps a copy of that descriptor too (pidfd_getfd(2), see lazy.ts): when this process
// dies (its dsec-lazyfs exits with it, on the end of its pipe), the connection lives on in the
// edge, which starts a new server with `resume` and the descriptor as fd 3: it mounts nothing and
// runs dsec-lazyfs with `resume` on it, as after a dsec-lazyfs restart.
//
// The edge talks to it on a unix socket, one JSON object per line: `{"op":"stats"}`,
// `{"op":"events"}` (then every event as it is raised), `{"op":"prefetch","chunks":[...]}`,
// `{"op":"stop"}` (unmounts the FUSE view and exits; refused while the layer is mounted on it).
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, readFileSync, statSync } from 'node:fs';
import { mkdir, rename, rm, stat, utimes, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import type { RaisedEvent } from '@dsec/protocol';
import { closeFd, mount, MS, O, openFd, umount } from '../sys/linux.js';
import { decodeChunkIndex } from './lazy-index.js';
import { RegistryClient } from './registry.js';
import type { RegistryEndpoint } from './registry.js';

/** What the edge hands a lazy server (a 0600 file in the layer's lazy directory). */
export interface LazyServerConfig {
  /** The layer's digest (for events). */
  digest: string;
  /** FUSE mount point; the blob is `<mountpoint>/blob`. */
  mountpoint: string;
  /** The binary chunk index. */
  index: string;
  /** The node-wide chunk cache. */
  cacheDir: string;
  /** The dsec-lazyfs binary. */
  lazyfs: string;
  /** A chunk not fetched within this many ms fails its read with EIO. */
  deadlineMs: number;
  /** Most range requests in flight. */
  concurrency: number;
  registry: RegistryEndpoint;
  repository: string;
  /** Digest of the data blob in the repository. */
  blobDigest: string;
  /** Control socket. */
  socket: string;
  /** Extents after those a read misses fetched with them (same request), in bytes. */
  readAheadBytes: number;
  /** Largest range one request asks for, in bytes. */
  maxRangeBytes: number;
}

/** Counters of a lazy server. */
export interface LazyServerStats {
  /** Chunks fetched from the registry and their bytes. */
  fetchedChunks: number;
  fetchedBytes: number;
  /** Reads served from the cache (no round trip). */
  hits: number;
  /** Reads that needed a fetch (or waited for one). */
  misses: number;
  /** Fetches that failed (registry unreachable, refused, past the deadline). */
  failures: number;
  /** Chunks refused for failing their digest. */
  corrupt: number;
  /** Distinct chunks read so far, in first-read order (the access profile). */
  touched: number;
  chunks: number;
  blobBytes: number;
  /** Range requests sent to the registry (one per run of neighbouring extents). */
  requests: number;
  /** Chunks fetched as read-ahead (not asked for by a read yet). */
  readAheadChunks: number;
  /** Chunks fetched ahead of any read from an access profile, and profiles fetched to the end. */
  prefetchedChunks: number;
  prefetches: number;
  /** dsec-lazyfs processes started again on the same FUSE connection after one died. */
  fuseRestarts: number;
}

/** A chunk asked for or being fetched: every reader waits on its promise. */
interface PendingChunk {
  promise: Promise<void>;
  resolve: () => void;
  reject: (err: unknown) => void;
  /** Part of a range request already (or about to be) sent. */
  started: boolean;
}

function pendingChunk(): PendingChunk {
  let resolve!: () => void;
  let reject!: (err: unknown) => void;
  const promise = new Promise<void>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  // Read-ahead and prefetched chunks may have no reader to hear of their failure.
  promise.catch(() => undefined);
  return { promise, resolve, reject, started: false };
}

/** Chunk `sha256`'s file in the cache. */
export function chunkPath(cacheDir: string, sha256: string): string {
  return join(cacheDir, sha256.slice(0, 2), sha256);
}

/** Minimum spacing of `layer.fetch-failed` events of one layer (a dead registry fails every read). */
const EVENT_SPACING_MS = 5_000;
/** Largest hole between two extents fetched by one request (its bytes are read and dropped). */
const MAX_GAP_BYTES = 64 * 1024;
/** Largest range one prefetch request asks for (bytes; at least the server's maxRangeBytes). */
const PREFETCH_RANGE_BYTES = 8 * 1024 * 1024;
/** Largest hole between two profile chunks that one prefetch request spans (its bytes dropped). */
const PREFETCH_GAP_BYTES = 256 * 1024;
/** dsec-lazyfs restarts allowed within RESTART_WINDOW_MS before the server gives up. */
const MAX_RESTARTS = 5;
const RESTART_WINDOW_MS = 60_000;
/** Prefetch runs in flight at once. */
const PREFETCH_RUNS = 4;
/** Cache files of chunks read are touched at most this often (their mtime is the LRU order). */
const TOUCH_SPACING_MS = 30_000;

/** The descriptor of a mounted FUSE connection a server started with `resume` gets from the edge. */
const RESUME_FD = 3;

async function main(configPath: string, resume: boolean): Promise<void> {
  const cfg = JSON.parse(readFileSync(configPath, 'utf8')) as LazyServerConfig;
  const index = decodeChunkIndex(readFileSync(cfg.index));
  const client = new RegistryClient(cfg.registry);
  const stats: LazyServerStats = {
    fetchedChunks: 0,
    fetchedBytes: 0,
    hits: 0,
    misses: 0,
    failures: 0,
    corrupt: 0,
    touched: 0,
    chunks: index.chunks.length,
    blobBytes: index.blobBytes,
    requests: 0,
    readAheadChunks: 0,
    prefetchedChunks: 0,
    prefetches: 0,
    fuseRestarts: 0,
  };
  const order: number[] = [];
  const seen = new Uint8Array(index.chunks.length);
  const touchedAt = new Map<number, number>();
  const subscribers = new Set<net.Socket>();
  const lastEvent = new Map<string, { at: number; suppressed: number }>();

  const raise = (ev: RaisedEvent): void => {
    const key = ev.kind;
    const now = Date.now();
    const last = lastEvent.get(key);
    if (ev.kind === 'layer.fetch-failed' && last !== undefined && now - last.at < EVENT_SPACING_MS) {
      last.suppressed++;
      return;
    }
    const suppressed = last?.suppressed ?? 0;
    lastEvent.set(key, { at: now, suppressed: 0 });
    const line = JSON.stringify({ event: { ...ev, data: { ...ev.data, ...(suppressed > 0 ? { suppressed } : {}) }, at: new Date().toISOString() } }) + '\n';
    for (const s of subscribers) s.write(line);
  };

  const note = (i: number): void => {
    if (seen[i] === 1) return;
    seen[i] = 1;
    order.push(i);
    stats.touched++;
  };

  // Bounded concurrency: a queue of waiters for a slot.
  let active = 0;
  const waiting: (() => void)[] = [];
  const slot = async (signal: AbortSignal): Promise<void> => {
    if (active < cfg.concurrency) {
      active++;
      return;
    }
    await new Promise<void>((resolve, reject) => {
      const go = () => {
        signal.removeEventListener('abort', abort);
        active++;
        resolve();
      };
      const abort = () => {
        const k = waiting.indexOf(go);
        if (k >= 0) waiting.splice(k, 1);
        reject(signal.reason instanceof Error ? signal.reason : new Error('deadline'));
      };
      waiting.push(go);
      signal.addEventListener('abort', abort, { once: true });
    });
  };
  const unslot = (): void => {
    active--;
    waiting.shift()?.();
  };

  // Every chunk asked for or being fetched has one pending entry, which every reader of that
  // chunk waits on; a chunk is fetched once however many readers, layers or prefetches want it.
  const inflight = new Map<number, PendingChunk>();
  /** Chunks asked for since the last flush (one tick): neighbours among them share a request. */
  let asked: number[] = [];
  let flushing = false;
  const cached = (i: number): boolean => existsSync(chunkPath(cfg.cacheDir, index.chunks[i]!.sha256));

  /** Resolves once chunk `i` is in the cache (fetched with its neighbours, see {@link flush}). */
  const ensure = (i: number): Promise<void> => {
    const known = inflight.get(i);
    if (known !== undefined) return known.promise;
    const p = pendingChunk();
    inflight.set(i, p);
    if (cached(i)) {
      // Another layer with this chunk fetched it.
      inflight.delete(i);
      p.resolve();
      return p.promise;
    }
    asked.push(i);
    if (!flushing) {
      flushing = true;
      setImmediate(flush);
    }
    return p.promise;
  };

  /**
   * Groups the chunks asked for in the last tick into runs of neighbouring extents (with the
   * extents after the last one asked for, up to the read-ahead) and fetches each run with one
   * range request.
   */
  const flush = (): void => {
    flushing = false;
    const list = [...new Set(asked)].sort((a, b) => a - b);
    asked = [];
    const wanted = new Set(list);
    for (const i of list) {
      const first = inflight.get(i);
      if (first === undefined || first.started) continue;
      first.started = true;
      const run = [i];
      const from = index.chunks[i]!.offset;
      let end = from + index.chunks[i]!.length;
      let wantedEnd = end;
      for (let j = i + 1; j < index.chunks.length; j++) {
        const c = index.chunks[j]!;
        const stop = c.offset + c.length;
        if (c.offset - end > MAX_GAP_BYTES || stop - from > cfg.maxRangeBytes) break;
        const known = inflight.get(j);
        if (wanted.has(j) && known !== undefined && !known.started) {
          known.started = true;
          wantedEnd = stop;
        } else if (known !== undefined || stop - wantedEnd > cfg.readAheadBytes || cached(j)) {
          break;
        } else {
          // Read-ahead: the extents after those read are most often the rest of the file (or
          // the next files of the directory); a registry round trip costs more than the bytes.
          const p = pendingChunk();
          p.started = true;
          inflight.set(j, p);
          stats.readAheadChunks++;
        }
        run.push(j);
        end = stop;
      }
      void fetchRun(run);
    }
  };

  /**
   * Fetches the extents `run` (consecutive indexes) with one range request, checks each against
   * its own digest and stores the good ones; each chunk's waiters learn its own outcome.
   */
  const fetchRun = async (run: number[]): Promise<void> => {
    const first = index.chunks[run[0]!]!;
    const last = index.chunks[run[run.length - 1]!]!;
    const settle = (i: number, err?: unknown): void => {
      const p = inflight.get(i);
      inflight.delete(i);
      if (err === undefined) p?.resolve();
      else p?.reject(err);
    };
    let bytes: Buffer;
    try {
      const signal = AbortSignal.timeout(cfg.deadlineMs);
      await slot(signal);
      try {
        stats.requests++;
        bytes = await client.blobRange(cfg.repository, cfg.blobDigest, first.offset, last.offset + last.length - first.offset, signal);
      } finally {
        unslot();
      }
    } catch (err) {
      for (const i of run) settle(i, err);
      return;
    }
    for (const i of run) {
      const c = index.chunks[i]!;
      try {
        await storeChunk(i, bytes.subarray(c.offset - first.offset, c.offset - first.offset + c.length));
        settle(i);
      } catch (err) {
        settle(i, err);
      }
    }
  };

  /** Checks chunk `i`'s bytes against its digest and writes them to the cache. */
  const storeChunk = async (i: number, bytes: Buffer): Promise<void> => {
    const c = index.chunks[i]!;
    const got = createHash('sha256').update(bytes).digest('hex');
    if (got !== c.sha256) {
      stats.corrupt++;
      raise({
        kind: 'layer.corrupt',
        severity: 'critical',
        message: `layer ${cfg.digest}: chunk ${i} from ${client.url} fails its digest; refused`,
        data: { layer: cfg.digest, chunk: i, offset: c.offset, length: c.length, expected: c.sha256, got },
      });
      throw new Error('corrupt chunk');
    }
    const path = chunkPath(cfg.cacheDir, c.sha256);
    await mkdir(join(cfg.cacheDir, c.sha256.slice(0, 2)), { recursive: true });
    const tmp = `${path}.tmp-${randomBytes(4).toString('hex')}`;
    await writeFile(tmp, bytes);
    await rename(tmp, path);
    stats.fetchedChunks++;
    stats.fetchedBytes += c.length;
  };

  const fetchFailed = (i: number, err: unknown): void => {
    stats.failures++;
    const c = index.chunks[i]!;
    const why = err instanceof Error ? (err.name === 'TimeoutError' ? `no answer within ${cfg.deadlineMs} ms` : err.message) : String(err);
    if (why === 'corrupt chunk') return;
    raise({
      kind: 'layer.fetch-failed',
      severity: 'warning',
      message: `layer ${cfg.digest}: chunk ${i} could not be fetched from ${client.url}: ${why}`,
      data: { layer: cfg.digest, chunk: i, offset: c.offset, length: c.length, error: why },
    });
  };

  await mkdir(cfg.cacheDir, { recursive: true });
  // Resuming, the mount point is the FUSE view itself, which nobody serves yet: a look at it
  // (mkdir's check) would wait on the dsec-lazyfs started below.
  if (!resume) await mkdir(cfg.mountpoint, { recursive: true });
  // The FUSE connection: opened and mounted here, its descriptor kept for as long as this process
  // lives, so that a dsec-lazyfs that dies can be replaced under the same mount (see the header).
  const devFuse = resume ? RESUME_FD : openFd('/dev/fuse', 0o2 /* O_RDWR */ | O.CLOEXEC);
  if (!resume) {
    try {
      mount('dsec-lazy', cfg.mountpoint, 'fuse.dsec-lazy', MS.RDONLY | MS.NOSUID | MS.NODEV, `fd=${devFuse},rootmode=40000,user_id=0,group_id=0,allow_other`);
    } catch (err) {
      closeFd(devFuse);
      throw err;
    }
  }
  let stopping = false;
  const restarts: number[] = [];
  // The FUSE side waits a little longer than a fetch may take, so the fetch's own failure (and
  // its event) comes first; past that it answers EIO on its own (this process gone or stuck).
  const startFuse = (resume: boolean): ChildProcess => {
    const args = ['/dev/fd/3', cfg.index, cfg.cacheDir, String(cfg.deadlineMs + 2_000), ...(resume ? ['resume'] : [])];
    const child = spawn(cfg.lazyfs, args, { stdio: ['pipe', 'pipe', 'inherit', devFuse] });
    child.stdin!.on('error', () => undefined);
    createInterface({ input: child.stdout! }).on('line', onFuseLine);
    child.on('exit', (code, signal) => {
      if (child !== fuse) return;
      const now = Date.now();
      while (restarts.length > 0 && now - restarts[0]! > RESTART_WINDOW_MS) restarts.shift();
      if (!stopping && mounted() && restarts.length < MAX_RESTARTS) {
        // Died on its own under a live mount: a new one takes the connection over.
        restarts.push(now);
        stats.fuseRestarts++;
        process.stderr.write(`dsec lazy server: dsec-lazyfs exited (${signal ?? code}); serving the mount with a new one\n`);
        fuse = startFuse(true);
        return;
      }
      server.close();
      for (const s of subscribers) s.destroy();
      if (!stopping && mounted()) umount(cfg.mountpoint, 2 /* MNT_DETACH */);
      closeFd(devFuse);
      void rm(cfg.socket, { force: true }).finally(() => process.exit(0));
    });
    return child;
  };
  /** Whether the FUSE view is still mounted (not unmounted by `stop` or by hand). */
  const mounted = (): boolean => readFileSync('/proc/self/mountinfo', 'utf8').includes(` ${cfg.mountpoint} `);
  const answer = (line: string): void => {
    if (fuse.stdin?.writable === true) fuse.stdin.write(line);
  };
  const onFuseLine = (line: string): void => {
    const [op, arg] = line.split(' ');
    const i = Number(arg);
    if (!Number.isInteger(i) || i < 0 || i >= index.chunks.length) return;
    if (op === 'H') {
      stats.hits++;
      note(i);
      const now = Date.now();
      if (now - (touchedAt.get(i) ?? 0) > TOUCH_SPACING_MS) {
        touchedAt.set(i, now);
        const p = chunkPath(cfg.cacheDir, index.chunks[i]!.sha256);
        utimes(p, now / 1000, now / 1000).catch(() => undefined);
      }
    } else if (op === 'F') {
      stats.misses++;
      note(i);
      touchedAt.set(i, Date.now());
      ensure(i).then(
        () => answer(`O ${i}\n`),
        (err: unknown) => {
          fetchFailed(i, err);
          answer(`E ${i} 5\n`);
        },
      );
    }
  };
  let fuse = startFuse(resume);

  const server = net.createServer((sock) => {
    sock.on('error', () => undefined);
    const lines = createInterface({ input: sock });
    lines.on('error', () => undefined); // readline re-emits the socket's errors
    lines.on('line', (line) => {
      let req: { op?: string; chunks?: unknown; concurrency?: unknown };
      try {
        req = JSON.parse(line) as typeof req;
      } catch {
        sock.end(JSON.stringify({ error: 'not JSON' }) + '\n');
        return;
      }
      switch (req.op) {
        case 'stats':
          sock.write(JSON.stringify({ stats, pid: process.pid, fuseFd: devFuse }) + '\n');
          break;
        case 'order':
          sock.write(JSON.stringify({ order }) + '\n');
          break;
        case 'events':
          subscribers.add(sock);
          sock.on('close', () => subscribers.delete(sock));
          sock.write(JSON.stringify({ subscribed: true }) + '\n');
          break;
        case 'prefetch': {
          const list = Array.isArray(req.chunks) ? req.chunks.filter((n): n is number => Number.isInteger(n) && n >= 0 && n < index.chunks.length) : [];
          void prefetch(list);
          sock.write(JSON.stringify({ prefetching: list.length }) + '\n');
          break;
        }
        case 'stop':
          try {
            umount(cfg.mountpoint);
            stopping = true;
            sock.end(JSON.stringify({ stopped: true }) + '\n');
          } catch (err) {
            sock.write(JSON.stringify({ stopped: false, error: (err as Error).message }) + '\n');
          }
          break;
        default:
          sock.write(JSON.stringify({ error: `unknown op ${String(req.op)}` }) + '\n');
      }
    });
  });

  /**
   * Fetches an access profile's chunks in the background, in blob order rather than in the
   * order they were first read: sorted by offset, the profile's chunks fall into a few long runs
   * (files read at start sit together in the blob), each fetched with one range request of up to
   * {@link PREFETCH_RANGE_BYTES} (holes of up to {@link PREFETCH_GAP_BYTES} between them read and
   * dropped), a few runs at a time. A read of a chunk being prefetched waits for that fetch; a
   * read of one not reached yet fetches it itself.
   */
  const prefetch = async (list: number[]): Promise<void> => {
    const sorted = [...new Set(list)].sort((a, b) => a - b);
    const runs: number[][] = [];
    for (const i of sorted) {
      const c = index.chunks[i]!;
      const run = runs[runs.length - 1];
      if (run !== undefined) {
        const first = index.chunks[run[0]!]!;
        const last = index.chunks[run[run.length - 1]!]!;
        if (
          c.offset - (last.offset + last.length) <= PREFETCH_GAP_BYTES &&
          c.offset + c.length - first.offset <= Math.max(cfg.maxRangeBytes, PREFETCH_RANGE_BYTES)
        ) {
          run.push(i);
          continue;
        }
      }
      runs.push([i]);
    }
    let next = 0;
    const worker = async (): Promise<void> => {
      while (next < runs.length) {
        // Chunks a read fetched meanwhile (or another layer stored) leave the run; what stays is
        // still one request from its first chunk to its last.
        const run = runs[next++]!.filter((k) => !inflight.has(k) && !cached(k));
        if (run.length === 0) continue;
        for (const k of run) {
          const p = pendingChunk();
          p.started = true;
          inflight.set(k, p);
        }
        stats.prefetchedChunks += run.length;
        await fetchRun(run);
      }
    };
    await Promise.all(Array.from({ length: Math.max(1, Math.min(cfg.concurrency, PREFETCH_RUNS)) }, worker));
    stats.prefetches++;
  };

  // Ready once the blob shows on the mount point with its size.
  const readyBy = Date.now() + 10_000;
  for (;;) {
    if (fuse.exitCode !== null) throw new Error(`dsec-lazyfs exited with ${fuse.exitCode}`);
    const st = await stat(join(cfg.mountpoint, 'blob')).catch(() => null);
    if (st !== null && st.size === index.blobBytes) break;
    if (Date.now() > readyBy) throw new Error('dsec-lazyfs did not mount within 10 s');
    await sleep(20);
  }
  await rm(cfg.socket, { force: true });
  await new Promise<void>((resolve) => server.listen(cfg.socket, resolve));
  process.stdout.write(`ready ${process.pid} ${devFuse}\n`);
}

if (process.argv[1] !== undefined && process.argv[1].endsWith('lazy-server.js') && process.argv[2] !== undefined) {
  // Killed with the edge's process group only if the edge asks: this process is its own session.
  process.on('SIGPIPE', () => undefined);
  main(process.argv[2], process.argv[3] === 'resume').catch((err: unknown) => {
    process.stderr.write(`dsec lazy server: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  });
}

/** Whether a cache file exists (for callers that only need to know). */
export function chunkCached(cacheDir: string, sha256: string): boolean {
  try {
    return statSync(chunkPath(cacheDir, sha256)).isFile();
  } catch {
    return false;
  }
}
