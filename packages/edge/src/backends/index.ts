// The backends a node runs unless its opener names others. A new backend is a folder beside
// `container/` (same file names) and one line here.
import type { BackendFactory } from '../backend.js';
import { containerBackend } from './container/index.js';
import type { ContainerBackendConfig } from './container/index.js';
import { microvmBackend } from './microvm/index.js';
import type { MicrovmBackendConfig } from './microvm/index.js';
import { vmBackend } from './vm/index.js';
import type { VmBackendConfig } from './vm/index.js';

/** The default backends of a node, configured from the node's options (microVMs and VMs only when configured). */
export function defaultBackends(config: ContainerBackendConfig = {}, microvm?: MicrovmBackendConfig, vm?: VmBackendConfig): BackendFactory[] {
  // The vm backend reads the node's accelerator from the microVM backend's probe (one cache).
  const vmProbe = microvm?.cacheDir && vm && !vm.probeCacheDir ? { probeCacheDir: microvm.cacheDir } : {};
  return [containerBackend(config), ...(microvm ? [microvmBackend(microvm)] : []), ...(vm ? [vmBackend({ ...vm, ...vmProbe })] : [])];
}
