// The full-VM backend: one QEMU q35 machine with OVMF per sandbox, booting its image (a `disk`
// layer, qcow2) through a copy-on-write overlay of its own; chronus as a systemd service in the
// guest on virtio-serial ports, the QEMU guest agent beside it.
import { execFile } from 'node:child_process';
import { chown, copyFile, mkdir, mkdtemp, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { DEFAULT_CPU, DEFAULT_DISK_MIB, DEFAULT_MEMORY_MIB, DsecError, invalidArgument } from '@dsec/protocol';
import type { EventSink, LayerInfo, SandboxStats, ScreenCapture } from '@dsec/protocol';
import type {
  Backend,
  BackendCreateRequest,
  BackendPauseResult,
  BackendResumeResult,
  BackendSandbox,
  MemoryForkFacet,
  DiskCopy,
  DiskSnapshotFacet,
  NetworkFacet,
  PauseFacet,
  SandboxAgent,
  ScreenFacet,
} from '../../backend.js';
import { withTimeout } from '../../abortable.js';
import type { Cgroups } from '../../host/cgroups.js';
import type { IdRanges } from '../../host/id-ranges.js';
import { AGENT_PORTS } from '../microvm/guest.js';
import { flattenOverlay, virtualBytes } from '../../layers/vm-image.js';
import { VM_AGENT_LABEL, VM_DESKTOP_LABEL, VM_DISK_LABEL } from '../../layers/store.js';
import { SNAPSHOT_PARENTS_LABEL } from '../../snapshots.js';
import { bridgeNodeLink, createVmNetns, guestNetScript, macOf, removeVmNetns, VM_TAP } from '../qemu/network.js';
import type { Accel } from '../qemu/process.js';
import { collectOutput, freezeLines, runGuestStep, thawLines } from '../qemu/guest-steps.js';
import type { QmpClient } from '../qemu/qmp.js';
import { QemuSandboxes } from '../qemu/sandboxes.js';
import type { OpenForQemu, QemuMachine, QemuVm } from '../qemu/sandboxes.js';
import { pngSize, QmpScreen } from '../qemu/screen.js';
import type { SandboxScreen } from '../qemu/screen.js';
import { connectUnix } from '../qemu/sockets.js';
import { fullVmArgs, fullVmFdList, fullVmSockets, OVMF_CODE, OVMF_VARS } from './qemu.js';
import type { VmDiskBus } from './qemu.js';
import { GuestAgentClient } from './guest.js';

const run = promisify(execFile);

/** Smallest guest memory a Debian systemd guest boots in. */
export const MIN_VM_MEMORY_MIB = 256;
/** Host memory a QEMU process may use beyond its guest's RAM (firmware, display, TCG's cache). */
export const VM_QEMU_OVERHEAD_MIB = 320;

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
  paused: string;
  state: string;
  /** The last screen (PNG) of a VM paused to a file, taken with its vCPUs stopped. */
  screen: string;
}

/** Full-VM sandboxes (QEMU q35 + OVMF, a qcow2 overlay over a disk image layer). */
export class VmBackend extends QemuSandboxes<Vm, Paths> implements Backend {
  readonly kind = 'vm' as const;
  private lastBootMs = 0;
  /** vCPUs stopped (QMP `stop`), memory kept; `cont` resumes. A virtio-blk root also pauses to a file. */
  readonly pausing: PauseFacet;
  /** A network namespace per networked VM, with a tap bridged to the node's link. */
  readonly network: NetworkFacet;
  /** Forks with memory (a virtio-blk root): the overlay, the firmware variables and the memory state copied. */
  readonly memoryFork: MemoryForkFacet = this;
  /**
   * Each VM's screen, mouse and keyboard (QMP; screendumps go to its run directory, which its QEMU
   * may write). A VM paused to a file has no QEMU: its screenshot is the screen it showed when it
   * paused (kept by `pauseToFile`); input and the live view need a QEMU.
   */
  readonly screen: ScreenFacet = {
    screen: (id): SandboxScreen => {
      const live = new QmpScreen({ qmp: () => this.qmp(id), dumpDir: this.paths(id).run, vncSocket: this.vncSocket(id) });
      return {
        capture: (signal) => (this.vm(id).saved ? this.lastScreen(id) : live.capture(signal)),
        input: (actions, signal) => live.input(actions, signal),
        connectVnc: () => live.connectVnc(),
      };
    },
  };

  constructor(private readonly o: VmBackendOptions) {
    super(o);
    this.network = { netnsPath: (id) => this.netnsPath(id), linked: (id) => this.linked(id) };
    // Pause to a file through the base; a sandbox whose root is on NVMe refuses it (`pauseToFile`).
    this.pausing = this.pauseFacet({ toFile: true });
    this.diskSnapshot = { copyDisk: (id, signal) => this.copyDisk(id, signal) };
  }

  /** Snapshots: the VM's overlay copied while the guest is held still, flattened over its image. */
  readonly diskSnapshot: DiskSnapshotFacet;

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
      paused: path.join(dir, 'paused'),
      state: path.join(dir, 'memory.state'),
      screen: path.join(dir, 'screen.png'),
    };
  }

  /**
   * The disk layer a VM boots: its image, or (a fork) the topmost of its image and the snapshots
   * taken over it, each a standalone disk whose parents label names the layers below it
   * (INVALID_ARGUMENT naming `image` otherwise).
   */
  private diskLayer(layers: LayerInfo[]): LayerInfo {
    const layer = layers.at(-1);
    if (!layer) throw invalidArgument('image', 'a vm sandbox boots one disk image: give only image.base');
    if (
      layers.length > 1 &&
      layer.labels[SNAPSHOT_PARENTS_LABEL] !==
        layers
          .slice(0, -1)
          .map((l) => l.digest)
          .join(',')
    )
      throw invalidArgument('image', 'a vm sandbox boots one disk image: give only image.base');
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
    const vm = this.adopted(req);
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

      // Every layer of the record (a fork's image and snapshots below the one it boots): the
      // teardown and an adoption count them all.
      for (const l of req.layers) {
        await this.o.layers.acquire(l.digest);
        undo.push(() => this.o.layers.release(l.digest));
      }
      const base = this.o.layers.diskFile(layer.digest);
      if (req.memory) {
        // A fork with memory: the source's overlay and firmware variables as they were when its
        // memory was saved (the overlay names the same image file as its backing).
        for (const file of [p.overlay, p.vars]) {
          const copy = req.memory.disks[path.basename(file)];
          if (!copy) throw new DsecError('INTERNAL', `sandbox ${req.id}: its memory image has no ${path.basename(file)}`, { sandboxId: req.id });
          await rename(copy, file);
        }
      } else {
        // The overlay: at least the image's size, diskMiB when larger (the guest's partitions stay
        // as the image made them; the room beyond is an unpartitioned tail).
        const sizeBytes = Math.max(await virtualBytes(base), diskMiB * 1024 * 1024);
        await run('qemu-img', ['create', '-q', '-f', 'qcow2', '-F', 'qcow2', '-b', base, '-u', p.overlay, String(sizeBytes)]);
        await copyFile(OVMF_VARS, p.vars);
      }
      signal?.throwIfAborted();

      const netns = req.spec.network?.mode === 'allowlist' ? await createVmNetns(req.id, idRange.uid, idRange.gid) : undefined;
      if (netns) undo.push(() => removeVmNetns(req.id));
      const record: BackendSandbox = { id: req.id, backend: 'vm', spec: req.spec, layers: req.layers, createdAt: new Date().toISOString(), idRange };
      await writeJsonAtomic(p.record, record);
      undo.push(() => this.o.cgroups.remove(req.id));
      this.vms.set(req.id, vm);
      undo.push(() => this.kill(req.id));
      const started = Date.now();
      if (req.memory) {
        await this.startFromMemory(record, vm, req.memory, signal);
      } else {
        const { exited } = await this.launch(record, vm);
        await this.awaitGuest(req.id, vm, exited, signal);
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

  /** The q35 machine: OVMF (code read-only, the VM's own variables), its disk's overlay over the image on the image's bus. */
  protected async machine(record: BackendSandbox, vm: Vm, open: OpenForQemu): Promise<QemuMachine> {
    const p = this.paths(record.id);
    const res = record.spec.resources ?? {};
    const memoryMiB = res.memoryMiB ?? DEFAULT_MEMORY_MIB;
    const fds = fullVmFdList({
      code: await open(OVMF_CODE),
      vars: [await open(p.vars), await open(p.vars, true)],
      base: await open(this.o.layers.diskFile(this.diskLayer(record.layers).digest)),
      overlay: [await open(p.overlay), await open(p.overlay, true)],
    });
    const args = fullVmArgs({
      accel: this.o.accel,
      memoryMiB,
      vcpus: Math.max(1, Math.ceil(res.cpu ?? DEFAULT_CPU)),
      runDir: p.run,
      disk: vm.disk,
      ...(record.spec.network?.mode === 'allowlist' ? { tap: { ifname: VM_TAP, mac: macOf(record.id) } } : {}),
    });
    return { args, fds, memoryBytes: (memoryMiB + VM_QEMU_OVERHEAD_MIB) * 1024 * 1024 };
  }

  protected qmpSocket(id: string): string {
    return fullVmSockets(this.paths(id).run).qmp;
  }

  protected adopted(record: Pick<BackendSandbox, 'layers'>): Vm {
    const layer = this.diskLayer(record.layers);
    return { portsInUse: new Set(), chronus: layer.labels[VM_AGENT_LABEL] === 'chronus', disk: diskBusOf(layer) };
  }

  /**
   * With chronus, waits until the guest's boot is over (`systemctl is-system-running --wait`):
   * chronus answers early in the boot (it needs nothing but its ports), and a connection made then
   * was seen to end or be reset before the boot did (the base's wait makes it again); the first
   * command then runs on a settled guest.
   */
  protected override async settled(id: string, vm: Vm, agent: SandboxAgent, deadline: number): Promise<void> {
    if (!vm.chronus) return;
    const att = await agent.spawn({ argv: ['/bin/systemctl', 'is-system-running', '--wait'] });
    const exit = await withTimeout(att.exited, Math.max(1000, deadline - Date.now()), `create ${id}: the guest's boot did not finish in time`);
    await agent.release(exit.proc).catch(() => undefined);
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
    // The MAC is set too: a fork with memory comes up with its source's (virtio-net's migrated state).
    const script = `for d in /sys/class/net/*; do n=\${d##*/}; [ "$n" != lo ] && break; done; ${guestNetScript('"$n"', link, 'ip', macOf(id))}`;
    await this.configureGuestNetwork(id, ['/bin/sh', '-c', script]);
  }

  /** A fork with memory copies the overlay and the firmware variables; an NVMe root cannot migrate (400 naming `memory`). */
  protected override forkDisks(id: string): string[] {
    if (this.vm(id).disk !== 'virtio-blk') {
      throw invalidArgument(
        'memory',
        `sandbox ${id} boots its image from an NVMe disk, which QEMU cannot save; images built with --vm --desktop (virtio-blk root) can fork with memory`,
      );
    }
    const p = this.paths(id);
    return [p.overlay, p.vars];
  }

  /**
   * Pauses with the guest's memory in a file (the base's `pauseToFile`). Only a VM whose root is
   * on virtio-blk (a `--desktop` image): QEMU 7.2's NVMe device cannot migrate, so such a VM is
   * refused with a 400 naming `memory` and runs on.
   */
  override async pauseToFile(id: string): Promise<BackendPauseResult> {
    if (this.vm(id).disk !== 'virtio-blk')
      throw invalidArgument(
        'memory',
        `sandbox ${id} boots its image from an NVMe disk, which QEMU cannot save; images built with --vm --desktop (virtio-blk root) can pause to a file`,
      );
    // The screen while paused is the last one the guest drew: the vCPUs stop first (the save
    // stops them anyway), then the screendump. Without one (a failed dump), a paused VM's
    // screenshot is refused as before.
    const p = this.paths(id);
    const qmp = this.qmp(id);
    await qmp.execute('stop');
    try {
      const last = await this.screen.screen(id).capture();
      await writeFile(p.screen, last.png, { mode: 0o600 });
    } catch {
      await rm(p.screen, { force: true });
    }
    try {
      return await super.pauseToFile(id);
    } catch (err) {
      // A failed save leaves the VM as it was: running (the base resumes it after its own failures).
      if (!this.vm(id).saved) await qmp.execute('cont').catch(() => undefined);
      await rm(p.screen, { force: true });
      throw err;
    }
  }

  /** Resumes (from the file, or QMP `cont`); the kept last screen goes once a QEMU shows the screen again. */
  override async resume(id: string): Promise<BackendResumeResult> {
    const r = await super.resume(id);
    await rm(this.paths(id).screen, { force: true });
    return r;
  }

  /** The screen a VM paused to a file showed when it paused (409 when none was kept). */
  private async lastScreen(id: string): Promise<ScreenCapture> {
    const png = await readFile(this.paths(id).screen).catch(() => {
      throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${id} is paused with its memory in a file, and its last screen was not kept`, {
        sandboxId: id,
        state: 'paused',
      });
    });
    return { png, ...pngSize(png) };
  }

  /**
   * Copies the VM's overlay (see {@link DiskSnapshotFacet}). A running guest is synced and its
   * file systems frozen first (chronus: `fsfreeze` of the root with a guard in the guest that
   * lifts it after FREEZE_GUARD_S (guest-steps.ts) whatever happens to the edge; an image without chronus:
   * the QEMU guest agent's `guest-fsfreeze-freeze`, or none when it cannot), then its vCPUs are
   * stopped (QEMU drains and flushes the disk) while the file is copied, and it runs on. A paused
   * VM (in memory or in a file) is copied as it is.
   */
  private async copyDisk(id: string, signal?: AbortSignal): Promise<DiskCopy> {
    const vm = this.vm(id);
    const p = this.paths(id);
    const record = await this.record(id);
    const layer = this.diskLayer(record.layers);
    // The disk create gave the VM (the image's size, diskMiB when larger): the copy's bound.
    const diskBytes = Math.max(await virtualBytes(this.o.layers.diskFile(layer.digest)), (record.spec.resources?.diskMiB ?? DEFAULT_DISK_MIB) * 1024 * 1024);
    const workDir = path.join(p.dir, 'snapshots');
    await mkdir(workDir, { recursive: true, mode: 0o700 });
    const dir = await mkdtemp(path.join(workDir, 'disk-'));
    const copy = path.join(dir, 'overlay.qcow2');
    const take = (): Promise<unknown> => run('cp', ['--sparse=always', '--reflink=auto', p.overlay, copy], { signal });
    await this.o.layers.acquire(layer.digest);
    const remove = async (): Promise<void> => {
      await rm(dir, { recursive: true, force: true });
      await this.o.layers.release(layer.digest);
    };
    try {
      if (vm.saved || !(await this.qmp(id).execute<{ running: boolean }>('query-status')).running) await take();
      else await this.copyRunning(id, vm, take, signal);
    } catch (err) {
      await remove();
      throw err;
    }
    const labels: Record<string, string> = {};
    for (const key of [VM_AGENT_LABEL, VM_DISK_LABEL, VM_DESKTOP_LABEL]) if (layer.labels[key] !== undefined) labels[key] = layer.labels[key];
    return { labels, flatten: (out, s) => flattenOverlay(copy, this.o.layers.diskFile(layer.digest), out, diskBytes, s), remove };
  }

  /** `take` with the running guest's file systems frozen (where it can) and its vCPUs stopped. */
  private async copyRunning(id: string, vm: Vm, take: () => Promise<unknown>, signal?: AbortSignal): Promise<void> {
    const agent = await this.connect(id);
    let thaw: () => Promise<unknown> = async () => undefined;
    try {
      if (vm.chronus) {
        // A freeze step that failed or timed out may still have frozen the root: thawed anyway.
        thaw = () => guestScript(agent, id, 'thaw', GUEST_THAW, []);
        const guard = (await guestScript(agent, id, 'freeze', GUEST_FREEZE, [], signal)).trim();
        thaw = () => guestScript(agent, id, 'thaw', GUEST_THAW, /^\d+$/.test(guard) ? [guard] : []);
      } else if (agent instanceof GuestAgentClient) {
        // Any OS: frozen where its guest agent can (a failure leaves the copy as after a power cut).
        thaw = () => agent.fsthaw();
        await agent.fsfreeze().catch(() => undefined);
      }
      const qmp = this.qmp(id);
      await qmp.execute('stop');
      try {
        await take();
      } finally {
        await qmp.execute('cont');
      }
    } finally {
      await thaw().catch(() => undefined);
    }
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

/** Starts the guard, syncs and freezes the root ({@link freezeLines}); prints the guard's pid. Run by chronus as root. */
const GUEST_FREEZE = `set -e
PATH=/usr/sbin:/usr/bin:/sbin:/bin
${freezeLines('/')}`;

/** Lifts the freeze and ends the guard (`$1`); safe to run again. */
const GUEST_THAW = `PATH=/usr/sbin:/usr/bin:/sbin:/bin
${thawLines('/')}exit 0
`;

/** Runs a snapshot step's `script` under the guest's sh as root (bounded): its stdout once it exited 0. */
async function guestScript(agent: SandboxAgent, id: string, step: string, script: string, args: string[], signal?: AbortSignal): Promise<string> {
  const out = await runGuestStep(agent, { id, step, shell: ['/bin/sh'], script, args, consume: collectOutput, signal });
  return out.toString('utf8');
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
