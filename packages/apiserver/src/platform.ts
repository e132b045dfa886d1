// dsec on one machine: apiserver + edge + watcher in one process, state in SQLite under
// its home. This is what `dsec up` (and `npm start`) runs.
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import Database from 'better-sqlite3';
import { getRequestListener } from '@hono/node-server';
import { Edge } from '@dsec/edge';
import type { NetworkOptions } from '@dsec/edge';
import { DEFAULT_DSEC_ADDR, DEFAULT_DSEC_HOME, DsecError, edgeThroughWire, resolveLimits } from '@dsec/protocol';
import type { EdgeWireMode, EventSink, LimitsConfig, NodeGarbageReport } from '@dsec/protocol';
import { authFailureAudit, requestSource } from './http/audit.js';
import { AuthFailureGate } from './tenant-limits.js';
import { Watcher } from '@dsec/watcher';
import { Authenticator } from './auth.js';
import { PUBLIC_PROJECT_ID, ROOT_PROJECT_ID, StateStore } from './db/store.js';
import { createApp } from './http/app.js';
import { createWsHandler } from './http/ws.js';
import { ACTIVITY_FLUSH_INTERVAL_MS } from './leases.js';
import { Metrics } from './metrics.js';
import { WatchService } from './watch.js';
import type { WatchServiceOptions } from './watch.js';
import { commandSummary } from '@dsec/watcher';
import { NodeRegistry } from './nodes.js';
import { Placement } from './scheduler.js';
import type { PlacementOptions } from './scheduler.js';
import { createServices } from './services/index.js';
import type { Services } from './services/index.js';
import type { TrajectoryOptions } from './trajectory.js';

/** Default state directory. */
export const DEFAULT_HOME = DEFAULT_DSEC_HOME;
/** Default listen address. */
export const DEFAULT_ADDR = DEFAULT_DSEC_ADDR;
/** Name of the built-in base layer. */
export const BUILTIN_BASE = 'busybox';

/** Options of {@link startPlatform}. */
export interface PlatformOptions {
  /** State directory. Default {@link DEFAULT_HOME}. */
  home?: string;
  /** `host:port` to listen on (port 0 picks a free one). Default {@link DEFAULT_ADDR}. */
  addr?: string;
  /** Host path of the chronus binary. Default: the one built in this checkout. */
  agentBinary?: string;
  /** Where progress and errors go. Default: stderr. */
  log?: (line: string) => void;
  /** Scheduler over-commit and sampling. */
  placement?: PlacementOptions;
  /** Interval of the watcher's passes. */
  watchIntervalMs?: number;
  /**
   * Size in MiB of a zram swap device for paused sandboxes' memory (EdgeOptions.zramSwapMiB).
   * Default none.
   */
  zramSwapMiB?: number;
  /** Limits and retention of the trajectory log. */
  trajectory?: TrajectoryOptions;
  /** Interval of the watcher's garbage collection on the node. */
  gcIntervalMs?: number;
  /** Events, audit and rules: heartbeats, queues, rate limits, retention. */
  watch?: WatchServiceOptions;
  /** A user namespace per container sandbox (default true). */
  userNamespaces?: boolean;
  /** Sandbox networking of the node (address pool, static hosts, resolvers). */
  network?: NetworkOptions;
  /** Also sees every event the control plane raises (owner.lost, lease.exceeded): for tests. */
  observeEvents?: EventSink;
  /**
   * How the control plane reaches the in-process edge: directly (`off`, the default) or through
   * the edge wire protocol over a loopback transport (`loopback`: every call, stream and event
   * encoded and decoded, as a remote edge's would be; the end-to-end suite runs once so).
   */
  edgeWire?: EdgeWireMode;
  /** Per-tenant limits over protocol's defaults (`DEFAULT_TENANT_LIMITS`; docs/security.md). */
  limits?: LimitsConfig;
  /**
   * Addresses of reverse proxies whose `X-Forwarded-For` is believed when telling clients apart
   * (failed authentications are rate-limited by client address). Default none: the peer address.
   */
  trustedProxies?: string[];
}

/** A running platform. */
export interface Platform {
  /** Base URL of the API. */
  url: string;
  /** The first admin key: set only on the first start (it is printed once). */
  adminKey?: string;
  /** File holding the admin key (mode 0600). */
  adminKeyFile: string;
  /** The in-process edge and the services behind the API (for tests and embedding). */
  edge: Edge;
  services: Services;
  /** Events, audit trail and rules. */
  watch: WatchService;
  /** Stops serving; sandboxes keep running and are found again by the next start. */
  close(): Promise<void>;
  /** Stops serving and removes every sandbox, layer mount and runtime namespace (tests). */
  shutdown(): Promise<void>;
}

function parseAddr(addr: string): { host: string; port: number } {
  const m = /^(\[[^\]]+\]|[^:]+):(\d{1,5})$/.exec(addr);
  if (!m || Number(m[2]) > 65535) throw new DsecError('INVALID_ARGUMENT', `addr: ${addr} is not host:port`, { field: 'addr' });
  return { host: m[1]!.replace(/^\[|\]$/g, ''), port: Number(m[2]) };
}

/** How many things a garbage collection removed. */
function garbageCount(r: NodeGarbageReport): number {
  return r.containers.length + r.cgroups.length + r.dirs.length + r.mounts + r.layerMounts;
}

function defaultAgentBinary(): string {
  return path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../chronus/build/chronus');
}

/** Starts apiserver, edge and watcher in this process. */
export async function startPlatform(opts: PlatformOptions = {}): Promise<Platform> {
  const log = opts.log ?? ((line: string) => process.stderr.write(line + '\n'));
  const home = path.resolve(opts.home ?? DEFAULT_HOME);
  const { host, port } = parseAddr(opts.addr ?? DEFAULT_ADDR);
  await mkdir(home, { recursive: true, mode: 0o700 });

  const userNamespaces = opts.userNamespaces ?? true;
  const zramSwapMiB = opts.zramSwapMiB;
  // The tenant limits, resolved once for the node and every service that enforces one.
  const limits = resolveLimits(opts.limits);
  const edge = await Edge.open({
    layerContentBytes: limits.layerUploadBytes,
    home: path.join(home, 'node'),
    agentBinary: opts.agentBinary ?? defaultAgentBinary(),
    userNamespaces,
    ...(opts.network ? { network: opts.network } : {}),
    ...(zramSwapMiB !== undefined ? { zramSwapMiB } : {}),
  });
  const sqlite = new Database(path.join(home, 'dsec.db'));
  const store = await StateStore.openSqlite(sqlite);
  const closers: Array<() => Promise<void> | void> = [() => store.close(), () => edge.close()];
  try {
    const auth = new Authenticator(store);
    const nodes = new NodeRegistry();
    const reached = await edgeThroughWire(edge, opts.edgeWire ?? 'off', { log });
    closers.unshift(() => reached.close());
    nodes.add(reached.client);

    // Events from the node and the control plane (owner.lost, lease.exceeded of idle and owner
    // leases) go through the watcher's pipeline; run-time rules tighten every new sandbox.
    const watch = new WatchService(store, { log, ...opts.watch, limits, tenantProjects: (t) => auth.tenantProjects(t) });
    closers.unshift(() => watch.close());
    // Failed authentications by source, collapsed into the audit (closed before the audit is).
    const authFailures = new AuthFailureGate(limits, authFailureAudit(watch));
    closers.unshift(() => authFailures.close());
    const trustedProxies = new Set(opts.trustedProxies ?? []);
    await watch.init();
    const unsubscribe = reached.client.onEvent(watch.events.ingest);
    closers.unshift(() => unsubscribe());
    const observe = opts.observeEvents;
    const services = createServices({
      store,
      auth,
      nodes,
      placement: new Placement(opts.placement),
      log,
      raise: (ev) => {
        observe?.(ev);
        watch.events.ingest(ev);
      },
      tighten: (projectId, spec) => watch.tighten(projectId, spec),
      deniedNames: (projectId) => watch.deniedNames(projectId),
      trajectory: { log, ...opts.trajectory },
      limits,
    });
    closers.unshift(() => services.trajectory.close());
    await services.lifecycle.loadAllocations();
    // This process is the only apiserver: a key still pending belongs to a request that died
    // with the previous one.
    await store.dropPendingIdempotencyKeys(new Date().toISOString());
    const startGarbage = edge.lastStartGarbage;
    const startRemoved = startGarbage ? garbageCount(startGarbage) : 0;
    if (startRemoved > 0) log(`dsec: removed ${startRemoved} leftovers of sandboxes a previous run lost (${JSON.stringify(startGarbage)})`);

    // The built-in base, built on first start (seconds) and public to every project.
    let base = await edge.layers.resolve(BUILTIN_BASE).catch(() => undefined);
    if (!base) {
      log(`dsec: building the built-in ${BUILTIN_BASE} base layer`);
      base = await edge.layers.build({ type: 'busybox' }, { kind: 'base', name: BUILTIN_BASE });
    }
    const publicRows = await store.layers([PUBLIC_PROJECT_ID]);
    if (!publicRows.some((r) => r.name === `${BUILTIN_BASE}:latest` && r.digest === base.digest)) {
      await services.layers.register(PUBLIC_PROJECT_ID, base, BUILTIN_BASE);
    }

    // The first admin key, written where the local CLI finds it.
    const adminKeyFile = path.join(home, 'admin.key');
    let adminKey: string | undefined;
    if ((await store.keys([ROOT_PROJECT_ID])).length === 0) {
      adminKey = (await services.iam.issueKey(ROOT_PROJECT_ID, 'admin', 'admin')).key;
      await writeFile(adminKeyFile, `${adminKey}\n`, { mode: 0o600 });
    }

    const metrics = new Metrics(services, watch);
    const app = createApp(services, metrics, log, watch, { gate: authFailures, source: requestSource(trustedProxies) });
    const ws = createWsHandler(
      services,
      (p, sandboxId, spec, exitCode) => {
        const entry = {
          keyId: p.keyId,
          projectId: p.projectId,
          method: 'GET',
          route: '/v1/sandboxes/:id/exec/ws',
          sandboxId,
          status: 101,
          durationMs: 0,
          command: commandSummary(spec),
        };
        const at = new Date().toISOString();
        void exitCode.then((code) => watch.audit.record({ ...entry, at, exitCode: code }));
      },
      log,
      { gate: authFailures, trustedProxies },
    );
    const server = createServer(getRequestListener(app.fetch));
    server.keepAliveTimeout = 65_000;
    server.on('upgrade', (req, socket, head) => ws.handle(req, socket, head));
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, host, () => {
        server.off('error', reject);
        resolve();
      });
    });
    closers.unshift(
      () => ws.close(),
      () => new Promise<void>((r) => server.close(() => r())),
      () => server.closeAllConnections(),
    );
    // Live event streams end first: the server's close waits for open connections.
    closers.unshift(() => watch.events.endSubscriptions());
    const actual = server.address() as AddressInfo;
    const url = `http://${host.includes(':') ? `[${host}]` : host}:${actual.port}`;

    const watcher = new Watcher(
      {
        nodes: () =>
          nodes.all().map((n) => ({
            name: n.name,
            sandboxIds: async () => (await n.client.list()).map((s) => s.id),
            destroyOrphan: (id) => n.client.destroy(id),
            collectGarbage: async () => garbageCount(await n.client.collectGarbage()),
          })),
        sandboxes: async () => (await store.allSandboxes()).map((r) => ({ id: r.id, node: r.node, state: r.state, expiresAt: r.expires_at })),
        setNodeHealthy: (name, healthy) => nodes.setHealthy(name, healthy),
        expire: async (id) => {
          const row = await store.sandbox(id);
          if (!row) return;
          await services.lifecycle.expireRow(row);
        },
        markLost: (id) => store.setSandboxState(id, 'lost'),
        leases: () => services.lifecycle.enforceLeases(log),
        raise: watch.events.ingest,
        maintain: () => watch.maintain(),
      },
      {
        log,
        ...(opts.watchIntervalMs !== undefined ? { intervalMs: opts.watchIntervalMs } : {}),
        ...(opts.gcIntervalMs !== undefined ? { gcIntervalMs: opts.gcIntervalMs } : {}),
      },
    );
    metrics.garbageCollected = () => startRemoved + watcher.garbageCollected;
    watcher.start();
    services.poolManager.start();
    closers.unshift(
      () => watcher.stop(),
      () => services.poolManager.stop(),
      () => services.admission.close(),
    );
    // API activity is recorded in memory and written about once a second (idle timeouts).
    const flush = setInterval(
      () => void services.lifecycle.flushActivity().catch((err: unknown) => log(`dsec: recording activity: ${(err as Error).message}`)),
      ACTIVITY_FLUSH_INTERVAL_MS,
    );
    flush.unref();
    closers.unshift(async () => {
      clearInterval(flush);
      await services.lifecycle.flushActivity().catch(() => undefined);
    });

    let closed = false;
    const platform: Platform = {
      url,
      ...(adminKey ? { adminKey } : {}),
      adminKeyFile,
      edge,
      services,
      watch,
      async close() {
        if (closed) return;
        closed = true;
        for (const c of closers) await c();
      },
      async shutdown() {
        await watcher.stop();
        await services.poolManager.stop();
        services.admission.close();
        for (const row of await store.allSandboxes())
          await services.lifecycle.destroyRow(row).catch((err: unknown) => log(`dsec: destroying ${row.id}: ${(err as Error).message}`));
        await platform.close();
        await edge.shutdown();
      },
    };
    return platform;
  } catch (err) {
    for (const c of closers)
      await Promise.resolve()
        .then(c)
        .catch(() => undefined);
    throw err;
  }
}
