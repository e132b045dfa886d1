// The microVM backend as the node registers it: `Edge.open({ backends: [microvmBackend()] })`,
// or `microvm: {}` in the node's options. Opening prepares the guest (kernel download and
// initramfs build, both cached machine-wide) and probes the accelerator with a real boot.
import { mkdir, chmod } from 'node:fs/promises';
import path from 'node:path';
import type { BackendFactory } from '../../backend.js';
import { IdRanges } from '../../host/id-ranges.js';
import { DEFAULT_OUTPUT_CAP_BYTES } from '../container/backend.js';
import { MicrovmBackend } from './backend.js';
import { DEFAULT_GUEST_CACHE, prepareGuest } from './guest.js';
import { probeAccel } from './probe.js';
import { kvmGroup } from '../qemu/process.js';
import type { AccelProbe } from './probe.js';

export { MicrovmBackend, MIN_GUEST_MEMORY_MIB } from './backend.js';
export { cpioNewc, DEFAULT_GUEST_CACHE, GUEST_INIT, moduleOrder, prepareGuest } from './guest.js';
export type { GuestImage, GuestKernel } from './guest.js';
export { probeAccel, bootOnce } from './probe.js';
export type { AccelProbe } from './probe.js';
export { QmpClient } from '../qemu/qmp.js';
export { collectOutput, FREEZE_GUARD_S, GUEST_STEP_TIMEOUT_MS, runGuestStep } from '../qemu/guest-steps.js';
export type { GuestStep } from '../qemu/guest-steps.js';
export { qemuArgs } from './qemu.js';
export { QEMU_SANDBOX } from '../qemu/process.js';

/** Options of {@link microvmBackend} (the node config's `microvm` block). */
export interface MicrovmBackendConfig {
  /** Cache of guest kernels, initramfs images and probe verdicts. Default {@link DEFAULT_GUEST_CACHE}. */
  cacheDir?: string;
  /** Debian kernel package. Default `linux-image-cloud-amd64`. */
  kernelPackage?: string;
  /** QEMU binary. Default `qemu-system-x86_64`. */
  qemu?: string;
  /** Longest a boot may take (probe and create). Default 120 s (TCG on a loaded machine). */
  bootTimeoutMs?: number;
  /** Never use KVM. */
  noKvm?: boolean;
  /** Bytes of output chronus keeps per stream. */
  outputCapBytes?: number;
}

/** MicroVM sandboxes; the probe's verdict is on the backend (`accelProbe`). */
export function microvmBackend(config: MicrovmBackendConfig = {}): BackendFactory {
  return async (host) => {
    const cacheDir = config.cacheDir ?? DEFAULT_GUEST_CACHE;
    const agentBinary = path.resolve(host.agentBinary);
    const qemu = config.qemu ?? 'qemu-system-x86_64';
    const bootTimeoutMs = config.bootTimeoutMs ?? 120_000;
    const guest = await prepareGuest({ cacheDir, agentBinary, ...(config.kernelPackage ? { kernelPackage: config.kernelPackage } : {}) });
    const probe: AccelProbe = await probeAccel({
      qemu,
      guest,
      cacheDir,
      tscHelper: path.join(path.dirname(agentBinary), 'dsec-tsckhz'),
      timeoutMs: bootTimeoutMs,
      ...(config.noKvm ? { noKvm: true } : {}),
    });
    const sandboxesDir = path.join(host.home, 'microvm');
    const socketsDir = path.join(host.runDir, 'microvm');
    await mkdir(sandboxesDir, { recursive: true, mode: 0o700 });
    await mkdir(socketsDir, { recursive: true });
    // Each VM's uid reaches its own folder (0700) through this one.
    await chmod(socketsDir, 0o711);
    return new MicrovmBackend({
      sandboxesDir,
      socketsDir,
      guest,
      accel: probe.accel,
      ...(probe.accel === 'kvm' ? { kvmGid: await kvmGroup() } : {}),
      bootMs: probe.bootMs,
      accelCmdline: probe.cmdline,
      qemu,
      layers: host.layers,
      cgroups: host.cgroups,
      // Claims of their own: the container backend's reconcile must not release a VM's range.
      idRanges: new IdRanges(`${host.home}#microvm`),
      outputCapBytes: config.outputCapBytes ?? DEFAULT_OUTPUT_CAP_BYTES,
      bootTimeoutMs,
      events: host.raise,
    });
  };
}
