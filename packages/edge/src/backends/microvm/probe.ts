// The node's accelerator probe: a real boot of the guest (kernel + initramfs, chronus answering
// on virtio-serial) under KVM when /dev/kvm opens, else (or when that boot fails: nested KVM
// that cannot run a stock guest kernel) under TCG. The verdict and the measured boot time are
// cached per kernel, initramfs, QEMU and host kernel, so a node's next start does not boot again.
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { constants as fsConstants } from 'node:fs';
import { chown, mkdir, mkdtemp, open, readFile, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { DsecError } from '@dsec/protocol';
import { ChronusClient } from '../../chronus/client.js';
import type { GuestImage } from './guest.js';
import type { Accel } from '../qemu/process.js';
import { kvmGroup, startQemu } from '../qemu/process.js';
import { qemuArgs, vmSockets } from './qemu.js';

const run = promisify(execFile);

/** What the probe found. */
export interface AccelProbe {
  accel: Accel;
  /** QEMU start to chronus's first answer, in ms. */
  bootMs: number;
  /** Guest kernel arguments the accelerator needs. */
  cmdline: string[];
  /** True when this verdict came from the cache. */
  cached: boolean;
  /** Why KVM was not used (absent under KVM). */
  kvmRefused?: string;
}

/** The uid the probe's QEMU runs as (nobody). */
const PROBE_UID = 65534;

/** Options of {@link probeAccel}. */
export interface ProbeOptions {
  qemu: string;
  guest: GuestImage;
  cacheDir: string;
  /** Host path of dsec-tsckhz (beside chronus). */
  tscHelper: string;
  /** Longest boot each try may take. */
  timeoutMs: number;
  /** Skip KVM even when /dev/kvm opens. */
  noKvm?: boolean;
}

/** Probes (or reads the cached verdict of) the accelerator this node's microVMs boot under. */
export async function probeAccel(o: ProbeOptions): Promise<AccelProbe> {
  const qemuVersion = (await run(o.qemu, ['--version'])).stdout.split('\n')[0] ?? '';
  // KVM as the VMs get it: an unprivileged QEMU in the device's group.
  const group = o.noKvm ? undefined : await kvmGroup();
  const kvm = group !== undefined;
  const key = createHash('sha256')
    .update(JSON.stringify([o.guest.kernel.key, path.basename(o.guest.initramfs), qemuVersion, os.release(), kvm]))
    .digest('hex')
    .slice(0, 24);
  const cacheFile = path.join(o.cacheDir, `probe-${key}.json`);
  const tscCmdline = async (): Promise<string[]> => {
    const khz = Number((await run(o.tscHelper)).stdout.trim());
    if (!Number.isInteger(khz) || khz <= 0) throw new DsecError('BACKEND_FAILED', `${o.tscHelper}: no TSC rate`);
    return [`tsc_early_khz=${khz}`];
  };
  const cached = await readFile(cacheFile, 'utf8').then(
    (t) => JSON.parse(t) as Omit<AccelProbe, 'cached' | 'cmdline'>,
    () => undefined,
  );
  if (cached) return { ...cached, cmdline: cached.accel === 'tcg' ? await tscCmdline() : [], cached: true };

  let kvmRefused: string | undefined = kvm ? undefined : o.noKvm ? 'turned off' : '/dev/kvm is missing or not read-write for its group';
  let verdict: Omit<AccelProbe, 'cached'> | undefined;
  if (kvm) {
    try {
      verdict = { accel: 'kvm', cmdline: [], bootMs: await bootOnce(o, 'kvm', [], group) };
    } catch (err) {
      kvmRefused = (err as Error).message;
    }
  }
  if (!verdict) {
    const cmdline = await tscCmdline();
    verdict = { accel: 'tcg', cmdline, bootMs: await bootOnce(o, 'tcg', cmdline), ...(kvmRefused ? { kvmRefused } : {}) };
  }
  const { cmdline: _c, ...keep } = verdict;
  await writeFile(`${cacheFile}.tmp`, JSON.stringify(keep));
  await import('node:fs/promises').then((fs) => fs.rename(`${cacheFile}.tmp`, cacheFile));
  return { ...verdict, cached: false };
}

/** One boot without disks (the init's probe mode): QEMU start to chronus's answer. */
export async function bootOnce(o: Pick<ProbeOptions, 'qemu' | 'guest' | 'timeoutMs'>, accel: Accel, cmdline: string[], kvmGid?: number): Promise<number> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-probe-'));
  await chown(dir, PROBE_UID, PROBE_UID);
  const runDir = path.join(dir, 'run');
  await mkdir(runDir, { mode: 0o700 });
  await chown(runDir, PROBE_UID, PROBE_UID);
  const args = qemuArgs({
    qemu: o.qemu,
    accel,
    kernel: o.guest.kernel.vmlinuz,
    initramfs: o.guest.initramfs,
    cmdline: [...cmdline, 'dsec.probe=1'],
    memoryMiB: 128,
    vcpus: 1,
    disks: [],
    runDir,
  });
  const log = await open(path.join(dir, 'qemu.log'), fsConstants.O_WRONLY | fsConstants.O_CREAT, 0o600);
  const started = performance.now();
  const child = startQemu(o.qemu, args, { uid: PROBE_UID, gid: PROBE_UID, cgroupProcs: [], ...(kvmGid !== undefined ? { groups: [kvmGid] } : {}) }, [], log.fd);
  await log.close();
  const exited = new Promise<never>((_, reject) =>
    child.once('exit', (code, sig) => reject(new DsecError('BACKEND_FAILED', `probe (${accel}): QEMU exited (${sig ?? code})`))),
  );
  exited.catch(() => undefined);
  let client: ChronusClient | undefined;
  try {
    const deadline = Date.now() + o.timeoutMs;
    const sock = await Promise.race([connectUntil(vmSockets(runDir).agents[0] as string, deadline), exited]);
    client = new ChronusClient(sock);
    const timeout = new Promise<never>((_, reject) =>
      setTimeout(() => reject(new DsecError('TIMEOUT', `probe (${accel}): no answer in ${o.timeoutMs} ms`)), Math.max(0, deadline - Date.now())).unref(),
    );
    await Promise.race([client.ping(), exited, timeout]);
    return Math.round(performance.now() - started);
  } catch (err) {
    const detail = (await readFile(path.join(dir, 'qemu.log'), 'utf8').catch(() => '')).trim().split('\n').slice(-2).join('; ');
    if (detail && err instanceof Error) err.message += `: ${detail}`;
    throw err;
  } finally {
    client?.close();
    if (child.exitCode === null && child.signalCode === null) {
      const gone = new Promise((r) => child.once('exit', r));
      child.kill('SIGKILL');
      await gone;
    }
    await rm(dir, { recursive: true, force: true });
  }
}

async function connectUntil(file: string, deadline: number): Promise<net.Socket> {
  for (;;) {
    try {
      return await new Promise<net.Socket>((resolve, reject) => {
        const s = net.createConnection({ path: file });
        s.once('error', reject);
        s.once('connect', () => {
          s.removeAllListeners('error');
          resolve(s);
        });
      });
    } catch (err) {
      if (Date.now() >= deadline) throw new DsecError('TIMEOUT', `no socket at ${file}: ${(err as Error).message}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}
