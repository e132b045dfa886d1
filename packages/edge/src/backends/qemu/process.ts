// How a QEMU process of any backend (microVM, full VM) is started confined: in the sandbox's
// cgroup, in a mount namespace of its own, as the sandbox's unprivileged host uid with no
// capabilities, under QEMU's own seccomp sandbox. Disks reach QEMU as open file descriptors
// (`-add-fd`), so QEMU opens no host file it was not handed.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { stat } from 'node:fs/promises';

/** QEMU's seccomp sandbox as the issue asks for it. */
export const QEMU_SANDBOX = 'on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny';

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

/** The host descriptors QEMU inherits as 3, 4, ... (the disks' in order). */
export function diskFds(disks: readonly VmDisk[]): number[] {
  return disks.flatMap((d) => d.fds);
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
