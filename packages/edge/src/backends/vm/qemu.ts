// QEMU's command line for one full VM (started confined by `../qemu/process.ts`): a q35 machine
// with OVMF's UEFI firmware, the sandbox's qcow2 overlay over the image as an NVMe disk (both
// handed to QEMU as descriptors: the overlay's backing node is given on the command line, so
// QEMU never opens the backing file by its path), a standard VGA display served over VNC on a
// unix socket, a USB tablet for absolute pointer coordinates, and virtio-serial ports for
// chronus and the QEMU guest agent.
import type { Accel } from '../qemu/process.js';
import { QEMU_SANDBOX } from '../qemu/process.js';
import { AGENT_PORTS } from '../microvm/guest.js';

/** OVMF's firmware code (read-only pflash) and the template of its variable store. */
export const OVMF_CODE = '/usr/share/OVMF/OVMF_CODE_4M.fd';
export const OVMF_VARS = '/usr/share/OVMF/OVMF_VARS_4M.fd';

/** Name of the QEMU guest agent's virtio-serial port (what qemu-guest-agent opens). */
export const GUEST_AGENT_PORT = 'org.qemu.guest_agent.0';

/** Descriptors QEMU inherits (3, 4, ... in this order) for firmware and disks. */
export interface VmFds {
  /** OVMF code, O_RDONLY. */
  code: number;
  /** The VM's own copy of the variable store: O_RDONLY and O_RDWR. */
  vars: [number, number];
  /** The shared image (the overlay's backing), O_RDONLY. */
  base: number;
  /** The VM's overlay: O_RDONLY and O_RDWR. */
  overlay: [number, number];
}

/**
 * The root disk's bus: NVMe (the default: firmware and most operating systems boot from it, but
 * QEMU 7.2 cannot migrate it) or virtio-blk (migratable; the guest needs its driver, dsec's
 * desktop image has it in its initramfs).
 */
export type VmDiskBus = 'nvme' | 'virtio-blk';

/** Everything one VM's command line depends on. */
export interface FullVmLaunch {
  accel: Accel;
  memoryMiB: number;
  vcpus: number;
  /** Directory (owned by the VM's uid, 0700) of QMP's, VNC's and the agents' sockets. */
  runDir: string;
  /** The root disk's bus; default NVMe. */
  disk?: VmDiskBus;
  /** A tap device in the network namespace QEMU runs in; absent: no network device. */
  tap?: { ifname: string; mac: string };
}

/** Socket paths inside the VM's run directory. */
export function fullVmSockets(runDir: string): { qmp: string; vnc: string; guestAgent: string; agents: string[] } {
  return {
    qmp: `${runDir}/qmp.sock`,
    vnc: `${runDir}/vnc.sock`,
    guestAgent: `${runDir}/qga.sock`,
    agents: Array.from({ length: AGENT_PORTS }, (_, i) => `${runDir}/agent${i}.sock`),
  };
}

/** The host descriptors in the order {@link fullVmArgs} numbers them. */
export function fullVmFdList(f: VmFds): number[] {
  return [f.code, ...f.vars, f.base, ...f.overlay];
}

/** QEMU's argv (without the binary); descriptors as {@link fullVmFdList} orders them. */
export function fullVmArgs(l: FullVmLaunch): string[] {
  const s = fullVmSockets(l.runDir);
  const args = [
    '-M',
    // No SMM: OVMF's plain build does not need it, and TCG runs faster without.
    'q35,smm=off,vmport=off',
    '-accel',
    // Under TCG a bounded translation cache keeps QEMU's own memory within its cgroup's margin.
    l.accel === 'kvm' ? 'kvm' : 'tcg,tb-size=128',
    '-cpu',
    l.accel === 'kvm' ? 'host' : 'max',
    '-m',
    `${l.memoryMiB}M`,
    '-smp',
    String(l.vcpus),
    '-nodefaults',
    '-no-user-config',
    '-sandbox',
    QEMU_SANDBOX,
    // Descriptor sets: 1 firmware code, 2 variable store, 3 image, 4 overlay.
    '-add-fd',
    'fd=3,set=1',
    '-add-fd',
    'fd=4,set=2',
    '-add-fd',
    'fd=5,set=2',
    '-add-fd',
    'fd=6,set=3',
    '-add-fd',
    'fd=7,set=4',
    '-add-fd',
    'fd=8,set=4',
    '-drive',
    'if=pflash,format=raw,unit=0,readonly=on,file=/dev/fdset/1',
    '-drive',
    // The writable files take no image lock (only this QEMU has them; QEMU 7.2 cannot take the
    // write lock back through an fdset after a completed migration: a fork with memory's source).
    'if=pflash,format=raw,unit=1,file=/dev/fdset/2,file.locking=off',
    '-blockdev',
    'driver=qcow2,node-name=base,read-only=on,file.driver=file,file.filename=/dev/fdset/3,file.read-only=on',
    '-blockdev',
    'driver=qcow2,node-name=root,backing=base,discard=unmap,file.driver=file,file.filename=/dev/fdset/4,file.aio=threads,file.locking=off',
    '-device',
    l.disk === 'virtio-blk' ? 'virtio-blk-pci,drive=root,serial=dsec-root,bootindex=0' : 'nvme,drive=root,serial=dsec-root,bootindex=0',
    // The screen: a standard VGA served over VNC on a unix socket (no TCP), no local window;
    // a USB tablet gives absolute pointer coordinates.
    '-display',
    'none',
    '-device',
    'VGA',
    '-vnc',
    `unix:${s.vnc}`,
    '-device',
    'qemu-xhci,id=usb',
    '-device',
    'usb-tablet,bus=usb.0',
    // The guest console goes to a 64 KiB ring read over QMP (ringbuf-read).
    '-chardev',
    'ringbuf,id=console,size=65536',
    '-serial',
    'chardev:console',
    '-qmp',
    `unix:${s.qmp},server=on,wait=off`,
    '-device',
    'virtio-serial-pci,id=vser,max_ports=8',
    '-chardev',
    `socket,id=qga,path=${s.guestAgent},server=on,wait=off`,
    '-device',
    `virtserialport,chardev=qga,name=${GUEST_AGENT_PORT}`,
  ];
  s.agents.forEach((sock, i) => {
    args.push('-chardev', `socket,id=agent${i},path=${sock},server=on,wait=off`, '-device', `virtserialport,chardev=agent${i},name=dsec.agent${i}`);
  });
  if (l.tap) {
    // No option ROM: the firmware tries no network boot.
    args.push('-netdev', `tap,id=net0,ifname=${l.tap.ifname},script=no,downscript=no`, '-device', `virtio-net-pci,netdev=net0,mac=${l.tap.mac},romfile=`);
  }
  return args;
}
