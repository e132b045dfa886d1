// The fncall runner as the node registers it: `Edge.open({ calls: fncallRunner() })`.
import { chmod, mkdir } from 'node:fs/promises';
import path from 'node:path';
import type { EdgeCalls } from '@dsec/protocol';
import type { BackendHost } from '../../backend.js';
import { IdRanges } from '../../host/id-ranges.js';
import { FnCallRunner } from './runner.js';
import type { WarmPoolOptions } from './pool.js';
import type { RuntimeLayerId } from './runtimes.js';

/** The node's function calls, with what it does when the node closes. */
export interface CallRunner extends EdgeCalls {
  /** Drains its pools; calls keep no state, so nothing of them outlives the node's process. */
  close(): Promise<void>;
}

/** Builds the node's call runner once its host state exists. */
export type CallRunnerFactory = (host: BackendHost) => Promise<CallRunner>;

/** Options of {@link fncallRunner}. */
export interface FnCallRunnerConfig {
  /** Sizing of each warm pool. */
  pool?: WarmPoolOptions;
  /** Machine-wide cache directory of the Debian runtime layers; none: built into the node's store only. */
  runtimeCache?: string | undefined;
  /** Runtime layers (`python`, `node`, `gcc`, `go`, `java`) built in the background from the start, in this order. */
  prebuild?: readonly RuntimeLayerId[] | undefined;
  /** Progress of runtime builds. */
  log?: ((line: string) => void) | undefined;
  /** Reuse a sandbox for further calls after a complete reset (docs/fncall.md). Default true; false: one sandbox per call. */
  reuse?: boolean | undefined;
}

/** Stateless calls on pools of single-use container sandboxes (what a previous process left is removed). */
export function fncallRunner(config: FnCallRunnerConfig = {}): CallRunnerFactory {
  return async (host) => {
    const crunRoot = path.join(host.runDir, 'crun');
    await mkdir(crunRoot, { recursive: true });
    const rootsDir = path.join(host.runDir, 'fncall-roots');
    await mkdir(rootsDir, { recursive: true });
    await chmod(rootsDir, 0o711);
    const runner = new FnCallRunner({
      dir: path.join(host.home, 'fncall'),
      crunRoot,
      runtimePrefix: host.runtimeNs.prefix,
      layers: host.layers,
      cgroups: host.cgroups,
      agentBinary: host.sandboxAgent,
      maskDir: host.sandboxMaskDir,
      launcher: host.launcher,
      resetBinary: config.reuse === false ? undefined : path.join(path.dirname(path.resolve(host.agentBinary)), 'dsec-fnreset'),
      runtimeNsFile: host.runtimeNs.nsFile,
      rootsDir,
      idRanges: new IdRanges(`${host.home}#fncall`),
      nodeMark: host.nodeMark,
      ...(config.pool ? { pool: config.pool } : {}),
      runtimeCache: config.runtimeCache,
      prebuild: config.prebuild,
      log: config.log,
    });
    await runner.init();
    return runner;
  };
}
