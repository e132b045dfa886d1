// QEMU's command line for one microVM and how it is started confined: in the sandbox's cgroup,
// in a mount namespace of its own, as the sandbox's unprivileged host uid with no capabilities,
// under QEMU's own seccomp sandbox. Disks reach QEMU as open file descriptors (`-add-fd`), so
// QEMU opens no host file but the kernel, the initramfs and its own sockets.
import { spawn } from 'node:child_process';
import { stat } from 'node:fs/promises';
import type { ChildProcess } from 'node:child_process';
import { AGENT_PORTS } from './guest.js';

/** QEMU's seccomp sandbox as the issue asks for it. */
export const QEMU_SANDBOX = 'on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny';
/** The guest kernel's fixed arguments. */
export const GUEST_CMDLINE = 'console=ttyS0 panic=-1 quiet loglevel=3 i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd';

export type Accel = 'kvm' | 'tcg';

/** A read-only or writable disk handed to QEMU as a descriptor. */
export interface VmDisk {
  /** Serial the guest's init finds it by (`m0`, `b0`, ..., `rw`). */
  serial: string;
  /**
   * Host descriptors of the file, one per access mode QEMU may open it with (a writable disk is
   * opened read-only first: it gets an O_RDONLY and an O_RDWR one).
   */
  fds: number[];
  readOnly: boolean;
}

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

/** The host descriptors QEMU inherits as 3, 4, ... (the disks' in order). */
export function diskFds(disks: readonly VmDisk[]): number[] {
  return disks.flatMap((d) => d.fds);
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
    l.accel,
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
  ];
  s.agents.forEach((sock, i) => {
    args.push('-chardev', `socket,id=agent${i},path=${sock},server=on,wait=off`, '-device', `virtserialport,chardev=agent${i},name=dsec.agent${i}`);
  });
  let next = 3;
  l.disks.forEach((d, i) => {
    const set = i + 1;
    for (const _ of d.fds) args.push('-add-fd', `fd=${next++},set=${set}`);
    args.push(
      '-drive',
      `id=${d.serial},file=/dev/fdset/${set},format=raw,if=none,${d.readOnly ? 'readonly=on' : 'discard=unmap'},cache=none,aio=threads`,
      '-device',
      `virtio-blk-device,drive=${d.serial},serial=${d.serial}`,
    );
  });
  if (l.tap) {
    args.push('-netdev', `tap,id=net0,ifname=${l.tap.ifname},script=no,downscript=no`, '-device', `virtio-net-device,netdev=net0,mac=${l.tap.mac}`);
  }
  return args;
}

/**
 * The supplementary group that opens /dev/kvm for an unprivileged QEMU: the device's group when
 * it grants read and write (Debian's `kvm` group, mode 0660), else undefined (KVM unusable).
 */
export async function kvmGroup(): Promise<number | undefined> {
  const st = await stat('/dev/kvm').catch(() => undefined);
  if (!st || (st.mode & 0o060) !== 0o060) return undefined;
  return st.gid;
}

/** How QEMU is confined. */
export interface Confinement {
  uid: number;
  gid: number;
  /** `cgroup.procs` files the process joins before QEMU starts. */
  cgroupProcs: string[];
  /** Supplementary groups (the group of /dev/kvm under KVM); default none. */
  groups?: number[];
  /** A network namespace to enter (`/proc/PID/ns/net` or a bind mount), absent: the host's. */
  netns?: string;
}

/**
 * Starts QEMU: a shell writes its own pid into the sandbox's cgroups, then `nsenter` (network),
 * `unshare` (a private mount namespace) and `setpriv` (the sandbox's uid and gid, no
 * supplementary groups, no capabilities, no new privileges) exec QEMU in place.
 */
export function startQemu(qemu: string, args: string[], c: Confinement, fds: number[], stderrFd: number): ChildProcess {
  const chain: string[] = [];
  if (c.netns) chain.push('nsenter', `--net=${c.netns}`, '--');
  chain.push('unshare', '--mount', '--propagation', 'private', '--');
  if (c.netns) {
    // The host's /dev/net/tun is root's (0600): in QEMU's own mount namespace a tun node of the
    // VM's uid is put in its place, so QEMU can open the tap made for it and nothing else changes.
    const tun = `mount -t tmpfs -o size=4k,mode=0755 dsec-tun /dev/net && mknod -m 0600 /dev/net/tun c 10 200 && chown ${c.uid}:${c.gid} /dev/net/tun && exec "$@"`;
    chain.push('/bin/sh', '-c', tun, 'dsec-tun');
  }
  chain.push(
    'setpriv',
    `--reuid=${c.uid}`,
    `--regid=${c.gid}`,
    ...(c.groups?.length ? [`--groups=${c.groups.join(',')}`] : ['--clear-groups']),
    '--no-new-privs',
    '--inh-caps=-all',
    '--bounding-set=-all',
    '--',
    qemu,
    ...args,
  );
  const script = 'for f; do [ "$f" = -- ] && break; echo $$ > "$f" || exit 125; done; shift $(($# - N)); exec "$@"';
  const argv = ['-c', script.replace('N', String(chain.length)), 'dsec-qemu', ...c.cgroupProcs, '--', ...chain];
  return spawn('/bin/sh', argv, { stdio: ['ignore', 'ignore', stderrFd, ...fds], detached: true });
}
