// Test fixture: the real CLI's `dsec up` as a child process on a throw-away home and a free
// loopback port, with what tests need to stop it (a signal, a SIGKILL) and to check what its node
// left on the host. Every child started here is killed by `killChildren` (call it in `after`).
import { spawn } from 'node:child_process';
import type { ChildProcessWithoutNullStreams } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { MNT, mountsUnder, umount } from '@dsec/edge';
import { AGENT_BINARY, REPO_ROOT } from './node.js';

/** The CLI's entry point in this checkout. */
export const CLI = path.join(REPO_ROOT, 'packages/cli/dist/main.js');
/** How long `dsec up` may take to listen (a first start builds the busybox base; the machine is loaded). */
export const START_TIMEOUT_MS = 120_000;

/** How a child ended. */
export interface ChildExit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

/** A running `dsec up`. */
export interface RunningNode {
  child: ChildProcessWithoutNullStreams;
  url: string;
  apiKey: string;
  home: string;
  /** Resolves when the process has ended (already resolved if it has). */
  exited: Promise<ChildExit>;
  stdout: () => string;
  stderr: () => string;
}

/** Options of {@link up}. */
export interface UpOptions {
  /** Extra arguments after `dsec up --addr 127.0.0.1:0`. */
  args?: string[];
  /** Extra environment (the child gets only PATH, DSEC_HOME, DSEC_AGENT and these). */
  env?: Record<string, string>;
}

const children = new Set<ChildProcessWithoutNullStreams>();

/** The node's private run directory of a node home (as the edge names it). */
export function runDirOf(nodeHome: string): string {
  return path.join('/run/dsec', createHash('sha256').update(path.resolve(nodeHome)).digest('hex').slice(0, 12));
}

/** Mount points of the node of `home` (in this mount namespace): under the home, or under its run directory. */
export async function nodeMounts(home: string): Promise<string[]> {
  const text = await readFile('/proc/self/mountinfo', 'utf8');
  const runDir = runDirOf(path.join(home, 'node'));
  return text
    .split('\n')
    .filter(Boolean)
    .map((line) => line.split(' ')[4] ?? '')
    .filter((target) => target === home || target.startsWith(`${home}/`) || target === runDir || target.startsWith(`${runDir}/`));
}

/** A fresh temp home whose name starts with `prefix`. */
export async function freshHome(prefix: string): Promise<string> {
  return mkdtemp(path.join(os.tmpdir(), prefix));
}

/** Starts `dsec up` on `home` and waits until it listens; a child that does not is killed. */
export async function up(home: string, opts: UpOptions = {}): Promise<RunningNode> {
  const child = spawn(process.execPath, [CLI, 'up', '--addr', '127.0.0.1:0', '--no-prebuild', ...(opts.args ?? [])], {
    env: { PATH: process.env.PATH ?? '', DSEC_HOME: home, DSEC_AGENT: AGENT_BINARY, ...opts.env },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  children.add(child);
  const exited = new Promise<ChildExit>((resolve) =>
    child.once('exit', (code, signal) => {
      children.delete(child);
      resolve({ code, signal });
    }),
  );
  let stdout = '';
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  try {
    const url = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`dsec up did not listen in ${START_TIMEOUT_MS} ms: ${stderr}`)), START_TIMEOUT_MS);
      const onData = (): void => {
        const m = /listening on (http:\/\/\S+)/.exec(stdout);
        if (m && stdout.includes('admin key')) {
          clearTimeout(timer);
          child.stdout.off('data', onData);
          resolve(m[1]!);
        }
      };
      child.stdout.on('data', onData);
      void exited.then((e) => {
        clearTimeout(timer);
        reject(new Error(`dsec up exited (${e.code ?? e.signal}) before listening: ${stderr}`));
      });
    });
    const apiKey = (await readFile(path.join(home, 'admin.key'), 'utf8')).trim();
    return { child, url, apiKey, home, exited, stdout: () => stdout, stderr: () => stderr };
  } catch (err) {
    child.kill('SIGKILL');
    await exited;
    throw err;
  }
}

/** Stops `dsec up` with `signal` and returns its exit status. */
export async function stop(node: RunningNode, signal: NodeJS.Signals): Promise<number | null> {
  if (node.child.exitCode === null && node.child.signalCode === null) node.child.kill(signal);
  return (await node.exited).code;
}

/** SIGKILLs every child this fixture started that still runs, and waits for them. */
export async function killChildren(): Promise<void> {
  const waits = [...children].map(
    (c) => new Promise<void>((resolve) => (c.exitCode !== null || c.signalCode !== null ? resolve() : c.once('exit', () => resolve()))),
  );
  for (const c of children) c.kill('SIGKILL');
  await Promise.all(waits);
}

/**
 * Removes a home a test is done with, whatever state it was left in: a node that still has
 * mounts is started once more with `--clean` and stopped (it destroys its sandboxes and removes
 * its mounts, cgroups, links and table), then whatever is still mounted is detached. `args` are
 * the platform's own (`--db` for a store on PostgreSQL: the home then has no `dsec.db`).
 */
export async function removeHome(home: string, args: string[] = []): Promise<void> {
  await killChildren();
  if ((await nodeMounts(home)).length > 0 && (args.includes('--db') || existsSync(path.join(home, 'dsec.db')))) {
    const node = await up(home, { args: [...args, '--clean'] }).catch(() => undefined);
    if (node) await stop(node, 'SIGTERM');
  }
  for (const m of [...(await mountsUnder(runDirOf(path.join(home, 'node'))).catch(() => [])), ...(await mountsUnder(home).catch(() => []))]) {
    try {
      umount(m, MNT.DETACH);
    } catch {
      // already gone
    }
  }
  await rm(home, { recursive: true, force: true });
}
