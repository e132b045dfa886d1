// The interface every isolation backend implements (container, microvm, vm), with optional
// facets for what only some can do, and the host state a backend is built with.
import type { BackendKind, EventSink, FileStat, LayerInfo, SandboxClaim, SandboxSpec, SandboxStats } from '@dsec/protocol';
import type { AgentExit, AgentInfo, AgentProcess, SpawnOptions } from './chronus/client.js';
import type { Attachment } from './chronus/attachment.js';
import type { Cgroups } from './host/cgroups.js';
import type { IdRange } from './host/id-ranges.js';
import type { RuntimeNamespace } from './host/runtime-ns.js';
import type { LayerStore } from './layers/index.js';
import type { SandboxScreen } from './backends/qemu/screen.js';
import type { LaunchServer } from './backends/container/launcher.js';

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
  /** Reads in chunks; an abort of `signal` stops it between chunks. */
  readFile(path: string, opts?: { offset?: number; length?: number; maxBytes?: number; signal?: AbortSignal | undefined }): Promise<Buffer>;
  /** Writes in chunks; an abort of `signal` stops it between chunks (those written stay). */
  writeFile(
    path: string,
    data: Uint8Array | string,
    opts?: { mode?: number; uid?: number; gid?: number; append?: boolean; signal?: AbortSignal | undefined },
  ): Promise<void>;
  listDir(path: string): Promise<FileStat[]>;
  mkdir(path: string, opts?: { parents?: boolean; mode?: number; uid?: number; gid?: number }): Promise<void>;
  remove(path: string, opts?: { recursive?: boolean }): Promise<void>;
  rename(from: string, to: string): Promise<void>;
  symlink(path: string, target: string): Promise<void>;
  statfs(path: string): Promise<{ totalBytes: number; freeBytes: number; files: number; freeFiles: number }>;
  /**
   * Extended attributes under `prefix` of each path (null where unreadable); with `replace`
   * (one path), replaces those first. Absent where the agent cannot (a VM's guest agent).
   */
  xattrs?(paths: string[], prefix: string, opts?: { replace?: Record<string, string> }): Promise<Array<Record<string, string> | null>>;
  readonly connected: boolean;
  close(): void;
}

/** What a backend is asked to create: a validated spec with its layers resolved. */
export interface BackendCreateRequest {
  id: string;
  spec: SandboxSpec;
  /** Layers bottom first: base, workspace, toolkits in the order given. */
  layers: LayerInfo[];
  /** A fork with memory (`spec.memoryOf`): the source's state to resume from instead of booting. */
  memory?: MemoryImage;
}

/** A VM's memory and writable disks copied at one instant (see {@link MemoryForkFacet}). */
export interface MemoryImage {
  /** The sandbox it was copied from. */
  sourceId: string;
  /** Folder (root's) holding the copies; the fork's create moves them out, the caller removes it after. */
  dir: string;
  /** The memory and device state file, its manifest (`<file>.json`) beside it. */
  state: string;
  /** Copies of the writable disks, by the file name each has in a sandbox's folder. */
  disks: Record<string, string>;
}

/**
 * Forks with memory: a VM's memory and writable disks copied at one instant, from which a new
 * sandbox of the same shape resumes (`BackendCreateRequest.memory`).
 */
export interface MemoryForkFacet {
  /**
   * Copies sandbox `id`'s memory state and writable disks into a new folder named for the fork:
   * a running VM is stopped while it is copied and runs on after; a paused one stays paused.
   * A fork whose machine would differ from its source's (layers, memory, vCPUs, network device)
   * is refused before anything is copied. Leaves nothing behind on failure.
   */
  captureMemory(id: string, fork: Pick<BackendCreateRequest, 'id' | 'spec' | 'layers'>, signal?: AbortSignal): Promise<MemoryImage>;
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

/** OOM kills and pids-limit hits of a sandbox so far (its cgroup's counters). */
export interface SandboxCounters {
  oomKills: number;
  pidsLimitHits: number;
}

/** Memory charged to a sandbox now. */
export interface SandboxMemory {
  usageBytes: number;
  swapBytes: number;
}

/** Pausing: the backend can freeze a sandbox whole and give its memory back. */
export interface PauseFacet {
  /**
   * Freezes every process of the sandbox and makes its memory reclaimable. Its processes, open
   * files and file system stay exactly as they are; its agent does not answer until resumed.
   */
  pause(id: string): Promise<BackendPauseResult>;
  /**
   * Pauses with the sandbox's memory written to a file and freed on the host (`memory: "file"`);
   * `resume` reads it back. Absent: the backend keeps a paused sandbox's memory (a VM's QEMU
   * migrates to a file; no process checkpoint for containers on this kernel).
   */
  pauseToFile?(id: string): Promise<BackendPauseResult>;
  /** Whether a paused sandbox's memory is in a file (present with `pauseToFile`). */
  inFile?(id: string): boolean;
  /** Thaws a paused sandbox (and with `prefetch`, reads its swapped-out memory back in first). */
  resume(id: string, opts?: { prefetch?: boolean }): Promise<BackendResumeResult>;
  /** Memory charged now (what a pause of a paused sandbox reports). */
  memory(id: string): Promise<SandboxMemory>;
  /** Freezes without reclaiming (a snapshot's consistent read); `thaw` undoes it. */
  freeze(id: string): Promise<void>;
  thaw(id: string): Promise<void>;
  isFrozen(id: string): Promise<boolean>;
}

/** Counters the node watches for events (oom.kill, pids.limit-hit) and OOM verdicts. */
export interface CounterFacet {
  /** Read without blocking the event loop (the periodic scan of every sandbox). */
  read(id: string): Promise<SandboxCounters>;
  /** Read at once (a command's start and exit, where the order of events matters). */
  readNow(id: string): SandboxCounters;
}

/** The sandbox's processes as host pids (the survivor check reads their /proc entries). */
export interface HostProcessFacet {
  /** How many processes the sandbox holds, read at once (1: its agent alone). */
  countNow(id: string): number;
  /** Host pids of every process of the sandbox. */
  hostPids(id: string): Promise<number[]>;
}

/** A writable layer that is a host directory: the source of snapshots, diffs and watches. */
export interface WritableLayerFacet {
  /**
   * Host path of the sandbox's upper directory: its changes over its layers, deletions as
   * overlayfs whiteouts. Read it while the sandbox is frozen for a consistent view.
   */
  upperDir(id: string): string;
}

/** Read-only protected paths served by a process that refuses and logs every change (containers). */
export interface ProtectedPathFacet {
  /** Host path of the sandbox's log of refused changes (read by RefusedWriteLogs). */
  refusalLog(id: string): string;
  /**
   * Whether the sandbox's server still runs (the process recorded at its launch); undefined when
   * none was recorded (launched before servers were recorded, or no paths served).
   */
  serving(id: string): boolean | undefined;
  /**
   * Starts a new server for the sandbox's paths after its server died, its mounts covering the
   * dead ones (which answer ENOTCONN until then: nothing is ever writable there). Rejects with a
   * 4xx DsecError when it refuses (the sandbox is not running, or a mount still answers): a
   * retry would be refused too; any other rejection (a launcher timeout, a fork that failed) may
   * pass.
   */
  restart(id: string): Promise<void>;
}

/** A guest's upper directory read out into a host folder for a snapshot (see {@link GuestLayerFacet}). */
export interface GuestUpper {
  /** Host folder (root's alone) holding the tree as an overlay upper directory: whiteouts, opaque markers. */
  dir: string;
  /** Removes the folder (once the snapshot is packed). */
  remove(): Promise<void>;
}

/**
 * A writable layer inside a guest (a microVM's disk, which the host never mounts): read out
 * through the guest's agent, the guest holding its disk still while it is read.
 */
export interface GuestLayerFacet {
  /**
   * Copies a running sandbox's upper directory into a new host folder; the sandbox's writes
   * wait while it is read and run on when this resolves (or fails, leaving nothing behind).
   * Its ids are the sandbox's own (no shift).
   */
  exportUpper(id: string, signal?: AbortSignal): Promise<GuestUpper>;
}

/** A VM's disk copied while it was held still (see {@link DiskSnapshotFacet}). */
export interface DiskCopy {
  /** Labels the snapshot layer carries over from the layer the VM boots (its agent, bus, desktop). */
  labels: Record<string, string>;
  /** Writes the copy over its image as a standalone qcow2 at `out` (the VM runs on meanwhile). */
  flatten(out: string, signal?: AbortSignal): Promise<void>;
  /** Removes the copy (once the snapshot is packed). */
  remove(): Promise<void>;
}

/**
 * A writable disk image (a full VM's qcow2 overlay over its `disk` layer): a snapshot is the
 * disk flattened into a new `disk` layer, which a fork boots as its image.
 */
export interface DiskSnapshotFacet {
  /**
   * Copies the sandbox's disk in a consistent state: a running guest's file systems are synced
   * and frozen and its vCPUs stopped while the copy is made, then it runs on; a paused one is
   * copied as it is (as after a power cut) and stays paused. Nothing is left on failure.
   */
  copyDisk(id: string, signal?: AbortSignal): Promise<DiskCopy>;
}

/** A network namespace the node can put a link into (per-sandbox networking). */
export interface NetworkFacet {
  /** Path of the sandbox's network namespace. */
  netnsPath(id: string): Promise<string>;
  /** Called once the node's link is in that namespace (a VM moves its address into the guest). */
  linked?(id: string): Promise<void>;
}

/** A screen, mouse and keyboard per sandbox (full VMs: `QmpScreen` in backends/qemu/screen.ts). */
export interface ScreenFacet {
  /** The sandbox's screen; CONFLICT naming why when this sandbox has none (a VM without a display). */
  screen(id: string): SandboxScreen;
}

/** Options of {@link GarbageFacet.collectGarbage}. */
export interface GarbageOptions {
  /** True for ids that belong to a live sandbox (known, being created or destroyed). */
  keep: (id: string) => boolean;
  /** Also collect function-call sandboxes (`fn-` ids): only while no call pool runs (edge start). */
  calls?: boolean;
  /**
   * The mark of this node's sandboxes (`nodeMarkFor(home)`, the source of their root overlay): a
   * cgroup whose processes' mounts name it is this node's even when nothing else of it is left.
   */
  ownerMark: string;
}

/** What one garbage collection removed. */
export interface GarbageReport {
  /** Runtime containers deleted. */
  containers: string[];
  /** Sandbox cgroups removed. */
  cgroups: string[];
  /** Processes killed in them. */
  processes: number;
  /** Mounts detached under sandbox folders. */
  mounts: number;
  /** Sandbox folders removed. */
  dirs: string[];
}

/** Removing what sandboxes nobody knows left behind (after a crash, by the watcher's passes). */
export interface GarbageFacet {
  collectGarbage(opts: GarbageOptions): Promise<GarbageReport>;
}

/**
 * One isolation backend: the calls every backend answers, and optional facets for what only
 * some can do. The node asks "can you?" (`backend.pausing?`), never "which backend are you?".
 */
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
  /** Releases what the backend holds in this process (connections); sandboxes keep running. */
  close(): Promise<void>;

  /** Pause and resume, freeze and thaw; absent: its sandboxes cannot pause (nor be snapshotted). */
  readonly pausing?: PauseFacet;
  /** OOM and pids-limit counters; absent: no such events and no OOM verdicts. */
  readonly counters?: CounterFacet;
  /** Host pids of its processes; absent: no survivor check. */
  readonly hostProcesses?: HostProcessFacet;
  /** Its writable layer as a host directory; absent: no snapshots, diffs or watched paths (VMs). */
  readonly writableLayer?: WritableLayerFacet;
  /** Its read-only protected paths log refused changes; absent: they are refused unseen (VMs). */
  readonly protectedPaths?: ProtectedPathFacet;
  /** A network namespace per sandbox; absent: only network mode `none`. */
  readonly network?: NetworkFacet;
  /** Its writable layer inside a guest, read out for snapshots (microVMs); absent with `writableLayer`. */
  readonly guestLayer?: GuestLayerFacet;
  /** Forks that resume from a copy of a sandbox's memory (VMs); absent: `memoryOf` is refused. */
  readonly memoryFork?: MemoryForkFacet;
  /** Its writable disk image, flattened into a `disk` layer for snapshots (full VMs). */
  readonly diskSnapshot?: DiskSnapshotFacet;
  /** Garbage collection of what unknown sandboxes left. */
  readonly garbage?: GarbageFacet;
  /** Screens of its sandboxes; absent: no screenshots, input or live view. */
  readonly screen?: ScreenFacet;
  /** A virtual machine's accelerator and measured boot time (the node's capabilities). */
  readonly capabilities?: { accel: 'kvm' | 'tcg'; bootMs: number };
}

/** What the node hands a backend when it opens: its shared host state. */
export interface BackendHost {
  /** The node's state directory. */
  home: string;
  /** Private run directory of the node (`runDirFor(home)`): runtime state, writable layers, roots. */
  runDir: string;
  /** argv prefix that enters the runtime mount namespace, and its nsfs file. */
  runtimeNs: RuntimeNamespace;
  layers: LayerStore;
  /** The cgroups of the node's sandboxes. */
  cgroups: Cgroups;
  /** Host path of the static chronus binary (its helpers sit beside it). */
  agentBinary: string;
  /** The copy of chronus that sandboxes bind, on a mount of its own (host/agent-mount.ts): their mountinfo shows no host path. */
  sandboxAgent: string;
  /** An empty read-only directory on the same mount, bound over the directories call sandboxes must not see (host/agent-mount.ts; container sandboxes bind one of their own). */
  sandboxMaskDir: string;
  /** Marks the node's sandboxes without naming a host path (the source of their root overlay; host/agent-mount.ts). */
  nodeMark: string;
  /** Raises a node event (backends report forged agent messages and the like). */
  raise: EventSink;
  /**
   * The node's one `dsec-launch --serve`, shared by the container backend and the call runner
   * (started at the first launch); the edge closes it after them.
   */
  launcher: LaunchServer;
}

/** Builds a backend once the node's host state exists (`Edge.open({ backends: [...] })`). */
export type BackendFactory = (host: BackendHost) => Backend | Promise<Backend>;
