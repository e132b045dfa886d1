// Lazily loaded layers, the edge's side: a layer pulled without its data blob is mounted over a
// FUSE view of that blob served by a lazy server (lazy-server.ts, a detached process per mounted
// layer that outlives the edge), which fetches the chunks read from the registry into the
// node-wide chunk cache `<layers>/chunks/<2 hex>/<sha256>`. The cache is content-addressed (a
// chunk shared by two layers is stored and fetched once), bounded (least recently read chunks go
// first) and never loses a chunk of a layer that is mounted. It is plain files: a node restart
// keeps it.
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { closeSync, fstatSync, openSync, statSync } from 'node:fs';
import { mkdir, readdir, readFile, rm, stat, unlink, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { DsecError } from '@dsec/protocol';
import type { EventSink, RaisedEvent } from '@dsec/protocol';
import { closeFd, mountsUnder, MNT, pidfdGetfd, pidfdOpen, umount } from '../sys/linux.js';
import { decodeChunkIndex } from './lazy-index.js';
import type { LazyServerConfig, LazyServerStats } from './lazy-server.js';
import type { LayerRegistry } from './remote.js';

/** How lazily loaded layers behave on a node. */
export interface LazyOptions {
  /** The dsec-lazyfs binary (built beside chronus). */
  lazyfsBinary: string;
  /** A chunk not fetched within this many ms fails its read with EIO; default 10 s. */
  deadlineMs?: number | undefined;
  /** Range requests in flight per layer; default 16. */
  concurrency?: number | undefined;
  /** Bytes of the extents after a missed read fetched with it (one request); default 1 MiB, 0 for none. */
  readAheadBytes?: number | undefined;
  /** Largest range one request asks for (neighbouring missed extents are merged up to it); default 4 MiB. */
  maxRangeBytes?: number | undefined;
  /** Bytes of the chunk cache; past it, chunks no mounted layer needs go, LRU. Default none. */
  chunkCacheMaxBytes?: number | undefined;
  /**
   * How long a layer's server (and its FUSE view, with the blob's page cache) is kept after the
   * layer's last unmount, for its next user to mount at once; default 5 min, 0 to stop at once.
   */
  serverIdleMs?: number | undefined;
  /** Where `layer.fetch-failed` and `layer.corrupt` go. */
  raise?: EventSink | undefined;
}

/** What a lazily pulled layer's directory records about its blob. */
export interface LazyRecord {
  /** Digest of the data blob in the registry's repository. */
  blobDigest: string;
}

/** The chunk cache and the lazy servers of a node, as `GET /v1/nodes/{id}` reports them. */
export interface LazyCacheStats {
  cacheBytes: number;
  cacheChunks: number;
  cacheMaxBytes: number | null;
  /** Chunk reads served from the cache, and those that needed a fetch, since the edge started. */
  hits: number;
  misses: number;
  /** hits / (hits + misses); null before any read. */
  hitRate: number | null;
  fetchedBytes: number;
  fetchedChunks: number;
  failures: number;
  corrupt: number;
  /** Lazy layers with a server: mounted, or unmounted and kept idle (`lazyServerIdleMs`). */
  lazyLayers: number;
}

export const LAZY_RECORD_FILE = 'lazy.json';
export const CHUNK_INDEX_FILE = 'chunks.idx';
const DEFAULT_DEADLINE_MS = 10_000;
const DEFAULT_CONCURRENCY = 16;
/** Read-ahead past a missed read (bytes): a round trip to the registry costs more than 1 MiB on a cluster link. */
export const DEFAULT_READ_AHEAD_BYTES = 1024 * 1024;
/** Largest range request (bytes). */
export const DEFAULT_MAX_RANGE_BYTES = 4 * 1024 * 1024;
/** How long an unmounted lazy layer's server is kept (ms; see LazyOptions.serverIdleMs). */
export const DEFAULT_LAZY_SERVER_IDLE_MS = 300_000;
const SERVER_SCRIPT = fileURLToPath(new URL('./lazy-server.js', import.meta.url));
const REQUEST_TIMEOUT_MS = 5_000;
/** Connections reset by a server that may be exiting, asked again before it is taken for alive. */
const GONE_RETRIES = 30;
/** A profile is recorded at the first command's end, or this long after the layer's server started. */
export const PROFILE_WINDOW_MS = 120_000;
/** Servers started again on a held FUSE connection within REVIVE_WINDOW_MS before the layer is given up. */
const MAX_REVIVES = 3;
// Ten minutes: a server that keeps dying (even minutes apart) is broken, not unlucky.
const REVIVE_WINDOW_MS = 600_000;
/** Where the lazy servers' control sockets are (see {@link LazyLayers.socketOf}). */
export const SOCKET_DIR = '/run/dsec/lazy';

type Counters = Pick<LazyServerStats, 'hits' | 'misses' | 'fetchedBytes' | 'fetchedChunks' | 'failures' | 'corrupt'>;
const ZERO: Counters = { hits: 0, misses: 0, fetchedBytes: 0, fetchedChunks: 0, failures: 0, corrupt: 0 };

/** Where a layer's access profile stands on this node (see LazyLayers.recordProfile). */
interface ProfileState {
  state: 'loading' | 'recording' | 'recorded' | 'prefetching';
  /** Settles once the registry said whether it has a profile. */
  loaded: Promise<void>;
  timer?: NodeJS.Timeout;
}

/** The lazy servers of one layer store. */
export class LazyLayers {
  readonly cacheDir: string;
  private readonly lazyDir: string;
  /** Event subscriptions to running servers, by layer hex. */
  private readonly subscriptions = new Map<string, net.Socket>();
  /** Chunks (sha256) each mounted lazy layer needs: never evicted. */
  private readonly pinned = new Map<string, Set<string>>();
  /** Counters of servers stopped since the edge started, and the last seen of running ones. */
  private retired: Counters = { ...ZERO };
  private evicting: Promise<void> = Promise.resolve();
  /**
   * Called when a layer's server dies on its own (its event connection closed and it answers no
   * more): its FUSE view is gone (ENOTCONN) under the layer's EROFS mount (see LayerStore).
   */
  onServerLost: ((hex: string) => void) | undefined;
  /**
   * Access profiles of the servers this edge started: `recording` until the first command of a
   * sandbox using the layer ends (or {@link PROFILE_WINDOW_MS}), then stored in the registry;
   * `prefetching` when the registry had one (its chunks are fetched in the background).
   */
  private readonly profiles = new Map<string, ProfileState>();
  /**
   * This edge's copy of each running server's FUSE connection (a /dev/fuse descriptor taken
   * with pidfd_getfd(2)): when the server dies, the connection, the layer's mount and the reads
   * waiting on it live on, and a new server takes it over ({@link revive}).
   */
  private readonly fuseFds = new Map<string, number>();
  /** Servers being started again on a held connection, and when each layer's were. */
  private readonly reviving = new Map<string, Promise<boolean>>();
  private readonly revivals = new Map<string, number[]>();

  constructor(
    private readonly root: string,
    private readonly registry: LayerRegistry,
    private readonly opts: LazyOptions,
  ) {
    this.cacheDir = join(root, 'chunks');
    this.lazyDir = join(root, 'lazy');
  }

  private dirOf(hex: string): string {
    return join(this.lazyDir, hex);
  }

  /**
   * The server's control socket: in a short directory of its own, since a unix socket path is
   * at most 107 bytes and a store's root can be long (named after the root and the layer).
   */
  private socketOf(hex: string): string {
    return join(SOCKET_DIR, `${createHash('sha256').update(`${this.root}\n${hex}`).digest('hex').slice(0, 32)}.sock`);
  }

  /** Directories of lazy servers (running or left over). */
  async serverDirs(): Promise<string[]> {
    return readdir(this.lazyDir).catch(() => []);
  }

  /**
   * Starts (or finds running) the lazy server of the layer whose files are in `layerDir` and
   * returns the path of its blob (what the EROFS mount's `device=` names).
   */
  async start(hex: string, layerDir: string): Promise<string> {
    // Pinned already when its server was kept idle since the last unmount (see LayerStore).
    if (!this.pinned.has(hex)) {
      const index = decodeChunkIndex(await readFile(join(layerDir, CHUNK_INDEX_FILE)));
      this.pinned.set(hex, new Set(index.chunks.map((c) => c.sha256)));
    }
    try {
      return await this.startPinned(hex, layerDir);
    } catch (err) {
      // A server that did not start holds no chunk: they may be evicted again.
      this.pinned.delete(hex);
      throw err;
    }
  }

  /** {@link start} once the layer's chunks are pinned. */
  private async startPinned(hex: string, layerDir: string): Promise<string> {
    const dir = this.dirOf(hex);
    const mountpoint = join(dir, 'fuse');
    const blob = join(mountpoint, 'blob');
    const running = (await this.request(hex, { op: 'stats' }).catch(() => undefined)) as { pid?: number; fuseFd?: number } | undefined;
    if (running !== undefined) {
      this.holdFuse(hex, running.pid, running.fuseFd);
      this.subscribe(hex);
      return blob;
    }
    await this.cleanup(hex);
    const record = JSON.parse(await readFile(join(layerDir, LAZY_RECORD_FILE), 'utf8')) as LazyRecord;
    await mkdir(dir, { recursive: true, mode: 0o700 });
    await mkdir(SOCKET_DIR, { recursive: true, mode: 0o700 });
    await mkdir(this.cacheDir, { recursive: true });
    const config: LazyServerConfig = {
      digest: `sha256:${hex}`,
      mountpoint,
      index: join(layerDir, CHUNK_INDEX_FILE),
      cacheDir: this.cacheDir,
      lazyfs: this.opts.lazyfsBinary,
      deadlineMs: this.opts.deadlineMs ?? DEFAULT_DEADLINE_MS,
      concurrency: this.opts.concurrency ?? DEFAULT_CONCURRENCY,
      registry: this.registry.endpoint,
      repository: this.registry.repository,
      blobDigest: record.blobDigest,
      socket: this.socketOf(hex),
      readAheadBytes: this.opts.readAheadBytes ?? DEFAULT_READ_AHEAD_BYTES,
      maxRangeBytes: Math.max(this.opts.maxRangeBytes ?? DEFAULT_MAX_RANGE_BYTES, 64 * 1024),
    };
    await writeFile(join(dir, 'server.json'), JSON.stringify(config), { mode: 0o600 });
    const ready = await this.spawnServer(hex);
    if (ready === undefined) {
      const why = await readFile(join(dir, 'server.log'), 'utf8').catch(() => '');
      await this.cleanup(hex);
      throw new DsecError('UNAVAILABLE', `lazy server of layer sha256:${hex} did not start: ${why.trim().split('\n').slice(-3).join(' ')}`, {
        layer: `sha256:${hex}`,
      });
    }
    this.holdFuse(hex, ready.pid, ready.fuseFd);
    this.subscribe(hex);
    this.loadProfile(hex);
    return blob;
  }

  /**
   * Starts the layer's server (config `server.json` in its directory) and waits for it to be
   * ready: its pid and the number of its FUSE descriptor, or undefined (it was killed). With
   * `resumeFd` it takes over that mounted FUSE connection instead of mounting one.
   */
  private async spawnServer(hex: string, resumeFd?: number): Promise<{ pid: number; fuseFd: number } | undefined> {
    const dir = this.dirOf(hex);
    const log = openSync(join(dir, 'server.log'), 'a', 0o600);
    let child;
    try {
      // Its own session: an edge that dies (or is killed with its process group) leaves it serving.
      child = spawn(process.execPath, [SERVER_SCRIPT, join(dir, 'server.json'), ...(resumeFd === undefined ? [] : ['resume'])], {
        detached: true,
        stdio: ['ignore', 'pipe', log, ...(resumeFd === undefined ? [] : [resumeFd])],
      });
    } finally {
      closeSync(log);
    }
    child.unref();
    const ready = await new Promise<{ pid: number; fuseFd: number } | undefined>((resolve) => {
      const timer = setTimeout(() => resolve(undefined), 15_000);
      const lines = createInterface({ input: child.stdout! });
      lines.on('error', () => undefined);
      lines.once('line', (line) => {
        clearTimeout(timer);
        const [word, pid, fd] = line.split(' ');
        resolve(word === 'ready' ? { pid: Number(pid), fuseFd: Number(fd) } : undefined);
      });
      child.once('exit', () => {
        clearTimeout(timer);
        resolve(undefined);
      });
    });
    child.stdout?.destroy();
    if (ready === undefined && child.exitCode === null) child.kill('SIGKILL');
    return ready;
  }

  /** Takes a copy of the server's FUSE descriptor (see {@link fuseFds}); without one the layer dies with its server. */
  private holdFuse(hex: string, pid: number | undefined, fuseFd: number | undefined): void {
    if (this.fuseFds.has(hex) || pid === undefined || fuseFd === undefined) return;
    try {
      const pidfd = pidfdOpen(pid);
      if (pidfd === undefined) return;
      try {
        const fd = pidfdGetfd(pidfd, fuseFd);
        // The pid came from the server's reply: if that server died and the pid was reused, the
        // descriptor is some other process's. Only a FUSE connection is kept.
        const st = fstatSync(fd);
        if (st.isCharacterDevice() && st.rdev === statSync('/dev/fuse').rdev) this.fuseFds.set(hex, fd);
        else closeFd(fd);
      } finally {
        closeFd(pidfd);
      }
    } catch {
      // No copy (no ptrace rights over the server): the layer is lost if its server dies.
    }
  }

  private releaseFuse(hex: string): void {
    const fd = this.fuseFds.get(hex);
    this.fuseFds.delete(hex);
    if (fd !== undefined) closeFd(fd);
  }

  /**
   * The layer's server died under a mounted layer whose FUSE connection this edge holds: a new
   * server takes the connection over (the kernel queues again the reads the dead one had taken),
   * so the sandboxes reading the layer carry on. False (the connection let go, the layer lost)
   * when it does not start, or after MAX_REVIVES within REVIVE_WINDOW_MS.
   */
  private revive(hex: string): Promise<boolean> {
    const known = this.reviving.get(hex);
    if (known !== undefined) return known;
    const run = (async (): Promise<boolean> => {
      const fd = this.fuseFds.get(hex);
      const now = Date.now();
      const recent = (this.revivals.get(hex) ?? []).filter((t) => now - t < REVIVE_WINDOW_MS);
      this.revivals.set(hex, [...recent, now]);
      if (fd === undefined || recent.length >= MAX_REVIVES || !this.pinned.has(hex)) {
        this.releaseFuse(hex);
        return false;
      }
      const ready = await this.spawnServer(hex, fd);
      if (ready === undefined) {
        this.releaseFuse(hex);
        return false;
      }
      this.subscribe(hex);
      return true;
    })().finally(() => this.reviving.delete(hex));
    this.reviving.set(hex, run);
    return run;
  }

  /**
   * A server just started (a cold start of the layer on this node): fetches the layer's access
   * profile and prefetches its chunks, or, when there is none, records one.
   */
  private loadProfile(hex: string): void {
    const entry: ProfileState = { state: 'loading', loaded: Promise.resolve() };
    this.profiles.set(hex, entry);
    const scratch = join(this.dirOf(hex), 'profile.json');
    entry.loaded = this.registry
      .profile(`sha256:${hex}`, scratch, AbortSignal.timeout(REQUEST_TIMEOUT_MS))
      .then(async (profile) => {
        if (profile !== undefined) {
          entry.state = 'prefetching';
          await this.prefetch(hex, profile.chunks);
          return;
        }
        entry.state = 'recording';
        entry.timer = setTimeout(() => {
          this.recordProfile(hex).catch(() => undefined);
        }, PROFILE_WINDOW_MS);
        entry.timer.unref();
      })
      .catch(() => {
        // No profile to be had (registry down): reads fetch as they come; nothing is recorded.
        entry.state = 'recorded';
      });
  }

  /**
   * Stores the layer's access profile (the chunks read so far, in order) in the registry if this
   * edge is recording one (the layer's first run on a node that found none). Once per server.
   */
  async recordProfile(hex: string): Promise<boolean> {
    const entry = this.profiles.get(hex);
    await entry?.loaded;
    if (entry?.state !== 'recording') return false;
    entry.state = 'recorded';
    clearTimeout(entry.timer);
    const order = await this.accessOrder(hex);
    if (order.length === 0) return false;
    await this.registry.pushProfile(`sha256:${hex}`, order, join(this.dirOf(hex), 'profile.json'));
    return true;
  }

  /** Stops the layer's server (its EROFS mount must be gone) and removes its directory. */
  async stop(hex: string): Promise<void> {
    this.pinned.delete(hex);
    clearTimeout(this.profiles.get(hex)?.timer);
    this.profiles.delete(hex);
    const final = await this.request(hex, { op: 'stats' }).catch(() => undefined);
    if (final !== undefined) this.retire((final as { stats: LazyServerStats }).stats);
    this.subscriptions.get(hex)?.destroy();
    this.subscriptions.delete(hex);
    // The FUSE view may stay busy a moment after the layer's unmount (the kernel lets go of the
    // backing file late): ask again for a while, then detach it (cleanup) and let the server go.
    // A server that did not answer is gone (died): nothing to wait for, only its leftovers.
    const until = final === undefined ? 0 : Date.now() + 5_000;
    while (Date.now() < until) {
      const reply = (await this.request(hex, { op: 'stop' }).catch(() => undefined)) as { stopped?: boolean } | undefined;
      if (reply === undefined || reply.stopped === true) break;
      await sleep(100);
    }
    while (Date.now() < until && (await stat(this.socketOf(hex)).catch(() => null)) !== null) await sleep(20);
    await this.cleanup(hex);
    void this.evict();
  }

  /** Unmounts a leftover FUSE view of the layer (its server gone) and removes its directory. */
  private async cleanup(hex: string): Promise<void> {
    const dir = this.dirOf(hex);
    for (const m of (await mountsUnder(dir)).reverse()) umount(m, MNT.DETACH);
    this.releaseFuse(hex);
    await rm(dir, { recursive: true, force: true });
    await rm(this.socketOf(hex), { force: true });
  }

  private retire(s: Counters): void {
    for (const k of Object.keys(ZERO) as (keyof Counters)[]) this.retired[k] += s[k];
  }

  /** The counters of the layer's running server. */
  async serverStats(hex: string): Promise<LazyServerStats | undefined> {
    const reply = (await this.request(hex, { op: 'stats' }).catch(() => undefined)) as { stats: LazyServerStats } | undefined;
    return reply?.stats;
  }

  /** The process id of the layer's server; undefined when none answers. */
  async serverPid(hex: string): Promise<number | undefined> {
    const reply = (await this.request(hex, { op: 'stats' }).catch(() => undefined)) as { pid?: number } | undefined;
    return reply?.pid;
  }

  /** Chunk indexes in the order the layer's reads first touched them (its access profile). */
  async accessOrder(hex: string): Promise<number[]> {
    const reply = (await this.request(hex, { op: 'order' })) as { order: number[] };
    return reply.order;
  }

  /** Asks the layer's server to fetch `chunks` in the background, in order. */
  async prefetch(hex: string, chunks: number[]): Promise<void> {
    await this.request(hex, { op: 'prefetch', chunks });
  }

  /**
   * Whether the layer's server is gone for certain: its socket is missing or refuses
   * connections (a server too busy to answer in time is not gone).
   */
  async gone(hex: string): Promise<boolean> {
    const reviving = this.reviving.get(hex);
    if (reviving !== undefined) return !(await reviving);
    if (!(await this.unreachable(hex))) return false;
    // Dead: a mounted layer whose connection this edge holds gets a new server.
    return !(this.fuseFds.has(hex) && (await this.revive(hex)));
  }

  /** Whether the layer's server's socket is missing or refuses connections (see {@link gone}). */
  private async unreachable(hex: string): Promise<boolean> {
    for (let attempt = 0; ; attempt++) {
      try {
        await this.request(hex, { op: 'stats' });
        return false;
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        if (code === 'ENOENT' || code === 'ECONNREFUSED') return true;
        // A server being killed can still accept a connection as it exits, then reset it: ask
        // again until the answer is certain.
        if ((code !== 'ECONNRESET' && code !== 'EPIPE') || attempt >= GONE_RETRIES) return false;
        await sleep(100);
      }
    }
  }

  /** Whether the layer has a running server. */
  async running(hex: string): Promise<boolean> {
    return (await this.request(hex, { op: 'stats' }).catch(() => undefined)) !== undefined;
  }

  /** Cache and fetch statistics of the node. */
  async stats(): Promise<LazyCacheStats> {
    const total: Counters = { ...this.retired };
    for (const hex of this.pinned.keys()) {
      const s = await this.serverStats(hex);
      if (s !== undefined) for (const k of Object.keys(ZERO) as (keyof Counters)[]) total[k] += s[k];
    }
    const usage = await this.usage();
    const reads = total.hits + total.misses;
    return {
      cacheBytes: usage.bytes,
      cacheChunks: usage.files.length,
      cacheMaxBytes: this.opts.chunkCacheMaxBytes ?? null,
      ...total,
      hitRate: reads === 0 ? null : total.hits / reads,
      lazyLayers: this.pinned.size,
    };
  }

  private async usage(): Promise<{ bytes: number; files: { path: string; sha: string; size: number; mtimeMs: number }[] }> {
    const files: { path: string; sha: string; size: number; mtimeMs: number }[] = [];
    let bytes = 0;
    for (const sub of await readdir(this.cacheDir).catch(() => [] as string[])) {
      const subDir = join(this.cacheDir, sub);
      for (const name of await readdir(subDir).catch(() => [] as string[])) {
        const path = join(subDir, name);
        const st = await stat(path).catch(() => null);
        if (st === null || !st.isFile()) continue;
        if (name.includes('.tmp-')) {
          // A fetch cut off by a crash; fetches in progress are younger than a minute.
          if (Date.now() - st.mtimeMs > 60_000) await unlink(path).catch(() => undefined);
          continue;
        }
        files.push({ path, sha: name, size: st.size, mtimeMs: st.mtimeMs });
        bytes += st.size;
      }
    }
    return { bytes, files };
  }

  /**
   * Removes the least recently read chunks that no mounted lazy layer needs until the cache
   * fits its bound. Serialized; a no-op without a bound.
   */
  evict(): Promise<void> {
    const max = this.opts.chunkCacheMaxBytes;
    if (max === undefined) return Promise.resolve();
    const run = this.evicting.then(async () => {
      const { bytes, files } = await this.usage();
      let total = bytes;
      if (total <= max) return;
      const pinned = new Set<string>();
      for (const set of this.pinned.values()) for (const sha of set) pinned.add(sha);
      files.sort((a, b) => a.mtimeMs - b.mtimeMs);
      for (const f of files) {
        if (total <= max) break;
        if (pinned.has(f.sha)) continue;
        await unlink(f.path).catch(() => undefined);
        total -= f.size;
      }
    });
    this.evicting = run.catch(() => undefined);
    return run;
  }

  /** Keeps one connection to the server open for its events. */
  private subscribe(hex: string): void {
    if (this.subscriptions.has(hex)) return;
    const sock = net.connect(this.socketOf(hex));
    this.subscriptions.set(hex, sock);
    sock.on('error', () => undefined);
    sock.on('close', () => {
      if (this.subscriptions.get(hex) !== sock) return; // stopped or detached by this edge
      this.subscriptions.delete(hex);
      void this.gone(hex).then((gone) => {
        if (gone && this.pinned.has(hex)) this.onServerLost?.(hex);
      });
    });
    sock.unref();
    sock.write(JSON.stringify({ op: 'events' }) + '\n');
    const lines = createInterface({ input: sock });
    lines.on('error', () => undefined); // readline re-emits the socket's errors
    lines.on('line', (line) => {
      try {
        const msg = JSON.parse(line) as { event?: RaisedEvent };
        if (msg.event !== undefined) this.opts.raise?.(msg.event);
      } catch {
        // not a line of the protocol
      }
    });
  }

  /** Subscriptions are dropped (the edge closing); servers keep running. */
  detach(): void {
    for (const p of this.profiles.values()) clearTimeout(p.timer);
    for (const s of this.subscriptions.values()) s.destroy();
    this.subscriptions.clear();
    // The servers keep their own descriptors; the next edge takes copies again.
    for (const hex of [...this.fuseFds.keys()]) this.releaseFuse(hex);
  }

  /** One request to the layer's server, one line back (to the new one once a revival is under way). */
  private async request(hex: string, body: object): Promise<unknown> {
    await this.reviving.get(hex);
    return new Promise((resolve, reject) => {
      const sock = net.connect(this.socketOf(hex));
      const timer = setTimeout(() => {
        sock.destroy();
        reject(new Error('lazy server did not answer'));
      }, REQUEST_TIMEOUT_MS);
      sock.on('error', (err) => {
        clearTimeout(timer);
        reject(err);
      });
      // Closed with no answer (a server exiting): the same as a reset (a no-op once answered).
      sock.on('close', () => {
        clearTimeout(timer);
        reject(Object.assign(new Error('lazy server closed the connection unanswered'), { code: 'ECONNRESET' }));
      });
      const lines = createInterface({ input: sock });
      lines.on('error', () => undefined); // readline re-emits the socket's errors (handled above)
      lines.once('line', (line) => {
        clearTimeout(timer);
        sock.destroy();
        try {
          resolve(JSON.parse(line));
        } catch (err) {
          reject(err instanceof Error ? err : new Error(String(err)));
        }
      });
      sock.write(JSON.stringify(body) + '\n');
    });
  }
}
