// What a node is opened with, what it is made of, and the results of its own calls.
import type { EdgeExecOptions, LayerRegistryConfig, RegistryEndpointConfig, SandboxSpec } from '@dsec/protocol';
import type { Backend, BackendFactory, BackendPauseResult, BackendResumeResult } from './backend.js';
import type { LaunchServer } from './backends/container/launcher.js';
import type { SeccompProfile } from './backends/container/seccomp.js';
import type { MicrovmBackendConfig } from './backends/microvm/index.js';
import type { VmBackendConfig } from './backends/vm/index.js';
import type { CallRunner, CallRunnerFactory } from './backends/fncall/index.js';
import type { Cgroups } from './host/cgroups.js';
import type { RuntimeNamespace } from './host/runtime-ns.js';
import type { ZramSwap } from './host/swap.js';
import type { LayerStore } from './layers/index.js';
import type { NetworkOptions, NodeNetwork } from './net/network.js';

/** Default admission limit of a node (DSec runs up to 3,200 containers per node). */
export const DEFAULT_MAX_SANDBOXES = 4000;

/** Options of {@link Edge.open}. */
export interface EdgeOptions {
  /** State directory (layers, sandboxes). Default `/var/lib/dsec`. */
  home?: string;
  /** Host path of the static chronus binary. */
  agentBinary: string;
  /** Name of this node, encoded in sandbox ids. Default: the host name. */
  nodeName?: string;
  /** Bytes of output chronus keeps per stream (the default container backend). */
  outputCapBytes?: number;
  /** cgroup parent of the node's sandboxes. Default `dsec`. */
  cgroupParent?: string;
  /** Most sandboxes this node admits. Default {@link DEFAULT_MAX_SANDBOXES}. */
  maxSandboxes?: number;
  /**
   * Size in MiB of a zram swap device that paused sandboxes' memory is compressed into (see
   * host/swap.ts). Default none: a pause then drops only page cache. `shutdown` removes it;
   * `close` leaves it for the paused sandboxes that survive the edge.
   */
  zramSwapMiB?: number;
  /** Sandbox networking: address pool, static hosts, resolvers, proxy limits. */
  network?: NetworkOptions;
  /** The OCI registry the node pushes its layers to and pulls missing ones from. Default none. */
  registry?: LayerRegistryConfig;
  /** Registries images may be pulled from (`dsec image pull`). Default none. */
  pullFrom?: RegistryEndpointConfig[];
  /**
   * Runs each container sandbox in a user namespace of its own (root inside is an unprivileged
   * host uid from a range of 65,536 ids). Default true (the default container backend).
   */
  userNamespaces?: boolean;
  /** Replaces the containers' default seccomp profile (tests of the fail-closed path). */
  seccompProfile?: (spec: SandboxSpec) => SeccompProfile;
  /** Interval of the scan of every sandbox's OOM and pids-limit counters. Default `DEFAULT_COUNTER_SCAN_MS`; 0 turns it off. */
  counterScanMs?: number;
  /**
   * The backends this node runs, built once the host is prepared. Default `defaultBackends()`
   * configured from `outputCapBytes`, `userNamespaces` and `seccompProfile`.
   */
  backends?: BackendFactory[];
  /** Runs the microVM backend beside containers (its guest is prepared and probed at open). Default off. */
  microvm?: MicrovmBackendConfig;
  /** Runs the full-VM backend beside containers (and lets the layer store build VM images). Default off. */
  vm?: VmBackendConfig;
  /** The node's function calls. Default `fncallRunner()`. */
  calls?: CallRunnerFactory;
  /**
   * Decompressed bytes one uploaded or imported layer may hold (the tenant limit
   * `layerUploadBytes`; staged under `home`, never the system temp dir). Default the tar
   * extractor's `DEFAULT_TAR_LIMITS.maxTotalBytes`.
   */
  layerContentBytes?: number;
  /** The machine-wide cache of built layers (layers/machine-cache.ts), e.g. `node.calls.runtimeCache`. Default none. */
  machineCacheDir?: string | undefined;
}

/** The parts an {@link Edge} is made of. */
export interface EdgeParts {
  home: string;
  nodeName: string;
  layers: LayerStore;
  cgroups: Cgroups;
  runtimeNs: Pick<RuntimeNamespace, 'destroy'>;
  /** One per kind. */
  backends: Backend[];
  calls: CallRunner;
  network: NodeNetwork;
  swap?: ZramSwap | undefined;
  /** The launch server the backends and calls share (`BackendHost.launcher`), closed after them. */
  launcher?: Pick<LaunchServer, 'close'> | undefined;
  /** Default {@link DEFAULT_MAX_SANDBOXES}. */
  maxSandboxes?: number;
  /** Whether the security monitor reads the kernel log (default true). */
  kernelLog?: boolean;
}

/** What a pause did. */
export interface PauseResult extends BackendPauseResult {
  durationMs: number;
}

/** What a resume did. */
export interface ResumeResult extends BackendResumeResult {
  durationMs: number;
}

/** Options of {@link Edge.exec}. */
export type ExecOptions = EdgeExecOptions;
