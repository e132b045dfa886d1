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
  /** `http://127.0.0.1:<port>` */
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

/** A bcrypt hash of `password` for htpasswd (the registry accepts only bcrypt). */
function bcrypt(password: string): string {
  const py = spawnSync('python3', ['-W', 'ignore', '-c', 'import crypt,sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH)))', password], {
    encoding: 'utf8',
  });
  const hash = py.stdout.trim();
  if (py.status !== 0 || !hash.startsWith('$2')) throw new Error(`bcrypt via python3 failed: ${py.stderr}`);
  return hash;
}

/** Starts a registry that requires `username`/`password`. */
export async function startOciRegistry(): Promise<OciRegistry> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-registry-'));
  const username = 'dsec';
  const password = 'registry-secret';
  const port = await freePort();
  await writeFile(path.join(dir, 'htpasswd'), `${username}:${bcrypt(password)}\n`);
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
      `  addr: 127.0.0.1:${port}`,
      'auth:',
      '  htpasswd:',
      '    realm: dsec-test',
      `    path: ${path.join(dir, 'htpasswd')}`,
      '',
    ].join('\n'),
  );
  let log: string[] = [];
  let child: ChildProcess | undefined;
  const url = `http://127.0.0.1:${port}`;

  const start = async (): Promise<void> => {
    const proc = spawn('docker-registry', ['serve', path.join(dir, 'config.yml')], { stdio: ['ignore', 'ignore', 'pipe'] });
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
    host: `127.0.0.1:${port}`,
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
