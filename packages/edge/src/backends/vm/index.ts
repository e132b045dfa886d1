// The full-VM backend as the node registers it: `vm: {}` in the node's options (or
// `Edge.open({ backends: [vmBackend()] })`). Its images are `disk` layers (`dsec image build
// --vm`, `dsec image import`).
import { chmod, mkdir } from 'node:fs/promises';
import path from 'node:path';
import type { BackendFactory } from '../../backend.js';
import { IdRanges } from '../../host/id-ranges.js';
import { DEFAULT_GUEST_CACHE, prepareGuest } from '../microvm/guest.js';
import { probeAccel } from '../microvm/probe.js';
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
   * Accelerator. Default: the node's accelerator probe's verdict (the microVM backend's: a real
   * boot of a stock Debian kernel under KVM when /dev/kvm opens for QEMU's group, else TCG; its
   * verdict is cached machine-wide, so the probe boots once per kernel, QEMU and host kernel).
   */
  accel?: Accel;
  /** Cache of the probe's guest (kernel, initramfs) and verdicts. Default the microVM backend's, `/var/cache/dsec/microvm`. */
  probeCacheDir?: string;
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
    const qemu = config.qemu ?? 'qemu-system-x86_64';
    const bootTimeoutMs = config.bootTimeoutMs ?? 300_000;
    const accel =
      config.accel ?? (await nodeAccel(host.agentBinary, qemu, config.probeCacheDir ?? DEFAULT_GUEST_CACHE, Math.min(bootTimeoutMs, PROBE_TIMEOUT_MS)));
    return new VmBackend({
      sandboxesDir,
      socketsDir,
      accel,
      ...(accel === 'kvm' ? { kvmGid: await kvmGroup() } : {}),
      qemu,
      layers: host.layers,
      cgroups: host.cgroups,
      // Claims of their own: the container backend's reconcile must not release a VM's range.
      idRanges: new IdRanges(`${host.home}#vm`),
      bootTimeoutMs,
      events: host.raise,
    });
  };
}

/** Longest the probe's boot may take (a KVM that hangs the boot falls back to TCG after it). */
const PROBE_TIMEOUT_MS = 120_000;

/**
 * The node's accelerator, as the microVM backend probes it: its guest (the cloud kernel and an
 * initramfs with chronus, prepared and cached machine-wide) booted once under KVM, TCG when that
 * fails; the verdict is cached. Shared with a microVM backend on the same node (same cache).
 */
async function nodeAccel(agentBinary: string, qemu: string, cacheDir: string, timeoutMs: number): Promise<Accel> {
  const agent = path.resolve(agentBinary);
  const guest = await prepareGuest({ cacheDir, agentBinary: agent });
  const probe = await probeAccel({ qemu, guest, cacheDir, tscHelper: path.join(path.dirname(agent), 'dsec-tsckhz'), timeoutMs });
  return probe.accel;
}
