// The peers dsec is measured against, on the same busybox rootfs: podman (run --rm, exec),
// crun (run, exec) on a prepared bundle, and bubblewrap one-shot (the cost floor).
//
// On hybrid-cgroup hosts crun and podman refuse to run; like edge, the peers run in a private
// mount namespace where /sys/fs/cgroup/unified is unmounted, pinned by a bind mount of its nsfs
// file and entered with nsenter. podman gets its own --root/--runroot under the bench's temp dir,
// so the host's podman state is never touched, and never pulls (--pull never, --network none).
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { detectCgroupMode, mount, MS, umount, MNT } from '@dsec/edge';
import { onCleanup } from './cleanup.js';

/** Limits podman would otherwise set above the host's hard limits (crun then fails). */
export const PODMAN_ULIMITS = ['--ulimit', 'nofile=4096:4096', '--ulimit', 'nproc=4096:4096'];
/** Output of a failed command kept for its error message. */
const MAX_CAPTURE = 8192;

/** Result of one command. */
export interface RunResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Options of {@link runCommand}. */
export interface RunOptions {
  /** Bytes written to stdin, which is then closed. */
  stdin?: string | Buffer;
  /** Called with each stdout chunk instead of collecting it. */
  onStdout?: (chunk: Buffer) => void;
  timeoutMs?: number;
  /** The command leaves a process behind (crun run --detach): do not wait for its output pipes. */
  detached?: boolean;
}

/** Runs argv; resolves with its exit code and (capped) output. */
export function runCommand(argv: readonly string[], opts: RunOptions = {}): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    const out = opts.detached ? 'ignore' : 'pipe';
    const child: ChildProcess = spawn(argv[0]!, argv.slice(1), { stdio: [opts.stdin === undefined ? 'ignore' : 'pipe', out, out] });
    let stdout = '';
    let stderr = '';
    child.stdout?.on('data', (d: Buffer) => {
      if (opts.onStdout) opts.onStdout(d);
      else if (stdout.length < MAX_CAPTURE) stdout += d.toString();
    });
    child.stderr?.on('data', (d: Buffer) => {
      if (stderr.length < MAX_CAPTURE) stderr += d.toString();
    });
    if (opts.stdin !== undefined) child.stdin!.end(opts.stdin);
    const timer = opts.timeoutMs ? setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs) : undefined;
    child.on('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code: code ?? (signal ? 128 : 1), stdout, stderr });
    });
  });
}

/** Runs argv and throws with its stderr when it exits non-zero. */
export async function mustRun(argv: readonly string[], opts: RunOptions = {}): Promise<RunResult> {
  const res = await runCommand(argv, opts);
  if (res.code !== 0) throw new Error(`${argv.slice(0, 6).join(' ')} ... exited ${res.code}: ${(res.stderr || res.stdout).trim().slice(-500)}`);
  return res;
}

/** Versions of the peer tools, for the report. */
export async function peerVersions(): Promise<Record<string, string>> {
  const first = async (argv: string[]): Promise<string> => {
    const res = await runCommand(argv).catch(() => undefined);
    return res?.stdout.split('\n')[0]?.trim() || 'not installed';
  };
  return {
    crun: await first(['crun', '--version']),
    podman: await first(['podman', '--version']),
    bwrap: await first(['bwrap', '--version']),
  };
}

/** The peers, prepared on one busybox rootfs under `dir`. */
export class Peers {
  /** The command prefix that runs a peer's command in the runtime namespace (empty where none is needed). */
  readonly prefix: string[];
  private readonly crunRoot: string;
  private readonly bundle: string;
  private readonly podmanArgs: string[];
  private seq = 0;
  /** Name of the busybox image in the private podman store. */
  readonly image = 'localhost/dsec-bench-busybox:latest';

  private constructor(
    readonly dir: string,
    readonly rootfs: string,
    prefix: string[],
  ) {
    this.prefix = prefix;
    this.crunRoot = path.join(dir, 'crun-state');
    this.bundle = path.join(dir, 'bundle');
    this.podmanArgs = [
      ...prefix,
      'podman',
      '--root',
      path.join(dir, 'podman', 'root'),
      '--runroot',
      path.join(dir, 'podman', 'run'),
      '--cgroup-manager',
      'cgroupfs',
      '--events-backend',
      'none',
      '--storage-driver',
      'overlay',
    ];
  }

  /** Prepares the runtime namespace, the crun bundle and the podman image of `rootfs`. */
  static async open(dir: string, rootfs: string): Promise<Peers> {
    await mkdir(dir, { recursive: true });
    const prefix = await runtimeNamespace(dir);
    const peers = new Peers(dir, rootfs, prefix);
    onCleanup('peer containers', () => peers.removeAll());
    await mkdir(peers.crunRoot, { recursive: true });
    await peers.writeBundle(peers.bundle, ['true']);
    const tar = path.join(dir, 'busybox.tar');
    await mustRun(['tar', '-C', rootfs, '-cf', tar, '.']);
    await peers.podman(['import', tar, peers.image]);
    return peers;
  }

  /** Runs `podman <args>` with the private store; throws on failure. */
  podman(args: string[], opts: RunOptions = {}): Promise<RunResult> {
    return mustRun([...this.podmanArgs, ...args], opts);
  }

  private crun(args: string[], opts: RunOptions = {}): Promise<RunResult> {
    return mustRun([...this.prefix, 'crun', '--root', this.crunRoot, ...args], opts);
  }

  /** Writes an OCI bundle: crun's default spec, our rootfs (read-only), `args`. */
  private async writeBundle(bundle: string, args: string[], rootfs = this.rootfs, readonly = true): Promise<void> {
    await mkdir(bundle, { recursive: true });
    await mustRun(['sh', '-c', `cd '${bundle}' && rm -f config.json && crun spec`]);
    const config = JSON.parse(await readFile(path.join(bundle, 'config.json'), 'utf8')) as {
      process: { terminal: boolean; args: string[] };
      root: { path: string; readonly: boolean };
    };
    config.process.terminal = false;
    config.process.args = args;
    config.root = { path: rootfs, readonly };
    await writeFile(path.join(bundle, 'config.json'), JSON.stringify(config));
  }

  /** `podman run --rm` of `true`. */
  async podmanRun(): Promise<void> {
    await this.podman(['run', '--rm', '--pull', 'never', '--network', 'none', ...PODMAN_ULIMITS, this.image, 'true']);
  }

  /** Starts an idle podman container (`sleep`); returns its name. */
  async podmanStartIdle(image = this.image, extra: string[] = []): Promise<string> {
    const name = `dsec-bench-${process.pid}-${this.seq++}`;
    await this.podman(['run', '-d', '--pull', 'never', '--network', 'none', ...PODMAN_ULIMITS, ...extra, '--name', name, image, 'sleep', '1000000']);
    return name;
  }

  /** `podman exec <name> argv`. */
  podmanExec(name: string, argv: string[], opts: RunOptions = {}): Promise<RunResult> {
    return this.podman(['exec', ...(opts.stdin !== undefined ? ['-i'] : []), name, ...argv], opts);
  }

  /** Removes podman containers at once (`rm -f -t 0`). */
  async podmanRemove(names: string[]): Promise<void> {
    if (names.length) await this.podman(['rm', '-f', '-t', '0', ...names]);
  }

  /** `crun run` of `true` on the prepared bundle (crun deletes it when it exits). */
  async crunRun(): Promise<void> {
    await this.crun(['run', '--bundle', this.bundle, `run-${process.pid}-${this.seq++}`]);
  }

  /** Starts an idle crun container (`sleep`, detached); returns its id. */
  async crunStartIdle(): Promise<string> {
    const id = `idle-${process.pid}-${this.seq++}`;
    const bundle = path.join(this.dir, 'bundles', id);
    await this.writeBundle(bundle, ['sleep', '1000000']);
    await this.crun(['run', '--detach', '--bundle', bundle, id], { detached: true });
    return id;
  }

  /** `crun exec <id> argv`. */
  crunExec(id: string, argv: string[], opts: RunOptions = {}): Promise<RunResult> {
    return this.crun(['exec', id, ...argv], opts);
  }

  /** `crun delete --force`. */
  async crunDelete(id: string): Promise<void> {
    await this.crun(['delete', '--force', id]);
  }

  /** bubblewrap one-shot of `true` with every namespace, rootfs bound read-only. */
  async bwrapRun(): Promise<void> {
    await mustRun(['bwrap', '--unshare-all', '--die-with-parent', '--ro-bind', this.rootfs, '/', '--proc', '/proc', '--dev', '/dev', 'true']);
  }

  /** Removes every podman container and image of the private store and every crun container. */
  async removeAll(): Promise<void> {
    await runCommand([...this.podmanArgs, 'rm', '-af', '-t', '0']);
    await runCommand([...this.podmanArgs, 'system', 'reset', '-f']);
    const list = await runCommand([...this.prefix, 'crun', '--root', this.crunRoot, 'list', '-q']);
    for (const id of list.stdout.split('\n').filter(Boolean)) await runCommand([...this.prefix, 'crun', '--root', this.crunRoot, 'delete', '--force', id]);
  }
}

/**
 * The mount namespace the peers run in: on hybrid cgroups, a pinned namespace without
 * /sys/fs/cgroup/unified (what edge's runtime-ns does); elsewhere none.
 */
async function runtimeNamespace(dir: string): Promise<string[]> {
  if ((await detectCgroupMode()) !== 'hybrid') return [];
  const nsDir = path.join(dir, 'ns');
  const nsFile = path.join(nsDir, 'mntns');
  await mkdir(nsDir, { recursive: true });
  // The nsfs bind mount must not sit on a shared mount.
  mount(nsDir, nsDir, null, MS.BIND);
  mount('none', nsDir, null, MS.PRIVATE);
  onCleanup('peer namespace', () => {
    if (existsSync(nsFile)) umount(nsFile, MNT.DETACH);
    umount(nsDir, MNT.DETACH);
  });
  await writeFile(nsFile, '');
  await mustRun(['unshare', `--mount=${nsFile}`, '--propagation', 'slave', 'umount', '-l', '/sys/fs/cgroup/unified']);
  return ['nsenter', `--mount=${nsFile}`, '--'];
}
