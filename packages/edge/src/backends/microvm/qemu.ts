// QEMU's command line for one microVM (started confined by `../qemu/process.ts`). Disks reach
// QEMU as open file descriptors (`-add-fd`), so QEMU opens no host file but the kernel, the
// initramfs and its own sockets.
import type { Accel, VmDisk } from '../qemu/process.js';
import { QEMU_SANDBOX } from '../qemu/process.js';
import { AGENT_PORTS } from './guest.js';

/** The guest kernel's fixed arguments. */
export const GUEST_CMDLINE = 'console=ttyS0 panic=-1 quiet loglevel=3 i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd';

/** TCG's translated-code buffer, MiB (inside the VM's QEMU_OVERHEAD_MIB). */
export const TCG_TB_MIB = 32;

/** Everything one microVM's command line depends on. */
export interface VmLaunch {
  qemu: string;
  accel: Accel;
  kernel: string;
  initramfs: string;
  /** Extra kernel arguments (`dsec.layers=N`, `tsc_early_khz=...`). */
  cmdline: string[];
  memoryMiB: number;
  vcpus: number;
  disks: VmDisk[];
  /** Directory (owned by the VM's uid, 0700) of QMP's and the agent's sockets. */
  runDir: string;
  /** A tap device in the network namespace QEMU runs in; absent: no network device. */
  tap?: { ifname: string; mac: string };
}

/** Socket paths inside the VM's run directory. */
export function vmSockets(runDir: string): { qmp: string; agents: string[] } {
  return {
    qmp: `${runDir}/qmp.sock`,
    agents: Array.from({ length: AGENT_PORTS }, (_, i) => `${runDir}/agent${i}.sock`),
  };
}

/** QEMU's argv (without the binary), disks as `/dev/fdset/N` of descriptors 3, 4, ... in order ({@link diskFds}). */
export function qemuArgs(l: VmLaunch): string[] {
  const s = vmSockets(l.runDir);
  // Under TCG the microvm machine needs the legacy PIT and PIC for a timer (no kvmclock).
  const machine = l.accel === 'kvm' ? 'microvm,x-option-roms=off,rtc=on' : 'microvm,x-option-roms=off,rtc=on,pit=on,pic=on';
  const args = [
    '-M',
    machine,
    '-accel',
    // TCG's translated-code buffer is anonymous memory QEMU fills as the guest runs new code
    // (1 GiB by default in QEMU 7.2): bounded, so that guest RAM plus QEMU_OVERHEAD_MIB holds
    // (a guest using its memoryMiB got its QEMU killed by the cgroup without it).
    l.accel === 'kvm' ? 'kvm' : `tcg,tb-size=${TCG_TB_MIB}`,
    '-cpu',
    l.accel === 'kvm' ? 'host' : 'max',
    '-m',
    `${l.memoryMiB}M`,
    '-smp',
    String(l.vcpus),
    '-nodefaults',
    '-no-user-config',
    '-nographic',
    '-display',
    'none',
    '-no-reboot',
    '-sandbox',
    QEMU_SANDBOX,
    '-kernel',
    l.kernel,
    '-initrd',
    l.initramfs,
    '-append',
    [GUEST_CMDLINE, ...l.cmdline].join(' '),
    // The guest console goes to a 64 KiB ring read over QMP (ringbuf-read): a guest writing to
    // its console fills no host disk.
    '-chardev',
    'ringbuf,id=console,size=65536',
    '-serial',
    'chardev:console',
    '-qmp',
    `unix:${s.qmp},server=on,wait=off`,
    '-device',
    'virtio-serial-device,max_ports=8',
    // Free page reporting: the guest's balloon driver (virtio_balloon, in the initramfs) reports
    // free 2 MiB blocks and QEMU discards them, so memory a guest touched and freed goes back to
    // the host (an idle microVM's RSS falls back, measured in docs/backends.md). No inflation: the
    // guest keeps its whole memoryMiB.
    '-device',
    'virtio-balloon-device,free-page-reporting=on',
  ];
  s.agents.forEach((sock, i) => {
    args.push('-chardev', `socket,id=agent${i},path=${sock},server=on,wait=off`, '-device', `virtserialport,chardev=agent${i},name=dsec.agent${i}`);
  });
  let next = 3;
  // The writable disk takes no image lock: only this QEMU ever has it, and QEMU 7.2 cannot take
  // its write lock back through an fdset after a completed migration (inactive, then `cont`:
  // "Failed to get write lock"), which a fork with memory does to its running source.
  l.disks.forEach((d, i) => {
    const set = i + 1;
    for (const _ of d.fds) args.push('-add-fd', `fd=${next++},set=${set}`);
    args.push(
      '-drive',
      `id=${d.serial},file=/dev/fdset/${set},format=raw,if=none,${d.readOnly ? 'readonly=on' : 'discard=unmap,file.locking=off'},cache=none,aio=threads`,
      '-device',
      `virtio-blk-device,drive=${d.serial},serial=${d.serial}`,
    );
  });
  if (l.tap) {
    args.push('-netdev', `tap,id=net0,ifname=${l.tap.ifname},script=no,downscript=no`, '-device', `virtio-net-device,netdev=net0,mac=${l.tap.mac}`);
  }
  return args;
}
