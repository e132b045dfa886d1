// dsec on one machine: apiserver + edge + watcher in one process, state in SQLite under
// its home (or, with `db`, in a PostgreSQL database other replicas share). This is what
// `dsec up` (and `npm start`) runs.
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import Database from 'better-sqlite3';
import { Edge, fncallRunner, makeCsr, makeKey, openssl } from '@dsec/edge';
import type { MicrovmBackendConfig, NetworkOptions, RuntimeLayerId, VmBackendConfig } from '@dsec/edge';
import { DEFAULT_DSEC_ADDR, DEFAULT_DSEC_HOME, edgeThroughWire, resolveLimits } from '@dsec/protocol';
import type { EdgeWireMode, LayerRegistryConfig, RegistryEndpointConfig } from '@dsec/protocol';
import { garbageCount, parseAddr, startControlPlane } from './control-plane.js';
import type { ControlPlaneOptions } from './control-plane.js';
import { PUBLIC_PROJECT_ID, StateStore } from './db/store.js';
import { startNodePort } from './cluster/node-port.js';
import type { ClusterOptions, NodePort } from './cluster/node-port.js';
import { NodeRegistry } from './nodes.js';
import type { Services } from './services/index.js';
import type { WatchService } from './watch.js';

/** Default state directory. */
export const DEFAULT_HOME = DEFAULT_DSEC_HOME;
/** Default listen address. */
export const DEFAULT_ADDR = DEFAULT_DSEC_ADDR;
/** Name of the built-in base layer. */
export const BUILTIN_BASE = 'busybox';

/** Options of {@link startPlatform}. */
export interface PlatformOptions extends ControlPlaneOptions {
  /** State directory. Default {@link DEFAULT_HOME}. */
  home?: string;
  /** `host:port` to listen on (port 0 picks a free one). Default {@link DEFAULT_ADDR}. */
  addr?: string;
  /** Host path of the chronus binary. Default: the one built in this checkout. */
  agentBinary?: string;
  /** Where progress and errors go. Default: stderr. */
  log?: (line: string) => void;
  /**
   * Size in MiB of a zram swap device for paused sandboxes' memory (EdgeOptions.zramSwapMiB).
   * Default none.
   */
  zramSwapMiB?: number;
  /** A user namespace per container sandbox (default true). */
  userNamespaces?: boolean;
  /** Most sandboxes the node admits (EdgeOptions.maxSandboxes). Default `DEFAULT_MAX_SANDBOXES`. */
  maxSandboxes?: number;
  /** Runs microVM sandboxes beside containers (EdgeOptions.microvm). Default off. */
  microvm?: MicrovmBackendConfig;
  /** Runs full-VM sandboxes beside containers (EdgeOptions.vm). Default off. */
  vm?: VmBackendConfig;
  /** Sandbox networking of the node (address pool, static hosts, resolvers). */
  network?: NetworkOptions;
  /** The OCI registry the node keeps its layers in (EdgeOptions.registry). */
  registry?: LayerRegistryConfig;
  /** Registries images may be pulled from (EdgeOptions.pullFrom). */
  pullFrom?: RegistryEndpointConfig[];
  /** The fncall language runtimes: machine-wide cache and the layers built at start (default: none, built when first asked for, in the node's store). */
  calls?: { runtimeCache?: string | undefined; prebuild?: RuntimeLayerId[] | undefined };
  /**
   * How the control plane reaches the in-process edge: directly (`off`, the default) or through
   * the edge wire protocol over a loopback transport (`loopback`: every call, stream and event
   * encoded and decoded, as a remote edge's would be; the end-to-end suite runs once so).
   */
  edgeWire?: EdgeWireMode;
  /**
   * PostgreSQL URL of a state store shared with other replicas (`dsec apiserver --db`). Default
   * none: SQLite at `$home/dsec.db`.
   */
  db?: string;
  /**
   * Nodes on other machines: the node port (`nodeAddr`, mutual TLS with the cluster CA under
   * `<home>/cluster/`) and how long a node may be silent before it is unreachable, then lost.
   * Default: no node port.
   */
  cluster?: ClusterOptions;
}

/** A running platform. */
export interface Platform {
  /** Base URL of the API. */
  url: string;
  /** `https://host:port` of the node port, when there is one. */
  nodeUrl?: string;
  /** `https://host:port` of E2B's HTTPS listener (`e2b.tls`), when configured. */
  e2bTlsUrl?: string;
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

function defaultAgentBinary(): string {
  return path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../chronus/build/chronus');
}

/** Starts apiserver, edge and watcher in this process. */
export async function startPlatform(opts: PlatformOptions = {}): Promise<Platform> {
  const log = opts.log ?? ((line: string) => process.stderr.write(line + '\n'));
  const home = path.resolve(opts.home ?? DEFAULT_HOME);
  const addr = opts.addr ?? DEFAULT_ADDR;
  parseAddr(addr);
  await mkdir(home, { recursive: true, mode: 0o700 });

  const userNamespaces = opts.userNamespaces ?? true;
  const zramSwapMiB = opts.zramSwapMiB;
  const limits = resolveLimits(opts.limits);
  const edge = await Edge.open({
    layerContentBytes: limits.layerUploadBytes,
    home: path.join(home, 'node'),
    agentBinary: opts.agentBinary ?? defaultAgentBinary(),
    userNamespaces,
    ...(opts.microvm ? { microvm: opts.microvm } : {}),
    ...(opts.vm ? { vm: opts.vm } : {}),
    ...(opts.network ? { network: opts.network } : {}),
    ...(opts.registry ? { registry: opts.registry } : {}),
    ...(opts.pullFrom ? { pullFrom: opts.pullFrom } : {}),
    ...(opts.calls ? { calls: fncallRunner({ ...opts.calls, log }) } : {}),
    // One machine-wide cache of built layers: the fncall runtimes' and E2B's `base`.
    ...(opts.calls?.runtimeCache !== undefined ? { machineCacheDir: opts.calls.runtimeCache } : {}),
    ...(zramSwapMiB !== undefined ? { zramSwapMiB } : {}),
    ...(opts.maxSandboxes !== undefined ? { maxSandboxes: opts.maxSandboxes } : {}),
  });
  const closers: Array<() => Promise<void> | void> = [() => edge.close()];
  try {
    const store = opts.db ? await StateStore.openPostgres(opts.db, { log }) : await StateStore.openSqlite(new Database(path.join(home, 'dsec.db')));
    const reached = await edgeThroughWire(edge, opts.edgeWire ?? 'off', { log }).catch(async (err: unknown) => {
      await store.close();
      throw err;
    });
    closers.unshift(() => reached.close());
    const nodes = new NodeRegistry();
    nodes.add(reached.client);
    const startGarbage = edge.lastStartGarbage;
    const startRemoved = startGarbage ? garbageCount(startGarbage) : 0;
    if (startRemoved > 0) log(`dsec: removed ${startRemoved} leftovers of sandboxes a previous run lost (${JSON.stringify(startGarbage)})`);

    let nodePort: NodePort | undefined;
    const cp = await startControlPlane({
      ...opts,
      home,
      addr,
      log,
      store,
      nodes,
      ...(opts.db ? { listenUrl: opts.db } : {}),
      startGarbage: startRemoved,
      prepare: async (services, watch) => {
        const unsubscribe = reached.client.onEvent((ev) => {
          watch.events.ingest(ev);
          // A microVM whose QEMU died: its row becomes lost (the node already removed it).
          services.nodeAdmin.nodeEvent(ev, reached.client.nodeName);
        });
        closers.unshift(() => unsubscribe());
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
        // Nodes on other machines join here; each member is unreachable until its session opens.
        nodePort = await startNodePort(opts.cluster, {
          home,
          certTools: { openssl, makeKey, makeCsr },
          nodes,
          nodeAdmin: services.nodeAdmin,
          ingest: watch.events.ingest,
          log,
        });
      },
    });
    closers.unshift(() => cp.close());
    // The node port closes before the control plane: its sessions use the store.
    const port = nodePort;
    if (port) closers.unshift(() => port.close());

    let closed = false;
    const platform: Platform = {
      url: cp.url,
      ...(port ? { nodeUrl: port.url } : {}),
      ...(cp.e2bTlsUrl ? { e2bTlsUrl: cp.e2bTlsUrl } : {}),
      ...(cp.adminKey ? { adminKey: cp.adminKey } : {}),
      adminKeyFile: cp.adminKeyFile,
      edge,
      services: cp.services,
      watch: cp.watch,
      async close() {
        if (closed) return;
        closed = true;
        for (const c of closers) await c();
      },
      async shutdown() {
        await cp.destroyAll();
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
