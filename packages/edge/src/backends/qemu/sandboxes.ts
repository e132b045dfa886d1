// What every QEMU backend (microVM, full VM) does alike with its sandboxes once QEMU runs: the
// agent connections over virtio-serial, claims, the crash watch, destroy and teardown, garbage
// collection, the network namespace. A backend adds how it builds and starts its machine.
import type { ChildProcess } from 'node:child_process';
import { readFile, readdir, rm, stat, writeFile } from 'node:fs/promises';
import { DsecError } from '@dsec/protocol';
import type { EventSink, SandboxClaim } from '@dsec/protocol';
import type { BackendPauseResult, BackendSandbox, GarbageFacet, GarbageOptions, GarbageReport, SandboxAgent } from '../../backend.js';
import { ChronusClient } from '../../chronus/client.js';
import type { Cgroups } from '../../host/cgroups.js';
import type { IdRanges } from '../../host/id-ranges.js';
import { killQemu, watchQemu } from './lifecycle.js';
import { netnsName, removeVmNetns } from './network.js';
import type { QmpClient } from './qmp.js';
import { connectUnix } from './sockets.js';

/** One running (or paused) QEMU sandbox as its backend holds it. */
export interface QemuVm {
  child?: ChildProcess;
  qmp?: QmpClient;
  /** Set while destroy runs: an exit is then expected. */
  stopping?: boolean;
  /** Extra agent ports (1..ports-1) in use by connections of their own. */
  portsInUse: Set<number>;
}

/** The files of one sandbox the shared code touches. */
export interface QemuPaths {
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
  cgroups: Cgroups;
  idRanges: IdRanges;
  layers: { release(digest: string): Promise<void> };
  events: EventSink;
}

/** The sandboxes of one QEMU backend; subclasses build and start the machines. */
export abstract class QemuSandboxes<V extends QemuVm, P extends QemuPaths> implements GarbageFacet {
  abstract readonly kind: 'microvm' | 'vm';
  protected readonly vms = new Map<string, V>();
  private readonly agents = new Map<string, SandboxAgent>();
  private readonly connecting = new Map<string, Promise<SandboxAgent>>();
  readonly garbage: GarbageFacet = this;

  constructor(private readonly q: QemuSandboxesOptions) {}

  protected abstract paths(id: string): P;
  /** Socket of the guest's chronus port `port` (0 is the main connection). */
  protected abstract agentSocket(id: string, port: number): string;
  /** Number of chronus ports the guest listens on. */
  protected abstract readonly agentPorts: number;

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
        const sock = await connectUnix(this.agentSocket(id, port));
        sock.once('close', () => vm.portsInUse.delete(port));
        return new ChronusClient(sock, this.forged(id));
      } catch (err) {
        vm.portsInUse.delete(port);
        throw err;
      }
    }
    throw new DsecError('UNAVAILABLE', `sandbox ${id}: all ${this.agentPorts - 1} extra agent ports are in use`, { sandboxId: id, retryAfterMs: 1000 });
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

  /** QMP `stop` (vCPUs stopped, memory kept) or `cont`, with the cgroup's memory around it. */
  protected async runState(id: string, command: 'stop' | 'cont'): Promise<BackendPauseResult> {
    const before = await this.q.cgroups.memory(id);
    await this.qmp(id).execute(command);
    const after = await this.q.cgroups.memory(id);
    return { memoryBeforeBytes: before.usageBytes, memoryAfterBytes: after.usageBytes, swapBytes: after.swapBytes };
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

  /** A crashed QEMU: the sandbox is lost (an event says so) and nothing of it is left behind. */
  protected watch(id: string, vm: V): void {
    watchQemu(vm.child, { id, backend: this.kind, events: this.q.events, stopping: () => vm.stopping === true, teardown: () => this.teardown(id) });
  }

  async recover(): Promise<BackendSandbox[]> {
    // A QEMU process outlives its edge only as an orphan nobody holds QMP for: end it.
    for (const id of await readdir(this.q.sandboxesDir).catch(() => [] as string[])) await this.teardown(id).catch(() => undefined);
    return [];
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

  async close(): Promise<void> {
    for (const id of [...this.agents.keys()]) this.dropAgent(id);
    for (const vm of this.vms.values()) vm.qmp?.close();
  }
}

export async function exists(p: string): Promise<boolean> {
  return stat(p).then(
    () => true,
    () => false,
  );
}
