// Fixture of tests and benchmarks: Debian's OCI distribution registry (docker-registry) on a
// loopback port, with a user and password (htpasswd, bcrypt), storing into a temp dir; stopped
// and removed even when a test fails. Its request log tells a test what the nodes fetched.
import { spawn, spawnSync } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

/** A running registry. */
export interface OciRegistry {
  /** `http://127.0.0.1:<port>` (or the namespace's address) */
  url: string;
  /** `127.0.0.1:<port>`, as image references name it. */
  host: string;
  username: string;
  password: string;
  /** The file that holds blob `digest` in the registry's storage (a test may damage it). */
  blobFile(digest: string): string;
  /** `METHOD path` of every request answered since the start (or the last {@link clearLog}). */
  requests(): string[];
  clearLog(): void;
  /** Stops the server (its storage stays). */
  stop(): Promise<void>;
  /** Starts it again on the same port and storage. */
  start(): Promise<void>;
  /** Stops it and removes its storage. */
  close(): Promise<void>;
}

async function freePort(): Promise<number> {
  const srv = net.createServer();
  await new Promise<void>((resolve) => srv.listen(0, '127.0.0.1', resolve));
  const port = (srv.address() as net.AddressInfo).port;
  await new Promise<void>((resolve) => srv.close(() => resolve()));
  return port;
}

/** A bcrypt hash of `password` for htpasswd (the registry accepts only bcrypt), `cost` rounds (log2). */
function bcrypt(password: string, cost: number): string {
  const code = 'import crypt,sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=1<<int(sys.argv[2]))))';
  const py = spawnSync('python3', ['-W', 'ignore', '-c', code, password, String(cost)], {
    encoding: 'utf8',
  });
  const hash = py.stdout.trim();
  if (py.status !== 0 || !hash.startsWith('$2')) throw new Error(`bcrypt via python3 failed: ${py.stderr}`);
  return hash;
}

/** Options of {@link startOciRegistry}. */
export interface OciRegistryOptions {
  /**
   * A network namespace to serve in (`ip netns exec`), listening on `address`:`port`; default
   * none: the host's loopback on a free port.
   */
  netns?: { name: string; address: string; port: number } | undefined;
  /**
   * bcrypt cost of the password's hash; default 12 (htpasswd's usual). The registry checks it on
   * every request (Basic auth has no session); a bench of a cluster registry, whose token check
   * is cheap, may lower it.
   */
  bcryptCost?: number | undefined;
}

/** Starts a registry that requires `username`/`password`. */
export async function startOciRegistry(opts: OciRegistryOptions = {}): Promise<OciRegistry> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-registry-'));
  const username = 'dsec';
  const password = 'registry-secret';
  const address = opts.netns?.address ?? '127.0.0.1';
  const port = opts.netns?.port ?? (await freePort());
  await writeFile(path.join(dir, 'htpasswd'), `${username}:${bcrypt(password, opts.bcryptCost ?? 12)}\n`);
  await writeFile(
    path.join(dir, 'config.yml'),
    [
      'version: 0.1',
      'log:',
      '  level: info',
      '  accesslog:',
      '    disabled: true',
      'storage:',
      '  filesystem:',
      `    rootdirectory: ${path.join(dir, 'data')}`,
      '  delete:',
      '    enabled: true',
      'http:',
      `  addr: ${address}:${port}`,
      'auth:',
      '  htpasswd:',
      '    realm: dsec-test',
      `    path: ${path.join(dir, 'htpasswd')}`,
      '',
    ].join('\n'),
  );
  let log: string[] = [];
  let child: ChildProcess | undefined;
  const url = `http://${address}:${port}`;

  const start = async (): Promise<void> => {
    const serve = ['docker-registry', 'serve', path.join(dir, 'config.yml')];
    const argv = opts.netns === undefined ? serve : ['ip', 'netns', 'exec', opts.netns.name, ...serve];
    const proc = spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', 'ignore', 'pipe'] });
    child = proc;
    let partial = '';
    proc.stderr.setEncoding('utf8');
    proc.stderr.on('data', (chunk: string) => {
      const lines = (partial + chunk).split('\n');
      partial = lines.pop() ?? '';
      for (const line of lines) {
        // logrus text: ... http.request.method=GET http.request.uri="/v2/..." ... msg="response completed"
        if (!line.includes('response completed')) continue;
        const method = /http\.request\.method=(\S+)/.exec(line)?.[1];
        const uri = /http\.request\.uri="([^"]+)"/.exec(line)?.[1];
        if (method && uri) log.push(`${method} ${uri}`);
      }
    });
    const deadline = Date.now() + 15_000;
    for (;;) {
      if (proc.exitCode !== null) throw new Error(`docker-registry exited with ${proc.exitCode}`);
      const ok = await fetch(`${url}/v2/`).then(
        (r) => r.status === 401 || r.ok,
        () => false,
      );
      if (ok) return;
      if (Date.now() > deadline) throw new Error('docker-registry did not answer within 15 s');
      await sleep(100);
    }
  };

  const stop = async (): Promise<void> => {
    const proc = child;
    child = undefined;
    if (!proc || proc.exitCode !== null) return;
    const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
    proc.kill('SIGTERM');
    const timer = setTimeout(() => proc.kill('SIGKILL'), 5000);
    await exited;
    clearTimeout(timer);
  };

  try {
    await start();
  } catch (err) {
    await stop();
    await rm(dir, { recursive: true, force: true });
    throw err;
  }
  return {
    url,
    host: `${address}:${port}`,
    username,
    password,
    blobFile: (digest: string) => path.join(dir, 'data', 'docker', 'registry', 'v2', 'blobs', 'sha256', digest.slice(7, 9), digest.slice(7), 'data'),
    requests: () => [...log],
    clearLog: () => {
      log = [];
    },
    stop,
    start,
    async close() {
      await stop();
      await rm(dir, { recursive: true, force: true });
    },
  };
}
