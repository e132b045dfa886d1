// The container backend as the node registers it: `Edge.open({ backends: [containerBackend()] })`.
import { chmod, mkdir } from 'node:fs/promises';
import path from 'node:path';
import type { SandboxSpec } from '@dsec/protocol';
import type { BackendFactory } from '../../backend.js';
import { IdRanges } from '../../host/id-ranges.js';
import { ContainerBackend } from './backend.js';
import type { SeccompProfile } from './seccomp.js';

/** Options of {@link containerBackend}. */
export interface ContainerBackendConfig {
  /** Bytes of output chronus keeps per stream. Default `DEFAULT_OUTPUT_CAP_BYTES`. */
  outputCapBytes?: number;
  /**
   * Runs each sandbox in a user namespace of its own (root inside is an unprivileged host uid
   * from a range of 65,536 ids). Default true.
   */
  userNamespaces?: boolean;
  /** Replaces the default seccomp profile (tests of the fail-closed path). */
  seccompProfile?: (spec: SandboxSpec) => SeccompProfile;
}

/** Container sandboxes (crun on an overlay of EROFS layers, chronus as PID 1) on the node's host state. */
export function containerBackend(config: ContainerBackendConfig = {}): BackendFactory {
  return async (host) => {
    const sandboxesDir = path.join(host.home, 'sandboxes');
    const crunRoot = path.join(host.runDir, 'crun');
    const writableDir = path.join(host.runDir, 'rw');
    const rootsDir = path.join(host.runDir, 'roots');
    for (const dir of [sandboxesDir, crunRoot, writableDir, rootsDir]) await mkdir(dir, { recursive: true });
    // Reachable by a user-namespaced sandbox's root, who sets up its root mount (the rest stays 0700).
    await chmod(rootsDir, 0o711);
    return new ContainerBackend({
      events: host.raise,
      sandboxesDir,
      crunRoot,
      runtimePrefix: host.runtimeNs.prefix,
      runtimeNsFile: host.runtimeNs.nsFile,
      writableDir,
      rootsDir,
      launcher: host.launcher,
      nodeMark: host.nodeMark,
      layers: host.layers,
      cgroups: host.cgroups,
      agentBinary: host.sandboxAgent,
      ...(config.outputCapBytes !== undefined ? { outputCapBytes: config.outputCapBytes } : {}),
      ...(config.userNamespaces !== false ? { idRanges: new IdRanges(host.home) } : {}),
      ...(config.seccompProfile ? { seccompProfile: config.seccompProfile } : {}),
    });
  };
}
