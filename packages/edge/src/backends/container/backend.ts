// The container backend: crun on an overlay of EROFS layers, chronus as PID 1.
import { readFileSync, writeFileSync } from 'node:fs';
import { mkdir, readdir, readFile, rm, rmdir, statfs, writeFile, rename } from 'node:fs/promises';
import path from 'node:path';
import { DEFAULT_DISK_MIB, DsecError, crashPoint, invalidArgument } from '@dsec/protocol';
import type { EventSink, SandboxClaim, SandboxStats } from '@dsec/protocol';
import type {
  Backend,
  BackendCreateRequest,
  BackendPauseResult,
  BackendResumeResult,
  BackendSandbox,
  CounterFacet,
  GarbageFacet,
  GarbageOptions,
  GarbageReport,
  HostProcessFacet,
  NetworkFacet,
  PauseFacet,
  SandboxAgent,
  WritableLayerFacet,
  ProtectedPathFacet,
} from '../../backend.js';
import { ChronusClient } from '../../chronus/client.js';
import type { Cgroups, MemorySettings } from '../../host/cgroups.js';
import type { IdRange, IdRanges } from '../../host/id-ranges.js';
import { MNT, umount, mountsUnder } from '../../sys/linux.js';
import { buildOciConfig } from './bundle.js';
import type { SeccompProfile } from './seccomp.js';
import { Crun, processRunning, processStartTime } from './crun.js';
import type { LaunchServer } from './launcher.js';
import { SeccompCache } from './seccomp-cache.js';

/** What the container backend needs from the layer store. */
export interface LayerMounter {
  /** Mounts a layer once per node (reference counted) and returns its directory. */
  acquire(digest: string): Promise<string>;
  release(digest: string): Promise<void>;
  /** The directory of a layer while it is acquired (what `acquire` returned). */
  mountDir(digest: string): string;
}

/** Default bytes of output chronus keeps per stream. */
export const DEFAULT_OUTPUT_CAP_BYTES = 4 * 1024 * 1024;
/** mount(2) copies at most one page of options. */
const MAX_MOUNT_OPTION_BYTES = 4096;
/** Inodes per MiB of writable layer. */
const INODES_PER_MIB = 256;

/** Options of {@link ContainerBackend}. */
export interface ContainerBackendOptions {
  /** Directory holding one folder per sandbox. */
  sandboxesDir: string;
  /** crun's state root. */
  crunRoot: string;
  /** argv prefix that enters the runtime mount namespace. */
  runtimePrefix: string[];
  /** The runtime mount namespace's nsfs file. */
  runtimeNsFile: string;
  /**
   * Host directory (on a private mount, outside the state directory's shared mount) where each
   * sandbox's writable-layer tmpfs is mounted, one folder per sandbox.
   */
  writableDir: string;
  /**
   * Host directory of the sandboxes' root mount points (mode 0711): in a user namespace crun
   * sets up the root as the sandbox's root user, who must be able to reach it, and the state
   * directory stays closed (0700).
   */
  rootsDir: string;
  /** The node's launch server (`BackendHost.launcher`, shared with the call runner; closed by the edge). */
  launcher: LaunchServer;
  /** The node's mark (`BackendHost.nodeMark`): the source of each sandbox's root overlay. */
  nodeMark: string;
  layers: LayerMounter;
  cgroups: Cgroups;
  /** Host path of the static chronus binary. */
  agentBinary: string;
  outputCapBytes?: number;
  crunBinary?: string;
  /**
   * Host id ranges for user namespaces: each sandbox runs in one of its own, root inside being
   * an unprivileged uid on the host. Without it sandboxes share the host's ids (root is root,
   * held back by capabilities, seccomp and namespaces only).
   */
  idRanges?: IdRanges;
  /** Replaces the default seccomp profile (tests of the fail-closed path). */
  seccompProfile?: (spec: BackendCreateRequest['spec']) => SeccompProfile;
  /** Where the backend raises events (a forged or malformed agent message). */
  events?: EventSink;
}

/** An empty cgroup of an unknown sandbox is removed once it is this old (a create may be filling it). */
export const EMPTY_CGROUP_GRACE_MS = 60_000;

/** The file in a sandbox's folder where dsec-rofs logs the changes to read-only protected paths it refused. */
const REFUSAL_LOG = 'refused-writes.log';
/** Where dsec-launch records that server: "<pid> <start time>" (named after the log). */
const ROFS_SERVER = `${REFUSAL_LOG}.pid`;

/** Exit status of dsec-launch when a protected path cannot be protected (a symlink, a device). */
const LAUNCH_EXIT_BAD_PROTECT = 3;
/** Exit status of dsec-launch when the image cannot be a root (its /dev is a symlink or a file). */
const LAUNCH_EXIT_BAD_IMAGE = 4;
/** Exit status of `dsec-launch --reprotect` when it will not: another process, or a mount that still answers. */
const LAUNCH_EXIT_REFUSED = 5;

interface Paths {
  dir: string;
  rw: string;
  upper: string;
  work: string;
  /**
   * An empty directory of the writable tmpfs (made by dsec-launch, outside the upper directory),
   * bound read-only over the masked directories: each sandbox its own, in no new superblock.
   */
  mask: string;
  rootfs: string;
  socket: string;
  record: string;
  /** Env and labels of the claim of a pooled sandbox (absent for the others). */
  claim: string;
  log: string;
  /** Present while the sandbox is paused: the memory settings to put back on resume. */
  paused: string;
  /** dsec-rofs's log of refused changes to read-only protected paths. */
  refused: string;
}

/** Container sandboxes: crun + overlayfs over shared EROFS layer mounts + chronus. */
export class ContainerBackend implements Backend {
  readonly kind = 'container' as const;
  private readonly crun: Crun;
  /** One dsec-launch server for every create (no fork of this process per create). */
  private readonly launcher: LaunchServer;
  /** Compiled seccomp programs by profile: crun compiles each profile once per edge process. */
  private readonly seccomp: SeccompCache;
  private readonly agents = new Map<string, ChronusClient>();
  private readonly connecting = new Map<string, Promise<ChronusClient>>();
  private readonly hostNofileHard: number;

  /** Pause and resume through the cgroup freezer, memory reclaimed to (zram) swap. */
  readonly pausing: PauseFacet;
  /** The memory cgroup's OOM kills and the pids cgroup's refused forks. */
  readonly counters: CounterFacet;
  /** The cgroup's processes. */
  readonly hostProcesses: HostProcessFacet;
  /** The overlay's upper directory on the sandbox's writable tmpfs. */
  readonly writableLayer: WritableLayerFacet = this;
  readonly protectedPaths: ProtectedPathFacet = {
    refusalLog: (id) => this.paths(id).refused,
    serving: (id) => {
      let text: string;
      try {
        text = readFileSync(path.join(this.paths(id).dir, ROFS_SERVER), 'utf8');
      } catch {
        return undefined;
      }
      const [pid, start] = text.trim().split(' ').map(Number);
      return pid !== undefined && pid > 0 && start !== undefined && processRunning(pid, start);
    },
    restart: (id) => this.restartProtectedServer(id),
  };
  /** crun gives every container a network namespace of its own. */
  readonly network: NetworkFacet = this;
  readonly garbage: GarbageFacet = this;

  constructor(private readonly o: ContainerBackendOptions) {
    this.crun = new Crun(o.runtimePrefix, o.crunRoot, o.crunBinary);
    this.launcher = o.launcher;
    this.seccomp = new SeccompCache(o.crunRoot);
    this.hostNofileHard = hostNofileHard();
    const cg = o.cgroups;
    this.pausing = {
      pause: (id) => this.pause(id),
      resume: (id, opts) => this.resume(id, opts),
      memory: (id) => cg.memory(id),
      freeze: (id) => cg.freeze(id),
      thaw: (id) => cg.thaw(id),
      isFrozen: (id) => cg.isFrozen(id),
    };
    this.counters = {
      read: async (id) => {
        const [oomKills, pidsLimitHits] = await Promise.all([cg.oomKills(id), cg.pidsLimitHits(id)]);
        return { oomKills, pidsLimitHits };
      },
      readNow: (id) => ({ oomKills: cg.oomKillsSync(id), pidsLimitHits: cg.pidsLimitHitsSync(id) }),
    };
    this.hostProcesses = { countNow: (id) => cg.pidsCurrentSync(id), hostPids: (id) => cg.procs(id) };
  }

  private paths(id: string): Paths {
    const dir = path.join(this.o.sandboxesDir, id);
    return {
      dir,
      rw: path.join(this.o.writableDir, id),
      upper: path.join(this.o.writableDir, id, 'upper'),
      work: path.join(this.o.writableDir, id, 'work'),
      mask: path.join(this.o.writableDir, id, 'mask'),
      rootfs: path.join(this.o.rootsDir, id),
      socket: path.join(dir, 'agent.sock'),
      record: path.join(dir, 'sandbox.json'),
      claim: path.join(dir, 'claim.json'),
      log: path.join(dir, 'runtime.log'),
      refused: path.join(dir, REFUSAL_LOG),
      paused: path.join(dir, 'paused.json'),
    };
  }

  async create(req: BackendCreateRequest, signal?: AbortSignal): Promise<BackendSandbox> {
    const p = this.paths(req.id);
    const undo: Array<() => unknown> = [];
    try {
      await mkdir(p.dir, { recursive: false }).catch((err: unknown) => {
        if ((err as NodeJS.ErrnoException).code === 'EEXIST') throw new DsecError('CONFLICT', `sandbox ${req.id} already exists`, { sandboxId: req.id });
        throw err;
      });
      undo.push(() => rm(p.dir, { recursive: true, force: true }));

      // Layers: bottom first in the request, top first in overlayfs's lowerdir.
      const lowers: string[] = [];
      for (const layer of req.layers) {
        lowers.unshift(await this.o.layers.acquire(layer.digest));
        undo.push(() => this.o.layers.release(layer.digest));
      }
      signal?.throwIfAborted();
      // mount(2) takes at most one page of options: a deep stack (toolkits and a long snapshot
      // chain under a long state path) must be refused here, not fail inside dsec-launch.
      const optionBytes = Buffer.byteLength(`lowerdir=${lowers.join(':')},upperdir=${p.upper},workdir=${p.work}`);
      if (optionBytes >= MAX_MOUNT_OPTION_BYTES) {
        throw new DsecError(
          'INVALID_ARGUMENT',
          `image: ${lowers.length} layers do not fit in one overlay mount (${optionBytes} bytes of options, at most ${MAX_MOUNT_OPTION_BYTES - 1})`,
          { field: 'image' },
        );
      }

      // The writable layer is a size-limited tmpfs (writing past diskMiB fails with ENOSPC
      // inside the sandbox, and nothing outside it is touched) under an overlay of the layers.
      // dsec-launch mounts the tmpfs on the host (edge reads its upper directory for snapshots
      // and diffs) and the overlay in a mount namespace of the sandbox's own, right before crun.
      const diskMiB = req.spec.resources?.diskMiB ?? DEFAULT_DISK_MIB;
      let idRange: IdRange | undefined;
      if (this.o.idRanges) {
        const ranges = this.o.idRanges;
        const claimed = await ranges.allocate(req.id);
        idRange = claimed;
        undo.push(() => ranges.release(claimed, req.id));
      }
      await mkdir(p.rw);
      undo.push(() => this.unmountWritable(p.rw));
      await mkdir(p.rootfs);
      undo.push(() => rmdir(p.rootfs));
      const launch = [
        '--ns',
        this.o.runtimeNsFile,
        '--rw',
        p.rw,
        '--tmpfs',
        `size=${diskMiB}m,nr_inodes=${Math.max(1024, diskMiB * INODES_PER_MIB)},mode=0700`,
        '--rootfs',
        p.rootfs,
        '--lower',
        lowers.join(':'),
        '--source',
        this.o.nodeMark,
        ...(idRange ? ['--idmap', `${idRange.uid}:${idRange.gid}:${idRange.size}`, '--loginuid', String(idRange.uid)] : []),
        ...readOnlyPaths(req.spec.protect?.readOnly ?? []).flatMap((p) => ['--protect', p]),
        ...(req.spec.protect?.readOnly?.length ? ['--protect-log', p.refused] : []),
        '--',
      ];

      const config = buildOciConfig({
        id: req.id,
        spec: req.spec,
        rootfs: p.rootfs,
        agentBinary: this.o.agentBinary,
        maskDir: p.mask,
        writableDev: true,
        cgroupsPath: this.o.cgroups.pathFor(req.id),
        outputCapBytes: this.o.outputCapBytes ?? DEFAULT_OUTPUT_CAP_BYTES,
        hostNofileHard: this.hostNofileHard,
        ...(this.o.cgroups.mode !== 'v2' ? { swappiness: 0 } : {}),
        ...(idRange ? { idRange } : {}),
        ...(this.o.seccompProfile ? { seccomp: this.o.seccompProfile(req.spec) } : {}),
      });
      const seccompKey = this.seccomp.apply(config);
      await writeFile(path.join(p.dir, 'config.json'), JSON.stringify(config));
      const record: BackendSandbox = {
        id: req.id,
        backend: 'container',
        spec: req.spec,
        layers: req.layers,
        createdAt: new Date().toISOString(),
        ...(idRange ? { idRange } : {}),
      };
      await writeJsonAtomic(p.record, record);
      signal?.throwIfAborted();

      // The agent's socket lives on the host, outside the sandbox's file system; the launcher
      // makes it (chronus inherits the listening fd) and edge connects to the path, as often
      // as it needs.
      undo.push(() => this.crun.run(['delete', '--force', req.id]));
      crashPoint('container.create.bundle');
      const code = await this.launcher.run({
        log: p.log,
        socket: p.socket,
        args: [...launch, ...this.crun.argv(['run', '--detach', '--preserve-fds', '1', '--bundle', p.dir, req.id])],
      });
      if (code !== 0) {
        const detail = (await readFile(p.log, 'utf8').catch(() => '')).trim();
        const refused = /^dsec-launch: protect (.*)$/m.exec(detail);
        if (code === LAUNCH_EXIT_BAD_PROTECT && refused) throw invalidArgument('protect.readOnly', refused[1] ?? 'cannot be protected');
        const badImage = /^dsec-launch: image: (.*)$/m.exec(detail);
        if (code === LAUNCH_EXIT_BAD_IMAGE && badImage) throw invalidArgument('image', badImage[1] ?? 'cannot be a sandbox root');
        const why = detail ? detail.split('\n').slice(-3).join('; ') : `exit ${code}`;
        throw new DsecError('BACKEND_FAILED', `create ${req.id}: crun run failed: ${why}`, { sandboxId: req.id });
      }
      crashPoint('container.create.started');
      if (seccompKey) await this.seccomp.learn(seccompKey, req.id);
      const agent = await this.agent(req.id);
      await agent.ping();
      return record;
    } catch (err) {
      this.dropAgent(req.id);
      for (const step of undo.reverse()) {
        await Promise.resolve()
          .then(step)
          .catch(() => undefined);
      }
      await this.o.cgroups.remove(req.id);
      throw err;
    }
  }

  /**
   * A new server for a running sandbox's read-only protected paths, its FUSE mounts stacked on
   * the dead ones inside the sandbox's mount namespace (dsec-launch --reprotect).
   */
  private async restartProtectedServer(id: string): Promise<void> {
    const p = this.paths(id);
    const record = JSON.parse(await readFile(p.record, 'utf8')) as BackendSandbox;
    const paths = readOnlyPaths(record.spec.protect?.readOnly ?? []);
    const init = await this.crun.initProcess(id);
    if (paths.length === 0 || !init?.startTime) throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${id} is not running`, { sandboxId: id });
    const lowers = (record.layers ?? []).map((l) => this.o.layers.mountDir(l.digest)).reverse();
    const code = await this.launcher.run({
      log: p.log,
      socket: '',
      args: [
        '--reprotect',
        `${init.pid}:${init.startTime}`,
        '--upper',
        p.upper,
        '--lower',
        lowers.join(':'),
        ...(record.idRange ? ['--idmap', `${record.idRange.uid}:${record.idRange.gid}:${record.idRange.size}`] : []),
        ...paths.flatMap((q) => ['--protect', q]),
        '--protect-log',
        p.refused,
      ],
    });
    if (code !== 0) {
      const detail = (await readFile(p.log, 'utf8').catch(() => '')).trim().split('\n').slice(-2).join('; ');
      // A refusal is final (CONFLICT); anything else, a killed launch included, may pass.
      const refused = code === LAUNCH_EXIT_REFUSED || code === LAUNCH_EXIT_BAD_PROTECT;
      throw new DsecError(
        refused ? 'CONFLICT' : 'BACKEND_FAILED',
        `sandbox ${id}: the protected-path server could not be restarted: ${detail || `exit ${code}`}`,
        {
          sandboxId: id,
        },
      );
    }
  }

  async recover(): Promise<BackendSandbox[]> {
    const found: BackendSandbox[] = [];
    const entries = await readdir(this.o.sandboxesDir).catch(() => [] as string[]);
    // Writable layers whose sandbox folder is gone (an edge that died mid-create or mid-destroy).
    const known = new Set(entries);
    for (const id of await readdir(this.o.writableDir).catch(() => [] as string[])) {
      if (!known.has(id)) await this.unmountWritable(path.join(this.o.writableDir, id));
    }
    for (const id of entries) {
      const p = this.paths(id);
      let record: BackendSandbox;
      try {
        record = JSON.parse(await readFile(p.record, 'utf8')) as BackendSandbox;
      } catch {
        await this.teardown(id, []);
        continue;
      }
      const status = await this.crun.status(id);
      if (status === 'paused') {
        // Paused (its memory settings are kept for the resume), or frozen by a snapshot that
        // ended with the previous edge: that one runs again.
        if (
          await readFile(p.paused).then(
            () => true,
            () => false,
          )
        )
          record.paused = true;
        else await this.o.cgroups.thaw(id).catch(() => undefined);
      } else if (status !== 'running') {
        // Its processes are gone (the node rebooted or PID 1 died): the sandbox is lost.
        await this.teardown(id, [], record.idRange);
        continue;
      }
      // Its layers are still mounted; take this process's references on them again.
      for (const layer of record.layers) await this.o.layers.acquire(layer.digest);
      const claim = await readFile(p.claim, 'utf8').then(
        (t) => JSON.parse(t) as SandboxClaim,
        () => undefined,
      );
      found.push(claim ? { ...record, spec: { ...record.spec, ...claim } } : record);
    }
    // Ranges this node claimed for sandboxes that did not survive (a crash mid-create).
    await this.o.idRanges?.reconcile(new Set(found.map((r) => r.id)));
    return found;
  }

  agent(id: string): Promise<SandboxAgent> {
    return this.connect(id);
  }

  connectAgent(id: string): Promise<SandboxAgent> {
    return ChronusClient.connect(this.paths(id).socket, { onProtocolError: this.forged(id) });
  }

  /** Raises control.forged-message when the agent's side of a connection breaks the protocol. */
  private forged(id: string): (message: string) => void {
    return (message) =>
      this.o.events?.({
        kind: 'control.forged-message',
        severity: 'critical',
        sandboxId: id,
        message: `sandbox ${id}: ${message}`,
        data: { channel: 'agent socket' },
      });
  }

  private async connect(id: string): Promise<ChronusClient> {
    const live = this.agents.get(id);
    if (live?.connected) return live;
    let pending = this.connecting.get(id);
    if (!pending) {
      pending = ChronusClient.connect(this.paths(id).socket, { onProtocolError: this.forged(id) })
        .then((client) => {
          this.agents.set(id, client);
          return client;
        })
        .finally(() => this.connecting.delete(id));
      this.connecting.set(id, pending);
    }
    return pending;
  }

  private dropAgent(id: string): void {
    this.agents.get(id)?.close();
    this.agents.delete(id);
  }

  async destroy(id: string): Promise<void> {
    const p = this.paths(id);
    let record: BackendSandbox;
    try {
      record = JSON.parse(await readFile(p.record, 'utf8')) as BackendSandbox;
    } catch {
      throw new DsecError('SANDBOX_NOT_FOUND', `no sandbox ${id} on this node`, { sandboxId: id });
    }
    await this.teardown(
      id,
      record.layers.map((l) => l.digest),
      record.idRange,
    );
  }

  /** Removes every trace of a sandbox; safe to call on a half-created or already-gone one. */
  private async teardown(id: string, digests: string[], idRange?: IdRange): Promise<void> {
    const p = this.paths(id);
    this.dropAgent(id);
    if (!(await this.crun.end(id, this.o.cgroups))) {
      // Something outlived the kill (or its cgroup cannot go): crun's own delete, as before.
      const res = await this.crun.run(['delete', '--force', id]);
      if (res.code !== 0 && (await this.crun.status(id)) !== undefined) {
        throw new DsecError('BACKEND_FAILED', `destroy ${id}: ${res.stderr.trim()}`, { sandboxId: id });
      }
      await this.o.cgroups.killAll(id);
      await this.o.cgroups.remove(id);
    }
    // (crun.end removed the cgroups and checked that none is left.)
    crashPoint('container.destroy.ended');
    await this.unmountWritable(p.rw);
    await rmdir(p.rootfs).catch(() => undefined);
    crashPoint('container.destroy.unmounted');
    for (const d of digests) await this.o.layers.release(d);
    await removeSandboxDir(p.dir);
    // Last: the range is free only once nothing of the sandbox holds its ids.
    if (idRange) await this.o.idRanges?.release(idRange, id);
  }

  /** Unmounts and removes a writable layer's folder; a no-op when it is not there. */
  private async unmountWritable(rw: string): Promise<void> {
    // Without reading the mount table (it holds one tmpfs per sandbox): unmount until nothing is left.
    for (let i = 0; i < 4 && umount(rw, MNT.DETACH); i++);
    await rm(rw, { recursive: true, force: true });
  }

  /** Host path of a sandbox's upper directory (its changes over the layers, with whiteouts). */
  upperDir(id: string): string {
    return this.paths(id).upper;
  }

  /** Freezes the container (cgroup freezer), then reclaims its memory (see Cgroups.reclaim). */
  async pause(id: string): Promise<BackendPauseResult> {
    const p = this.paths(id);
    await this.o.cgroups.freeze(id);
    try {
      const r = await this.o.cgroups.reclaim(id);
      await writeJsonAtomic(p.paused, r.restore);
      return { memoryBeforeBytes: r.beforeBytes, memoryAfterBytes: r.afterBytes, swapBytes: r.swapBytes };
    } catch (err) {
      await this.o.cgroups.thaw(id).catch(() => undefined);
      throw err;
    }
  }

  /** Puts the memory settings back, thaws, and prefetches swapped-out process memory. */
  async resume(id: string, opts: { prefetch?: boolean } = {}): Promise<BackendResumeResult> {
    const p = this.paths(id);
    const before = await this.o.cgroups.memory(id);
    const settings = await readFile(p.paused, 'utf8').then(
      (t) => JSON.parse(t) as MemorySettings,
      () => ({}),
    );
    await this.o.cgroups.restoreMemory(id, settings);
    await this.o.cgroups.thaw(id);
    await rm(p.paused, { force: true });
    if (opts.prefetch !== false) await this.o.cgroups.prefetch(id);
    const after = await this.o.cgroups.memory(id);
    return { memoryBeforeBytes: before.usageBytes, memoryAfterBytes: after.usageBytes, swapBytes: after.swapBytes };
  }

  async stats(id: string): Promise<SandboxStats> {
    const cg = await this.o.cgroups.stats(id);
    const fs = await statfs(this.paths(id).rw);
    return { ...cg, diskUsedBytes: (fs.blocks - fs.bfree) * fs.bsize, diskLimitBytes: fs.blocks * fs.bsize };
  }

  async claim(id: string, claim: SandboxClaim): Promise<void> {
    // A file of its own, created once and written in one call: no rename over sandbox.json
    // (ext4 flushes on that). Synchronous: a claim waits on it, and a small write costs less
    // than the thread-pool round trips of the asynchronous calls on a busy node.
    try {
      writeFileSync(this.paths(id).claim, JSON.stringify(claim), { flag: 'wx', mode: 0o600 });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'EEXIST') throw new DsecError('CONFLICT', `sandbox ${id} was already claimed`, { sandboxId: id });
      throw err;
    }
  }

  /**
   * Removes what sandboxes nobody knows left on this node: runtime containers, cgroups (and
   * the processes in them), mounts and folders. An edge that crashed, or lost its state, leaves
   * them; `Edge.open` and the watcher's passes call this with the live sandboxes in `keep`.
   */
  async collectGarbage(o: GarbageOptions): Promise<GarbageReport> {
    const report: GarbageReport = { containers: [], cgroups: [], processes: 0, mounts: 0, dirs: [] };
    const dirs = new Set(await readdir(this.o.sandboxesDir).catch(() => [] as string[]));
    const containers = new Set(await readdir(this.o.crunRoot).catch(() => [] as string[]));
    const ids = new Set([...dirs, ...containers, ...(await this.o.cgroups.list())]);
    for (const id of ids) {
      if (o.keep(id) || (id.startsWith('fn-') && !o.calls)) continue;
      const ours = dirs.has(id) || containers.has(id);
      if (containers.has(id)) {
        this.dropAgent(id);
        const res = await this.crun.run(['delete', '--force', id]);
        if (res.code === 0 || (await this.crun.status(id)) === undefined) report.containers.push(id);
      }
      if ((await this.o.cgroups.existing(id)).length > 0) {
        const pids = await this.o.cgroups.procs(id);
        let remove = ours;
        if (!remove && pids.length > 0) remove = await ownedBy(pids, o.ownerMark);
        if (!remove && pids.length === 0) remove = (await this.o.cgroups.ageMs(id)) >= EMPTY_CGROUP_GRACE_MS;
        if (remove) {
          report.processes += await this.o.cgroups.killAll(id);
          await this.o.cgroups.remove(id);
          if ((await this.o.cgroups.existing(id)).length === 0) report.cgroups.push(id);
        }
      }
      if (dirs.has(id)) {
        const dir = this.paths(id).dir;
        for (const m of await mountsUnder(dir)) {
          umount(m, MNT.DETACH);
          report.mounts++;
        }
        await rm(dir, { recursive: true, force: true });
        report.dirs.push(id);
      }
    }
    return report;
  }

  /**
   * The network namespace of the sandbox's PID 1 (crun gave it a fresh one), from crun's state
   * file; the start time guards against a reused PID.
   */
  async netnsPath(id: string): Promise<string> {
    const init = await this.crun.initProcess(id);
    if (!init) throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${id} has no running container`, { sandboxId: id });
    const startTime = processStartTime(init.pid);
    if (startTime === undefined || (init.startTime !== undefined && startTime !== init.startTime)) {
      throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${id} is not running`, { sandboxId: id });
    }
    return `/proc/${init.pid}/ns/net`;
  }

  async close(): Promise<void> {
    for (const id of [...this.agents.keys()]) this.dropAgent(id);
    this.o.cgroups.closeCounterFiles();
  }
}

/** True when one of the processes has a mount whose source is `mark` (its root overlay: dsec-launch's `--source`). */
async function ownedBy(pids: number[], mark: string): Promise<boolean> {
  for (const pid of pids.slice(0, 8)) {
    const info = await readFile(`/proc/${pid}/mountinfo`, 'utf8').catch(() => '');
    if (info.split('\n').some((line) => line.split(' - ')[1]?.split(' ')[1] === mark)) return true;
  }
  return false;
}

/**
 * The read-only paths dsec-launch mounts: sorted, without duplicates and without paths below
 * another one (a read-only directory already covers everything under it).
 */
export function readOnlyPaths(paths: readonly string[]): string[] {
  const sorted = [...new Set(paths)].sort();
  return sorted.filter((p) => !sorted.some((q) => q !== p && p.startsWith(q + '/')));
}

async function writeJsonAtomic(file: string, value: unknown): Promise<void> {
  const tmp = `${file}.tmp`;
  await writeFile(tmp, JSON.stringify(value));
  await rename(tmp, file);
}

function hostNofileHard(): number {
  try {
    const limits = readFileSync('/proc/self/limits', 'utf8');
    const line = limits.split('\n').find((l) => l.startsWith('Max open files'));
    const hard = line?.trim().split(/\s+/)[4];
    return hard && hard !== 'unlimited' ? Number(hard) : 1_048_576;
  } catch {
    return 1_048_576;
  }
}

/** The files a container sandbox's folder holds (the bundle, the agent socket, its records). */
const SANDBOX_DIR_FILES = new Set(['config.json', 'sandbox.json', 'claim.json', 'paused.json', 'runtime.log', 'agent.sock', REFUSAL_LOG]);

/**
 * Removes a sandbox's folder. Nothing is mounted under it on the host (the root file system is
 * mounted in the sandbox's own namespace, the writable layer under the writable folder), so the
 * known files are unlinked and the folder removed without reading the node's mount table, which
 * holds a mount per sandbox (reading it per destroy made a teardown of N sandboxes O(N^2)). Only
 * a folder holding something else (a directory, say) goes the careful way: unmount what is
 * under it, then remove it recursively.
 */
async function removeSandboxDir(dir: string): Promise<void> {
  const entries = await readdir(dir, { withFileTypes: true }).catch(() => undefined);
  if (!entries) return;
  if (entries.every((e) => !e.isDirectory() && SANDBOX_DIR_FILES.has(e.name))) {
    await Promise.all(entries.map((e) => rm(path.join(dir, e.name), { force: true })));
    if (
      await rmdir(dir).then(
        () => true,
        () => false,
      )
    )
      return;
  }
  for (const m of await mountsUnder(dir)) umount(m, MNT.DETACH);
  await rm(dir, { recursive: true, force: true });
}
