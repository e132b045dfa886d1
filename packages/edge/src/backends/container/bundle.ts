// Writes the OCI runtime config of a container sandbox: chronus as PID 1 with the agent socket
// inherited as fd 3, Docker-like hardening, and the sandbox's resource limits.
import { statSync } from 'node:fs';
import { DEFAULT_CPU, DEFAULT_MEMORY_MIB, DEFAULT_OPEN_FILES, DEFAULT_PIDS } from '@dsec/protocol';
import type { SandboxSpec } from '@dsec/protocol';
import type { IdRange } from '../../host/id-ranges.js';
import { defaultSeccompProfile } from './seccomp.js';
import type { SeccompProfile } from './seccomp.js';

/** Where chronus appears inside a container (bind-mounted read-only from the host). */
export const AGENT_PATH_IN_SANDBOX = '/.dsec/chronus';
/** CFS period used for CPU quotas. */
const CPU_PERIOD_US = 100_000;

/** Capabilities a container sandbox keeps (Docker's default set less NET_RAW and MKNOD). */
export const DEFAULT_CAPABILITIES = [
  'CAP_CHOWN',
  'CAP_DAC_OVERRIDE',
  'CAP_FSETID',
  'CAP_FOWNER',
  'CAP_SETGID',
  'CAP_SETUID',
  'CAP_SETFCAP',
  'CAP_SETPCAP',
  'CAP_NET_BIND_SERVICE',
  'CAP_SYS_CHROOT',
  'CAP_KILL',
  'CAP_AUDIT_WRITE',
];

/** /proc and /sys paths hidden from sandboxes (runc's and Docker's list plus the kpage files). */
export const MASKED_PATHS = [
  '/proc/acpi',
  '/proc/asound',
  '/proc/kcore',
  '/proc/keys',
  '/proc/latency_stats',
  '/proc/timer_list',
  '/proc/timer_stats',
  '/proc/sched_debug',
  '/proc/scsi',
  '/proc/kpagecgroup',
  '/proc/kpageflags',
  '/proc/kpagecount',
  '/proc/sysrq-trigger',
  '/sys/firmware',
  '/sys/devices/virtual/powercap',
  '/sys/kernel/debug',
  '/sys/fs/cgroup',
];

/** The masked paths as this kernel has them now: see {@link splitMaskedPaths}. */
export interface MaskedPathsSplit {
  /** Directories, each bound read-only from an empty directory. */
  dirs: string[];
  /** Files (crun binds /dev/null over them) and paths this kernel lacks (crun skips them): crun's maskedPaths. */
  others: string[];
}

/**
 * Splits `paths` into directories, bound from an empty directory instead of crun's tmpfs per
 * directory (a superblock, and so a shrinker, per directory per sandbox: see
 * bench/notes/density.md), and the rest, left to crun's maskedPaths. Read at every create (a stat
 * per path): a directory that disappears while the node runs (/proc/asound after rmmod, a
 * powercap zone) must not stay a bind destination, which crun cannot make in procfs or sysfs.
 */
export function splitMaskedPaths(paths: readonly string[]): MaskedPathsSplit {
  const split: MaskedPathsSplit = { dirs: [], others: [] };
  for (const p of paths) (statSync(p, { throwIfNoEntry: false })?.isDirectory() ? split.dirs : split.others).push(p);
  return split;
}

/** /proc paths mounted read-only. */
export const READONLY_PATHS = ['/proc/bus', '/proc/fs', '/proc/irq', '/proc/sys'];

/** Inputs of {@link buildOciConfig}. */
export interface OciConfigOptions {
  id: string;
  spec: SandboxSpec;
  rootfs: string;
  agentBinary: string;
  /**
   * Host path (as crun sees it) of an empty directory bound read-only over masked directories:
   * a folder of the sandbox's writable tmpfs (container sandboxes, each its own) or the node's
   * (`BackendHost.sandboxMaskDir`, call sandboxes).
   */
  maskDir: string;
  /**
   * /dev and /dev/shm are folders of the sandbox's writable tmpfs that dsec-launch binds (container
   * sandboxes: inside `diskMiB`, and no tmpfs of their own); without it they are tmpfs mounts of
   * their own (call sandboxes, whose root has no writable layer).
   */
  writableDev?: boolean;
  cgroupsPath: string;
  outputCapBytes: number;
  /** Hard RLIMIT_NOFILE of the host: a sandbox may not ask for more. */
  hostNofileHard: number;
  /**
   * memory.swappiness of the sandbox's cgroup (cgroup v1 only; omit on v2). 0 keeps a running
   * sandbox out of swap when it reaches its own limit; a pause raises it.
   */
  swappiness?: number;
  /** Host ids of the sandbox's user namespace; without it the sandbox shares the host's ids. */
  idRange?: IdRange;
  /** Replaces the profile built from the spec (tests of the fail-closed path). */
  seccomp?: SeccompProfile;
}

/** Builds the OCI config.json object for one sandbox. */
export function buildOciConfig(o: OciConfigOptions): Record<string, unknown> {
  const r = o.spec.resources ?? {};
  const cpu = r.cpu ?? DEFAULT_CPU;
  const memoryBytes = (r.memoryMiB ?? DEFAULT_MEMORY_MIB) * 1024 * 1024;
  const nofile = Math.min(r.openFiles ?? DEFAULT_OPEN_FILES, o.hostNofileHard);
  const bestEffort = r.cpuClass === 'best-effort';
  const env = Object.entries(o.spec.env ?? {}).map(([k, v]) => `${k}=${v}`);
  const caps = DEFAULT_CAPABILITIES;
  const namespaces: Array<{ type: string }> = [{ type: 'pid' }, { type: 'ipc' }, { type: 'uts' }, { type: 'mount' }, { type: 'network' }, { type: 'cgroup' }];
  const idMappings: Record<string, unknown> = {};
  if (o.idRange) {
    // crun creates the user namespace together with the others, so the network, ipc and pid
    // namespaces it owns let the sandbox mount its own sysfs, mqueue and proc.
    namespaces.push({ type: 'user' });
    idMappings.uidMappings = [{ containerID: 0, hostID: o.idRange.uid, size: o.idRange.size }];
    idMappings.gidMappings = [{ containerID: 0, hostID: o.idRange.gid, size: o.idRange.size }];
  }
  const masked = splitMaskedPaths(MASKED_PATHS);
  const seccomp =
    o.seccomp ??
    defaultSeccompProfile({
      allowPtrace: o.spec.security?.allowPtrace === true,
      ...(o.spec.protect?.denySyscalls ? { extraDenied: o.spec.protect.denySyscalls } : {}),
    });
  return {
    ociVersion: '1.0.2',
    process: {
      terminal: false,
      user: { uid: 0, gid: 0 },
      args: [
        AGENT_PATH_IN_SANDBOX,
        '--listen-fd',
        '3',
        '--output-cap',
        String(o.outputCapBytes),
        '--cpu-class',
        bestEffort ? 'best-effort' : 'latency-sensitive',
        // The agent keeps the node's OOM score (lowering it needs privileges a runtime may not
        // have); its commands get 500, or 1000 in best-effort sandboxes, and die first.
        '--child-oom-score-adj',
        String(bestEffort ? 1000 : 500),
      ],
      env: ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', 'HOME=/root', ...env],
      cwd: '/',
      capabilities: { bounding: caps, effective: caps, permitted: caps },
      rlimits: [{ type: 'RLIMIT_NOFILE', hard: nofile, soft: nofile }],
      noNewPrivileges: true,
    },
    root: { path: o.rootfs, readonly: false },
    hostname: o.spec.hostname ?? 'sandbox',
    mounts: [
      { destination: '/proc', type: 'proc', source: 'proc', options: ['nosuid', 'noexec', 'nodev'] },
      ...(o.writableDev ? [] : [{ destination: '/dev', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'strictatime', 'mode=755', 'size=65536k'] }]),
      { destination: '/dev/pts', type: 'devpts', source: 'devpts', options: ['nosuid', 'noexec', 'newinstance', 'ptmxmode=0666', 'mode=0620'] },
      ...(o.writableDev ? [] : [{ destination: '/dev/shm', type: 'tmpfs', source: 'shm', options: ['nosuid', 'noexec', 'nodev', 'mode=1777', 'size=65536k'] }]),
      // The ipc namespace's own mqueue superblock (the kernel makes it with the namespace).
      { destination: '/dev/mqueue', type: 'mqueue', source: 'mqueue', options: ['nosuid', 'noexec', 'nodev'] },
      { destination: '/sys', type: 'sysfs', source: 'sysfs', options: ['nosuid', 'noexec', 'nodev', 'ro'] },
      ...masked.dirs.map((destination) => ({ destination, type: 'bind', source: o.maskDir, options: ['bind', 'ro', 'nosuid', 'nodev', 'noexec'] })),
      { destination: AGENT_PATH_IN_SANDBOX, type: 'bind', source: o.agentBinary, options: ['bind', 'ro', 'nosuid', 'nodev'] },
    ],
    linux: {
      namespaces,
      ...idMappings,
      cgroupsPath: o.cgroupsPath,
      resources: {
        devices: [{ allow: false, access: 'rwm' }],
        memory: { limit: memoryBytes, swap: memoryBytes, ...(o.swappiness !== undefined ? { swappiness: o.swappiness } : {}) },
        cpu: { shares: bestEffort ? 2 : Math.max(2, Math.round(1024 * cpu)), quota: Math.round(cpu * CPU_PERIOD_US), period: CPU_PERIOD_US },
        pids: { limit: r.pids ?? DEFAULT_PIDS },
      },
      seccomp,
      maskedPaths: masked.others,
      readonlyPaths: READONLY_PATHS,
      rootfsPropagation: 'private',
    },
  };
}
