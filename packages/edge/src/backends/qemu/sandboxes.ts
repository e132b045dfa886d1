// What every QEMU backend (microVM, full VM) does alike with its sandboxes: starting QEMU
// confined and waiting for its guest, the agent connections over virtio-serial, claims, the crash
// watch, destroy and teardown, adoption by a restarted edge, garbage collection, the network
// namespace. A backend adds what its machine is (`machine`: QEMU's arguments and descriptors).
import type { ChildProcess } from 'node:child_process';
import { constants as fsConstants } from 'node:fs';
import { mkdir, open, readFile, readdir, rm, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import type { FileHandle } from 'node:fs/promises';
import { DEFAULT_CPU, DEFAULT_MEMORY_MIB, DsecError, crashPoint } from '@dsec/protocol';
import type { EventSink, SandboxClaim } from '@dsec/protocol';
import type {
  BackendPauseResult,
  BackendResumeResult,
  BackendSandbox,
  GarbageFacet,
  GarbageOptions,
  GarbageReport,
  MemoryForkFacet,
  MemoryImage,
  PauseFacet,
  SandboxAgent,
} from '../../backend.js';
import { withTimeout } from '../../abortable.js';
import { ChronusClient } from '../../chronus/client.js';
import type { Cgroups } from '../../host/cgroups.js';
import type { IdRanges } from '../../host/id-ranges.js';
import { killQemu, qemuPid, watchQemu } from './lifecycle.js';
import { copySavedState, copySparse, INCOMING_ARGS, readSavedState, removeSavedState, restoreState, saveState, writeSavedManifest } from './migration.js';
import type { SavedState } from './migration.js';
import { netnsName, removeVmNetns } from './network.js';
import { startQemu } from './process.js';
import { QmpClient } from './qmp.js';
import { connectRetrying, connectUnix } from './sockets.js';

/** What a fork's shape check reads of a create request or a record. */
type BackendCreateShape = Pick<BackendSandbox, 'spec' | 'layers'>;
/** A fork with memory as its shape check sees it. */
type ForkShape = BackendCreateShape & { id: string };

/** Default pids limit of a QEMU process's cgroup (its threads). */
const QEMU_PIDS = 256;
/** How much larger than guest RAM a saved state may grow (device state, page headers). */
const STATE_MARGIN_MIB = 64;
/** How long a restarted edge waits for an adopted guest's agent to answer. */
const ADOPT_TIMEOUT_MS = 10_000;
/** How long a new connection to an extra agent port waits for chronus's answer before it is made again. */
const PORT_ANSWER_MS = 3_000;
/** How long an extra agent port is tried before the connection fails. */
const PORT_DEADLINE_MS = 20_000;
/** Pause between two tries (chronus opens a port it closed again after 200 ms). */
const PORT_RETRY_MS = 250;

/** One running (or paused) QEMU sandbox as its backend holds it. */
export interface QemuVm {
  child?: ChildProcess;
  qmp?: QmpClient;
  /** Set while destroy runs: an exit is then expected. */
  stopping?: boolean;
  /** Extra agent ports (1..ports-1) in use by connections of their own. */
  portsInUse: Set<number>;
  /** Paused with its memory in this file: no QEMU runs until resumed. */
  saved?: SavedState;
}

/** What a backend's machine is: QEMU's arguments, the descriptors it inherits, its cgroup's size. */
export interface QemuMachine {
  args: string[];
  /** Host descriptors QEMU inherits as 3, 4, ... (opened through `open`, closed once QEMU runs). */
  fds: number[];
  /** Memory limit of its cgroup: guest RAM plus QEMU's own overhead. */
  memoryBytes: number;
}

/** Opens a host file for QEMU (read-only, or read-write) and returns the descriptor. */
export type OpenForQemu = (file: string, writable?: boolean) => Promise<number>;

/** The files of one sandbox the shared code touches. */
export interface QemuPaths {
  /** Marker of a sandbox paused in memory (a restarted edge keeps it paused; else it runs again). */
  paused: string;
  /** The guest's memory and device state while paused to a file (`pauseToFile`), its manifest beside it. */
  state: string;
  /** Folder of its records and disks (removed at teardown). */
  dir: string;
  /** Folder of its sockets, owned by its QEMU uid (removed at teardown). */
  run: string;
  record: string;
  claim: string;
  pid: string;
  /** QEMU's own output (the console of a failed boot when QMP is gone). */
  log: string;
}

/** What the shared code needs of the node. */
export interface QemuSandboxesOptions {
  sandboxesDir: string;
  cgroups: Pick<Cgroups, 'create' | 'memory' | 'killAll' | 'remove'>;
  idRanges: Pick<IdRanges, 'release' | 'reconcile'>;
  layers: { acquire(digest: string): Promise<string>; release(digest: string): Promise<void> };
  events: EventSink;
  qemu: string;
  /** Group of /dev/kvm (under KVM). */
  kvmGid?: number | undefined;
  /** How long a boot (QEMU start to the agent's answer) may take. */
  bootTimeoutMs: number;
}

/** The sandboxes of one QEMU backend; subclasses build and start the machines. */
export abstract class QemuSandboxes<V extends QemuVm, P extends QemuPaths> implements GarbageFacet, MemoryForkFacet {
  abstract readonly kind: 'microvm' | 'vm';
  protected readonly vms = new Map<string, V>();
  private readonly agents = new Map<string, SandboxAgent>();
  private readonly connecting = new Map<string, Promise<SandboxAgent>>();
  readonly garbage: GarbageFacet = this;

  constructor(private readonly q: QemuSandboxesOptions) {}

  protected abstract paths(id: string): P;
  /** Socket of the guest's chronus port `port` (0 is the main connection). */
  protected abstract agentSocket(id: string, port: number): string;
  /** QEMU's QMP socket. */
  protected abstract qmpSocket(id: string): string;
  /** Number of chronus ports the guest listens on. */
  protected abstract readonly agentPorts: number;
  /** The machine QEMU runs for `record` (its disks opened through `open`); `incoming` is added after. */
  protected abstract machine(record: BackendSandbox, vm: V, open: OpenForQemu): Promise<QemuMachine>;
  /** The in-memory state of a sandbox this backend did not start (a restarted edge adopts it). */
  protected abstract adopted(record: BackendSandbox): V;
  /** Called once the guest's agent answers; a backend waits here for the rest of its boot. Default nothing. */
  protected async settled(_id: string, _vm: V, _agent: SandboxAgent, _deadline: number): Promise<void> {}

  /** Opens the main agent connection; a backend whose guest may lack chronus overrides it. */
  protected async openAgent(id: string, _vm: V): Promise<SandboxAgent> {
    return new ChronusClient(await connectUnix(this.agentSocket(id, 0)), this.forged(id));
  }

  /** Whether the guest has chronus's extra ports (a guest without chronus has none). */
  protected hasExtraPorts(_vm: V): boolean {
    return true;
  }

  /** The main agent connection (made once, made again after it ends). */
  protected async connect(id: string): Promise<SandboxAgent> {
    const live = this.agents.get(id);
    if (live?.connected) return live;
    let pending = this.connecting.get(id);
    if (!pending) {
      pending = this.openAgent(id, this.vm(id))
        .then((client) => {
          this.agents.set(id, client);
          return client;
        })
        .finally(() => this.connecting.delete(id));
      this.connecting.set(id, pending);
    }
    return pending;
  }

  agent(id: string): Promise<SandboxAgent> {
    return this.connect(id);
  }

  /** A connection of the caller's own: one of the guest's extra agent ports, released when it closes. */
  async connectAgent(id: string): Promise<SandboxAgent> {
    const vm = this.vm(id);
    if (!this.hasExtraPorts(vm)) return this.connect(id);
    for (let port = 1; port < this.agentPorts; port++) {
      if (vm.portsInUse.has(port)) continue;
      vm.portsInUse.add(port);
      try {
        return await this.openPort(id, port, () => vm.portsInUse.delete(port));
      } catch (err) {
        vm.portsInUse.delete(port);
        throw err;
      }
    }
    throw new DsecError('UNAVAILABLE', `sandbox ${id}: all ${this.agentPorts - 1} extra agent ports are in use`, { sandboxId: id, retryAfterMs: 1000 });
  }

  /**
   * Connects to an extra agent port and waits for chronus to answer on it (a ping), made again
   * while it does not answer within {@link PORT_ANSWER_MS}, until {@link PORT_DEADLINE_MS}.
   * Why: a port whose host side went away (QEMU restored from a file starts with no one on its
   * sockets) reads as end-of-file in the guest; chronus closes it and opens it again 200 ms later,
   * and the guest's kernel drops whatever the host had sent the port by then. A request sent in
   * that window (a reader reattaching right after a resume) would never be answered.
   * `released` runs when the connection finally closes.
   */
  private async openPort(id: string, port: number, released: () => void): Promise<SandboxAgent> {
    const deadline = Date.now() + PORT_DEADLINE_MS;
    for (;;) {
      const sock = await connectUnix(this.agentSocket(id, port));
      const client = new ChronusClient(sock, this.forged(id));
      try {
        await withTimeout(client.ping(), PORT_ANSWER_MS, `sandbox ${id}: its agent did not answer on port ${port} within ${PORT_ANSWER_MS} ms`);
        sock.once('close', released);
        return client;
      } catch (err) {
        client.close();
        if (Date.now() >= deadline) throw err;
        await new Promise((r) => setTimeout(r, PORT_RETRY_MS));
      }
    }
  }

  /** Where a chronus connection reports frames that break the protocol (the guest forged them). */
  protected forged(id: string): (message: string) => void {
    return (message) =>
      this.q.events({
        kind: 'control.forged-message',
        severity: 'critical',
        sandboxId: id,
        message: `sandbox ${id}: ${message}`,
        data: { channel: 'virtio-serial' },
      });
  }

  protected dropAgent(id: string): void {
    this.agents.get(id)?.close();
    this.agents.delete(id);
  }

  protected vm(id: string): V {
    const vm = this.vms.get(id);
    if (!vm) throw new DsecError('SANDBOX_NOT_FOUND', `no ${this.kind} sandbox ${id} on this node`, { sandboxId: id });
    return vm;
  }

  protected qmp(id: string): QmpClient {
    const q = this.vm(id).qmp;
    if (!q?.connected) throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${id}: its QEMU does not answer`, { sandboxId: id });
    return q;
  }

  /**
   * Starts the sandbox's QEMU (confined, in its cgroup and network namespace) with the machine
   * the backend builds; with `incoming`, QEMU waits for a saved state (`restoreState`) instead of
   * booting. Resolves once started, with `exited`, which rejects when QEMU exits.
   */
  protected async launch(record: BackendSandbox, vm: V, incoming = false): Promise<{ exited: Promise<never> }> {
    const id = record.id;
    const p = this.paths(id);
    const idRange = record.idRange;
    if (!idRange) throw new DsecError('INTERNAL', `sandbox ${id}: its record has no uid`, { sandboxId: id });
    const netns = record.spec.network?.mode === 'allowlist' ? `/run/netns/${netnsName(id)}` : undefined;
    const handles: FileHandle[] = [];
    try {
      const m = await this.machine(record, vm, async (file, writable = false) => {
        const f = await open(file, writable ? fsConstants.O_RDWR : fsConstants.O_RDONLY);
        handles.push(f);
        return f.fd;
      });
      const cgroupProcs = await this.q.cgroups.create(id, { memoryBytes: m.memoryBytes, cpu: record.spec.resources?.cpu ?? DEFAULT_CPU, pids: QEMU_PIDS });
      const args = incoming ? [...m.args, ...INCOMING_ARGS] : m.args;
      const log = await open(p.log, fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_APPEND, 0o600);
      try {
        vm.child = startQemu(
          this.q.qemu,
          args,
          {
            uid: idRange.uid,
            gid: idRange.gid,
            cgroupProcs,
            ...(netns ? { netns } : {}),
            ...(this.q.kvmGid !== undefined ? { groups: [this.q.kvmGid] } : {}),
          },
          m.fds,
          log.fd,
        );
      } finally {
        await log.close();
      }
      vm.stopping = false;
      delete vm.qmp;
      const child = vm.child;
      const exited = new Promise<never>((_, reject) =>
        child.once('exit', (code, sig) =>
          reject(new DsecError('BACKEND_FAILED', `sandbox ${id}: QEMU exited (${sig ?? code}) while ${incoming ? 'restoring' : 'booting'}`, { sandboxId: id })),
        ),
      );
      exited.catch(() => undefined);
      await writeFile(p.pid, String(child.pid));
      return { exited };
    } finally {
      for (const f of handles) await f.close().catch(() => undefined);
    }
  }

  /** Connects QMP to a QEMU just started: retried until `deadline`, failing at once when QEMU exits or on `stop`. */
  protected async connectQmp(id: string, vm: V, exited: Promise<never>, deadline: number, stop?: AbortSignal): Promise<QmpClient> {
    const qmp = await Promise.race([connectRetrying(() => QmpClient.connect(this.qmpSocket(id), 5000), deadline, stop), exited]);
    if (stop?.aborted) {
      qmp.close();
      throw stop.reason as Error;
    }
    vm.qmp = qmp;
    return qmp;
  }

  /**
   * Waits for a QEMU just started (`launch`) until its guest is ready: QMP connected, the agent
   * answering, the backend's `settled`. It ends with QEMU's exit, an abort of `signal` or the
   * boot deadline, and then stops trying (no reconnecting under an id a retried create may
   * reuse); its abort listener is removed when it ends.
   */
  protected async awaitGuest(id: string, vm: V, exited: Promise<never>, signal?: AbortSignal): Promise<void> {
    const deadline = Date.now() + this.q.bootTimeoutMs;
    const stop = new AbortController();
    const onAbort = (): void => stop.abort(signal?.reason);
    signal?.addEventListener('abort', onAbort, { once: true });
    const aborted = new Promise<never>((_, reject) => stop.signal.addEventListener('abort', () => reject(stop.signal.reason as Error), { once: true }));
    aborted.catch(() => undefined);
    try {
      signal?.throwIfAborted();
      if (!vm.qmp) await Promise.race([this.connectQmp(id, vm, exited, deadline, stop.signal), aborted]);
      await Promise.race([this.ready(id, vm, deadline, stop.signal), exited, aborted]);
    } finally {
      signal?.removeEventListener('abort', onAbort);
      stop.abort(new DsecError('CANCELLED', `sandbox ${id}: the wait for its guest ended`, { sandboxId: id }));
    }
  }

  /**
   * Waits until the guest's agent answers and the backend's `settled` returns. A connection lost
   * or reset while the guest boots (`UNAVAILABLE`) is made again until the deadline (or `stop`).
   */
  private async ready(id: string, vm: V, deadline: number, stop: AbortSignal): Promise<void> {
    for (;;) {
      stop.throwIfAborted();
      try {
        const agent = await this.connect(id);
        await withTimeout(agent.ping(), Math.max(1000, deadline - Date.now()), `sandbox ${id}: the guest did not answer within ${this.q.bootTimeoutMs} ms`);
        await this.settled(id, vm, agent, deadline);
        return;
      } catch (err) {
        if (stop.aborted || Date.now() >= deadline || !(err instanceof DsecError) || err.code !== 'UNAVAILABLE') throw err;
        this.dropAgent(id);
        await new Promise((r) => setTimeout(r, 200));
      }
    }
  }

  /**
   * The backend's pause facet: QMP `stop`/`cont` with the memory kept, and with `toFile` also
   * `pauseToFile` (the guest's memory written to a file and QEMU ended; needs a machine whose
   * devices all migrate). A VM paused to a file counts as frozen: no QEMU runs.
   */
  protected pauseFacet(o: { toFile: boolean }): PauseFacet {
    return {
      pause: (id) => this.pauseInMemory(id),
      ...(o.toFile ? { pauseToFile: (id: string) => this.pauseToFile(id), inFile: (id: string) => this.vm(id).saved !== undefined } : {}),
      resume: (id) => this.resume(id),
      memory: (id) => this.q.cgroups.memory(id),
      freeze: async (id) => {
        if (!this.vm(id).saved) await this.qmp(id).execute('stop');
      },
      thaw: async (id) => {
        if (!this.vm(id).saved) await this.qmp(id).execute('cont');
      },
      isFrozen: async (id) => this.vm(id).saved !== undefined || !(await this.qmp(id).execute<{ running: boolean }>('query-status')).running,
    };
  }

  /** Resumes a paused sandbox: from its file when it was paused to one, else QMP `cont`. */
  async resume(id: string): Promise<BackendResumeResult> {
    const before = await this.q.cgroups.memory(id);
    const vm = this.vm(id);
    if (vm.saved) await this.resumeFromFile(id, vm, vm.saved);
    else await this.resumeInMemory(id);
    const after = await this.q.cgroups.memory(id);
    return { memoryBeforeBytes: before.usageBytes, memoryAfterBytes: after.usageBytes, swapBytes: after.swapBytes };
  }

  /**
   * Pauses with the guest's memory in a file: vCPUs stopped, RAM and device state streamed to
   * `paths.state` (`saveState`), then QEMU is ended and its memory goes back to the host. Agent
   * connections end with it (the edge's command streams attach again once resumed). A failed
   * save leaves the VM running and no file.
   */
  async pauseToFile(id: string): Promise<BackendPauseResult> {
    const vm = this.vm(id);
    const p = this.paths(id);
    const record = await this.record(id);
    const before = await this.q.cgroups.memory(id);
    const memoryMiB = record.spec.resources?.memoryMiB ?? DEFAULT_MEMORY_MIB;
    const qmp = this.qmp(id);
    let saved: SavedState;
    try {
      saved = await saveState({
        qmp,
        socketDir: p.run,
        owner: { uid: record.idRange?.uid ?? 0, gid: record.idRange?.gid ?? 0 },
        file: p.state,
        maxBytes: (memoryMiB + STATE_MARGIN_MIB) * 1024 * 1024,
        timeoutMs: this.q.bootTimeoutMs,
      });
    } catch (err) {
      await qmp.execute('cont').catch(() => undefined);
      throw err;
    }
    vm.saved = saved;
    this.dropAgent(id);
    await this.kill(id);
    delete vm.qmp;
    delete vm.child;
    const after = await this.q.cgroups.memory(id);
    return { memoryBeforeBytes: before.usageBytes, memoryAfterBytes: after.usageBytes, swapBytes: after.swapBytes };
  }

  /**
   * A VM paused to a file runs again: a new QEMU with the same arguments loads the state
   * (`restoreState`), then `cont`; the agent answers on the same ports, its processes never
   * noticed. A missing or damaged file, or a failed load, leaves the sandbox paused with its file;
   * a guest that ran again and did not answer is lost (its file is behind its disk).
   */
  private async resumeFromFile(id: string, vm: V, saved: SavedState): Promise<void> {
    const p = this.paths(id);
    const state = await readSavedState(saved.file);
    const record = await this.record(id);
    let manifestGone = false;
    let ran = false;
    try {
      const { exited } = await this.launch(record, vm, true);
      const qmp = await this.connectQmp(id, vm, exited, Date.now() + this.q.bootTimeoutMs);
      await restoreState({ qmp, socketDir: p.run, state, exited, timeoutMs: this.q.bootTimeoutMs });
      // The state is QEMU's now. The manifest goes before the guest runs: an edge that dies from
      // here on adopts this QEMU, never the file (the guest's disk moves on once it runs).
      await removeSavedState(saved.file, true);
      manifestGone = true;
      // The main agent port connected before the guest runs: QEMU then tells the guest its host
      // side is there (as it was when saved), and the guest never closes the port on us (see
      // `openPort`). A failure here is the guest's answer's business (awaitGuest).
      await this.connect(id).catch(() => undefined);
      await qmp.execute('cont');
      manifestGone = false;
      ran = true;
      await this.awaitGuest(id, vm, exited);
    } catch (err) {
      this.dropAgent(id);
      await this.kill(id);
      delete vm.qmp;
      delete vm.child;
      // Failed before the guest ran: the file is still its state.
      if (manifestGone) await writeSavedManifest(state);
      if (ran) {
        // The guest ran and did not come back: the file is behind its disk, nothing can resume it.
        this.q.events({
          kind: 'sandbox.lost',
          severity: 'warning',
          sandboxId: id,
          message: `sandbox ${id}: its guest did not answer after a resume from its memory file (${(err as Error).message})`,
          data: { backend: this.kind },
        });
        await this.teardown(id).catch(() => undefined);
      }
      throw err;
    }
    delete vm.saved;
    this.watch(id, vm);
    await removeSavedState(saved.file);
  }

  /**
   * The writable disks of a sandbox (absolute paths; the file names are the same in every
   * sandbox's folder): what a fork with memory copies beside the memory state. Empty: the
   * backend does not fork with memory.
   */
  protected forkDisks(_id: string): string[] {
    return [];
  }

  /**
   * A fork with memory, first half: sandbox `id`'s memory and device state (`saveState`) and a
   * copy of each of its writable disks, taken at one instant, into a folder of its own. A running
   * VM is stopped for it (QEMU flushes its disks when the migration completes, so each copy
   * matches the memory) and runs on after, also when the copy fails; a VM paused in memory stays
   * paused; one paused to a file lends its file (no QEMU runs). Disks are copied sparse, and
   * reflinked where the file system can. The fork's shape is checked first: nothing is stopped
   * or copied for a fork that could not resume. Leaves nothing behind on failure.
   */
  async captureMemory(id: string, fork: ForkShape, signal?: AbortSignal): Promise<MemoryImage> {
    const vm = this.vm(id);
    const disks = this.forkDisks(id);
    if (disks.length === 0) throw new DsecError('INVALID_ARGUMENT', `the ${this.kind} backend does not fork with memory`, { field: 'memory', sandboxId: id });
    await this.checkForkShape(fork, id);
    const p = this.paths(id);
    const dir = path.join(p.dir, `fork-${fork.id}`);
    await mkdir(dir, { mode: 0o700 });
    const image: MemoryImage = { sourceId: id, dir, state: path.join(dir, 'memory.state'), disks: {} };
    const copyDisks = async (): Promise<void> => {
      for (const disk of disks) {
        const copy = path.join(dir, path.basename(disk));
        await copySparse(disk, copy);
        image.disks[path.basename(disk)] = copy;
      }
    };
    try {
      if (vm.saved) {
        await copySavedState(await readSavedState(vm.saved.file), image.state);
        await copyDisks();
        return image;
      }
      const qmp = this.qmp(id);
      const { running, status } = await qmp.execute<{ running: boolean; status: string }>('query-status');
      // A VM paused in memory is saved once (QEMU refuses a second migration of a VM it stopped for
      // one); its state file serves every fork until it runs again (`resumeInMemory` drops it).
      const kept = forkStateOf(p);
      if (!running && status === 'postmigrate' && (await exists(`${kept}.json`))) {
        await copySavedState(await readSavedState(kept), image.state);
        await copyDisks();
        return image;
      }
      const record = await this.record(id);
      const memoryMiB = record.spec.resources?.memoryMiB ?? DEFAULT_MEMORY_MIB;
      let failed = false;
      try {
        const saved = await saveState({
          qmp,
          socketDir: p.run,
          owner: { uid: record.idRange?.uid ?? 0, gid: record.idRange?.gid ?? 0 },
          file: running ? image.state : kept,
          maxBytes: (memoryMiB + STATE_MARGIN_MIB) * 1024 * 1024,
          timeoutMs: this.q.bootTimeoutMs,
          ...(signal ? { signal } : {}),
        });
        if (!running) await copySavedState(saved, image.state);
        await copyDisks();
      } catch (err) {
        failed = true;
        throw err;
      } finally {
        // The source runs on as it was (a failed `cont` is the caller's error unless one came first).
        if (running) {
          const resumed = qmp.execute('cont');
          if (failed) await resumed.catch(() => undefined);
          else await resumed;
        }
      }
      return image;
    } catch (err) {
      await rm(dir, { recursive: true, force: true });
      throw err;
    }
  }

  /**
   * A fork with memory, second half: the new sandbox's QEMU (its own arguments: disks, sockets,
   * tap, uid) loads the source's state and runs; the main agent port is connected before the
   * guest runs (see `resumeFromFile`). The guest's processes, memory and tmpfs are the source's;
   * its network identity is set once the node made its link (the backend's `linked`). The
   * caller's undo ends QEMU on failure.
   */
  protected async startFromMemory(record: BackendSandbox, vm: V, image: MemoryImage, signal?: AbortSignal): Promise<void> {
    const id = record.id;
    const state = await readSavedState(image.state);
    const { exited } = await this.launch(record, vm, true);
    const qmp = await this.connectQmp(id, vm, exited, Date.now() + this.q.bootTimeoutMs, signal);
    await restoreState({ qmp, socketDir: this.paths(id).run, state, exited, timeoutMs: this.q.bootTimeoutMs, ...(signal ? { signal } : {}) });
    await this.connect(id).catch(() => undefined);
    await qmp.execute('cont');
    await this.awaitGuest(id, vm, exited, signal);
  }

  /**
   * Refuses a fork with memory whose machine would differ from its source's: the state loads only
   * into the same devices (layers, memory, vCPUs, network device or none).
   */
  protected async checkForkShape(req: ForkShape, sourceId: string): Promise<void> {
    const source = await this.record(sourceId).catch(() => undefined);
    if (!source || source.backend !== this.kind)
      throw new DsecError('INVALID_ARGUMENT', `memoryOf: no ${this.kind} sandbox ${sourceId} on this node`, { field: 'memoryOf' });
    const shape = (s: BackendCreateShape): string =>
      JSON.stringify({
        layers: s.layers.map((l) => l.digest),
        memoryMiB: s.spec.resources?.memoryMiB ?? DEFAULT_MEMORY_MIB,
        vcpus: Math.max(1, Math.ceil(s.spec.resources?.cpu ?? DEFAULT_CPU)),
        network: s.spec.network?.mode === 'allowlist',
      });
    if (shape(source) !== shape(req)) {
      throw new DsecError(
        'CONFLICT',
        `sandbox ${req.id}: a fork with memory needs its source's layers, memory, vCPUs and network device (${shape(source)}, asked ${shape(req)})`,
        {
          sandboxId: req.id,
        },
      );
    }
  }

  /** The sandbox's record as its create wrote it. */
  protected async record(id: string): Promise<BackendSandbox> {
    return JSON.parse(await readFile(this.paths(id).record, 'utf8')) as BackendSandbox;
  }

  /** QMP `stop` (vCPUs stopped, memory kept) or `cont`, with the cgroup's memory around it. */
  protected async runState(id: string, command: 'stop' | 'cont'): Promise<BackendPauseResult> {
    const before = await this.q.cgroups.memory(id);
    await this.qmp(id).execute(command);
    const after = await this.q.cgroups.memory(id);
    return { memoryBeforeBytes: before.usageBytes, memoryAfterBytes: after.usageBytes, swapBytes: after.swapBytes };
  }

  /** Pauses in memory (QMP `stop`); the marker tells a restarted edge the sandbox is paused. */
  protected async pauseInMemory(id: string): Promise<BackendPauseResult> {
    const result = await this.runState(id, 'stop');
    await writeFile(this.paths(id).paused, '', { mode: 0o600 });
    return result;
  }

  /** Resumes a sandbox paused in memory (QMP `cont`) and removes the marker (and a state kept for forks). */
  protected async resumeInMemory(id: string): Promise<BackendPauseResult> {
    const result = await this.runState(id, 'cont');
    await rm(this.paths(id).paused, { force: true });
    await removeSavedState(forkStateOf(this.paths(id)));
    return result;
  }

  /** Runs the guest's network set-up (`argv`, through chronus) once the node's link is in the VM's namespace. */
  protected async configureGuestNetwork(id: string, argv: string[]): Promise<void> {
    const agent = await this.connect(id);
    const att = await agent.spawn({ argv });
    const exit = await att.exited;
    await agent.release(exit.proc).catch(() => undefined);
    if (exit.exitCode !== 0)
      throw new DsecError('BACKEND_FAILED', `sandbox ${id}: configuring the guest's network failed (exit ${exit.exitCode ?? exit.signal})`, { sandboxId: id });
  }

  /** The guest console's last lines (a failed boot's reason), read from QEMU's ring buffer. */
  protected async consoleTail(id: string, vm: V): Promise<string> {
    if (!vm.qmp?.connected) return (await readFile(this.paths(id).log, 'utf8').catch(() => '')).trim().split('\n').slice(-3).join('; ');
    const text = await vm.qmp.execute<string>('ringbuf-read', { device: 'console', size: 65536, format: 'utf8' }, 2000);
    return text.trim().split('\n').slice(-4).join('; ');
  }

  /**
   * A crashed QEMU: the sandbox is lost (an event says so) and nothing of it is left behind. Our
   * own child is watched for its exit; an adopted QEMU (a previous edge's) through its QMP
   * connection, which ends only with the process (or with `close`, which sets `stopping`).
   */
  protected watch(id: string, vm: V): void {
    watchQemu(vm.child ?? vm.qmp, { id, backend: this.kind, events: this.q.events, stopping: () => vm.stopping === true, teardown: () => this.teardown(id) });
  }

  /**
   * Adopts the sandboxes a previous edge left running: a QEMU found by its pid file is
   * reconnected (QMP, then the agent) and keeps running, or stays paused when it was paused
   * (the `paused` marker; a VM stopped without it, by a snapshot that ended with the edge, runs
   * again); a sandbox paused to a file (`savedState`) stays paused with no QEMU. Anything else (no
   * record, no QEMU, no answer) is torn down.
   */
  async recover(): Promise<BackendSandbox[]> {
    const found: BackendSandbox[] = [];
    for (const id of await readdir(this.q.sandboxesDir).catch(() => [] as string[])) {
      const record = await this.adopt(id).catch(() => undefined);
      if (record) found.push(record);
      else await this.teardown(id).catch(() => undefined);
    }
    // Ranges claimed for sandboxes that did not survive (an edge that died mid-create).
    await this.q.idRanges.reconcile(new Set(found.map((r) => r.id)));
    return found;
  }

  /** A sandbox of a previous edge, running or paused again under this one; undefined: it is gone. */
  private async adopt(id: string): Promise<BackendSandbox | undefined> {
    const p = this.paths(id);
    const record = JSON.parse(await readFile(p.record, 'utf8')) as BackendSandbox;
    // What a fork with memory or a snapshot that ended with the previous edge left in the folder
    // (a memory state, disk copies): no request waits for them any more.
    for (const name of await readdir(p.dir)) {
      if (name.startsWith('fork-') || name === 'snapshots') await rm(path.join(p.dir, name), { recursive: true, force: true });
    }
    const vm = this.adopted(record);
    let paused: boolean;
    if (await this.adoptSaved(id, vm)) {
      // Paused to a file: a QEMU left over from a save the edge did not finish goes.
      await killQemu(undefined, p.pid, p.run);
      paused = true;
    } else {
      if ((await qemuPid(p.pid, p.run, record.idRange?.uid ?? -1)) === undefined) return undefined;
      const qmp = await QmpClient.connect(this.qmpSocket(id), ADOPT_TIMEOUT_MS);
      vm.qmp = qmp;
      this.vms.set(id, vm);
      try {
        const { running } = await qmp.execute<{ running: boolean }>('query-status');
        paused = !running && (await exists(p.paused));
        if (!running && !paused) await qmp.execute('cont');
        if (!paused) await withTimeout((await this.connect(id)).ping(), ADOPT_TIMEOUT_MS, `sandbox ${id}: its guest did not answer`);
      } catch (err) {
        this.vms.delete(id);
        this.dropAgent(id);
        qmp.close();
        throw err;
      }
      this.watch(id, vm);
    }
    this.vms.set(id, vm);
    // This process's references on its layers.
    for (const layer of record.layers) await this.q.layers.acquire(layer.digest);
    const claim = await readFile(p.claim, 'utf8').then(
      (t) => JSON.parse(t) as SandboxClaim,
      () => undefined,
    );
    return { ...record, spec: claim ? { ...record.spec, ...claim } : record.spec, ...(paused ? { paused: true } : {}) };
  }

  /** A VM paused to a file by the previous edge stays paused to it (its manifest checked); false when it has none. */
  private async adoptSaved(id: string, vm: V): Promise<boolean> {
    const file = this.paths(id).state;
    if (!(await exists(`${file}.json`))) return false;
    vm.saved = await readSavedState(file);
    return true;
  }

  async claim(id: string, claim: SandboxClaim): Promise<void> {
    try {
      await writeFile(this.paths(id).claim, JSON.stringify(claim), { flag: 'wx', mode: 0o600 });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'EEXIST') throw new DsecError('CONFLICT', `sandbox ${id} was already claimed`, { sandboxId: id });
      throw err;
    }
  }

  async destroy(id: string): Promise<void> {
    if (!this.vms.has(id) && !(await exists(this.paths(id).record))) {
      throw new DsecError('SANDBOX_NOT_FOUND', `no sandbox ${id} on this node`, { sandboxId: id });
    }
    await this.teardown(id);
  }

  /** Ends QEMU (SIGKILL: the guest's disk holds nothing worth a clean shutdown) and waits for its exit. */
  protected async kill(id: string): Promise<void> {
    const vm = this.vms.get(id);
    if (vm) vm.stopping = true;
    vm?.qmp?.close();
    await killQemu(vm?.child, this.paths(id).pid, this.paths(id).run);
  }

  /** Removes every trace of a sandbox; safe on a half-created or already-gone one. */
  protected async teardown(id: string): Promise<void> {
    const p = this.paths(id);
    this.dropAgent(id);
    await this.kill(id);
    await this.q.cgroups.killAll(id);
    await this.q.cgroups.remove(id);
    crashPoint('qemu.destroy.killed');
    const record = await readFile(p.record, 'utf8').then(
      (t) => JSON.parse(t) as BackendSandbox,
      () => undefined,
    );
    if (record) for (const l of record.layers) await this.q.layers.release(l.digest).catch(() => undefined);
    await rm(p.dir, { recursive: true, force: true });
    await rm(p.run, { recursive: true, force: true });
    await removeVmNetns(id);
    this.vms.delete(id);
    if (record?.idRange) await this.q.idRanges.release(record.idRange, id);
  }

  /** The VM's network namespace (only a networked VM has one). */
  async netnsPath(id: string): Promise<string> {
    const file = `/run/netns/${netnsName(id)}`;
    if (!(await exists(file))) throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${id} has no network namespace`, { sandboxId: id });
    return file;
  }

  /** QEMU's host pid (tests check its confinement). */
  qemuPid(id: string): number | undefined {
    return this.vms.get(id)?.child?.pid;
  }

  async collectGarbage(o: GarbageOptions): Promise<GarbageReport> {
    const report: GarbageReport = { containers: [], cgroups: [], processes: 0, mounts: 0, dirs: [] };
    for (const id of await readdir(this.q.sandboxesDir).catch(() => [] as string[])) {
      if (o.keep(id)) continue;
      await this.teardown(id).catch(() => undefined);
      report.dirs.push(id);
    }
    return report;
  }

  /** Lets go of the VMs (they keep running for the next edge to adopt): their end is no longer ours to watch. */
  async close(): Promise<void> {
    for (const id of [...this.agents.keys()]) this.dropAgent(id);
    for (const vm of this.vms.values()) {
      vm.stopping = true;
      vm.qmp?.close();
    }
  }
}

/** The memory state a VM paused in memory keeps for its forks while it stays paused. */
function forkStateOf(p: QemuPaths): string {
  return path.join(p.dir, 'fork.state');
}

export async function exists(p: string): Promise<boolean> {
  return stat(p).then(
    () => true,
    () => false,
  );
}
