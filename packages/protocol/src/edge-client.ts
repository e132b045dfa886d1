// The interface between the control plane and a node: what the apiserver may ask of an edge.
// The in-process `Edge` implements it; a remote edge implements it over the network, so every
// input and output here is plain data (or a stream of plain data) and every long call takes a
// signal. No chronus types, no layer-store objects: nothing here exists only inside a node.
import type { CallBatchRequest, CallBatchResult, CallRequest, CallResult } from './calls.js';
import type { ExecResult, ExecSpec, ExitInfo, ProcessInfo } from './exec.js';
import type { DiffOptions, DiffResult, FileStat, VerifyRequest, VerifyResult } from './files.js';
import type { BuildableLayerKind, LayerInfo, LayerKind } from './layers.js';
import type { EgressLogEntry, NetworkPolicy, SandboxNetwork } from './network.js';
import type { BackendKind } from './resources.js';
import type { PauseMemory, SandboxClaim, SandboxSpec, SandboxState, SandboxStats } from './sandboxes.js';
import type { EventSink } from './events.js';
import type { LayerCacheStats } from './layer-cache.js';
import type { ScreenAction, ScreenCapture, ScreenInputResult } from './screen.js';
import type { DsecError } from './errors.js';

/** What a node offers, before over-commit. */
export interface NodeCapacity {
  cpu: number;
  memoryMiB: number;
  sandboxes: number;
  backends: BackendKind[];
  /** The microVM backend's accelerator (a real boot probe at node start) and measured boot time. */
  microvm?: { accel: 'kvm' | 'tcg'; bootMs: number };
  /** The full-VM backend's accelerator and its last boot's time (0 before the first). */
  vm?: { accel: 'kvm' | 'tcg'; bootMs: number };
}

/** A sandbox as its node reports it. */
export interface EdgeSandbox {
  id: string;
  node: string;
  backend: BackendKind;
  state: SandboxState;
  spec: SandboxSpec;
  /** Layer digests, bottom first. */
  layers: string[];
  createdAt: string;
}

/** One piece of a process's output at its byte offset, or a gap where output was dropped. */
export type OutputEvent =
  { kind: 'data'; stream: 'stdout' | 'stderr'; offset: number; data: Uint8Array } | { kind: 'gap'; stream: 'stdout' | 'stderr'; offset: number; bytes: number };

/**
 * A process started or attached through an edge: its output as an async iterable (in order,
 * ending after the exit), its exit, and its stdin. Iterating applies back-pressure to the
 * process; `detach` stops the stream and leaves the process running.
 */
export interface ProcessStream extends AsyncIterable<OutputEvent> {
  /** dsec's id of the process: unique for the sandbox's life (the API's `pid`). */
  readonly pid: number;
  /** Its process id inside the sandbox (the API's `osPid`). */
  readonly osPid: number;
  /** Resolves with how it ended; rejects when the stream is lost first (the process may still run). */
  readonly exited: Promise<ExitInfo>;
  /** Writes to its stdin (`eof` closes it after the data). */
  write(data: Uint8Array | string, eof?: boolean): Promise<void>;
  closeStdin(): Promise<void>;
  /** Sends a signal to its process group (default SIGKILL). */
  kill(signal?: string | number): Promise<void>;
  /** Stops streaming; the process keeps running and can be attached again from an offset. */
  detach(): Promise<void>;
  /** Called once when the stream ends for any reason (exit, detach, lost connection). */
  onDetach(fn: () => void): void;
}

/**
 * What every call of an {@link EdgeClient} that does I/O takes as its last argument (merged into
 * the call's own options where it has some). See {@link EdgeClient} for what an abort does.
 */
export interface EdgeCallOptions {
  /** Aborting it ends the caller's wait; the call's work stops where that is safe. */
  signal?: AbortSignal | undefined;
}

/** Options of {@link EdgeClient.exec}. */
export interface EdgeExecOptions extends EdgeCallOptions {
  /** Called with each piece of output as it arrives (the recording of a trajectory). */
  onOutput?: (ev: OutputEvent) => void;
  /** Cap on collected stdout and stderr (each); the rest is drained and `truncated` set. */
  maxOutputBytes?: number;
}

/** What a pause or a resume did on the node. */
export interface NodePauseResult {
  durationMs: number;
  memoryBeforeBytes: number;
  memoryAfterBytes: number;
  swapBytes: number;
}

/**
 * What a node's sandboxes use, all of them together (the node's cgroup parent): the scheduler
 * over-commits by it. CPU is cumulative; the control plane takes the rate between two reports.
 */
export interface NodeUsageReport {
  cpuUsageMs: number;
  memoryBytes: number;
  /** Sandboxes the node holds. */
  sandboxes: number;
}

/** What a node's garbage collection removed. */
export interface NodeGarbageReport {
  containers: string[];
  cgroups: string[];
  processes: number;
  mounts: number;
  dirs: string[];
  /** Unused layer mounts a previous process left. */
  layerMounts: number;
}

/** Where a layer that a node builds comes from. Streams are the bytes of the upload. */
export type LayerBuildSource =
  | { type: 'tar'; stream: AsyncIterable<Uint8Array> }
  /** An OCI image archive (`docker save` / `skopeo copy oci-archive:`). */
  | { type: 'oci-archive'; stream: AsyncIterable<Uint8Array> }
  | { type: 'debian'; suite?: string; packages: string[]; variant?: 'minbase' | 'apt' }
  | { type: 'busybox' }
  /** An image in one of the registries the node pulls from (`node.pullFrom`). */
  | { type: 'image'; ref: string }
  /** A bootable VM disk image built from Debian (a `disk` layer; `opts.kind` is not used). */
  | { type: 'vm'; suite?: string; packages?: string[]; desktop?: boolean }
  /** An uploaded qcow2 or raw disk image (a `disk` layer; `opts.kind` is not used). */
  | { type: 'disk'; stream: AsyncIterable<Uint8Array> };

/** Options of {@link EdgeLayers.build}. */
export interface LayerBuildOptions {
  kind: BuildableLayerKind;
  /** `name` or `name:tag` to point at the layer. */
  name?: string;
  labels?: Record<string, string>;
  /** Progress lines of long builds (Debian). */
  onProgress?: (line: string) => void;
  signal?: AbortSignal;
  /** Build into (or take from) the node's machine-wide cache of built layers, keyed by `name`; a node without one builds in its store. */
  machineCache?: boolean;
}

/** The layers a node holds. */
export interface EdgeLayers {
  /** A layer by digest or name; LAYER_NOT_FOUND when the node does not hold it. */
  resolve(ref: string): Promise<LayerInfo>;
  list(filter?: { kind?: LayerKind }): Promise<LayerInfo[]>;
  build(source: LayerBuildSource, opts: LayerBuildOptions): Promise<LayerInfo>;
  /** Removes a layer no sandbox uses (CONFLICT while one does). */
  remove(ref: string): Promise<void>;
  /** The chunk cache of lazily loaded layers; null when the node loads none lazily. */
  cacheStats?(): Promise<LayerCacheStats | null>;
  /**
   * Bytes of a `disk` layer's image as `format` (raw: converted once, sparse), from `offset`;
   * empty past the end. The export of `dsec image export`.
   */
  readDisk?(ref: string, opts: ReadDiskOptions): Promise<Uint8Array>;
}

/** Options of {@link EdgeLayers.readDisk}. */
export interface ReadDiskOptions {
  format: 'raw' | 'qcow2';
  offset: number;
  /** Bytes at most (up to 8 MiB). */
  length: number;
}

/** Function calls (the fncall backend). */
export interface EdgeCalls {
  run(req: CallRequest, opts?: EdgeCallOptions): Promise<CallResult>;
  runBatch(req: CallBatchRequest, opts?: EdgeCallOptions): Promise<CallBatchResult>;
}

/**
 * The screen, keyboard and mouse of a sandbox that has them (backend `vm`); CONFLICT naming the
 * backend for one that has none.
 */
export interface EdgeScreen {
  /** A screenshot (PNG) and the screen's size. */
  capture(id: string, opts?: EdgeCallOptions): Promise<ScreenCapture>;
  /** Performs the actions in order (coordinates checked against the screen's size first: INVALID_ARGUMENT naming the field). */
  input(id: string, actions: ScreenAction[], opts?: EdgeCallOptions): Promise<ScreenInputResult>;
  /**
   * A connection to the sandbox's VNC server (RFB), carried as a process stream: its output is
   * what the server sends, `write` sends the viewer's bytes, `detach` closes the connection.
   */
  connect(id: string, opts?: EdgeCallOptions): Promise<ProcessStream>;
}

/**
 * A node as the control plane uses it. Inputs are already validated (parsed with the protocol's
 * schemas, defaults applied); an implementation across a process boundary validates again on
 * its side of the wire.
 *
 * Cancellation: every call that does I/O takes `signal` (in {@link EdgeCallOptions}). When it
 * aborts, the caller stops waiting: the call rejects with the signal's reason (over the wire,
 * the edge's CANCELLED becomes that reason again). What the call was doing on the node stops
 * where it can stop safely: a create is undone, an exec's process is killed, a snapshot is not
 * committed, a diff or verify walk stops between entries, a multi-chunk file read or write
 * stops between chunks (a write so stopped leaves the chunks already written), and a call that
 * waits for a pause, resume or drain stops waiting. A call whose effect is one step (mkdir,
 * rename, a signal, a network policy) is either not begun or completes. A pause, resume,
 * claim or destroy that has already begun completes on the node even though its caller has
 * stopped waiting: stopping it half-way would leave the sandbox in no known state. A spawn or
 * attach aborted after its process started leaves the process running (as a detach does).
 */
/** One create of {@link EdgeClient.createMany}. */
export interface EdgeCreateItem {
  spec: SandboxSpec;
  id: string;
}

/** The outcome of one item of {@link EdgeClient.createMany}: the sandbox, or why it was not created. */
export type EdgeCreateResult = { sandbox: EdgeSandbox } | { error: DsecError };

export interface EdgeClient {
  /** The node's name (encoded in its sandboxes' ids). */
  readonly nodeName: string;
  capacity(): NodeCapacity;
  /** Subscribes to the node's events (OOM kills, denials, survivors, ...); returns the unsubscribe. */
  onEvent(sink: EventSink): () => void;
  readonly layers: EdgeLayers;
  readonly calls: EdgeCalls;
  /** Screens of VMs. */
  readonly screen: EdgeScreen;

  /** Creates and starts a sandbox; layers in `spec.image` and `spec.snapshots` are digests. */
  create(spec: SandboxSpec, opts?: EdgeCallOptions & { id?: string }): Promise<EdgeSandbox>;
  /**
   * Creates many sandboxes in one call (one node message for many creates: the control plane
   * groups the creates placed on a node at the same moment); each item succeeds or fails alone,
   * in order. Optional: the node protocol's serving side runs `create` for each item where the
   * edge has no such method.
   */
  createMany?(items: readonly EdgeCreateItem[], opts?: EdgeCallOptions): Promise<EdgeCreateResult[]>;
  /** Hands a sandbox made ahead of demand (a pool's) to its user: env and labels applied. */
  claim(id: string, claim: SandboxClaim, opts?: EdgeCallOptions): Promise<EdgeSandbox>;
  /** Stops a sandbox and removes all it had; a sandbox already gone is not an error. */
  destroy(id: string, opts?: EdgeCallOptions): Promise<void>;
  list(): Promise<EdgeSandbox[]>;
  stats(id: string, opts?: EdgeCallOptions): Promise<SandboxStats>;
  pause(id: string, opts?: EdgeCallOptions & { reason?: string; memory?: PauseMemory }): Promise<NodePauseResult>;
  resume(id: string, opts?: EdgeCallOptions & { reason?: string; prefetch?: boolean }): Promise<NodePauseResult>;
  /** Packs the sandbox's writable layer into a snapshot layer. */
  snapshot(id: string, opts?: EdgeCallOptions & { labels?: Record<string, string> }): Promise<LayerInfo>;
  diff(id: string, opts: DiffOptions, call?: EdgeCallOptions): Promise<DiffResult>;
  verify(id: string, req: VerifyRequest, opts?: EdgeCallOptions): Promise<VerifyResult>;
  collectGarbage(opts?: { calls?: boolean }): Promise<NodeGarbageReport>;
  /** What the node's sandboxes use now (placement by measured use). */
  usage(opts?: EdgeCallOptions): Promise<NodeUsageReport>;

  exec(id: string, spec: ExecSpec, opts?: EdgeExecOptions): Promise<ExecResult>;
  spawn(id: string, spec: ExecSpec, opts?: EdgeCallOptions): Promise<ProcessStream>;
  processes(id: string, opts?: EdgeCallOptions): Promise<ProcessInfo[]>;
  /** Streams a process's output from byte offsets (default 0) and its exit. */
  attach(id: string, pid: number, from?: { stdout?: number; stderr?: number }, opts?: EdgeCallOptions): Promise<ProcessStream>;
  writeStdin(id: string, pid: number, data: Uint8Array | string, eof?: boolean, opts?: EdgeCallOptions): Promise<void>;
  signal(id: string, pid: number, signal: string | number, opts?: EdgeCallOptions): Promise<void>;
  resize(id: string, pid: number, rows: number, cols: number, opts?: EdgeCallOptions): Promise<void>;

  readFile(id: string, path: string, opts?: EdgeCallOptions & { offset?: number; length?: number }): Promise<Uint8Array>;
  writeFile(id: string, path: string, data: Uint8Array | string, opts?: EdgeCallOptions & { mode?: number; append?: boolean }): Promise<void>;
  listDir(id: string, path: string, opts?: EdgeCallOptions): Promise<FileStat[]>;
  stat(id: string, path: string, opts?: EdgeCallOptions): Promise<FileStat>;
  mkdir(id: string, path: string, opts?: EdgeCallOptions): Promise<void>;
  remove(id: string, path: string, opts?: EdgeCallOptions & { recursive?: boolean }): Promise<void>;
  rename(id: string, from: string, to: string, opts?: EdgeCallOptions): Promise<void>;
  symlink(id: string, path: string, target: string, opts?: EdgeCallOptions): Promise<void>;
  /**
   * Extended attributes under `prefix` (`user.` namespace) of each path, names without the
   * prefix (null where unreadable); with `replace` (one path) those under the prefix are
   * replaced first. INVALID_ARGUMENT where the sandbox's agent has no such operation (a VM).
   */
  xattrs(
    id: string,
    paths: string[],
    prefix: string,
    opts?: EdgeCallOptions & { replace?: Record<string, string> },
  ): Promise<Array<Record<string, string> | null>>;

  /** Replaces the sandbox's network policy (validated and normalised by the caller). */
  setNetwork(id: string, policy: NetworkPolicy, opts?: EdgeCallOptions): Promise<SandboxNetwork>;
  networkInfo(id: string, opts?: EdgeCallOptions): Promise<SandboxNetwork>;
  networkLog(id: string, limit: number, opts?: EdgeCallOptions): Promise<EgressLogEntry[]>;
}
