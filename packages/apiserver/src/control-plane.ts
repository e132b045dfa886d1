// The control plane: services, HTTP API, watcher, pools and the first admin key over a state
// store and a set of nodes. `dsec up` starts it with its own edge (platform.ts); `dsec apiserver`
// starts it alone on a PostgreSQL store shared with other replicas (replica.ts).
import { createServer } from 'node:http';
import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import type { AddressInfo } from 'node:net';
import { mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { getRequestListener } from '@hono/node-server';
import { DsecError, resolveLimits } from '@dsec/protocol';
import type { EventSink, LimitsConfig, NodeGarbageReport } from '@dsec/protocol';
import { authFailureAudit } from './http/audit.js';
import { AuthFailureGate } from './tenant-limits.js';
import { Watcher, commandSummary } from '@dsec/watcher';
import type { WatchedSandbox } from '@dsec/watcher';
import { Authenticator, IAM_CHANNEL } from './auth.js';
import { ROOT_PROJECT_ID } from './db/store.js';
import type { SandboxSummary, StateStore } from './db/store.js';
import { PostgresListener } from './db/postgres.js';
import { CATALOG_CHANNEL } from './db/catalog-cache.js';
import { createApp } from './http/app.js';
import { createWsHandler } from './http/ws.js';
import { withRawHandlers } from './http/exec-fast-path.js';
import type { RawRequestHandler } from './http/exec-fast-path.js';
import { listenE2bTls } from './e2b/tls.js';
import type { E2bTlsOptions } from './e2b/tls.js';
import { IDEMPOTENCY_PENDING_STALE_MS } from './idempotency.js';
import { ACTIVITY_FLUSH_INTERVAL_MS, leaseOf } from './leases.js';
import { Metrics } from './metrics.js';
import type { NodeRegistry } from './nodes.js';
import { GoneReplicas, reconcileAtStart, reconcileOwnNodes, reconcileSummary, reconcileWasClean } from './reconcile.js';
import type { ReconcileDeps } from './reconcile.js';
import { Placement } from './scheduler.js';
import type { PlacementOptions } from './scheduler.js';
import { createServices } from './services/index.js';
import type { Services } from './services/index.js';
import type { TrajectoryOptions } from './trajectory.js';
import { WatchService } from './watch.js';
import type { WatchServiceOptions } from './watch.js';
import { startUsagePoll } from './usage-poll.js';

/** How many things a garbage collection removed. */
export function garbageCount(r: NodeGarbageReport): number {
  return r.containers.length + r.cgroups.length + r.dirs.length + r.mounts + r.layerMounts;
}

/** A sandbox as the watcher sees it. */
function watched(r: SandboxSummary): WatchedSandbox {
  return { id: r.id, node: r.node, state: r.state, expiresAt: r.expires_at, keptPaused: r.state === 'paused' && leaseOf(r).onExpire === 'pause' };
}

/** `host:port` split; INVALID_ARGUMENT naming `addr` otherwise. */
export function parseAddr(addr: string): { host: string; port: number } {
  const m = /^(\[[^\]]+\]|[^:]+):(\d{1,5})$/.exec(addr);
  if (!m || Number(m[2]) > 65535) throw new DsecError('INVALID_ARGUMENT', `addr: ${addr} is not host:port`, { field: 'addr' });
  return { host: m[1]!.replace(/^\[|\]$/g, ''), port: Number(m[2]) };
}

/** Settings of the control plane that `dsec up` and `dsec apiserver` share. */
export interface ControlPlaneOptions {
  /** Per-tenant limits over protocol's defaults (`DEFAULT_TENANT_LIMITS`; docs/security.md). */
  limits?: LimitsConfig;
  /** Scheduler over-commit and sampling. */
  placement?: PlacementOptions;
  /** Interval of the watcher's passes. */
  watchIntervalMs?: number;
  /** Interval of the watcher's garbage collection on the nodes. */
  gcIntervalMs?: number;
  /** How long a sandbox a node runs without a record may stay so before the watcher destroys it (default `DEFAULT_ORPHAN_GRACE_MS`). */
  orphanGraceMs?: number;
  /** How long the lease pass waits before it finishes a `stopping` row no teardown here owns (default `ABANDONED_STOPPING_MS`). */
  abandonedStoppingMs?: number;
  /** How long a replica with work on a shared store shows no session before the lease pass settles its work (default `GONE_REPLICA_MS`). */
  goneReplicaMs?: number;
  /** Limits and retention of the trajectory log. */
  trajectory?: TrajectoryOptions;
  /** Events, audit and rules: heartbeats, queues, rate limits, retention. */
  watch?: WatchServiceOptions;
  /** Also sees every event the control plane raises (owner.lost, lease.exceeded): for tests. */
  observeEvents?: EventSink;
  /**
   * Addresses (or CIDR ranges) of the reverse proxies in front of the API whose
   * `X-Forwarded-For` is believed. Default none: the client is the socket's peer.
   */
  trustedProxies?: string[];
  /**
   * The E2B-compatible API (docs/e2b.md): build its `base` template at start (`dsec up` does)
   * or on first use, or take its Debian part from a layer (`baseFrom`); the `domain` it returns.
   */
  e2b?: { buildBase?: boolean; buildOnDemand?: boolean; baseFrom?: string; domain?: string | null; tls?: E2bTlsOptions };
}

/** What {@link startControlPlane} is started with. */
export interface ControlPlaneStart extends ControlPlaneOptions {
  /** State directory (the admin key file lives here). */
  home: string;
  /** `host:port` to listen on. */
  addr: string;
  log: (line: string) => void;
  store: StateStore;
  nodes: NodeRegistry;
  /**
   * PostgreSQL URL of a shared store: this replica listens there for the others' announcements,
   * and its listening connection is the session that shows it alive to them (its pool's sessions
   * close when idle). Without it a replica on a shared store settles no gone replica's work, and
   * may itself be taken for gone while idle: every replica of a shared store must set it (the
   * `dsec up --db` platform and `dsec apiserver --db` do).
   */
  listenUrl?: string;
  /** Runs once the services exist and before the API listens (the built-in base of a node). */
  prepare?: (services: Services, watch: WatchService) => Promise<void>;
  /** Leftovers the node removed before the start (counted in the metrics). */
  startGarbage?: number;
}

/** A running control plane. */
export interface ControlPlane {
  /** Base URL of the API. */
  url: string;
  /** `https://host:port` of E2B's HTTPS listener (`e2b.tls`), when configured. */
  e2bTlsUrl?: string;
  /** The first admin key: set only where this process created it (it is printed once). */
  adminKey?: string;
  /** File holding the admin key (mode 0600). */
  adminKeyFile: string;
  services: Services;
  watch: WatchService;
  store: StateStore;
  /** Stops the background passes and destroys every sandbox (tests, `dsec up --clean`). */
  destroyAll(): Promise<void>;
  /** Stops serving and closes the store. */
  close(): Promise<void>;
}

/** Starts the control plane; on failure everything started is stopped again. */
export async function startControlPlane(o: ControlPlaneStart): Promise<ControlPlane> {
  const { store, nodes, log } = o;
  const { host, port } = parseAddr(o.addr);
  await mkdir(o.home, { recursive: true, mode: 0o700 });
  const closers: Array<() => Promise<void> | void> = [() => store.close()];
  try {
    // The tenant limits, resolved once for every service that enforces one.
    const limits = resolveLimits(o.limits);
    const auth = new Authenticator(store, { perSecond: limits.requestsPerSecondPerTenant, burst: limits.requestBurstPerTenant });
    // Events from the nodes and the control plane (owner.lost, lease.exceeded of idle and owner
    // leases) go through the watcher's pipeline; run-time rules tighten every new sandbox.
    const watch = new WatchService(store, { log, ...o.watch, limits, tenantProjects: (t) => auth.tenantProjects(t) });
    closers.unshift(() => watch.close());
    await watch.init();
    // Failed authentications by source, collapsed into the audit (closed before the audit is).
    const authFailures = new AuthFailureGate(limits, authFailureAudit(watch));
    closers.unshift(() => authFailures.close());
    let replicas: PostgresListener | undefined;
    if (o.listenUrl) {
      const listener = new PostgresListener(o.listenUrl, log, store.sessionTag);
      replicas = listener;
      closers.unshift(() => listener.close());
      await watch.joinReplicas(listener);
      await listener.listen(IAM_CHANNEL, (origin) => {
        if (origin !== auth.origin) auth.forget();
      });
      // Layers and pools changed on another replica: drop the cached ones (catalog-cache.ts).
      await listener.listen(CATALOG_CHANNEL, (origin) => {
        if (origin !== store.catalog.origin) store.catalog.forget();
      });
      listener.onReconnect(() => store.catalog.forget());
    }
    // A store of one process, or a shared one that no other replica runs on now (this one holds
    // the replicas' lock alone until it has reconciled): what is in flight there was cut short.
    const alone = replicas ? await replicas.joinReplicas() : !store.shared;
    const observe = o.observeEvents;
    const services = createServices({
      store,
      auth,
      nodes,
      placement: new Placement(o.placement),
      log,
      raise: (ev) => {
        observe?.(ev);
        watch.events.ingest(ev);
      },
      raiseOwned: (ev, owner) => {
        observe?.(ev);
        watch.events.ingest(ev, owner);
      },
      tighten: (projectId, spec) => watch.tighten(projectId, spec),
      deniedNames: (projectId) => watch.deniedNames(projectId),
      trajectory: { log, ...o.trajectory },
      limits,
    });
    closers.unshift(() => services.trajectory.close());
    // Deletes already answered finish their teardown before the nodes and the store close.
    closers.unshift(() => services.lifecycle.teardownsIdle());
    // Alone on the store: what a crash of the previous process cut short is settled against the
    // nodes before anything is served or charged. Beside others: the nodes this process reaches
    // from the start (its built-in one) are reconciled for the work of gone replicas (its own
    // previous life) and their sandboxes without rows; a joining node is reconciled when its
    // session opens; a gone replica's other work (GoneReplicas) and abandoned deletes are the
    // lease pass's.
    const reconcileDeps: ReconcileDeps = { store, nodes, log, toSandbox: (row) => services.lifecycle.toSandbox(row), rowEvents: services.lifecycle.rowEvents };
    const reconciled = alone ? await reconcileAtStart(reconcileDeps) : await reconcileOwnNodes(reconcileDeps);
    if (!reconcileWasClean(reconciled)) log(reconcileSummary(reconciled));
    await services.lifecycle.loadAllocations(alone);
    // Alone: a key still pending belongs to a request that died with the previous process.
    // Beside other replicas: one may be running that request; only a key pending far too long is dead.
    await store.settlePendingIdempotencyKeys(new Date(Date.now() - (alone ? 0 : IDEMPOTENCY_PENDING_STALE_MS)).toISOString());
    // Reconciled: other replicas may start.
    await replicas?.shareWithReplicas();
    await o.prepare?.(services, watch);

    // The first admin key, written where the local CLI finds it. Replicas starting together on
    // an empty database: the first to take the lock makes it, the others find it.
    const adminKeyFile = path.join(o.home, 'admin.key');
    const adminKey = await store.exclusive('bootstrap', async () => {
      if ((await store.keys([ROOT_PROJECT_ID])).length > 0) return undefined;
      const key = (await services.iam.issueKey(ROOT_PROJECT_ID, 'admin', 'admin')).key;
      await writeFile(adminKeyFile, `${key}\n`, { mode: 0o600 });
      return key;
    });

    const metrics = new Metrics(services, watch);
    const upgrades: Array<(req: IncomingMessage, socket: Duplex, head: Buffer) => boolean> = [];
    const rawHandlers: RawRequestHandler[] = [];
    const app = createApp(services, metrics, log, watch, {
      health: () => store.ping(),
      ...(o.trustedProxies ? { trustedProxies: o.trustedProxies } : {}),
      failures: { gate: authFailures, source: (c) => (c.get('clientAddress') as string | undefined) ?? 'unknown' },
      ...(o.e2b ? { e2b: o.e2b } : {}),
      onClose: (fn) => void closers.unshift(fn),
      onUpgrade: (fn) => void upgrades.push(fn),
      onRequest: (fn) => void rawHandlers.push(fn),
    });
    const ws = createWsHandler(
      services,
      (p, sandboxId, spec, exit, route) => {
        const entry = {
          keyId: p.keyId,
          projectId: p.projectId,
          method: 'GET',
          route: route ?? '/v1/sandboxes/:id/exec/ws',
          sandboxId,
          status: 101,
          durationMs: 0,
          command: spec ? commandSummary(spec) : null,
        };
        const at = new Date().toISOString();
        exit.onSettled((code) => watch.audit.record({ ...entry, at, exitCode: code }));
      },
      log,
      { gate: authFailures, trustedProxies: new Set(o.trustedProxies ?? []) },
    );
    // Handlers of Node's own requests first (the exec route), then the app.
    const listener = withRawHandlers(rawHandlers, getRequestListener(app.fetch));
    const server = createServer(listener);
    server.keepAliveTimeout = 65_000;
    const onUpgrade = (req: IncomingMessage, socket: Duplex, head: Buffer): void => {
      if (!upgrades.some((take) => take(req, socket, head))) ws.handle(req, socket, head);
    };
    server.on('upgrade', onUpgrade);
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
    // E2B's HTTPS listener (host names with the operator's certificate), when configured.
    const e2bTls = o.e2b?.tls ? await listenE2bTls(o.e2b.tls, listener, onUpgrade) : undefined;
    if (e2bTls) closers.unshift(() => e2bTls.close());
    const actual = server.address() as AddressInfo;
    const url = `http://${host.includes(':') ? `[${host}]` : host}:${actual.port}`;

    // Replicas on a shared store: the work of one that died beside the others is settled here,
    // by a replica whose listening connection shows it alive (see `listenUrl`).
    const goneReplicas = replicas ? new GoneReplicas(reconcileDeps, (row, to) => services.lifecycle.settledElsewhere(row, to), o.goneReplicaMs) : undefined;
    const watcher = new Watcher(
      {
        // A node whose session is down is the node port's to judge (unreachable, lost).
        nodes: () =>
          nodes
            .all()
            .filter((n) => n.state === 'ready')
            .map((n) => ({
              name: n.name,
              sandboxIds: async () => (await n.client.list()).map((s) => s.id),
              destroyOrphan: (id) => n.client.destroy(id),
              collectGarbage: async () => garbageCount(await n.client.collectGarbage()),
            })),
        sandboxes: async (names) => (await store.sandboxSummaries(names)).map(watched),
        expired: async (at) => (await store.expiredSandboxes(at)).map(watched),
        setNodeHealthy: (name, healthy) => nodes.setHealthy(name, healthy),
        expire: async (id) => {
          const row = await store.sandbox(id);
          // Replicas: a sandbox on a node this replica does not reach is another's to expire.
          if (!row || (store.shared && !nodes.get(row.node))) return;
          await services.lifecycle.expireRow(row);
        },
        // Through the node service: the row's node charge and spread count go with it.
        markLost: async (id) => {
          if (!(await services.nodeAdmin.sandboxLost(id))) throw new Error(`sandbox ${id} is no longer on its node`);
        },
        // Leases, then the work of replicas that are gone (reconcile.ts), then deletes a dead
        // replica left `stopping` on a store that does not say whose (see lifecycle.ts), then the
        // shares of rows in flight that another replica ended without this one.
        leases: async () => {
          await services.lifecycle.enforceLeases(log);
          await goneReplicas?.pass();
          await services.lifecycle.finishAbandonedStopping(log, Date.now(), o.abandonedStoppingMs);
          await services.lifecycle.giveBackEndedElsewhere();
        },
        raise: watch.events.ingest,
        maintain: () => watch.maintain(),
      },
      {
        log,
        ...(o.watchIntervalMs !== undefined ? { intervalMs: o.watchIntervalMs } : {}),
        ...(o.gcIntervalMs !== undefined ? { gcIntervalMs: o.gcIntervalMs } : {}),
        ...(o.orphanGraceMs !== undefined ? { orphanGraceMs: o.orphanGraceMs } : {}),
      },
    );
    metrics.garbageCollected = () => (o.startGarbage ?? 0) + watcher.garbageCollected;
    watcher.start();
    services.poolManager.start();
    closers.unshift(startUsagePoll(nodes));
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
    return {
      url,
      ...(e2bTls ? { e2bTlsUrl: e2bTls.url } : {}),
      ...(adminKey ? { adminKey } : {}),
      adminKeyFile,
      services,
      watch,
      store,
      async destroyAll() {
        await watcher.stop();
        await services.poolManager.stop();
        services.admission.close();
        await services.lifecycle.teardownsIdle();
        for (const row of await store.allSandboxes()) {
          if (store.shared && !nodes.get(row.node)) continue;
          await services.lifecycle.destroyRow(row).catch((err: unknown) => log(`dsec: destroying ${row.id}: ${(err as Error).message}`));
        }
      },
      async close() {
        if (closed) return;
        closed = true;
        for (const c of closers) await c();
      },
    };
  } catch (err) {
    for (const c of closers)
      await Promise.resolve()
        .then(c)
        .catch(() => undefined);
    throw err;
  }
}
