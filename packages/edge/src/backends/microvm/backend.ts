// The microVM backend: one QEMU `-M microvm` per sandbox, chronus as the guest's PID 1 on
// virtio-serial ports, the image's EROFS layers as read-only disks under an overlay whose upper
// directory is on a writable ext4 disk of diskMiB.
import { execFile } from 'node:child_process';
import { chown, mkdir, rename, rm, stat, truncate, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { DEFAULT_CPU, DEFAULT_DISK_MIB, DEFAULT_MEMORY_MIB, DsecError, crashPoint, invalidArgument } from '@dsec/protocol';
import type { EventSink, SandboxStats } from '@dsec/protocol';
import type { Backend, BackendCreateRequest, BackendSandbox, GuestLayerFacet, GuestUpper, MemoryForkFacet, NetworkFacet, PauseFacet } from '../../backend.js';
import type { Cgroups } from '../../host/cgroups.js';
import type { IdRanges } from '../../host/id-ranges.js';
import type { GuestImage } from './guest.js';
import { AGENT_PORTS } from './guest.js';
import type { Accel, VmDisk } from '../qemu/process.js';
import { diskFds } from '../qemu/process.js';
import { qemuArgs, vmSockets } from './qemu.js';
import { exportGuestUpper } from './snapshot.js';
import { QemuSandboxes } from '../qemu/sandboxes.js';
import type { OpenForQemu, QemuMachine, QemuVm } from '../qemu/sandboxes.js';
import { bridgeNodeLink, createVmNetns, guestNetScript, macOf, removeVmNetns, VM_TAP } from '../qemu/network.js';

const run = promisify(execFile);

/** Smallest guest memory a Debian kernel and the initramfs boot in. */
export const MIN_GUEST_MEMORY_MIB = 128;
/** Host memory a QEMU process may use beyond its guest's RAM (its own code, buffers, page tables). */
export const QEMU_OVERHEAD_MIB = 96;

/** What the backend needs of the node and the machine. */
export interface MicrovmBackendOptions {
  /** Directory of one folder per sandbox (0700): records and writable disks. */
  sandboxesDir: string;
  /**
   * Directory (0711, under /run) of one folder per sandbox owned by its QEMU uid (0700): QMP's
   * and the agent's sockets.
   */
  socketsDir: string;
  guest: GuestImage;
  accel: Accel;
  /** Group of /dev/kvm (under KVM). */
  kvmGid?: number | undefined;
  /** The probe's boot time (QEMU start to chronus's first answer), ms. */
  bootMs: number;
  /** Extra guest kernel arguments the accelerator needs (`tsc_early_khz=` under TCG). */
  accelCmdline: string[];
  qemu: string;
  layers: { acquire(digest: string): Promise<string>; release(digest: string): Promise<void>; imageFiles(digest: string): { meta: string; blob: string } };
  cgroups: Cgroups;
  idRanges: IdRanges;
  outputCapBytes: number;
  /** How long a boot may take before the create fails. */
  bootTimeoutMs: number;
  events: EventSink;
}

type Vm = QemuVm;

interface Paths {
  dir: string;
  run: string;
  record: string;
  claim: string;
  disk: string;
  pid: string;
  log: string;
  paused: string;
  /** The guest's memory and device state while paused to a file (`pauseToFile`). */
  state: string;
}

/** MicroVM sandboxes (QEMU microvm + chronus on virtio-serial). */
export class MicrovmBackend extends QemuSandboxes<Vm, Paths> implements Backend {
  readonly kind = 'microvm' as const;
  /** vCPUs stopped (QMP `stop`), memory kept, or written to a file and QEMU ended; resume undoes either. */
  readonly pausing: PauseFacet;
  /** A network namespace per networked VM, with a tap bridged to the node's link (see `linked`). */
  readonly network: NetworkFacet;
  /** Snapshots: the guest copies its overlay's upper directory out through chronus (snapshot.ts). */
  readonly guestLayer: GuestLayerFacet = this;
  /** Forks with memory: a copy of `rw.img` and of the memory state (`../qemu/sandboxes.ts`). */
  readonly memoryFork: MemoryForkFacet = this;

  constructor(private readonly o: MicrovmBackendOptions) {
    super(o);
    this.network = { netnsPath: (id) => this.netnsPath(id), linked: (id) => this.linked(id) };
    this.pausing = this.pauseFacet({ toFile: true });
  }

  /** The accelerator and the probe's boot time: the node's capabilities. */
  get capabilities(): { accel: Accel; bootMs: number } {
    return { accel: this.o.accel, bootMs: this.o.bootMs };
  }

  protected readonly agentPorts = AGENT_PORTS;

  protected agentSocket(id: string, port: number): string {
    return vmSockets(this.paths(id).run).agents[port] as string;
  }

  protected paths(id: string): Paths {
    const dir = path.join(this.o.sandboxesDir, id);
    return {
      dir,
      run: path.join(this.o.socketsDir, id),
      record: path.join(dir, 'sandbox.json'),
      claim: path.join(dir, 'claim.json'),
      disk: path.join(dir, 'rw.img'),
      pid: path.join(dir, 'qemu.pid'),
      log: path.join(dir, 'qemu.log'),
      paused: path.join(dir, 'paused'),
      state: path.join(dir, 'memory.state'),
    };
  }

  async create(req: BackendCreateRequest, signal?: AbortSignal): Promise<BackendSandbox> {
    const p = this.paths(req.id);
    const res = req.spec.resources ?? {};
    const memoryMiB = res.memoryMiB ?? DEFAULT_MEMORY_MIB;
    if (memoryMiB < MIN_GUEST_MEMORY_MIB) throw invalidArgument('resources.memoryMiB', `a microVM needs at least ${MIN_GUEST_MEMORY_MIB} MiB`);
    const diskMiB = res.diskMiB ?? DEFAULT_DISK_MIB;
    const undo: Array<() => unknown> = [];
    const vm: Vm = { portsInUse: new Set() };
    try {
      await mkdir(p.dir, { mode: 0o700 }).catch((err: unknown) => {
        if ((err as NodeJS.ErrnoException).code === 'EEXIST') throw new DsecError('CONFLICT', `sandbox ${req.id} already exists`, { sandboxId: req.id });
        throw err;
      });
      undo.push(() => rm(p.dir, { recursive: true, force: true }));
      const ranges = this.o.idRanges;
      const idRange = await ranges.allocate(req.id);
      undo.push(() => ranges.release(idRange, req.id));
      // QEMU (the sandbox's uid) may reach the run directory; the sandbox folder stays root's.
      await mkdir(p.run, { mode: 0o700 });
      undo.push(() => rm(p.run, { recursive: true, force: true }));
      await chown(p.run, idRange.uid, idRange.gid);

      for (const layer of req.layers) {
        await this.o.layers.acquire(layer.digest);
        undo.push(() => this.o.layers.release(layer.digest));
      }
      const forkedDisk = req.memory?.disks[path.basename(p.disk)];
      if (req.memory && !forkedDisk)
        throw new DsecError('INTERNAL', `sandbox ${req.id}: its memory image has no ${path.basename(p.disk)}`, { sandboxId: req.id });
      if (forkedDisk) {
        // The source's disk as it was when its memory was saved (the same folder tree: a rename).
        await rename(forkedDisk, p.disk);
      } else {
        // The writable disk: a sparse file of diskMiB, ext4 made here (never mounted on the host).
        await writeFile(p.disk, '', { mode: 0o600 });
        await truncate(p.disk, diskMiB * 1024 * 1024);
        await run('mkfs.ext4', ['-q', '-F', '-m', '0', '-E', 'root_owner=0:0,lazy_itable_init=1,lazy_journal_init=1,nodiscard', p.disk]);
      }
      signal?.throwIfAborted();

      // A networked VM: a namespace of its own with a tap (QEMU's uid may open it) on a bridge;
      // the node's link joins the bridge once it is made (`linked`).
      const netns = req.spec.network?.mode === 'allowlist' ? await createVmNetns(req.id, idRange.uid, idRange.gid) : undefined;
      if (netns) undo.push(() => removeVmNetns(req.id));
      const record: BackendSandbox = { id: req.id, backend: 'microvm', spec: req.spec, layers: req.layers, createdAt: new Date().toISOString(), idRange };
      await writeJsonAtomic(p.record, record);
      undo.push(() => this.o.cgroups.remove(req.id));
      this.vms.set(req.id, vm);
      undo.push(() => this.kill(req.id));
      if (req.memory) {
        await this.startFromMemory(record, vm, req.memory, signal);
      } else {
        const { exited } = await this.launch(record, vm);
        crashPoint('microvm.create.launched');
        await this.awaitGuest(req.id, vm, exited, signal);
      }
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

  /** The microVM: its kernel, initramfs and disks (layers read-only, the writable disk), as descriptors. */
  protected async machine(record: BackendSandbox, _vm: Vm, open: OpenForQemu): Promise<QemuMachine> {
    const id = record.id;
    const p = this.paths(id);
    const res = record.spec.resources ?? {};
    const memoryMiB = res.memoryMiB ?? DEFAULT_MEMORY_MIB;
    const netns = record.spec.network?.mode === 'allowlist';
    const disks: VmDisk[] = [];
    for (const [i, layer] of record.layers.entries()) {
      const files = this.o.layers.imageFiles(layer.digest);
      disks.push({ serial: `m${i}`, fds: [await open(files.meta)], readOnly: true });
      if ((await stat(files.blob)).size > 0) disks.push({ serial: `b${i}`, fds: [await open(files.blob)], readOnly: true });
    }
    disks.push({ serial: 'rw', fds: [await open(p.disk), await open(p.disk, true)], readOnly: false });
    const args = qemuArgs({
      qemu: this.o.qemu,
      accel: this.o.accel,
      kernel: this.o.guest.kernel.vmlinuz,
      initramfs: this.o.guest.initramfs,
      cmdline: [...this.o.accelCmdline, `dsec.layers=${record.layers.length}`, `dsec.cap=${this.o.outputCapBytes}`],
      memoryMiB,
      vcpus: Math.max(1, Math.ceil(res.cpu ?? DEFAULT_CPU)),
      disks,
      runDir: p.run,
      ...(netns ? { tap: { ifname: VM_TAP, mac: macOf(id) } } : {}),
    });
    return { args, fds: diskFds(disks), memoryBytes: (memoryMiB + QEMU_OVERHEAD_MIB) * 1024 * 1024 };
  }

  protected override forkDisks(id: string): string[] {
    return [this.paths(id).disk];
  }

  protected qmpSocket(id: string): string {
    return vmSockets(this.paths(id).run).qmp;
  }

  protected adopted(): Vm {
    return { portsInUse: new Set() };
  }

  /**
   * The node made its link (eth0 with the sandbox's address peering the gateway, default route) in
   * the VM's namespace: the address moves into the guest and eth0 joins the tap's bridge, so the
   * guest's packets leave through the very link (and rules) a container's would.
   */
  async linked(id: string): Promise<void> {
    const link = await bridgeNodeLink(id);
    // The MAC is set too: a fork with memory comes up with its source's (virtio-net's migrated state).
    await this.configureGuestNetwork(id, ['/.dsec/busybox', 'sh', '-c', guestNetScript('eth0', link, 'ip', macOf(id))]);
  }

  /** The sandbox's upper directory copied into a folder of its own on the host (snapshot.ts). */
  async exportUpper(id: string, signal?: AbortSignal): Promise<GuestUpper> {
    const record = await this.record(id);
    const diskMiB = record.spec.resources?.diskMiB ?? DEFAULT_DISK_MIB;
    return exportGuestUpper(await this.connect(id), {
      id,
      workDir: path.join(this.paths(id).dir, 'snapshots'),
      // Nothing in the disk can be larger than the disk.
      limits: { maxTotalBytes: diskMiB * 1024 * 1024 },
      signal,
    });
  }

  async stats(id: string): Promise<SandboxStats> {
    const cg = await this.o.cgroups.stats(id);
    const st = await stat(this.paths(id).disk);
    return { ...cg, diskUsedBytes: st.blocks * 512, diskLimitBytes: st.size };
  }
}

async function writeJsonAtomic(file: string, value: unknown): Promise<void> {
  const tmp = `${file}.tmp`;
  await writeFile(tmp, JSON.stringify(value));
  await rename(tmp, file);
}
