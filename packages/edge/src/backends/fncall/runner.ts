// The fncall runner: stateless calls. Each call claims a pre-created crun sandbox (read-only
// root from the runtime's layers, fresh tmpfs /tmp and /work, no network, the container
// backend's seccomp profile and capability set, cgroup limits, chronus as PID 1) and runs one
// process in it through chronus. Afterwards the sandbox is reset and goes back to its pool
// (every process but chronus killed, every writable tmpfs replaced by a fresh one, System V
// IPC and POSIX message queues emptied: `resetSandbox`), or is destroyed when any step of the
// reset fails or cannot be shown complete: no state of one call reaches the next.
// Each sandbox has a user namespace of its own (a host id range from `IdRanges`, root inside an
// unprivileged host uid): dsec-launch mounts its root, the read-only overlay of the layers
// idmapped to that range, in a mount namespace of its own right before crun, as for containers.
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import {
  DEFAULT_CALL_COMPILE_TIMEOUT_MS,
  DEFAULT_CALL_MEMORY_MIB,
  DEFAULT_CALL_OUTPUT_LIMIT_BYTES,
  DEFAULT_CALL_TIMEOUT_MS,
  DsecError,
  forEachBounded,
  imageLayers,
  invalidArgument,
  Limiter,
} from '@dsec/protocol';
import type { CallBatchItem, CallBatchRequest, CallBatchResult, CallRequest, CallResult, CallStepResult, EdgeCalls, LayerInfo } from '@dsec/protocol';
import { ChronusClient } from '../../chronus/client.js';
import type { AgentExit } from '../../chronus/client.js';
import type { Attachment } from '../../chronus/attachment.js';
import type { Cgroups } from '../../host/cgroups.js';
import type { IdRange, IdRanges } from '../../host/id-ranges.js';
import type { LayerStore } from '../../layers/index.js';
import { mountsUnder, MNT, umount } from '../../sys/linux.js';
import { Crun } from '../container/crun.js';
import type { LaunchServer } from '../container/launcher.js';
import { buildFnCallConfig, CALL_UID, CALL_WORKDIR, writableTmpfsMounts } from './bundle.js';
import type { FreshTmpfs } from './bundle.js';
import { WarmPool } from './pool.js';
import type { WarmPoolOptions } from './pool.js';
import { SandboxResetter } from './reset.js';
import { RuntimeBuilds } from './runtime-builds.js';
import { RUNTIMES } from './runtimes.js';
import type { RuntimeLayerId } from './runtimes.js';
import { WARM_PYTHON_ARGV, warmPythonEligible, warmPythonInput } from './warm-python.js';

/** Calls one node runs at once; further calls wait for a slot. */
export const MAX_CONCURRENT_CALLS = 64;
/** crun creates and deletes run at once (each is a few ms of CPU). */
export const MAX_PARALLEL_RUNTIME_OPS = 4;
/** Calls of one batch run at once. */
export const BATCH_PARALLELISM = 8;
/** A pool unused this long is drained and its root unmounted. */
export const POOL_IDLE_MS = 60_000;
/** Past timeoutMs, how long edge waits for chronus's own kill before killing the sandbox. */
const HARD_KILL_GRACE_MS = 1_000;
/** After an output overflow, how long the group kill may take before the sandbox is killed. */
const OVERFLOW_KILL_GRACE_MS = 250;
/** Output chronus keeps per stream (calls are always attached, so this only bounds buffers). */
const AGENT_OUTPUT_CAP_BYTES = 1_048_576;
/** Largest file a call's `fetchFiles` returns. */
const MAX_FETCH_FILE_BYTES = 16 * 1_048_576;
const CALL_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
/** Calls one sandbox serves (reset between each) before it is destroyed and replaced. */
export const MAX_CALLS_PER_SANDBOX = 256;
/** Name of the small layer on top of every call root: the mount points a read-only root needs. */
const SKELETON_LAYER = 'fncall-skeleton';

/** Options of {@link FnCallRunner}. */
export interface FnCallRunnerOptions {
  /** Directory the runner owns (`$home/fncall`). */
  dir: string;
  crunRoot: string;
  runtimePrefix: string[];
  layers: LayerStore;
  cgroups: Cgroups;
  /** Host path of the chronus copy sandboxes bind (`BackendHost.sandboxAgent`). */
  agentBinary: string;
  /** Empty read-only directory bound over masked directories (`BackendHost.sandboxMaskDir`). */
  maskDir: string;
  /** The node's launch server (`BackendHost.launcher`, shared with the container backend; closed by the edge). */
  launcher: LaunchServer;
  /** Host path of dsec-fnreset (the reset between calls); none: each sandbox serves one call. */
  resetBinary?: string | undefined;
  /** The runtime mount namespace's nsfs file (dsec-launch enters it). */
  runtimeNsFile: string;
  /**
   * Host directory (mode 0711, outside the 0700 state directory) of the sandboxes' root mount
   * points: the sandbox's root user sets its root up and must reach it.
   */
  rootsDir: string;
  /** Host id ranges: one user namespace per sandbox. */
  idRanges: IdRanges;
  /** The node's mark (`BackendHost.nodeMark`): the source of each sandbox's root overlay. */
  nodeMark: string;
  crunBinary?: string;
  /** Sizing of each pool. */
  pool?: WarmPoolOptions;
  /** Machine-wide cache of the Debian runtime layers (runtime-builds.ts); none: the node's store only. */
  runtimeCache?: string | undefined;
  /** Runtime layers built in the background from the start, in this order. Default none (built when first asked for). */
  prebuild?: readonly RuntimeLayerId[] | undefined;
  /** Progress of runtime builds. */
  log?: ((line: string) => void) | undefined;
}

/** A pre-created sandbox waiting for its next call. */
interface WarmSandbox {
  id: string;
  dir: string;
  agent: ChronusClient;
  idRange: IdRange;
  /** Its PID 1 (chronus) on the host and that process's start time; none: not reusable. */
  init: { pid: number; startTime: number } | undefined;
  /** The tmpfs mounts the reset makes afresh. */
  tmpfs: FreshTmpfs[];
  /** Calls it has served. */
  calls: number;
  /** The cgroup's OOM kill count when the current call began (calls' own count is the difference). */
  oomBase: number;
  /** Killed from outside (time limit or output overflow past their grace): never reused. */
  killed: boolean;
  /** A python3 started after the sandbox's last reset, waiting for the next call's code (warm-python.ts). */
  warm: WarmInterpreter | undefined;
}

/** A pre-started interpreter and whether it has already ended (then it is of no use). */
interface WarmInterpreter {
  att: Attachment;
  ended: boolean;
}

/** The mounted layers of one stack, held for the pools that use it. */
interface RootMount {
  /** Host directories of the layers, top first (overlayfs's order). */
  lowers: string[];
  digests: string[];
  users: number;
}

interface PoolEntry {
  pool: WarmPool<WarmSandbox>;
  root: RootMount;
  /** When the pool last served a call that could run in a warm python3 (0: never): while that is recent, its sandboxes get one after each reset. */
  lastWarmCallAt: number;
}

/**
 * Stateless function calls on pools of pre-created, single-use sandboxes. Not a `Backend`: a
 * call has no id, no lifecycle and no agent anyone reaches; it is the node's `EdgeCalls`.
 */
export class FnCallRunner implements EdgeCalls {
  readonly kind = 'fncall' as const;
  private readonly crun: Crun;
  /** The node's `dsec-launch --serve` makes every call sandbox (no fork of this process per refill). */
  private readonly launcher: LaunchServer;
  private readonly pools = new Map<string, PoolEntry>();
  /** Pools being made (their root being mounted): concurrent first calls share one. */
  private readonly poolsPending = new Map<string, Promise<PoolEntry>>();
  private readonly roots = new Map<string, RootMount>();
  /** Roots being mounted: concurrent first calls wait for the one mount instead of mounting again. */
  private readonly rootsPending = new Map<string, Promise<RootMount>>();
  private readonly runtimeLayers = new Map<string, Promise<LayerInfo>>();
  /** The Debian runtime layers, built in the background. */
  readonly builds: RuntimeBuilds;
  private skeleton: Promise<LayerInfo> | undefined;
  private readonly runtimeOps = new Limiter(MAX_PARALLEL_RUNTIME_OPS);
  private readonly slots = new Limiter(MAX_CONCURRENT_CALLS);
  private readonly destroying = new Set<Promise<void>>();
  private readonly hostNofileHard = hostNofileHard();
  /** The dsec-fnreset process (started at the first reset) and the tmpfs mounts it was started for. */
  private resetter: { key: string; server: SandboxResetter } | undefined;
  private readonly sweeper: NodeJS.Timeout;
  private closed = false;

  constructor(private readonly o: FnCallRunnerOptions) {
    this.crun = new Crun(o.runtimePrefix, o.crunRoot, o.crunBinary);
    this.launcher = o.launcher;
    this.builds = new RuntimeBuilds({ layers: o.layers, cacheDir: o.runtimeCache, ...(o.log ? { log: o.log } : {}) });
    this.sweeper = setInterval(() => void this.sweepIdlePools(), POOL_IDLE_MS / 4);
    this.sweeper.unref();
  }

  private get sandboxesDir(): string {
    return path.join(this.o.dir, 'sandboxes');
  }

  /** Where the roots of earlier versions were mounted on the host (removed at start). */
  private get oldRootsDir(): string {
    return path.join(this.o.dir, 'roots');
  }

  /** Removes what a previous edge process left behind (calls do not survive a restart). */
  async init(): Promise<void> {
    await mkdir(this.sandboxesDir, { recursive: true });
    await mkdir(this.o.rootsDir, { recursive: true });
    for (const id of await readdir(this.sandboxesDir)) await this.destroySandbox(id);
    for (const m of await mountsUnder(this.oldRootsDir)) umount(m, MNT.DETACH);
    await rm(this.oldRootsDir, { recursive: true, force: true });
    await rm(this.o.rootsDir, { recursive: true, force: true });
    await mkdir(this.o.rootsDir, { recursive: true, mode: 0o711 });
    await this.o.idRanges.reconcile(new Set());
    await this.builds.init();
    this.builds.prebuild(this.o.prebuild ?? []);
  }

  /** Runs one call in a fresh sandbox and returns its result. */
  async run(req: CallRequest, opts: { signal?: AbortSignal } = {}): Promise<CallResult> {
    return this.runOne(req, opts.signal);
  }

  /** Runs up to 1,000 calls (a few at a time) and returns their results in request order. */
  async runBatch(req: CallBatchRequest, opts: { signal?: AbortSignal } = {}): Promise<CallBatchResult> {
    const { calls } = req;
    const results: CallBatchItem[] = new Array<CallBatchItem>(calls.length);
    await forEachBounded(calls, BATCH_PARALLELISM, async (call, i) => {
      try {
        results[i] = await this.runOne(call, opts.signal);
      } catch (err) {
        const e = err instanceof DsecError ? err : new DsecError('INTERNAL', String(err));
        results[i] = { error: { code: e.code, message: e.message } };
      }
    });
    return { results };
  }

  private async runOne(spec: CallRequest, signal?: AbortSignal): Promise<CallResult> {
    if (this.closed) throw new DsecError('UNAVAILABLE', 'the fncall backend is closed');
    const layers = await this.layersOf(spec);
    const entry = await this.poolFor(layers);
    if (warmPythonEligible(spec)) entry.lastWarmCallAt = Date.now();
    return this.slots.run(async () => {
      const sb = await entry.pool.claim(signal);
      let result: CallResult | undefined;
      try {
        await this.limitMemory(sb, spec.memoryMiB ?? DEFAULT_CALL_MEMORY_MIB);
        result = await this.execute(sb, spec, signal);
        return result;
      } finally {
        if (result && !sb.killed && this.reusable(sb)) entry.pool.recycle(sb, () => this.resetSandbox(sb, entry));
        else this.discard(sb);
      }
    });
  }

  /** The call's layers, bottom first. */
  private async layersOf(spec: CallRequest): Promise<LayerInfo[]> {
    if (spec.runtime !== undefined) return [await this.runtimeLayer(spec.runtime)];
    if (spec.compileTimeoutMs !== undefined) throw invalidArgument('compileTimeoutMs', 'only runtimes c, cpp, go and java compile');
    const image = spec.image;
    if (!image) throw invalidArgument('runtime', 'give exactly one of runtime or image');
    const out: LayerInfo[] = [];
    for (const { field, ref } of imageLayers(image)) {
      out.push(
        await this.o.layers.fetch(ref).catch((err: unknown) => {
          if (err instanceof DsecError) err.details.field = field;
          throw err;
        }),
      );
    }
    return out;
  }

  /**
   * A built-in runtime's layer: busybox is built on first use (once, however many calls ask);
   * a Debian one must be ready (else UNAVAILABLE at once, its build started).
   */
  private async runtimeLayer(name: keyof typeof RUNTIMES): Promise<LayerInfo> {
    const layer = RUNTIMES[name].layer;
    if (layer.type === 'debian') return this.builds.layerFor(layer.id as RuntimeLayerId, name);
    let p = this.runtimeLayers.get(name);
    if (!p) {
      const layerName = layer.name;
      p = this.o.layers.resolve(layerName).catch(() => this.o.layers.build({ type: 'busybox' }, { kind: 'base', name: layerName }));
      p.catch(() => this.runtimeLayers.delete(name));
      this.runtimeLayers.set(name, p);
    }
    return p;
  }

  /** The layer with the mount points (/proc, /dev, /sys, /tmp, /work, chronus) of a read-only root. */
  private skeletonLayer(): Promise<LayerInfo> {
    this.skeleton ??= (async () => {
      const existing = await this.o.layers.resolve(SKELETON_LAYER).catch(() => undefined);
      if (existing) return existing;
      const tree = path.join(this.o.dir, `skeleton-${randomBytes(4).toString('hex')}`);
      try {
        for (const d of ['proc', 'sys', 'dev', 'tmp', 'work', '.dsec']) await mkdir(path.join(tree, d), { recursive: true, mode: 0o755 });
        await writeFile(path.join(tree, '.dsec/chronus'), '', { mode: 0o755 });
        const { utimes } = await import('node:fs/promises');
        const epoch = new Date(0);
        for (const p of ['proc', 'sys', 'dev', 'tmp', 'work', '.dsec/chronus', '.dsec', '.']) await utimes(path.join(tree, p), epoch, epoch);
        return await this.o.layers.build({ type: 'dir', path: tree }, { kind: 'toolkit', name: SKELETON_LAYER });
      } finally {
        await rm(tree, { recursive: true, force: true });
      }
    })();
    this.skeleton.catch(() => (this.skeleton = undefined));
    return this.skeleton;
  }

  /**
   * The warm pool of a layer stack: one whatever the calls' `memoryMiB` (a call's memory is a
   * cgroup limit set on the sandbox it claims, {@link limitMemory}), so that a tenant cycling
   * through sizes does not multiply warm sandboxes.
   */
  private async poolFor(layers: LayerInfo[]): Promise<PoolEntry> {
    const skeleton = await this.skeletonLayer();
    // overlayfs lists lower dirs top first.
    const digests = [skeleton.digest, ...layers.map((l) => l.digest).reverse()];
    const key = digests.join(',');
    const entry = this.pools.get(key);
    if (entry) return entry;
    // One pool per key, made once however many first calls ask at the same moment (each
    // making its own raced on the root's mount point: a loser's release unmounted the
    // winner's root, and its calls failed).
    let pending = this.poolsPending.get(key);
    if (!pending) {
      pending = (async () => {
        const root = await this.acquireRoot(digests);
        const create = async (): Promise<WarmSandbox> => {
          const sb = await this.runtimeOps.run(() => this.createSandbox(root.lowers));
          if (wantsWarmPython(made)) {
            await this.prestartPython(sb).catch((err: unknown) => {
              this.discard(sb);
              throw err;
            });
          }
          return sb;
        };
        const pool = new WarmPool<WarmSandbox>(
          {
            create,
            discard: (sb) => this.discard(sb),
            healthy: (sb) => sb.agent.connected,
          },
          this.o.pool,
        );
        const made: PoolEntry = { pool, root, lastWarmCallAt: 0 };
        this.pools.set(key, made);
        return made;
      })().finally(() => this.poolsPending.delete(key));
      this.poolsPending.set(key, pending);
    }
    return pending;
  }

  /**
   * Mounts (or shares) the layers of a stack; one set of layer mounts serves every sandbox. A
   * stack being mounted is waited for, never mounted twice.
   */
  private async acquireRoot(digests: string[]): Promise<RootMount> {
    const key = digests.join(',');
    for (;;) {
      const known = this.roots.get(key);
      if (known) {
        known.users++;
        return known;
      }
      const pending = this.rootsPending.get(key);
      if (!pending) break;
      await pending.catch(() => undefined);
    }
    const p = this.mountRoot(key, digests).finally(() => this.rootsPending.delete(key));
    this.rootsPending.set(key, p);
    return p;
  }

  /** Mounts a layer stack's layers (its first user holds them). */
  private async mountRoot(key: string, digests: string[]): Promise<RootMount> {
    const lowers: string[] = [];
    const taken: string[] = [];
    try {
      for (const d of digests) {
        lowers.push(await this.o.layers.acquire(d));
        taken.push(d);
      }
    } catch (err) {
      for (const d of taken) await this.o.layers.release(d).catch(() => undefined);
      throw err;
    }
    const root: RootMount = { lowers, digests, users: 1 };
    this.roots.set(key, root);
    return root;
  }

  private async releaseRoot(root: RootMount): Promise<void> {
    if (--root.users > 0) return;
    this.roots.delete(root.digests.join(','));
    for (const d of root.digests) await this.o.layers.release(d).catch(() => undefined);
  }

  /** A waiting sandbox, its memory limited to the default call's (each call sets its own when it claims it). */
  private async createSandbox(lowers: string[]): Promise<WarmSandbox> {
    const id = `fn-${randomBytes(8).toString('hex')}`;
    const dir = path.join(this.sandboxesDir, id);
    const rootfs = path.join(this.o.rootsDir, id);
    const socket = path.join(dir, 'agent.sock');
    const logFile = path.join(dir, 'runtime.log');
    let agent: ChronusClient | undefined;
    let idRange: IdRange | undefined;
    try {
      await mkdir(dir);
      await mkdir(rootfs);
      idRange = await this.o.idRanges.allocate(id);
      const config = buildFnCallConfig({
        id,
        rootfs,
        agentBinary: this.o.agentBinary,
        maskDir: this.o.maskDir,
        cgroupsPath: this.o.cgroups.pathFor(id),
        memoryMiB: DEFAULT_CALL_MEMORY_MIB,
        outputCapBytes: AGENT_OUTPUT_CAP_BYTES,
        hostNofileHard: this.hostNofileHard,
        idRange,
      });
      await writeFile(path.join(dir, 'config.json'), JSON.stringify(config));
      // dsec-launch (the runner's `--serve` process) enters the runtime namespace, makes a mount
      // namespace of its own, mounts the layers idmapped to the range and the read-only overlay
      // on them, makes the agent's listening socket (fd 3) and runs crun.
      const launch = [
        '--ns',
        this.o.runtimeNsFile,
        '--rootfs',
        rootfs,
        '--lower',
        lowers.join(':'),
        '--source',
        this.o.nodeMark,
        '--idmap',
        `${idRange.uid}:${idRange.gid}:${idRange.size}`,
        '--loginuid',
        String(idRange.uid),
        '--',
      ];
      const code = await this.launcher.run({
        log: logFile,
        socket,
        args: [...launch, ...this.crun.argv(['run', '--detach', '--preserve-fds', '1', '--bundle', dir, id])],
      });
      if (code !== 0) {
        const detail = (await readFile(logFile, 'utf8').catch(() => '')).trim();
        const why = detail ? detail.split('\n').slice(-3).join('; ') : `exit ${code}`;
        throw new DsecError('BACKEND_FAILED', `create call sandbox ${id}: crun run failed: ${why}`);
      }
      agent = await ChronusClient.connect(socket);
      await agent.ping();
      return {
        id,
        dir,
        agent,
        idRange,
        init: await this.agentProcess(id),
        tmpfs: writableTmpfsMounts(config),
        calls: 0,
        oomBase: 0,
        killed: false,
        warm: undefined,
      };
    } catch (err) {
      agent?.close();
      await this.destroySandbox(id, idRange);
      throw err;
    }
  }

  /** A sandbox's PID 1 as crun recorded it (the reset checks the start time: no pid reuse). */
  private async agentProcess(id: string): Promise<{ pid: number; startTime: number } | undefined> {
    if (this.o.resetBinary === undefined) return undefined;
    const init = await this.crun.initProcess(id);
    return init?.startTime !== undefined ? { pid: init.pid, startTime: init.startTime } : undefined;
  }

  /**
   * Sets the claimed sandbox's memory limit (its cgroup's, without swap) to the call's
   * `memoryMiB`, before anything of the call runs; the reset puts the default back. A limit
   * under what the sandbox holds unreclaimably (its waiting python3 interpreter) is retried
   * once that interpreter is gone; failing again, the sandbox is not used (destroyed) and the
   * call fails. The OOM count is read after, so that the call's `oomKilled` is its own.
   */
  private async limitMemory(sb: WarmSandbox, memoryMiB: number): Promise<void> {
    const bytes = memoryMiB * 1_048_576;
    try {
      await this.o.cgroups.setMemoryLimit(sb.id, bytes);
    } catch {
      const warm = sb.warm;
      sb.warm = undefined;
      if (warm) await this.dropWarm(warm);
      await this.o.cgroups.setMemoryLimit(sb.id, bytes).catch((err: unknown) => {
        sb.killed = true;
        throw new DsecError('BACKEND_FAILED', `call sandbox ${sb.id}: memory limit ${memoryMiB} MiB not set: ${String(err)}`);
      });
    }
    sb.oomBase = await this.o.cgroups.oomKills(sb.id);
  }

  private reusable(sb: WarmSandbox): boolean {
    return !this.closed && sb.init !== undefined && sb.calls + 1 < MAX_CALLS_PER_SANDBOX && sb.agent.connected;
  }

  /**
   * Makes a used sandbox equal to a fresh one, or says it cannot (false: it is destroyed):
   * chronus (PID 1) kills every other process of the sandbox and forgets them (RESET); no socket
   * may be left in its network namespace (a TIME_WAIT of the last call's connections); then
   * dsec-fnreset, in the sandbox's user, IPC and mount namespaces through a pidfd of chronus,
   * removes every System V object and POSIX message queue and replaces each writable tmpfs by
   * a fresh one with crun's options. The cgroup's limits are the edge's (a call cannot write
   * them): its memory limit goes back to the default (the next call sets its own); its OOM
   * count is read so that the next call's `oomKilled` is its own. Last, when
   * the pool's calls are python3 ones, a fresh interpreter is started for the next call
   * (warm-python.ts): after the reset, so it sees only the clean sandbox.
   */
  private async resetSandbox(sb: WarmSandbox, entry: PoolEntry): Promise<boolean> {
    const { sockets } = await sb.agent.reset();
    if (sockets > 0 || sb.init === undefined || this.o.resetBinary === undefined) return false;
    const tmpfsKey = JSON.stringify(sb.tmpfs);
    this.resetter ??= { key: tmpfsKey, server: new SandboxResetter({ binary: this.o.resetBinary, tmpfs: sb.tmpfs, log: this.o.log }) };
    if (this.resetter.key !== tmpfsKey) return false;
    if (!(await this.resetter.server.reset(sb.init.pid, sb.init.startTime))) return false;
    // The last call's memory limit goes with it: the sandbox waits under the default again.
    if (
      !(await this.o.cgroups.setMemoryLimit(sb.id, DEFAULT_CALL_MEMORY_MIB * 1_048_576).then(
        () => true,
        () => false,
      ))
    )
      return false;
    sb.calls++;
    sb.oomBase = await this.o.cgroups.oomKills(sb.id);
    if (wantsWarmPython(entry)) await this.prestartPython(sb);
    return true;
  }

  /**
   * Starts the python3 that the sandbox's next call will run in, as that call's user, with the
   * environment, cwd and stdin pipe it would get; no time limit yet (the call's limit is timed
   * from when its code is written).
   */
  private async prestartPython(sb: WarmSandbox): Promise<void> {
    const att = await sb.agent.spawn({ argv: [...WARM_PYTHON_ARGV], env: callEnv('python3'), cwd: CALL_WORKDIR, uid: CALL_UID, gid: CALL_UID, stdin: true });
    const warm: WarmInterpreter = { att, ended: false };
    void att.exited.finally(() => (warm.ended = true)).catch(() => undefined);
    sb.warm = warm;
  }

  /** Ends a warm interpreter the claimed call does not use (the call must find the sandbox as a fresh one). */
  private async dropWarm(warm: WarmInterpreter): Promise<void> {
    if (warm.ended) return;
    await warm.att.kill('SIGKILL').catch(() => undefined);
    await warm.att.exited.catch(() => undefined);
  }

  /** Destroys a used (or dead) sandbox in the background. */
  private discard(sb: WarmSandbox): void {
    sb.agent.close();
    const p = this.runtimeOps.run(() => this.destroySandbox(sb.id, sb.idRange)).finally(() => this.destroying.delete(p));
    this.destroying.add(p);
  }

  /** Kills every process of a sandbox and removes its cgroups, files and id range. */
  private async destroySandbox(id: string, idRange?: IdRange): Promise<void> {
    // Without a crun process when the kill empties its cgroup (Crun.end), else crun's delete.
    const ended = await this.crun.end(id, this.o.cgroups).catch(() => false);
    if (!ended) await this.crun.run(['delete', '--force', id]).catch(() => undefined);
    await this.o.cgroups.remove(id);
    await rm(path.join(this.sandboxesDir, id), { recursive: true, force: true });
    // Only a mount point: its overlay lived in the sandbox's own mount namespaces.
    await rm(path.join(this.o.rootsDir, id), { recursive: true, force: true });
    if (idRange) await this.o.idRanges.release(idRange, id);
  }

  /**
   * Runs the call in a claimed sandbox: its files, the compile step if any, the process, the
   * files fetched back. Once `signal` aborts (its caller went away) the running step is killed:
   * nobody waits for its result, and it would hold its sandbox and slot to its time limit.
   */
  private async execute(sb: WarmSandbox, spec: CallRequest, signal?: AbortSignal): Promise<CallResult> {
    const { agent } = sb;
    // A warm python3 serves only the call it was started for; any other call finds it gone.
    const warm = sb.warm;
    sb.warm = undefined;
    const useWarm = warm !== undefined && !warm.ended && warmPythonEligible(spec);
    if (!useWarm && warm) await this.dropWarm(warm);
    const owner = { uid: CALL_UID, gid: CALL_UID };
    const base64 = spec.fileEncoding === 'base64';
    const files: Array<[string, string | Buffer]> = Object.entries(spec.files ?? {}).map(([rel, content]) => [
      rel,
      base64 ? Buffer.from(content, 'base64') : content,
    ]);
    const def = spec.runtime !== undefined ? RUNTIMES[spec.runtime] : undefined;
    const compile = spec.code !== undefined ? def?.compile : undefined;
    if (compile) files.push([compile.file, spec.code ?? '']);
    for (const [rel, content] of files) {
      const file = path.posix.join(CALL_WORKDIR, rel);
      const parent = path.posix.dirname(file);
      if (parent !== CALL_WORKDIR) await agent.mkdir(parent, { parents: true, ...owner });
      await agent.writeFile(file, content, { mode: 0o644, ...owner });
    }
    const env = { ...callEnv(spec.runtime), ...spec.env };
    const limit = spec.outputLimitBytes ?? DEFAULT_CALL_OUTPUT_LIMIT_BYTES;
    let compiled: CallStepResult | undefined;
    if (compile) {
      compiled = await this.runStep(sb, { argv: compile.argv, env, timeoutMs: spec.compileTimeoutMs ?? DEFAULT_CALL_COMPILE_TIMEOUT_MS, limit, signal });
      if (compiled.exitCode !== 0) {
        const skipped = { exitCode: null, signal: null, stdout: '', stderr: '', durationMs: 0, truncated: false, timedOut: false, oomKilled: false };
        return { ...skipped, cpuMs: 0, peakMemoryKiB: 0, compile: compiled };
      }
    }
    const argv = spec.argv ?? (def ? def.argv(spec.code ?? '') : ['/bin/sh', '-c', spec.code ?? '']);
    const step = await this.runStep(sb, {
      argv,
      env,
      timeoutMs: spec.timeoutMs ?? DEFAULT_CALL_TIMEOUT_MS,
      limit,
      signal,
      ...(useWarm ? { warm: warm.att, input: warmPythonInput(spec.code ?? '', spec.stdin) } : spec.stdin !== undefined ? { stdin: spec.stdin } : {}),
    });
    const result: CallResult = { ...step, ...(compiled ? { compile: compiled } : {}) };
    if (spec.fetchFiles?.length) result.files = await this.fetchFiles(agent, spec.fetchFiles, base64);
    return result;
  }

  /** The files asked for, from the sandbox after the run (relative paths under /work); missing ones left out. */
  private async fetchFiles(agent: ChronusClient, names: readonly string[], base64: boolean): Promise<Record<string, string>> {
    const out: Record<string, string> = {};
    for (const name of names) {
      const file = path.posix.resolve(CALL_WORKDIR, name);
      const data = await agent.readFile(file, { maxBytes: MAX_FETCH_FILE_BYTES }).catch(() => undefined);
      if (data !== undefined) out[name] = base64 ? data.toString('base64') : data.toString('utf8');
    }
    return out;
  }

  /** Runs one process of a call to its end (or its time limit, or an output overflow). */
  private async runStep(
    sb: WarmSandbox,
    o: {
      argv: string[];
      env: Record<string, string>;
      timeoutMs: number;
      limit: number;
      stdin?: string;
      /** A warm interpreter to run in instead of a new process, and what to write to it (warm-python.ts). */
      warm?: Attachment;
      input?: Buffer;
      /** Kills the process when it aborts. */
      signal?: AbortSignal | undefined;
    },
  ): Promise<CallStepResult & { cpuMs: number; peakMemoryKiB: number }> {
    const { agent } = sb;
    const { argv, timeoutMs, limit } = o;
    const started = performance.now();
    let att: Attachment;
    try {
      att =
        o.warm ??
        (await agent.spawn({
          argv,
          env: o.env,
          cwd: CALL_WORKDIR,
          uid: CALL_UID,
          gid: CALL_UID,
          stdin: o.stdin !== undefined,
          timeoutMs,
        }));
    } catch (err) {
      // A command that cannot be started is the caller's result, as in a shell.
      if (err instanceof DsecError && (err.code === 'FILE_NOT_FOUND' || err.code === 'PERMISSION_DENIED')) {
        const exitCode = err.code === 'FILE_NOT_FOUND' ? 127 : 126;
        return {
          exitCode,
          signal: null,
          stdout: '',
          stderr: `${argv[0]}: ${err.message}\n`,
          durationMs: 0,
          cpuMs: 0,
          peakMemoryKiB: 0,
          truncated: false,
          timedOut: false,
          oomKilled: false,
        };
      }
      throw err;
    }
    const out = { stdout: [] as Buffer[], stderr: [] as Buffer[] };
    const size = { stdout: 0, stderr: 0 };
    let truncated = false;
    let hardKilled = false;
    const killSandbox = (): void => {
      hardKilled = true;
      sb.killed = true;
      void this.crun.run(['kill', '--all', sb.id, 'KILL']).catch(() => undefined);
    };
    let overflowTimer: NodeJS.Timeout | undefined;
    att.onOutput((ev) => {
      if (ev.kind !== 'data') return;
      const room = limit - size[ev.stream];
      const chunk = ev.data.length > room ? ev.data.subarray(0, Math.max(0, room)) : ev.data;
      if (chunk.length > 0) {
        out[ev.stream].push(chunk);
        size[ev.stream] += chunk.length;
      }
      if (chunk.length < ev.data.length && !truncated) {
        truncated = true;
        void att.kill('SIGKILL').catch(() => undefined);
        overflowTimer = setTimeout(killSandbox, OVERFLOW_KILL_GRACE_MS);
      }
    });
    const deadline = setTimeout(killSandbox, timeoutMs + HARD_KILL_GRACE_MS);
    // A warm interpreter was started without a time limit: the edge times the call from here,
    // as chronus does from a spawn, and kills its process group at the limit.
    let warmTimedOut = false;
    const warmLimit = o.warm
      ? setTimeout(() => {
          warmTimedOut = true;
          void att.kill('SIGKILL').catch(() => undefined);
        }, timeoutMs)
      : undefined;
    const abort = (): void => void att.kill('SIGKILL').catch(() => undefined);
    if (o.signal?.aborted) abort();
    else o.signal?.addEventListener('abort', abort, { once: true });
    let exit: AgentExit | undefined;
    try {
      if (o.input !== undefined) await att.write(o.input, true).catch(() => undefined);
      else if (o.stdin !== undefined) await att.write(o.stdin, true).catch(() => undefined);
      exit = await att.exited.catch(() => undefined);
    } finally {
      clearTimeout(deadline);
      clearTimeout(overflowTimer);
      clearTimeout(warmLimit);
      o.signal?.removeEventListener('abort', abort);
    }
    const wallMs = Math.round(performance.now() - started);
    const killed = exit === undefined || exit.signal === 'SIGKILL' || exit.exitCode === 137;
    const timedOut = exit?.timedOut === true || (warmTimedOut && killed && !truncated) || (hardKilled && !truncated && wallMs >= timeoutMs);
    const oomKilled = killed && !timedOut && !truncated && (await this.o.cgroups.oomKills(sb.id)) > sb.oomBase;
    return {
      exitCode: exit ? exit.exitCode : null,
      signal: exit ? exit.signal : 'SIGKILL',
      stdout: Buffer.concat(out.stdout).toString('utf8'),
      stderr: Buffer.concat(out.stderr).toString('utf8'),
      // A warm interpreter's run began when its code was written, not when it was started.
      durationMs: exit && !o.warm ? exit.durationMs : wallMs,
      cpuMs: exit ? exit.cpuUserMs + exit.cpuSysMs : 0,
      peakMemoryKiB: exit ? exit.peakMemoryKiB : 0,
      truncated,
      timedOut,
      oomKilled,
    };
  }

  private async sweepIdlePools(): Promise<void> {
    for (const [key, entry] of [...this.pools]) {
      if (entry.pool.idleMs < POOL_IDLE_MS) continue;
      this.pools.delete(key);
      await entry.pool.close();
      await this.releaseRoot(entry.root).catch(() => undefined);
    }
  }

  /** Destroys every pooled sandbox and unmounts every root (calls do not outlive the edge). */
  async close(): Promise<void> {
    this.closed = true;
    clearInterval(this.sweeper);
    await this.builds.close();
    for (const [key, entry] of [...this.pools]) {
      this.pools.delete(key);
      await entry.pool.close();
    }
    while (this.destroying.size > 0) await Promise.allSettled([...this.destroying]);
    await this.resetter?.server.close();
    for (const root of [...this.roots.values()]) {
      root.users = 1;
      await this.releaseRoot(root).catch(() => undefined);
    }
  }
}

function hostNofileHard(): number {
  try {
    const limits = readFileSync('/proc/self/limits', 'utf8');
    const hard = limits
      .split('\n')
      .find((l) => l.startsWith('Max open files'))
      ?.trim()
      .split(/\s+/)[4];
    return hard && hard !== 'unlimited' ? Number(hard) : 1_048_576;
  } catch {
    return 1_048_576;
  }
}

/** Whether a pool's sandboxes get a warm python3: it served a call that could use one in the last {@link POOL_IDLE_MS}. */
function wantsWarmPython(entry: PoolEntry): boolean {
  return entry.lastWarmCallAt > 0 && Date.now() - entry.lastWarmCallAt < POOL_IDLE_MS;
}

/** The environment of a call of a runtime before the call's own variables. */
function callEnv(runtime: CallRequest['runtime']): Record<string, string> {
  return { PATH: CALL_PATH, HOME: CALL_WORKDIR, LANG: 'C.UTF-8', ...(runtime !== undefined ? RUNTIMES[runtime].env : undefined) };
}
