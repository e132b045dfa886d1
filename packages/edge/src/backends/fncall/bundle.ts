// The OCI config of a function-call sandbox: the container backend's hardening (capabilities,
// seccomp, masked paths, no network, cgroup limits) with a read-only root and fresh tmpfs mounts
// for /tmp and the working directory.
import type { SandboxSpec } from '@dsec/protocol';
import type { IdRange } from '../../host/id-ranges.js';
import { buildOciConfig } from '../container/bundle.js';

/** Working directory of every call (a fresh tmpfs). */
export const CALL_WORKDIR = '/work';
/** The user calls run as (no capabilities once chronus drops root for them). */
export const CALL_UID = 65534;
/** Size limit of each of /tmp and /work; their pages also count toward the memory limit. */
export const CALL_TMPFS_MIB = 512;
/** Process (and thread) limit of one call: stops fork bombs. */
export const CALL_PIDS = 128;
/** Open-file limit of one call. */
export const CALL_OPEN_FILES = 1024;

/** Inputs of {@link buildFnCallConfig}. */
export interface FnCallConfigOptions {
  id: string;
  rootfs: string;
  agentBinary: string;
  maskDir: string;
  cgroupsPath: string;
  memoryMiB: number;
  outputCapBytes: number;
  hostNofileHard: number;
  /** Host ids of the sandbox's user namespace. */
  idRange: IdRange;
}

/** Builds config.json for one function-call sandbox. */
export function buildFnCallConfig(o: FnCallConfigOptions): Record<string, unknown> {
  const spec: SandboxSpec = {
    backend: 'fncall',
    image: { base: 'unused' },
    resources: { cpu: 1, memoryMiB: o.memoryMiB, pids: CALL_PIDS, openFiles: CALL_OPEN_FILES },
    hostname: 'fncall',
  };
  const config = buildOciConfig({
    id: o.id,
    spec,
    rootfs: o.rootfs,
    agentBinary: o.agentBinary,
    maskDir: o.maskDir,
    cgroupsPath: o.cgroupsPath,
    outputCapBytes: o.outputCapBytes,
    hostNofileHard: o.hostNofileHard,
    idRange: o.idRange,
  });
  config.root = { path: o.rootfs, readonly: true };
  const tmpfs = (destination: string, mode: string): Record<string, unknown> => ({
    destination,
    type: 'tmpfs',
    source: 'tmpfs',
    options: ['nosuid', 'nodev', `mode=${mode}`, `size=${CALL_TMPFS_MIB}m`, 'nr_inodes=65536', `uid=${CALL_UID}`, `gid=${CALL_UID}`],
  });
  (config.mounts as unknown[]).push(tmpfs('/tmp', '1777'), tmpfs(CALL_WORKDIR, '0755'));
  return config;
}

/** A writable tmpfs of a call sandbox, as the reset between two calls mounts it afresh. */
export interface FreshTmpfs {
  path: string;
  /** Mount flags (`nosuid`, `nodev`, `noexec`). */
  flags: string[];
  /** tmpfs options (`mode=`, `size=`, `nr_inodes=`, `uid=`, `gid=`). */
  data: string[];
}

const MOUNT_FLAG_WORDS = new Set(['nosuid', 'nodev', 'noexec']);

/**
 * Every tmpfs of a call sandbox's config a call can write to (all but `/dev`, whose device nodes
 * only root may change), with the options crun mounted it with: the reset replaces each by a
 * fresh one with the same options, so a reused sandbox's tmpfs mounts equal a new sandbox's.
 */
export function writableTmpfsMounts(config: Record<string, unknown>): FreshTmpfs[] {
  const mounts = config.mounts as Array<{ destination: string; type?: string; options?: string[] }>;
  return mounts
    .filter((m) => m.type === 'tmpfs' && m.destination !== '/dev' && !(m.options ?? []).includes('ro'))
    .map((m) => ({
      path: m.destination,
      flags: (m.options ?? []).filter((o) => MOUNT_FLAG_WORDS.has(o)),
      data: (m.options ?? []).filter((o) => !MOUNT_FLAG_WORDS.has(o)),
    }));
}
