// `dsec` commands as real child processes (the control plane, joined edges) and the waits
// around them, for tests that start, kill and restart them.
import { spawn } from 'node:child_process';
import type { ChildProcessWithoutNullStreams } from 'node:child_process';
import { existsSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { AGENT_BINARY, REPO_ROOT } from './node.js';

/** The CLI's compiled entry point. */
export const CLI = path.join(REPO_ROOT, 'packages/cli/dist/main.js');
/** Bound of a process start (the first start builds the busybox base layer). */
export const START_TIMEOUT_MS = 120_000;
/** Bound of every wait for a state change. */
export const WAIT_MS = 45_000;

/** A running `dsec` command with its output so far. */
export interface Proc {
  child: ChildProcessWithoutNullStreams;
  out: () => string;
  err: () => string;
  exited: Promise<number | null>;
}

/**
 * Starts `dsec ARGS` with a minimal environment plus `env`; in network namespace `netns` when
 * given (by `nsenter`, which execs in place: the pid is the CLI's).
 */
export function run(args: string[], env: Record<string, string>, netns?: string): Proc {
  const argv = [process.execPath, CLI, ...args];
  const [cmd, ...rest] = netns ? ['nsenter', `--net=/run/netns/${netns}`, '--', ...argv] : argv;
  const child = spawn(cmd!, rest, {
    env: { PATH: process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin', DSEC_AGENT: AGENT_BINARY, ...env },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  return { child, out: () => out, err: () => err, exited };
}

/** Polls `check` every 100 ms until it gives a truthy value (returned), failing after `ms`. */
export async function until<T>(what: string, check: () => Promise<T | undefined | false> | T | undefined | false, ms = WAIT_MS): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await Promise.resolve()
      .then(check)
      .catch(() => undefined);
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Waits for `re` in a process's stdout, or fails with its stderr when it exits first. */
export async function waitFor(p: Proc, re: RegExp, name: string): Promise<RegExpExecArray> {
  let code: number | null | undefined;
  void p.exited.then((c) => (code = c));
  return until(
    `${name}: ${re}`,
    () => {
      if (code !== undefined) throw new Error(`${name} exited with ${code}: ${p.err()}`);
      return re.exec(p.out()) ?? undefined;
    },
    START_TIMEOUT_MS,
  ).catch((err: unknown) => {
    throw new Error(`${(err as Error).message}\n--- ${name} stderr ---\n${p.err().slice(-4000)}`);
  });
}

/** A port of `host` (default loopback) nobody listens on (now). */
export async function freePort(host = '127.0.0.1'): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((r) => server.listen(0, host, () => r()));
  const port = (server.address() as net.AddressInfo).port;
  await new Promise<void>((r) => server.close(() => r()));
  return port;
}

/** True when sandbox `id` has a cgroup under `parent` (v1 memory controller, or v2). */
export function hasCgroup(parent: string, id: string): boolean {
  return existsSync(path.join('/sys/fs/cgroup/memory', parent, id)) || existsSync(path.join('/sys/fs/cgroup', parent, id));
}

/** Stops a process started here with `signal` (SIGKILL after 60 s) and waits for its exit. */
export async function stopProc(p: Proc | undefined, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
  if (!p || p.child.exitCode !== null || p.child.signalCode !== null) return;
  p.child.kill(signal);
  const t = setTimeout(() => p.child.kill('SIGKILL'), 60_000);
  await p.exited;
  clearTimeout(t);
}
