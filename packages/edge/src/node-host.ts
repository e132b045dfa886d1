// Preparing the host a node runs on: its state directory, cgroup mode, runtime namespace,
// layer store and cgroups (what every backend is built with), its backends, name and zram swap;
// and the garbage collection across its backends.
import { access, mkdir } from 'node:fs/promises';
import { hostname } from 'node:os';
import path from 'node:path';
import { DsecError, invalidArgument } from '@dsec/protocol';
import type { BackendKind, EventSink, LayerRegistryConfig, NodeGarbageReport, RegistryEndpointConfig } from '@dsec/protocol';
import type { Backend, BackendHost, GarbageOptions } from './backend.js';
import { LaunchServer } from './backends/container/launcher.js';
import { fncallRunner } from './backends/fncall/index.js';
import { defaultBackends } from './backends/index.js';
import type { EdgeOptions, EdgeParts } from './edge-options.js';
import { nodeMarkFor, prepareAgentMount } from './host/agent-mount.js';
import { Cgroups, detectCgroupMode } from './host/cgroups.js';
import { prepareRuntimeNamespace, runDirFor } from './host/runtime-ns.js';
import { ZramSwap } from './host/swap.js';
import { LayerStore } from './layers/index.js';
import { LayerRegistry } from './layers/remote.js';
import { NodeNetwork } from './net/network.js';

/** Longest node name: sandbox ids are `<node>-<16 hex>` and must stay short (crun ids, socket paths). */
const MAX_NODE_NAME = 40;

/** Prepares the host of a node at `home` (made 0700); events of backends go to `raise`. */
export async function prepareHost(opts: {
  home: string;
  agentBinary: string;
  cgroupParent: string;
  raise: EventSink;
  registry?: LayerRegistryConfig | undefined;
  pullFrom?: RegistryEndpointConfig[] | undefined;
  layerContentBytes?: number | undefined;
  machineCacheDir?: string | undefined;
  /** Machine-wide cache of built VM disk images (`vm` layer sources). Default `/var/cache/dsec/vm`. */
  vmImageCache?: string | undefined;
}): Promise<BackendHost> {
  await access(opts.agentBinary).catch(() => {
    throw new DsecError('UNAVAILABLE', `chronus binary not found at ${opts.agentBinary} (run the install step: npm run setup)`);
  });
  await mkdir(opts.home, { recursive: true, mode: 0o700 });
  const mode = await detectCgroupMode();
  const runtimeNs = await prepareRuntimeNamespace(opts.home, mode);
  const layers = new LayerStore({
    root: path.join(opts.home, 'layers'),
    ...(opts.machineCacheDir !== undefined ? { machineCacheDir: opts.machineCacheDir } : {}),
    registry: opts.registry && new LayerRegistry(opts.registry),
    cacheMaxBytes: opts.registry?.cacheMaxBytes,
    pullFrom: opts.pullFrom,
    vmImage: { agentBinary: opts.agentBinary, cacheDir: opts.vmImageCache },
    ...(opts.layerContentBytes !== undefined ? { tarLimits: { maxTotalBytes: opts.layerContentBytes, totalBytesLimit: 'layerUploadBytes' } } : {}),
    lazy: opts.registry?.lazy
      ? {
          lazyfsBinary: path.join(path.dirname(opts.agentBinary), 'dsec-lazyfs'),
          deadlineMs: opts.registry.fetchDeadlineMs,
          readAheadBytes: opts.registry.readAheadBytes,
          chunkCacheMaxBytes: opts.registry.chunkCacheMaxBytes,
          serverIdleMs: opts.registry.lazyServerIdleMs,
          raise: opts.raise,
        }
      : undefined,
  });
  await layers.init();
  const cgroups = new Cgroups(mode, opts.cgroupParent);
  const agentMount = await prepareAgentMount(opts.home, opts.agentBinary);
  return {
    home: opts.home,
    runDir: runDirFor(opts.home),
    runtimeNs,
    layers,
    cgroups,
    agentBinary: opts.agentBinary,
    sandboxAgent: agentMount.agent,
    sandboxMaskDir: agentMount.maskDir,
    nodeMark: nodeMarkFor(opts.home),
    raise: opts.raise,
    launcher: new LaunchServer(path.join(path.dirname(path.resolve(opts.agentBinary)), 'dsec-launch')),
  };
}

/** Builds the node's backends (`opts.backends`, else the defaults configured from `opts`), one per kind. */
export async function openBackends(host: BackendHost, opts: EdgeOptions): Promise<Map<BackendKind, Backend>> {
  const factories =
    opts.backends ??
    defaultBackends(
      {
        ...(opts.outputCapBytes !== undefined ? { outputCapBytes: opts.outputCapBytes } : {}),
        ...(opts.userNamespaces !== undefined ? { userNamespaces: opts.userNamespaces } : {}),
        ...(opts.seccompProfile ? { seccompProfile: opts.seccompProfile } : {}),
      },
      opts.microvm,
      opts.vm,
    );
  const backends = new Map<BackendKind, Backend>();
  for (const factory of factories) {
    const backend = await factory(host);
    if (backends.has(backend.kind)) throw invalidArgument('backends', `${backend.kind} is registered twice`);
    backends.set(backend.kind, backend);
  }
  return backends;
}

/**
 * The node's zram swap: the one an earlier edge set up and left on, or a new one. A zram swap
 * the host configured itself is used as it is (and left alone).
 */
export async function prepareZramSwap(sizeMiB: number): Promise<ZramSwap | undefined> {
  const earlier = await ZramSwap.adopt();
  if (earlier) return earlier;
  if ((await ZramSwap.active()).some((d) => /^\/dev\/zram\d+$/.test(d))) return undefined;
  return ZramSwap.enable({ sizeMiB });
}

/** A node name usable in sandbox ids: lowercase letters, digits and `-`. */
export function nodeNameOf(name: string): string {
  const clean = name
    .toLowerCase()
    .replace(/[^a-z0-9-]/g, '-')
    .replace(/^-+|-+$/g, '')
    .slice(0, MAX_NODE_NAME);
  return clean.length >= 1 ? clean : 'node';
}

/**
 * Makes the parts of a node at `opts.home` (default /var/lib/dsec): the prepared host, its
 * backends, function calls, network and zram swap. Their events go to `raise`.
 */
export async function openParts(opts: EdgeOptions, raise: EventSink): Promise<EdgeParts> {
  const home = path.resolve(opts.home ?? '/var/lib/dsec');
  const host = await prepareHost({
    home,
    agentBinary: opts.agentBinary,
    cgroupParent: opts.cgroupParent ?? 'dsec',
    raise,
    registry: opts.registry,
    pullFrom: opts.pullFrom,
    layerContentBytes: opts.layerContentBytes,
    machineCacheDir: opts.machineCacheDir,
    vmImageCache: opts.vm?.imageCache,
  });
  const backends = await openBackends(host, opts);
  const calls = await (opts.calls ?? fncallRunner())(host);
  const helpers = path.dirname(path.resolve(opts.agentBinary));
  const network = new NodeNetwork(opts.network ?? {}, {
    home,
    nflogBinary: path.join(helpers, 'dsec-nflog'),
    netlinkBinary: path.join(helpers, 'dsec-netlink'),
    raise,
  });
  const swap = opts.zramSwapMiB !== undefined ? await prepareZramSwap(opts.zramSwapMiB) : undefined;
  return {
    home,
    nodeName: nodeNameOf(opts.nodeName ?? hostname()),
    layers: host.layers,
    cgroups: host.cgroups,
    runtimeNs: host.runtimeNs,
    backends: [...backends.values()],
    calls,
    network,
    swap,
    launcher: host.launcher,
    ...(opts.maxSandboxes !== undefined ? { maxSandboxes: opts.maxSandboxes } : {}),
  };
}

/** Collects each backend's garbage (what `opts.keep` does not claim), then the layer mounts nobody uses. */
export async function collectNodeGarbage(
  backends: Iterable<Backend>,
  layers: Pick<LayerStore, 'unmountUnused'>,
  opts: GarbageOptions,
): Promise<NodeGarbageReport> {
  const report: NodeGarbageReport = { containers: [], cgroups: [], processes: 0, mounts: 0, dirs: [], layerMounts: 0 };
  for (const backend of backends) {
    if (!backend.garbage) continue;
    const r = await backend.garbage.collectGarbage(opts);
    report.containers.push(...r.containers);
    report.cgroups.push(...r.cgroups);
    report.processes += r.processes;
    report.mounts += r.mounts;
    report.dirs.push(...r.dirs);
  }
  report.layerMounts = await layers.unmountUnused();
  return report;
}
