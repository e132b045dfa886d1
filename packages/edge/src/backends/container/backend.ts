// The container backend: crun on an overlay of EROFS layers, chronus as PID 1.
import { constants as fsConstants, readFileSync } from 'node:fs';
import { mkdir, open, readdir, readFile, rm, writeFile, rename } from 'node:fs/promises';
import type { FileHandle } from 'node:fs/promises';
import path from 'node:path';
import { DEFAULT_DISK_MIB, DsecError } from '@dsec/protocol';
import type { SandboxStats } from '@dsec/protocol';
import type { Backend, BackendCreateRequest, BackendSandbox, SandboxAgent } from '../../backend.js';
import { ChronusClient } from '../../chronus/client.js';
import type { Cgroups } from '../../host/cgroups.js';
import { closeFd, listenUnix, MNT, umount, mountsUnder } from '../../sys/linux.js';
import { buildOciConfig } from './bundle.js';
import { Crun } from './crun.js';

/** What the container backend needs from the layer store. */
export interface LayerMounter {
  /** Mounts a layer once per node (reference counted) and returns its directory. */
  acquire(digest: string): Promise<string>;
  release(digest: string): Promise<void>;
}

/** Default bytes of output chronus keeps per stream. */
export const DEFAULT_OUTPUT_CAP_BYTES = 4 * 1024 * 1024;
/** Inodes per MiB of writable layer. */
const INODES_PER_MIB = 256;

/** Options of {@link ContainerBackend}. */
export interface ContainerBackendOptions {
  /** Directory holding one folder per sandbox. */
  sandboxesDir: string;
  /** crun's state root. */
  crunRoot: string;
  /** argv prefix that enters the runtime mount namespace (empty on hosts that need none). */
  runtimePrefix: string[];
  /** The runtime mount namespace's nsfs file, when the host needs one. */
  runtimeNsFile?: string;
  /** Host path of dsec-launch (built beside chronus). */
  launcherBinary: string;
  layers: LayerMounter;
  cgroups: Cgroups;
  /** Host path of the static chronus binary. */
  agentBinary: string;
  outputCapBytes?: number;
  crunBinary?: string;
}

interface Paths {
  dir: string;
  rw: string;
  upper: string;
  work: string;
  rootfs: string;
  socket: string;
  record: string;
  log: string;
}

/** Container sandboxes: crun + overlayfs over shared EROFS layer mounts + chronus. */
export class ContainerBackend implements Backend {
  readonly kind = 'container' as const;
  private readonly crun: Crun;
  private readonly agents = new Map<string, ChronusClient>();
  private readonly connecting = new Map<string, Promise<ChronusClient>>();
  private readonly hostNofileHard: number;

  constructor(private readonly o: ContainerBackendOptions) {
    this.crun = new Crun(o.runtimePrefix, o.crunRoot, o.crunBinary);
    this.hostNofileHard = hostNofileHard();
  }

  private paths(id: string): Paths {
    const dir = path.join(this.o.sandboxesDir, id);
    return {
      dir,
      rw: path.join(dir, 'rw'),
      upper: path.join(dir, 'rw', 'upper'),
      work: path.join(dir, 'rw', 'work'),
      rootfs: path.join(dir, 'rootfs'),
      socket: path.join(dir, 'agent.sock'),
      record: path.join(dir, 'sandbox.json'),
      log: path.join(dir, 'runtime.log'),
    };
  }

  async create(req: BackendCreateRequest, signal?: AbortSignal): Promise<BackendSandbox> {
    const p = this.paths(req.id);
    const undo: Array<() => Promise<unknown> | unknown> = [];
    try {
      await mkdir(p.dir, { recursive: false }).catch((err: NodeJS.ErrnoException) => {
        if (err.code === 'EEXIST') throw new DsecError('CONFLICT', `sandbox ${req.id} already exists`, { sandboxId: req.id });
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

      // The writable layer is a size-limited tmpfs (writing past diskMiB fails with ENOSPC
      // inside the sandbox, and nothing outside it is touched) under an overlay of the layers.
      // dsec-launch mounts both in a mount namespace of the sandbox's own, right before crun:
      // they never enter the host's mount table, so creates stay flat as the node fills.
      const diskMiB = req.spec.resources?.diskMiB ?? DEFAULT_DISK_MIB;
      await mkdir(p.rw);
      await mkdir(p.rootfs);
      const launch = [
        this.o.launcherBinary,
        ...(this.o.runtimeNsFile ? ['--ns', this.o.runtimeNsFile] : []),
        '--rw', p.rw,
        '--tmpfs', `size=${diskMiB}m,nr_inodes=${Math.max(1024, diskMiB * INODES_PER_MIB)},mode=0700`,
        '--rootfs', p.rootfs,
        '--lower', lowers.join(':'),
        '--',
      ];

      const config = buildOciConfig({
        id: req.id,
        spec: req.spec,
        rootfs: p.rootfs,
        agentBinary: this.o.agentBinary,
        cgroupsPath: this.o.cgroups.pathFor(req.id),
        outputCapBytes: this.o.outputCapBytes ?? DEFAULT_OUTPUT_CAP_BYTES,
        hostNofileHard: this.hostNofileHard,
      });
      await writeFile(path.join(p.dir, 'config.json'), JSON.stringify(config));
      const record: BackendSandbox = { id: req.id, backend: 'container', spec: req.spec, layers: req.layers, createdAt: new Date().toISOString() };
      await writeJsonAtomic(p.record, record);
      signal?.throwIfAborted();

      // The agent's socket lives on the host, outside the sandbox's file system; chronus
      // inherits the listening fd and edge connects to the path, as often as it needs.
      const sockFd = listenUnix(p.socket);
      let log: FileHandle | undefined;
      try {
        log = await open(p.log, fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_APPEND, 0o600);
        undo.push(() => this.crun.run(['delete', '--force', req.id]));
        await this.crun.check(['run', '--detach', '--preserve-fds', '1', '--bundle', p.dir, req.id], `create ${req.id}`, {
          extraFds: [sockFd],
          logFd: log.fd,
          prefix: launch,
        });
      } catch (err) {
        const detail = await readFile(p.log, 'utf8').catch(() => '');
        if (err instanceof DsecError && detail.trim()) err.message += ` (${detail.trim().split('\n').slice(-3).join('; ')})`;
        throw err;
      } finally {
        closeFd(sockFd);
        await log?.close();
      }
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

  async recover(): Promise<BackendSandbox[]> {
    const found: BackendSandbox[] = [];
    const entries = await readdir(this.o.sandboxesDir).catch(() => [] as string[]);
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
      if (status !== 'running') {
        // Its processes are gone (the node rebooted or PID 1 died): the sandbox is lost.
        await this.teardown(id, []);
        continue;
      }
      // Its layers are still mounted; take this process's references on them again.
      for (const layer of record.layers) await this.o.layers.acquire(layer.digest);
      found.push(record);
    }
    return found;
  }

  agent(id: string): Promise<SandboxAgent> {
    return this.connect(id);
  }

  connectAgent(id: string): Promise<SandboxAgent> {
    return ChronusClient.connect(this.paths(id).socket);
  }

  private async connect(id: string): Promise<ChronusClient> {
    const live = this.agents.get(id);
    if (live?.connected) return live;
    let pending = this.connecting.get(id);
    if (!pending) {
      pending = ChronusClient.connect(this.paths(id).socket)
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
    let layers: BackendSandbox['layers'] = [];
    try {
      layers = (JSON.parse(await readFile(p.record, 'utf8')) as BackendSandbox).layers;
    } catch {
      throw new DsecError('SANDBOX_NOT_FOUND', `no sandbox ${id} on this node`, { sandboxId: id });
    }
    await this.teardown(id, layers.map((l) => l.digest));
  }

  /** Removes every trace of a sandbox; safe to call on a half-created or already-gone one. */
  private async teardown(id: string, digests: string[]): Promise<void> {
    const p = this.paths(id);
    this.dropAgent(id);
    const res = await this.crun.run(['delete', '--force', id]);
    if (res.code !== 0 && (await this.crun.status(id)) !== undefined) {
      throw new DsecError('BACKEND_FAILED', `destroy ${id}: ${res.stderr.trim()}`, { sandboxId: id });
    }
    for (const m of await mountsUnder(p.dir)) umount(m, MNT.DETACH);
    for (const d of digests) await this.o.layers.release(d);
    await this.o.cgroups.remove(id);
    await rm(p.dir, { recursive: true, force: true });
  }

  async stats(id: string): Promise<SandboxStats> {
    const p = this.paths(id);
    const cg = await this.o.cgroups.stats(id);
    // The overlay root reports its upper file system: the sandbox's tmpfs.
    const fs = await (await this.connect(id)).statfs('/');
    return { ...cg, diskUsedBytes: fs.totalBytes - fs.freeBytes, diskLimitBytes: fs.totalBytes };
  }


  /**
   * The network namespace of the sandbox's PID 1 (crun gave it a fresh one), from crun's state
   * file; the start time guards against a reused PID.
   */
  async netnsPath(id: string): Promise<string> {
    let state: { pid?: number; 'process-start-time'?: number };
    try {
      state = JSON.parse(await readFile(path.join(this.o.crunRoot, id, 'status'), 'utf8')) as typeof state;
    } catch {
      throw new DsecError('SANDBOX_NOT_FOUND', `sandbox ${id} has no running container`, { sandboxId: id });
    }
    const pid = state.pid;
    const stat = pid ? await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '') : '';
    // Field 22 (start time) counts from after the command name, which may hold spaces.
    const startTime = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]);
    if (!pid || !stat || (state['process-start-time'] !== undefined && startTime !== state['process-start-time'])) {
      throw new DsecError('SANDBOX_NOT_RUNNING', `sandbox ${id} is not running`, { sandboxId: id });
    }
    return `/proc/${pid}/ns/net`;
  }

  /** OOM kills so far in a sandbox (read synchronously: it is on the exec path). */
  oomKillsNow(id: string): number {
    return this.o.cgroups.oomKillsSync(id);
  }

  async close(): Promise<void> {
    for (const id of [...this.agents.keys()]) this.dropAgent(id);
  }
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

