// The interface every isolation backend implements (fncall, container, microvm, vm).
import type { BackendKind, LayerInfo, SandboxClaim, SandboxSpec, SandboxStats } from '@dsec/protocol';
import type { AgentExit, AgentInfo, AgentProcess, Attachment, SpawnOptions } from './chronus/client.js';
import type { FileStat } from '@dsec/protocol';
import type { IdRange } from './host/id-ranges.js';

/**
 * The in-sandbox agent as edge uses it. chronus implements it over a unix socket (containers)
 * or a virtio-serial port (microVMs); a full VM implements it over the QEMU guest agent.
 */
export interface SandboxAgent {
  ping(): Promise<AgentInfo>;
  spawn(opts: SpawnOptions): Promise<Attachment>;
  attach(proc: number, from?: { stdout?: number; stderr?: number }): Promise<Attachment>;
  wait(proc: number, signal?: AbortSignal): Promise<AgentExit>;
  signal(proc: number, sig: string | number, group?: boolean): Promise<void>;
  writeStdin(proc: number, data: Uint8Array | string, eof?: boolean): Promise<void>;
  resize(proc: number, rows: number, cols: number): Promise<void>;
  list(): Promise<AgentProcess[]>;
  release(proc: number): Promise<void>;
  stat(path: string, opts?: { followSymlinks?: boolean }): Promise<FileStat>;
  readFile(path: string, opts?: { offset?: number; length?: number; maxBytes?: number }): Promise<Buffer>;
  writeFile(path: string, data: Uint8Array | string, opts?: { mode?: number; uid?: number; gid?: number; append?: boolean }): Promise<void>;
  listDir(path: string): Promise<FileStat[]>;
  mkdir(path: string, opts?: { parents?: boolean; mode?: number; uid?: number; gid?: number }): Promise<void>;
  remove(path: string, opts?: { recursive?: boolean }): Promise<void>;
  rename(from: string, to: string): Promise<void>;
  symlink(path: string, target: string): Promise<void>;
  statfs(path: string): Promise<{ totalBytes: number; freeBytes: number; files: number; freeFiles: number }>;
  readonly connected: boolean;
  close(): void;
}

/** What a backend is asked to create: a validated spec with its layers resolved. */
export interface BackendCreateRequest {
  id: string;
  spec: SandboxSpec;
  /** Layers bottom first: base, workspace, toolkits in the order given. */
  layers: LayerInfo[];
}

/** A sandbox as a backend knows it; persisted so a restarted edge can find it again. */
export interface BackendSandbox {
  id: string;
  backend: BackendKind;
  spec: SandboxSpec;
  layers: LayerInfo[];
  createdAt: string;
  /** Host ids that ids 0..size-1 inside map to, when the sandbox has a user namespace. */
  idRange?: IdRange;
  /** Set by `recover` for a sandbox that was paused when the edge stopped (never persisted). */
  paused?: boolean;
}

/** What pausing a sandbox did to its memory. */
export interface BackendPauseResult {
  /** Memory charged to the sandbox before and after the reclaim. */
  memoryBeforeBytes: number;
  memoryAfterBytes: number;
  /** The sandbox's memory in swap afterwards (0 without swap). */
  swapBytes: number;
}

/** What resuming a sandbox did. */
export interface BackendResumeResult {
  memoryBeforeBytes: number;
  memoryAfterBytes: number;
  swapBytes: number;
}

/** One isolation backend. */
export interface Backend {
  readonly kind: BackendKind;
  /** Creates and starts a sandbox; on failure nothing of it is left behind. */
  create(req: BackendCreateRequest, signal?: AbortSignal): Promise<BackendSandbox>;
  /** Sandboxes that survived an edge restart, running and usable again. */
  recover(): Promise<BackendSandbox[]>;
  /** A connection to the sandbox's agent (reused while it is alive). */
  agent(id: string): Promise<SandboxAgent>;
  /** A new connection of the caller's own, for a reader that must not share one. */
  connectAgent(id: string): Promise<SandboxAgent>;
  /**
   * Records a claim of a sandbox created ahead of demand: its env and labels, kept so that a
   * restarted edge applies them again. A sandbox is claimed at most once (CONFLICT after).
   */
  claim(id: string, claim: SandboxClaim): Promise<void>;
  /** Stops a sandbox and removes everything it had: processes, mounts, cgroups, files. */
  destroy(id: string): Promise<void>;
  /** Current resource use. */
  stats(id: string): Promise<SandboxStats>;
  /**
   * Host path of the sandbox's upper directory: its changes over its layers, deletions as
   * overlayfs whiteouts. Backends whose writable state is not a host directory (VMs) omit it.
   */
  upperDir?(id: string): string;
  /**
   * Freezes every process of the sandbox and makes its memory reclaimable. Its processes, open
   * files and file system stay exactly as they are; its agent does not answer until resumed.
   * Backends that cannot pause omit it.
   */
  pause?(id: string): Promise<BackendPauseResult>;
  /** Thaws a paused sandbox (and with `prefetch`, reads its swapped-out memory back in first). */
  resume?(id: string, opts?: { prefetch?: boolean }): Promise<BackendResumeResult>;
  /** Path of the sandbox's network namespace (where edge puts its link); absent: no network. */
  netnsPath?(id: string): Promise<string>;
  /** Releases what the backend holds in this process (connections); sandboxes keep running. */
  close(): Promise<void>;
}
