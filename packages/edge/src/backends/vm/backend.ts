// The full-VM backend: one QEMU q35 machine with OVMF per sandbox, booting its image (a `disk`
// layer, qcow2) through a copy-on-write overlay of its own; chronus as a systemd service in the
// guest on virtio-serial ports, the QEMU guest agent beside it.
import { execFile } from 'node:child_process';
import { constants as fsConstants } from 'node:fs';
import { chown, copyFile, mkdir, open, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import type { FileHandle } from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { DEFAULT_CPU, DEFAULT_DISK_MIB, DEFAULT_MEMORY_MIB, DsecError, invalidArgument } from '@dsec/protocol';
import type { EventSink, LayerInfo, SandboxStats } from '@dsec/protocol';
import type {
  Backend,
  BackendCreateRequest,
  BackendPauseResult,
  BackendResumeResult,
  BackendSandbox,
  NetworkFacet,
  PauseFacet,
  SandboxAgent,
  ScreenFacet,
} from '../../backend.js';
import { withTimeout } from '../../abortable.js';
import type { Cgroups } from '../../host/cgroups.js';
import type { IdRanges } from '../../host/id-ranges.js';
import { AGENT_PORTS } from '../microvm/guest.js';
import { virtualBytes } from '../../layers/vm-image.js';
import { VM_AGENT_LABEL, VM_DISK_LABEL } from '../../layers/store.js';
import { INCOMING_ARGS, readSavedState, removeSavedState, restoreState, saveState } from '../qemu/migration.js';
import type { SavedState } from '../qemu/migration.js';
import { bridgeNodeLink, createVmNetns, guestNetScript, macOf, netnsName, removeVmNetns, VM_TAP } from '../qemu/network.js';
import type { Accel } from '../qemu/process.js';
import { startQemu } from '../qemu/process.js';
import { QmpClient } from '../qemu/qmp.js';
import { QemuSandboxes } from '../qemu/sandboxes.js';
import type { QemuVm } from '../qemu/sandboxes.js';
import { QmpScreen } from '../qemu/screen.js';
import { connectRetrying, connectUnix } from '../qemu/sockets.js';
import { fullVmArgs, fullVmFdList, fullVmSockets, OVMF_CODE, OVMF_VARS } from './qemu.js';
import type { VmDiskBus } from './qemu.js';
import { GuestAgentClient } from './guest.js';

const run = promisify(execFile);

/** Smallest guest memory a Debian systemd guest boots in. */
export const MIN_VM_MEMORY_MIB = 256;
/** Host memory a QEMU process may use beyond its guest's RAM (firmware, display, TCG's cache). */
export const VM_QEMU_OVERHEAD_MIB = 320;
/** Default pids limit of the QEMU process's cgroup (its threads). */
const QEMU_PIDS = 256;
/** A saved state's room beyond the guest's RAM (device state: VGA memory, firmware, virtio). */
const VM_STATE_MARGIN_MIB = 64;

/** What the backend needs of the node and the machine. */
export interface VmBackendOptions {
  /** Directory of one folder per sandbox (0700): records, overlays, firmware variables. */
  sandboxesDir: string;
  /** Directory (0711, under /run) of one folder per sandbox owned by its QEMU uid (0700): sockets. */
  socketsDir: string;
  accel: Accel;
  /** Group of /dev/kvm (under KVM). */
  kvmGid?: number | undefined;
  qemu: string;
  layers: {
    acquire(digest: string): Promise<string>;
    release(digest: string): Promise<void>;
    diskFile(digest: string): string;
  };
  cgroups: Cgroups;
  idRanges: IdRanges;
  /** How long a boot (QEMU start to the agent's first answer) may take. */
  bootTimeoutMs: number;
  events: EventSink;
}

interface Vm extends QemuVm {
  /** The guest runs chronus (else only the QEMU guest agent serves it). */
  chronus: boolean;
  /** The root disk's bus (the image's label; NVMe cannot migrate, virtio-blk can). */
  disk: VmDiskBus;
  /** Paused with its memory in this file: no QEMU runs until resumed. */
  saved?: SavedState;
  /** Boot time of this VM (QEMU start to the agent's first answer), ms. */
  bootMs?: number;
}

interface Paths {
  dir: string;
  run: string;
  record: string;
  claim: string;
  overlay: string;
  vars: string;
  pid: string;
  log: string;
  /** The guest's memory and device state while paused to a file. */
  state: string;
}

/** Full-VM sandboxes (QEMU q35 + OVMF, a qcow2 overlay over a disk image layer). */
export class VmBackend extends QemuSandboxes<Vm, Paths> implements Backend {
  readonly kind = 'vm' as const;
  private lastBootMs = 0;
  /** vCPUs stopped (QMP `stop`), memory kept; `cont` resumes. */
  readonly pausing: PauseFacet;
  /** A network namespace per networked VM, with a tap bridged to the node's link. */
  readonly network: NetworkFacet;
  /** Each VM's screen, mouse and keyboard (QMP; screendumps go to its run directory, which its QEMU may write). */
  readonly screen: ScreenFacet = {
    screen: (id) => new QmpScreen({ qmp: () => this.qmp(id), dumpDir: this.paths(id).run, vncSocket: this.vncSocket(id) }),
  };

  constructor(private readonly o: VmBackendOptions) {
    super(o);
    this.network = { netnsPath: (id) => this.netnsPath(id), linked: (id) => this.linked(id) };
    this.pausing = {
      pause: (id) => this.pause(id),
      pauseToFile: (id) => this.pauseToFile(id),
      inFile: (id) => this.vm(id).saved !== undefined,
      resume: (id) => this.resume(id),
      memory: (id) => o.cgroups.memory(id),
      // A VM paused to a file is as frozen as it gets: no QEMU runs.
      freeze: async (id) => {
        if (!this.vm(id).saved) await this.qmp(id).execute('stop');
      },
      thaw: async (id) => {
        if (!this.vm(id).saved) await this.qmp(id).execute('cont');
      },
      isFrozen: async (id) => this.vm(id).saved !== undefined || !(await this.qmp(id).execute<{ running: boolean }>('query-status')).running,
    };
  }

  /** The accelerator and the last boot's time. */
  get capabilities(): { accel: Accel; bootMs: number } {
    return { accel: this.o.accel, bootMs: this.lastBootMs };
  }

  protected readonly agentPorts = AGENT_PORTS;

  protected agentSocket(id: string, port: number): string {
    return fullVmSockets(this.paths(id).run).agents[port] as string;
  }

  /** The main agent connection: chronus's port 0, or the QEMU guest agent for an image without chronus. */
  protected override async openAgent(id: string, vm: Vm): Promise<SandboxAgent> {
    if (vm.chronus) return super.openAgent(id, vm);
    return new GuestAgentClient(await connectUnix(fullVmSockets(this.paths(id).run).guestAgent));
  }

  protected override hasExtraPorts(vm: Vm): boolean {
    return vm.chronus;
  }

  protected paths(id: string): Paths {
    const dir = path.join(this.o.sandboxesDir, id);
    return {
      dir,
      run: path.join(this.o.socketsDir, id),
      record: path.join(dir, 'sandbox.json'),
      claim: path.join(dir, 'claim.json'),
      overlay: path.join(dir, 'overlay.qcow2'),
      vars: path.join(dir, 'efivars.fd'),
      pid: path.join(dir, 'qemu.pid'),
      log: path.join(dir, 'qemu.log'),
      state: path.join(dir, 'memory.state'),
    };
  }

  /** The one disk layer a VM boots (INVALID_ARGUMENT naming `image` otherwise). */
  private diskLayer(layers: LayerInfo[]): LayerInfo {
    const [layer, ...more] = layers;
    if (!layer || more.length > 0) throw invalidArgument('image', 'a vm sandbox boots one disk image: give only image.base');
    if (layer.kind !== 'disk')
      throw invalidArgument('image.base', `layer ${layer.digest} is a ${layer.kind} layer, not a disk image (dsec image build --vm, dsec image import)`);
    return layer;
  }

  async create(req: BackendCreateRequest, signal?: AbortSignal): Promise<BackendSandbox> {
    const p = this.paths(req.id);
    const res = req.spec.resources ?? {};
    const memoryMiB = res.memoryMiB ?? DEFAULT_MEMORY_MIB;
    if (memoryMiB < MIN_VM_MEMORY_MIB) throw invalidArgument('resources.memoryMiB', `a vm needs at least ${MIN_VM_MEMORY_MIB} MiB`);
    const diskMiB = res.diskMiB ?? DEFAULT_DISK_MIB;
    const layer = this.diskLayer(req.layers);
    const undo: Array<() => unknown> = [];
    const vm: Vm = { portsInUse: new Set(), chronus: layer.labels[VM_AGENT_LABEL] === 'chronus', disk: diskBusOf(layer) };
    try {
      await mkdir(p.dir, { mode: 0o700 }).catch((err: unknown) => {
        if ((err as NodeJS.ErrnoException).code === 'EEXIST') throw new DsecError('CONFLICT', `sandbox ${req.id} already exists`, { sandboxId: req.id });
        throw err;
      });
      undo.push(() => rm(p.dir, { recursive: true, force: true }));
      const idRange = await this.o.idRanges.allocate(req.id);
      undo.push(() => this.o.idRanges.release(idRange, req.id));
      await mkdir(p.run, { mode: 0o700 });
      undo.push(() => rm(p.run, { recursive: true, force: true }));
      await chown(p.run, idRange.uid, idRange.gid);

      await this.o.layers.acquire(layer.digest);
      undo.push(() => this.o.layers.release(layer.digest));
      const base = this.o.layers.diskFile(layer.digest);
      // The overlay: at least the image's size, diskMiB when larger (the guest's partitions stay
      // as the image made them; the room beyond is an unpartitioned tail).
      const sizeBytes = Math.max(await virtualBytes(base), diskMiB * 1024 * 1024);
      await run('qemu-img', ['create', '-q', '-f', 'qcow2', '-F', 'qcow2', '-b', base, '-u', p.overlay, String(sizeBytes)]);
      await copyFile(OVMF_VARS, p.vars);
      signal?.throwIfAborted();

      const netns = req.spec.network?.mode === 'allowlist' ? await createVmNetns(req.id, idRange.uid, idRange.gid) : undefined;
      if (netns) undo.push(() => removeVmNetns(req.id));
      const record: BackendSandbox = { id: req.id, backend: 'vm', spec: req.spec, layers: req.layers, createdAt: new Date().toISOString(), idRange };
      await writeJsonAtomic(p.record, record);
      undo.push(() => this.o.cgroups.remove(req.id));
      const started = Date.now();
      this.vms.set(req.id, vm);
      undo.push(() => this.kill(req.id));
      const { exited } = await this.launch(record, vm);
      const deadline = Date.now() + this.o.bootTimeoutMs;
      vm.qmp = await Promise.race([connectRetrying(() => QmpClient.connect(fullVmSockets(p.run).qmp, 5000), deadline), exited]);
      const abort = signal
        ? new Promise<never>((_, reject) => signal.addEventListener('abort', () => reject(signal.reason as Error), { once: true }))
        : undefined;
      abort?.catch(() => undefined);
      // The wait for the guest ends with the race: after QEMU's exit or an abort it must not go
      // on reconnecting (and dropping connections) under an id that a retried create may reuse.
      const stop = new AbortController();
      try {
        await Promise.race([this.ready(req.id, vm, deadline, stop.signal), exited, ...(abort ? [abort] : [])]);
      } finally {
        stop.abort();
      }
      vm.bootMs = Date.now() - started;
      this.lastBootMs = vm.bootMs;
      this.watch(req.id, vm);
      return record;
    } catch (err) {
      const detail = await this.consoleTail(req.id, vm).catch(() => '');
      this.dropAgent(req.id);
      for (const step of undo.reverse()) {
        await Promise.resolve()
          .then(step)
          .catch(() => undefined);
      }
      this.vms.delete(req.id);
      if (detail && err instanceof DsecError && err.code !== 'INVALID_ARGUMENT') err.message += `; guest console: ${detail}`;
      throw err;
    }
  }

  /**
   * Starts the VM's QEMU (confined, in its cgroup and network namespace) with firmware, image and
   * overlay as descriptors; with `incoming`, QEMU waits for a saved state (`restoreState`)
   * instead of booting. Resolves once started, with `exited`, which rejects when QEMU exits.
   */
  private async launch(record: BackendSandbox, vm: Vm, incoming = false): Promise<{ exited: Promise<never> }> {
    const id = record.id;
    const p = this.paths(id);
    const idRange = record.idRange;
    if (!idRange) throw new DsecError('INTERNAL', `sandbox ${id}: its record has no uid`, { sandboxId: id });
    const layer = this.diskLayer(record.layers);
    const res = record.spec.resources ?? {};
    const memoryMiB = res.memoryMiB ?? DEFAULT_MEMORY_MIB;
    const cpu = res.cpu ?? DEFAULT_CPU;
    const netns = record.spec.network?.mode === 'allowlist' ? netnsName(id) : undefined;
    const fds: FileHandle[] = [];
    const ro = async (file: string) => {
      const f = await open(file, fsConstants.O_RDONLY);
      fds.push(f);
      return f.fd;
    };
    const rw = async (file: string) => {
      const f = await open(file, fsConstants.O_RDWR);
      fds.push(f);
      return f.fd;
    };
    try {
      const vmFds = fullVmFdList({
        code: await ro(OVMF_CODE),
        vars: [await ro(p.vars), await rw(p.vars)],
        base: await ro(this.o.layers.diskFile(layer.digest)),
        overlay: [await ro(p.overlay), await rw(p.overlay)],
      });
      const cgroupProcs = await this.o.cgroups.create(id, {
        memoryBytes: (memoryMiB + VM_QEMU_OVERHEAD_MIB) * 1024 * 1024,
        cpu,
        pids: QEMU_PIDS,
      });
      const args = fullVmArgs({
        accel: this.o.accel,
        memoryMiB,
        vcpus: Math.max(1, Math.ceil(cpu)),
        runDir: p.run,
        disk: vm.disk,
        ...(netns ? { tap: { ifname: VM_TAP, mac: macOf(id) } } : {}),
      });
      if (incoming) args.push(...INCOMING_ARGS);
      const log = await open(p.log, fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_APPEND, 0o600);
      try {
        vm.child = startQemu(
          this.o.qemu,
          args,
          {
            uid: idRange.uid,
            gid: idRange.gid,
            cgroupProcs,
            ...(netns ? { netns: `/run/netns/${netns}` } : {}),
            ...(this.o.kvmGid !== undefined ? { groups: [this.o.kvmGid] } : {}),
          },
          vmFds,
          log.fd,
        );
      } finally {
        await log.close();
      }
      vm.stopping = false;
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
      for (const f of fds) await f.close().catch(() => undefined);
    }
  }

  /**
   * Waits until the guest answers and, with chronus, until its boot is over (`systemctl
   * is-system-running --wait`): chronus answers early in the boot (it needs nothing but its
   * ports), and a connection made then was seen to end or be reset before the boot did. A lost
   * connection is made again until the deadline (or `stop`); the first command then runs on a
   * settled guest.
   */
  private async ready(id: string, vm: Vm, deadline: number, stop: AbortSignal): Promise<void> {
    for (;;) {
      stop.throwIfAborted();
      try {
        const agent = await this.connect(id);
        await withTimeout(agent.ping(), Math.max(1000, deadline - Date.now()), `create ${id}: the guest did not answer within ${this.o.bootTimeoutMs} ms`);
        if (!vm.chronus) return;
        const att = await agent.spawn({ argv: ['/bin/systemctl', 'is-system-running', '--wait'] });
        const exit = await withTimeout(att.exited, Math.max(1000, deadline - Date.now()), `create ${id}: the guest's boot did not finish in time`);
        await agent.release(exit.proc).catch(() => undefined);
        return;
      } catch (err) {
        if (stop.aborted || Date.now() >= deadline || !(err instanceof DsecError) || err.code !== 'UNAVAILABLE') throw err;
        this.dropAgent(id);
        await new Promise((r) => setTimeout(r, 200));
      }
    }
  }

  /** The VM's QMP connection (the screen and other QMP users build on it). */
  qmpOf(id: string): QmpClient {
    return this.qmp(id);
  }

  /** Path of the VM's VNC unix socket (the live view). */
  vncSocket(id: string): string {
    this.vm(id);
    return fullVmSockets(this.paths(id).run).vnc;
  }

  /** The node's link is in the VM's namespace: the guest takes over its address on its first ethernet interface. */
  async linked(id: string): Promise<void> {
    const link = await bridgeNodeLink(id);
    const script = `for d in /sys/class/net/*; do n=\${d##*/}; [ "$n" != lo ] && break; done; ${guestNetScript('"$n"', link)}`;
    await this.configureGuestNetwork(id, ['/bin/sh', '-c', script]);
  }

  pause(id: string): Promise<BackendPauseResult> {
    return this.runState(id, 'stop');
  }

  /**
   * Pauses with the guest's memory in a file: vCPUs stopped, RAM and device state (firmware
   * variables, VGA, USB, virtio) streamed to `memory.state` (`saveState`), then QEMU quits and
   * its memory goes back to the host; the overlay stays as QEMU left it. Only a VM whose root is
   * on virtio-blk (a `--desktop` image): QEMU 7.2's NVMe device cannot migrate (a 400 naming
   * `memory`). A failed save leaves the VM running and no file.
   */
  async pauseToFile(id: string): Promise<BackendPauseResult> {
    const vm = this.vm(id);
    if (vm.disk !== 'virtio-blk')
      throw invalidArgument(
        'memory',
        `sandbox ${id} boots its image from an NVMe disk, which QEMU cannot save; images built with --vm --desktop (virtio-blk root) can pause to a file`,
      );
    const p = this.paths(id);
    const record = await this.record(id);
    const before = await this.o.cgroups.memory(id);
    const memoryMiB = record.spec.resources?.memoryMiB ?? DEFAULT_MEMORY_MIB;
    const qmp = this.qmp(id);
    let saved: SavedState;
    try {
      saved = await saveState({
        qmp,
        socketDir: p.run,
        owner: { uid: record.idRange?.uid ?? 0, gid: record.idRange?.gid ?? 0 },
        file: p.state,
        maxBytes: (memoryMiB + VM_STATE_MARGIN_MIB) * 1024 * 1024,
        timeoutMs: this.o.bootTimeoutMs,
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
    const after = await this.o.cgroups.memory(id);
    return { memoryBeforeBytes: before.usageBytes, memoryAfterBytes: after.usageBytes, swapBytes: after.swapBytes };
  }

  /**
   * A VM paused to a file runs again: a new QEMU with the same arguments loads the state, then
   * `cont`; the guest (its screen too) goes on where it stopped. A missing or damaged file, or a
   * failed load, leaves the sandbox paused with its file.
   */
  private async resumeFromFile(id: string, vm: Vm, saved: SavedState): Promise<void> {
    const p = this.paths(id);
    const state = await readSavedState(saved.file);
    const record = await this.record(id);
    try {
      const { exited } = await this.launch(record, vm, true);
      const deadline = Date.now() + this.o.bootTimeoutMs;
      vm.qmp = await Promise.race([connectRetrying(() => QmpClient.connect(fullVmSockets(p.run).qmp, 5000), deadline), exited]);
      await restoreState({ qmp: vm.qmp, socketDir: p.run, state, exited, timeoutMs: this.o.bootTimeoutMs });
      await vm.qmp.execute('cont');
      const agent = await Promise.race([this.connect(id), exited]);
      await Promise.race([withTimeout(agent.ping(), Math.max(1000, deadline - Date.now()), `resume ${id}: the guest did not answer`), exited]);
    } catch (err) {
      this.dropAgent(id);
      await this.kill(id);
      delete vm.qmp;
      delete vm.child;
      throw err;
    }
    delete vm.saved;
    this.watch(id, vm);
    await removeSavedState(saved.file);
  }

  private async record(id: string): Promise<BackendSandbox> {
    return JSON.parse(await readFile(this.paths(id).record, 'utf8')) as BackendSandbox;
  }

  async resume(id: string): Promise<BackendResumeResult> {
    const before = await this.o.cgroups.memory(id);
    const vm = this.vm(id);
    if (vm.saved) await this.resumeFromFile(id, vm, vm.saved);
    else await this.qmp(id).execute('cont');
    const after = await this.o.cgroups.memory(id);
    return { memoryBeforeBytes: before.usageBytes, memoryAfterBytes: after.usageBytes, swapBytes: after.swapBytes };
  }

  async stats(id: string): Promise<SandboxStats> {
    const cg = await this.o.cgroups.stats(id);
    const p = this.paths(id);
    const st = await stat(p.overlay);
    const { stdout } = await run('qemu-img', ['info', '-U', '--output=json', '-f', 'qcow2', p.overlay]);
    const size = (JSON.parse(stdout) as { 'virtual-size': number })['virtual-size'];
    return { ...cg, diskUsedBytes: st.blocks * 512, diskLimitBytes: size };
  }
}

/** The bus a disk layer's root needs: `virtio-blk` where its label says so, else NVMe (any OS boots from it). */
function diskBusOf(layer: LayerInfo): VmDiskBus {
  return layer.labels[VM_DISK_LABEL] === 'virtio-blk' ? 'virtio-blk' : 'nvme';
}

async function writeJsonAtomic(file: string, value: unknown): Promise<void> {
  const tmp = `${file}.tmp`;
  await writeFile(tmp, JSON.stringify(value));
  await rename(tmp, file);
}
