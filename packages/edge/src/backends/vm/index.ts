// The full-VM backend as the node registers it: `vm: {}` in the node's options (or
// `Edge.open({ backends: [vmBackend()] })`). Its images are `disk` layers (`dsec image build
// --vm`, `dsec image import`).
import { chmod, mkdir } from 'node:fs/promises';
import path from 'node:path';
import type { BackendFactory } from '../../backend.js';
import { IdRanges } from '../../host/id-ranges.js';
import { kvmGroup } from '../qemu/process.js';
import type { Accel } from '../qemu/process.js';
import { VmBackend } from './backend.js';

export { VmBackend, MIN_VM_MEMORY_MIB } from './backend.js';
export { VM_AGENT_LABEL } from '../../layers/store.js';
export { buildVmImage, DEFAULT_VM_CACHE, importDiskImage, VM_IMAGE_PACKAGES } from '../../layers/vm-image.js';
export { fullVmArgs, fullVmSockets, OVMF_CODE, OVMF_VARS, GUEST_AGENT_PORT } from './qemu.js';

/** Options of {@link vmBackend} (the node config's `vm` block). */
export interface VmBackendConfig {
  /** QEMU binary. Default `qemu-system-x86_64`. */
  qemu?: string;
  /** Longest a boot may take (QEMU start to the agent's answer). Default 300 s (TCG on a loaded machine). */
  bootTimeoutMs?: number;
  /**
   * Accelerator. Default `tcg`: KVM only when asked for (a nested KVM that cannot run stock
   * guest kernels hangs the boot instead of failing it).
   */
  accel?: Accel;
  /** Machine-wide cache of built VM disk images (read by the layer store). Default `/var/cache/dsec/vm`. */
  imageCache?: string;
}

/** Full-VM sandboxes. */
export function vmBackend(config: VmBackendConfig = {}): BackendFactory {
  return async (host) => {
    const sandboxesDir = path.join(host.home, 'vm');
    const socketsDir = path.join(host.runDir, 'vm');
    await mkdir(sandboxesDir, { recursive: true, mode: 0o700 });
    await mkdir(socketsDir, { recursive: true });
    // Each VM's uid reaches its own folder (0700) through this one.
    await chmod(socketsDir, 0o711);
    const accel = config.accel ?? 'tcg';
    return new VmBackend({
      sandboxesDir,
      socketsDir,
      accel,
      ...(accel === 'kvm' ? { kvmGid: await kvmGroup() } : {}),
      qemu: config.qemu ?? 'qemu-system-x86_64',
      layers: host.layers,
      cgroups: host.cgroups,
      // Claims of their own: the container backend's reconcile must not release a VM's range.
      idRanges: new IdRanges(`${host.home}#vm`),
      bootTimeoutMs: config.bootTimeoutMs ?? 300_000,
      events: host.raise,
    });
  };
}
