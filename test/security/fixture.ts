// The adversarial suite's fixture: a real node with the attack kit as a toolkit layer, what the
// kit prints, the host-side checks every attack must leave passing, and the events the watcher
// is expected to raise.
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { access, copyFile, mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { TestContext } from 'node:test';
import type { Edge } from '@dsec/edge';
import type { EventKind, ExecResult, RaisedEvent } from '@dsec/protocol';
import { REPO_ROOT, startNode } from '../helpers/node.js';
import type { TestNode } from '../helpers/node.js';

/** Host path of the attack kit (built by `make -C test/security/attacks`, part of `npm run build`). */
export const KIT_BINARY = path.join(REPO_ROOT, 'test/security/attacks/build/kit');
/** Where the kit sits inside a sandbox. */
export const KIT = '/opt/attack/kit';
/** Name of the toolkit layer that carries the kit. */
export const KIT_LAYER = 'attack-kit';
/** The image every attack runs in: busybox plus the kit. */
export const KIT_IMAGE = { base: 'busybox', toolkits: [KIT_LAYER] };
/** Small limits, so that resource attacks hit them quickly. */
export const SMALL = { memoryMiB: 64, pids: 64, diskMiB: 16 };

/**
 * Event kinds whose detectors exist in this tree. Each attack states the event it must raise
 * through {@link expectEvent}; a kind listed here is asserted, any other is reported as pending.
 * Add a kind here when its detector lands.
 */
export const LIVE_DETECTORS: ReadonlySet<EventKind> = new Set<EventKind>([
  'seccomp.denied',
  'protected-path.write',
  'oom.kill',
  'pids.limit-hit',
  'process.survived-command',
]);

/** One line of the kit's output. */
export interface Probe {
  probe: string;
  result?: string;
  [field: string]: unknown;
}

/** Parses the kit's JSON lines (other lines are ignored). */
export function probes(output: { stdout: string } | string): Probe[] {
  const stdout = typeof output === 'string' ? output : output.stdout;
  return stdout
    .split('\n')
    .filter((l) => l.startsWith('{"probe":'))
    .map((l) => JSON.parse(l) as Probe);
}

/** The single line of a probe, or a failed assertion showing the whole output. */
export function probe(r: { stdout: string; stderr: string }, name: string): Probe {
  const found = probes(r).filter((p) => p.probe === name);
  assert.equal(found.length, 1, `expected one "${name}" line from the kit, got:\n${r.stdout}${r.stderr}`);
  return found[0]!;
}

/** Result of each probe by name (for probes that print one line each). */
export function resultsByProbe(r: { stdout: string }): Record<string, string | undefined> {
  return Object.fromEntries(probes(r).map((p) => [p.probe, p.result]));
}

/** A fresh random string that exists nowhere until a test plants it. */
export function newCanary(): string {
  return `dsec-canary-${randomBytes(12).toString('hex')}`;
}

/** Hex of a string (how the kit's scan takes its needle, so that its own argv never matches). */
export function hex(s: string): string {
  return Buffer.from(s).toString('hex');
}

/** Events raised on a node, kept for assertions. */
export class EventLog {
  readonly events: RaisedEvent[] = [];
  private readonly unsubscribe: () => void;

  constructor(edge: Edge) {
    this.unsubscribe = edge.onEvent((ev) => this.events.push(ev));
  }

  /** Waits until an event of `kind` about `sandboxId` (and matching `data`, when given) has been raised. */
  async waitFor(kind: EventKind, sandboxId: string, data: Record<string, unknown> = {}, timeoutMs = 5_000): Promise<RaisedEvent> {
    const deadline = Date.now() + timeoutMs;
    const matches = (e: RaisedEvent): boolean => e.kind === kind && e.sandboxId === sandboxId && Object.entries(data).every(([k, v]) => e.data?.[k] === v);
    for (;;) {
      const ev = this.events.find(matches);
      if (ev) return ev;
      if (Date.now() > deadline) {
        const seen = this.events.filter((e) => e.sandboxId === sandboxId).map((e) => [e.kind, e.data]);
        assert.fail(`no ${kind} event ${JSON.stringify(data)} for ${sandboxId}; raised for it: ${JSON.stringify(seen)}`);
      }
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  close(): void {
    this.unsubscribe();
  }
}

/**
 * States that an attack must raise an event: asserted when the kind's detector exists
 * ({@link LIVE_DETECTORS}), otherwise written to the test's diagnostics as pending.
 */
export async function expectEvent(t: TestContext, log: EventLog, kind: EventKind, sandboxId: string, data: Record<string, unknown> = {}): Promise<void> {
  if (!LIVE_DETECTORS.has(kind)) {
    t.diagnostic(`event ${kind} ${JSON.stringify(data)} expected for ${sandboxId}: detector pending`);
    return;
  }
  const ev = await log.waitFor(kind, sandboxId, data);
  assert.ok(ev.message.length > 0);
}

/** Host processes whose name (comm) is `name`. */
export async function hostProcessesNamed(name: string): Promise<number[]> {
  const found: number[] = [];
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const comm = await readFile(`/proc/${entry}/comm`, 'utf8').catch(() => '');
    if (comm.trim() === name) found.push(Number(entry));
  }
  return found;
}

/** A process name of at most 15 characters (comm's limit) that no other process has. */
export function uniqueProcessName(prefix: string): string {
  return `${prefix}${randomBytes(4).toString('hex')}`.slice(0, 15);
}

/** Host state that no attack may change, read before and compared after. */
interface HostState {
  hostname: string;
  corePattern: string;
  canary: string;
  canarySha: string;
  canaryMtimeMs: number;
}

/** A node with the attack kit, a bystander sandbox, and the checks every test ends with. */
export interface SecurityNode {
  node: TestNode;
  edge: Edge;
  events: EventLog;
  /** A sandbox no attack targets directly: it must stay intact through all of them. */
  bystander: string;
  /** What the bystander holds in /root/sentinel. */
  bystanderSecret: string;
  /** A canary file on the host, in the node's home next to its layer store. */
  hostCanaryFile: string;
  hostCanary: string;
  /** Creates a sandbox from {@link KIT_IMAGE} (or another image), destroyed by `cleanup`. */
  sandbox(spec?: Record<string, unknown>): Promise<string>;
  /** Runs the kit in a sandbox. */
  kit(id: string, args: string[], opts?: { timeoutMs?: number }): Promise<ExecResult>;
  /** Runs a shell command in a sandbox. */
  sh(id: string, cmd: string, opts?: { timeoutMs?: number }): Promise<ExecResult>;
  /**
   * Asserts that nothing outside the attacked sandbox changed: host files and settings, the
   * bystander sandbox, and the node itself (a fresh sandbox works).
   */
  verifyContained(): Promise<void>;
  cleanup(): Promise<void>;
}

async function readHostState(canaryFile: string): Promise<HostState> {
  const canary = await readFile(canaryFile, 'utf8');
  return {
    hostname: os.hostname(),
    corePattern: await readFile('/proc/sys/kernel/core_pattern', 'utf8'),
    canary,
    canarySha: createHash('sha256').update(canary).digest('hex'),
    canaryMtimeMs: (await stat(canaryFile)).mtimeMs,
  };
}

/** A temp directory holding the kit at opt/attack/kit (a toolkit layer's content). */
export async function kitLayerDir(): Promise<string> {
  await access(KIT_BINARY).catch(() => {
    throw new Error(`attack kit not built at ${KIT_BINARY}: run npm run build (make -C test/security/attacks)`);
  });
  const dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-scratch-kit-'));
  await mkdir(path.join(dir, 'opt/attack'), { recursive: true });
  await copyFile(KIT_BINARY, path.join(dir, 'opt/attack/kit'));
  return dir;
}

/** Starts a node with busybox, the kit layer and a bystander sandbox. */
export async function startSecurityNode(opts: { outputCapBytes?: number } = {}): Promise<SecurityNode> {
  const node = await startNode(opts);
  const created: string[] = [];
  let events: EventLog | undefined;
  const layerDir = await kitLayerDir();
  try {
    const edge = node.edge;
    events = new EventLog(edge);
    await edge.layers.build({ type: 'busybox' }, { kind: 'base', name: 'busybox' });
    await edge.layers.build({ type: 'dir', path: layerDir }, { kind: 'toolkit', name: KIT_LAYER });
    const hostCanary = newCanary();
    const hostCanaryFile = path.join(node.home, 'layers', 'answers.txt');
    await writeFile(hostCanaryFile, `expected output: ${hostCanary}\n`);
    const sandbox = async (spec: Record<string, unknown> = {}): Promise<string> => {
      const sb = await node.edge.create({ image: KIT_IMAGE, ...spec });
      created.push(sb.id);
      return sb.id;
    };
    const sh = (id: string, cmd: string, o: { timeoutMs?: number } = {}): Promise<ExecResult> =>
      node.edge.exec(id, { cmd, timeoutMs: o.timeoutMs ?? 60_000 }, { maxOutputBytes: 1 << 20 });
    const kit = (id: string, args: string[], o: { timeoutMs?: number } = {}): Promise<ExecResult> =>
      node.edge.exec(id, { argv: [KIT, ...args], timeoutMs: o.timeoutMs ?? 60_000 }, { maxOutputBytes: 1 << 20 });
    const bystanderSecret = newCanary();
    const bystander = await sandbox({ env: { BYSTANDER_SECRET: bystanderSecret } });
    const w = await sh(bystander, `echo ${bystanderSecret} > /root/sentinel`);
    assert.equal(w.exitCode, 0, w.stderr);
    // A long-running command of its own, started and left running as a trainer would.
    await (await edge.spawn(bystander, { argv: ['sleep', '100000'] })).detach();
    const before = await readHostState(hostCanaryFile);
    const bystanderPids = (await edge.processes(bystander)).filter((p) => p.state === 'running').length;
    const sec: SecurityNode = {
      node,
      edge,
      events,
      bystander,
      bystanderSecret,
      hostCanaryFile,
      hostCanary,
      sandbox,
      kit,
      sh,
      async verifyContained() {
        assert.deepEqual(await readHostState(hostCanaryFile), before, 'host files and settings are unchanged');
        const b = await sh(bystander, 'cat /root/sentinel; pidof sleep');
        assert.equal(b.exitCode, 0, `bystander sandbox broken: ${b.stderr}`);
        assert.equal(b.stdout.split('\n')[0], bystanderSecret, 'the bystander sandbox still holds its file');
        assert.equal((await edge.processes(bystander)).filter((p) => p.state === 'running').length, bystanderPids, 'its process still runs');
        // The node still works: a fresh sandbox is created, runs a command and goes away.
        const fresh = await edge.create({ image: { base: 'busybox' } });
        try {
          const r = await edge.exec(fresh.id, { cmd: 'echo fresh' });
          assert.equal(r.stdout, 'fresh\n', 'a fresh sandbox works after the attack');
        } finally {
          await edge.destroy(fresh.id);
        }
      },
      async cleanup() {
        events?.close();
        try {
          const live = new Set((await edge.list()).map((s) => s.id));
          for (const id of created.filter((c) => live.has(c))) await edge.destroy(id).catch(() => undefined);
          await node.cleanup();
        } finally {
          await rm(layerDir, { recursive: true, force: true });
        }
      },
    };
    return sec;
  } catch (err) {
    events?.close();
    await node.cleanup();
    await rm(layerDir, { recursive: true, force: true });
    throw err;
  }
}

/** Destroys a sandbox and asserts that none of its processes is left on the host. */
export async function destroyAndCheck(sec: SecurityNode, id: string, processNames: string[] = []): Promise<void> {
  const cgroups = await sec.edge.cgroups.existing(id);
  await sec.edge.destroy(id);
  for (const name of processNames) assert.deepEqual(await hostProcessesNamed(name), [], `no host process named ${name} outlives the sandbox`);
  for (const dir of cgroups) await assert.rejects(stat(dir), `cgroup ${dir} is removed`);
}

/**
 * The lines of a sandbox's /proc/self/mountinfo that tell it a host path: one naming any of
 * `hostPaths` (the node's home, its run directory, the repository), or a layer option of an
 * overlay (`lowerdir=`, `upperdir=`, `workdir=`, `datadir=`) that is not a descriptor path.
 */
export function mountinfoHostPathLines(mountinfo: string, hostPaths: readonly string[]): string[] {
  return mountinfo
    .split('\n')
    .filter(Boolean)
    .filter((line) => {
      if (hostPaths.some((p) => line.includes(p))) return true;
      const options = line.split(' - ')[1]?.split(' ')[2] ?? '';
      return options
        .split(',')
        .filter((o) => /^(lowerdir|upperdir|workdir|datadir)=/.test(o))
        .flatMap((o) => o.slice(o.indexOf('=') + 1).split(':'))
        .some((p) => !/^\/proc\/self\/fd\/\d+$/.test(p));
    });
}
