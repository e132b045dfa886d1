// Host-name routing without a sandbox: the Host forms that name a port, and the relay (the same
// bash script a sandbox runs, here as a local process) carrying HTTP through RelaySocket.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createServer, request } from 'node:http';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import type { OutputEvent, ProcessStream } from '@dsec/protocol';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer as createHttpsServer } from 'node:https';
import os from 'node:os';
import path from 'node:path';
import type { Duplex } from 'node:stream';
import { MAX_CONNECTIONS_PER_SANDBOX, PortBudget, RELAY, RelaySocket, firstChunk, hostTarget, overTls } from './ports.js';

test('hostTarget: <port>-<id>.<domain>, with or without a port in the domain', () => {
  assert.deepEqual(hostTarget('3000-sb-1a2b.e2b.test', 'e2b.test'), { port: 3000, sandboxId: 'sb-1a2b' });
  assert.deepEqual(hostTarget('3000-SB-1A2B.E2B.test:8080', 'e2b.test'), { port: 3000, sandboxId: 'sb-1a2b' });
  assert.deepEqual(hostTarget('49983-x.dsec.test:7070', 'dsec.test:7070'), { port: 49983, sandboxId: 'x' });
  assert.equal(hostTarget('49983-x.dsec.test:7071', 'dsec.test:7070'), undefined);
  assert.equal(hostTarget('e2b.test', 'e2b.test'), undefined);
  assert.equal(hostTarget('70000-x.e2b.test', 'e2b.test'), undefined);
  assert.equal(hostTarget('3000-x.y.e2b.test', 'e2b.test'), undefined);
  assert.equal(hostTarget('3000-x.e2b.test', null), undefined);
  assert.equal(hostTarget('3000-x.evil-e2b.test', 'e2b.test'), undefined);
});

/** The relay as a local process, seen as an edge's ProcessStream. */
function localRelay(port: number): ProcessStream {
  const child = spawn('bash', ['-c', RELAY, String(port)], { stdio: ['pipe', 'pipe', 'ignore'] });
  // A relay that exited makes later writes fail (EPIPE): the write's promise says so, as the edge's does.
  child.stdin.on('error', () => undefined);
  const exited = new Promise<{ exitCode: number | null; signal: string | null }>((resolve) =>
    child.once('exit', (code, signal) => resolve({ exitCode: code, signal })),
  );
  return {
    pid: 1,
    osPid: child.pid ?? 0,
    exited: exited as unknown as ProcessStream['exited'],
    write: async (data) => void child.stdin.write(data),
    closeStdin: async () => void child.stdin.end(),
    kill: async () => void child.kill('SIGKILL'),
    detach: async () => undefined,
    onDetach: () => undefined,
    async *[Symbol.asyncIterator](): AsyncGenerator<OutputEvent> {
      let offset = 0;
      for await (const chunk of child.stdout as AsyncIterable<Buffer>) {
        yield { kind: 'data', stream: 'stdout', offset, data: chunk };
        offset += chunk.length;
      }
    },
  };
}

test('the relay carries an HTTP request and its response; a closed port is an error', async () => {
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString()));
    req.on('end', () => res.end(`${req.method} ${req.url} ${body}`));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;
  try {
    const relay = new RelaySocket(localRelay(port));
    const answer = await new Promise<string>((resolve, reject) => {
      const req = request({ createConnection: () => relay, method: 'POST', path: '/x?y=1', headers: { connection: 'close' } }, (res) => {
        let b = '';
        res.on('data', (d: Buffer) => (b += d.toString()));
        res.on('end', () => resolve(`${res.statusCode} ${b}`));
      });
      req.setTimeout(10_000, () => req.destroy(new Error('no answer within 10 s')));
      req.on('error', reject);
      req.end('hello');
    });
    assert.equal(answer, '200 POST /x?y=1 hello');
    server.close();
    const closed = new RelaySocket(localRelay(port));
    await assert.rejects(
      new Promise((resolve, reject) => {
        closed.on('error', reject);
        closed.on('end', resolve);
        closed.resume();
      }),
      /nothing listens/,
    );
  } finally {
    server.close();
  }
});

test('PortBudget: a refused connection counts nothing; a release counts once; rates per source and per sandbox', () => {
  // Rates that refill too slowly to matter during the test (a loaded machine may pause anywhere).
  const perSource = { perSecond: 0.0001, burst: 5 };
  const perSandbox = { perSecond: 0.0001, burst: 12 };
  const budget = new PortBudget({ perSource, perSandbox });
  const releases = Array.from({ length: MAX_CONNECTIONS_PER_SANDBOX }, () => budget.openConnection('sb-a'));
  for (let i = 0; i < 100; i++) assert.throws(() => budget.openConnection('sb-a'), /at most 64 proxied connections/);
  assert.equal(budget.openConnections('sb-a'), MAX_CONNECTIONS_PER_SANDBOX);
  releases[0]!();
  releases[0]!();
  assert.equal(budget.openConnections('sb-a'), MAX_CONNECTIONS_PER_SANDBOX - 1);
  budget.openConnection('sb-a');
  assert.throws(() => budget.openConnection('sb-a'), /at most 64/);
  assert.equal(budget.openConnections('sb-b'), 0);
  for (const release of releases) release();

  // One address spends its own burst, not another's; the sandbox's burst bounds all addresses together.
  for (let i = 0; i < perSource.burst; i++) budget.takeRequest('sb-a', '192.0.2.1');
  assert.throws(() => budget.takeRequest('sb-a', '192.0.2.1'), /too many port requests from this address/);
  budget.takeRequest('sb-a', '192.0.2.2');
  for (let i = 0; i < perSandbox.burst - perSource.burst - 1; i++) budget.takeRequest('sb-a', `198.51.100.${i}`);
  assert.throws(() => budget.takeRequest('sb-a', '203.0.113.9'), /too many port requests to sandbox sb-a/);
  // A refusal takes nothing from the address's bucket: it may still reach another sandbox.
  budget.takeRequest('sb-b', '203.0.113.9');
});

test('httpsPorts: TLS to the port over the relay, its self-signed certificate accepted; firstChunk waits for the answer', async () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'dsec-ports-tls-'));
  try {
    execFileSync(
      'openssl',
      [
        'req',
        '-x509',
        '-newkey',
        'ec',
        '-pkeyopt',
        'ec_paramgen_curve:prime256v1',
        '-nodes',
        '-keyout',
        'k.pem',
        '-out',
        'c.pem',
        '-days',
        '1',
        '-subj',
        '/CN=inside.test',
      ],
      { cwd: dir, stdio: 'ignore' },
    );
    const server = createHttpsServer({ cert: readFileSync(path.join(dir, 'c.pem')), key: readFileSync(path.join(dir, 'k.pem')) }, (req, res) =>
      res.end(`tls ${req.headers.host ?? ''}`),
    );
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const port = (server.address() as AddressInfo).port;
    try {
      const answer = await new Promise<string>((resolve, reject) => {
        const req = request(
          {
            createConnection: () => overTls(new RelaySocket(localRelay(port)), 'inside.test:3000'),
            path: '/',
            headers: { host: 'inside.test:3000', connection: 'close' },
          },
          (res) => {
            let b = '';
            res.on('data', (d: Buffer) => (b += d.toString()));
            res.on('end', () => resolve(`${res.statusCode} ${b}`));
          },
        );
        req.setTimeout(10_000, () => req.destroy(new Error('no answer within 10 s')));
        req.on('error', reject);
        req.end();
      });
      assert.equal(answer, '200 tls inside.test:3000');
    } finally {
      server.close();
    }
    // A closed port: firstChunk rejects (the upgrade path answers 502 then).
    const closed: Duplex = new RelaySocket(localRelay(port));
    await assert.rejects(firstChunk(closed), /nothing listens/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
