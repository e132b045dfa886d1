// Sandbox: one sandbox, assembled from modules (commands, files, network, snapshots, changes,
// trajectory), each in its own file. The methods users already call (`exec`, `spawn`, `pause`,
// `snapshot`, ...) stay here and delegate; the static methods find and create sandboxes.
import { Screen } from './screen.js';
import type { DiffEntry, DiffResult, PauseMemory, Trajectory, VerifyResult } from '@dsec/protocol';
import { Changes } from './changes.js';
import type { DiffOptions } from './changes.js';
import { clientFrom } from './client.js';
import type { CallOptions, ConnectionOptions, DsecClient } from './client.js';
import { Commands } from './commands.js';
import type { AttachOptions, ExecOptions, SpawnOptions } from './commands.js';
import type { ExecHandle } from './exec-handle.js';
import { Files } from './files.js';
import { Lifecycle } from './lifecycle.js';
import { networkApi } from './network.js';
import type { NetworkApi } from './network.js';
import * as sandboxes from './sandboxes.js';
import type { BatchCreateOptions, BatchCreateResult, CreateOptions, SandboxFactory, SandboxPaginator } from './sandboxes.js';
import { sandboxRoute } from './scope.js';
import type { SandboxScope } from './scope.js';
import { Snapshots } from './snapshots.js';
import type { ForkOptions, ForkOutcome, SnapshotOptions } from './snapshots.js';
import { trajectoryApi } from './trajectory.js';
import type { ReplayOptions, ReplayOutcome, TrajectoryApi, TrajectoryOptions } from './trajectory.js';
import type {
  EgressLogEntry,
  ExecResult,
  LayerInfo,
  LeaseOptions,
  NetworkPolicy,
  NetworkPolicyPatch,
  Page,
  PauseResult,
  ProcessInfo,
  SandboxBatchRequest,
  SandboxCreateOptions,
  SandboxInfo,
  SandboxListOptions,
  SandboxNetworkInfo,
  SandboxStats,
} from './types.js';
import { checkSandboxId, defined } from './validate.js';

/** A sandbox: a disposable, isolated Linux computer. */
export class Sandbox {
  /** Sandbox id (`<node>-<hex>`). */
  readonly id: string;
  /** The client this sandbox talks through. */
  readonly client: DsecClient;
  /** The sandbox as last returned by the API (create, connect, info, pause, ...). */
  lastInfo: SandboxInfo | undefined;
  /** Commands and processes: `run`, `spawn`, `attach`, `list`. */
  readonly commands: Commands;
  /** Files inside the sandbox. */
  readonly files: Files;
  /** Its network: `sandbox.network()` (its policy and counters), `.set`, `.patch`, `.log`. */
  readonly network: NetworkApi;
  /** Snapshots of its writable layer, and forks from them. */
  readonly snapshots: Snapshots;
  /** What it changed against its image layers, and integrity checks of its files. */
  readonly changes: Changes;
  /** Its recorded steps: `sandbox.trajectory()` (every step), `.page`, `.replay`. */
  readonly trajectory: TrajectoryApi;
  /** A VM's screen, mouse and keyboard: `sandbox.screen.capture()`, `.click(x, y)`, `.type(text)`, ... */
  readonly screen: Screen;
  readonly #lifecycle: Lifecycle;

  static readonly #make: SandboxFactory = (client, id, info) => new Sandbox(client, id, info);

  private constructor(client: DsecClient, id: string, info?: SandboxInfo) {
    this.client = client;
    this.id = id;
    this.lastInfo = info;
    const scope: SandboxScope = {
      client,
      id,
      route: (suffix) => sandboxRoute(id, suffix),
      remember: (next) => {
        this.lastInfo = next;
      },
      adopt: (other) => Sandbox.#make(client, other.id, other),
    };
    this.commands = new Commands(scope);
    this.files = new Files(client, id);
    this.network = networkApi(scope);
    this.snapshots = new Snapshots(scope);
    this.changes = new Changes(scope);
    this.trajectory = trajectoryApi(scope);
    this.screen = new Screen(scope);
    this.#lifecycle = new Lifecycle(scope);
  }

  /**
   * Creates a sandbox and returns once it is running (claimed from a warm pool of the project
   * when one matches). With `admission: {wait: true}` it waits for quota or capacity instead of
   * failing with QUOTA_EXCEEDED or CAPACITY_EXHAUSTED; that wait is added to the request timeout.
   * A client with an owner session (the `owner` option) makes it the sandbox's owner unless
   * `owner` is given.
   */
  static create(opts: SandboxCreateOptions & CreateOptions, conn: ConnectionOptions = {}): Promise<Sandbox> {
    return sandboxes.create(Sandbox.#make, opts, conn);
  }

  /**
   * Creates `count` sandboxes of one spec, or one per entry of `items` (up to 10,000), in one
   * request. Each item succeeds or fails on its own (a bad spec, the quota); `onItem` sees them
   * as they finish. The request timeout covers the batch's acceptance, not its creates.
   */
  static createBatch(request: SandboxBatchRequest, opts: BatchCreateOptions = {}, conn: ConnectionOptions = {}): Promise<BatchCreateResult> {
    return sandboxes.createBatch(Sandbox.#make, request, opts, conn);
  }

  /**
   * Finds an existing sandbox by id (SANDBOX_NOT_FOUND when it does not exist). A client with
   * an owner session takes the sandbox over (`claim: false` to only look): after a crash, the
   * new process's client connects and the sandbox is its own again, resumed if its old
   * owner's disappearance had paused it.
   */
  static connect(id: string, conn: ConnectionOptions & CallOptions & { claim?: boolean } = {}): Promise<Sandbox> {
    return sandboxes.connect(Sandbox.#make, id, conn);
  }

  /** Connects to every sandbox with these labels (and state), as {@link Sandbox.connect} does. */
  static find(opts: SandboxListOptions, conn: ConnectionOptions & { claim?: boolean } = {}): Promise<Sandbox[]> {
    return sandboxes.find(Sandbox.#make, opts, conn);
  }

  /**
   * A handle to a sandbox by id, without asking the API (for a sandbox that may be gone, such
   * as one whose trajectory is to be read or replayed).
   */
  static fromId(id: string, conn: ConnectionOptions = {}): Sandbox {
    return new Sandbox(clientFrom(conn), checkSandboxId(id));
  }

  /** Destroys a sandbox by id without fetching it first. */
  static async kill(id: string, conn: ConnectionOptions & CallOptions = {}): Promise<void> {
    await Sandbox.fromId(id, conn).kill(defined({ signal: conn.signal, requestTimeoutMs: conn.requestTimeoutMs }));
  }

  /**
   * Lists sandboxes, fetching pages as the result is iterated
   * (`for await (const s of Sandbox.list(...))`, or `.toArray()`). `limit` is the page size.
   */
  static list(opts: SandboxListOptions = {}, conn: ConnectionOptions = {}): SandboxPaginator {
    return sandboxes.list(opts, conn);
  }

  /** Fetches one page of a sandbox listing. */
  static listPage(opts: SandboxListOptions & { cursor?: string } = {}, conn: ConnectionOptions = {}): Promise<Page<SandboxInfo>> {
    return sandboxes.listPage(opts, conn);
  }

  // ---- lifecycle ----

  /** Fetches the sandbox's current description. */
  info(opts: CallOptions = {}): Promise<SandboxInfo> {
    return this.#lifecycle.info(opts);
  }

  /** Resource use read from the sandbox's cgroups and writable layer. */
  stats(opts: CallOptions = {}): Promise<SandboxStats> {
    return this.#lifecycle.stats(opts);
  }

  /**
   * Destroys the sandbox and everything in it; `wait: false` returns once the delete is durably
   * taken, the teardown following in the background (see {@link Lifecycle.kill}).
   */
  kill(opts: CallOptions & { wait?: boolean } = {}): Promise<void> {
    return this.#lifecycle.kill(opts);
  }

  /**
   * Pauses the sandbox: every process is frozen and its memory made reclaimable; processes,
   * open files and the file system are kept exactly. Requests resume it again (unless its
   * lease says `autoResume: false`), as does {@link Sandbox.resume}. With `memory: "file"`
   * (microVMs, and full VMs of a `--desktop` image) the memory is written to a file on the node and freed until resumed.
   */
  pause(opts: CallOptions & { memory?: PauseMemory } = {}): Promise<PauseResult> {
    return this.#lifecycle.pause(opts);
  }

  /** Resumes a paused sandbox (`prefetch: false` skips reading swapped-out memory back first). */
  resume(opts: CallOptions & { prefetch?: boolean } = {}): Promise<PauseResult> {
    return this.#lifecycle.resume(opts);
  }

  /** Changes the lease: the fields given replace the current ones. */
  setLease(lease: LeaseOptions, opts: CallOptions = {}): Promise<SandboxInfo> {
    return this.#lifecycle.setLease(lease, opts);
  }

  /** Hands the sandbox to an owner session (null: none); resumes it if its old owner's loss paused it. */
  setOwner(owner: string | null, opts: CallOptions = {}): Promise<SandboxInfo> {
    return this.#lifecycle.setOwner(owner, opts);
  }

  // ---- the names users already call, kept: each is one of the modules' ----

  /** Runs a command to completion: {@link Commands.run}. */
  exec(cmd: string | readonly string[], opts: ExecOptions = {}): Promise<ExecResult> {
    return this.commands.run(cmd, opts);
  }

  /** Starts a command and returns a handle to it: {@link Commands.spawn}. */
  spawn(cmd: string | readonly string[], opts: SpawnOptions = {}): Promise<ExecHandle> {
    return this.commands.spawn(cmd, opts);
  }

  /** Attaches to a process again from output offsets: {@link Commands.attach}. */
  attach(pid: number, opts: AttachOptions = {}): Promise<ExecHandle> {
    return this.commands.attach(pid, opts);
  }

  /** Processes the sandbox's agent knows, running and exited: {@link Commands.list}. */
  processes(opts: CallOptions = {}): Promise<ProcessInfo[]> {
    return this.commands.list(opts);
  }

  /** Replaces the sandbox's network policy: `network.set`. */
  setNetwork(policy: NetworkPolicy, opts: CallOptions = {}): Promise<SandboxNetworkInfo> {
    return this.network.set(policy, opts);
  }

  /** Changes part of the sandbox's network policy: `network.patch`. */
  patchNetwork(patch: NetworkPolicyPatch, opts: CallOptions = {}): Promise<SandboxNetworkInfo> {
    return this.network.patch(patch, opts);
  }

  /** The sandbox's latest egress attempts, oldest first: `network.log`. */
  networkLog(opts: CallOptions & { limit?: number } = {}): Promise<EgressLogEntry[]> {
    return this.network.log(opts);
  }

  /** Packs the sandbox's writable layer into a snapshot layer: {@link Snapshots.create}. */
  snapshot(opts: SnapshotOptions = {}): Promise<LayerInfo> {
    return this.snapshots.create(opts);
  }

  /** One snapshot, then `count` sandboxes from it: {@link Snapshots.fork}. */
  fork(count: number, opts: ForkOptions = {}): Promise<ForkOutcome> {
    return this.snapshots.fork(count, opts);
  }

  /** One page of what the sandbox changed against its layers: {@link Changes.diff}. */
  diff(opts: DiffOptions & CallOptions = {}): Promise<DiffResult> {
    return this.changes.diff(opts);
  }

  /** Every entry of the diff, page after page: {@link Changes.entries}. */
  diffEntries(opts: Omit<DiffOptions, 'cursor'> & CallOptions = {}): AsyncGenerator<DiffEntry> {
    return this.changes.entries(opts);
  }

  /** Whether each path holds a regular file with the given sha256: {@link Changes.verify}. */
  verify(expected: Record<string, string>, opts: CallOptions = {}): Promise<VerifyResult> {
    return this.changes.verify(expected, opts);
  }

  /** One page of the sandbox's trajectory: `trajectory.page`. */
  trajectoryPage(opts: TrajectoryOptions = {}): Promise<Trajectory> {
    return this.trajectory.page(opts);
  }

  /** A fresh sandbox with the recorded steps re-run and compared: `trajectory.replay`. */
  replay(opts: ReplayOptions = {}): Promise<ReplayOutcome> {
    return this.trajectory.replay(opts);
  }
}
