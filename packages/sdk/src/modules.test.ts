// The Sandbox is assembled from modules; the names users already call reach the same routes.
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, beforeEach, test } from 'node:test';
import { DsecError } from '@dsec/protocol';
import { Changes } from './changes.js';
import { DsecClient } from './client.js';
import { Commands } from './commands.js';
import { CommandExitError } from './errors.js';
import { Files } from './files.js';
import { Sandbox } from './sandbox.js';
import { Snapshots } from './snapshots.js';

const ID = 'node1-0123';
let server: http.Server;
let client: DsecClient;
let seen: string[] = [];

const sandboxInfo = (id: string, state = 'running') => ({ id, state, project: 'p' });
const exitOf = (exitCode: number) => ({
  exitCode,
  signal: null,
  timedOut: false,
  oomKilled: false,
  durationMs: 1,
  cpuUserMs: 0,
  cpuSysMs: 0,
  peakMemoryKiB: 1,
  stdoutBytes: 2,
  stderrBytes: 0,
});

/** Answers each route with a canned body; records `METHOD path` of every request. */
function answer(method: string, path: string, body: string): unknown {
  const route = path.replace(`/v1/sandboxes/${ID}`, '');
  if (method === 'GET' && route === '') return sandboxInfo(ID);
  if (method === 'POST' && route === '/exec')
    return { ...exitOf(JSON.parse(body).cmd === 'false' ? 1 : 0), pid: 4, stdout: 'hi', stderr: '', truncated: false };
  if (method === 'GET' && route === '/processes') return { items: [{ pid: 4, osPid: 99, argv: ['sh'], state: 'exited', stdoutBytes: 2, stderrBytes: 0 }] };
  if (route.startsWith('/network/log')) return { items: [{ sandboxId: ID, via: 'dns', host: 'x.test', port: 443, verdict: 'denied' }] };
  if (route === '/network') return { policy: { mode: 'none' }, stats: { bytesIn: 0, bytesOut: 0, connections: 0, totalConnections: 0, allowed: 0, denied: 0 } };
  if (route === '/snapshot') return { digest: 'sha256:ab', kind: 'snapshot' };
  if (route === '/fork') return { snapshot: { digest: 'sha256:ab' }, sandboxes: [sandboxInfo('node1-f1'), sandboxInfo('node1-f2')] };
  if (route === '/pause') return { sandbox: sandboxInfo(ID, 'paused'), durationMs: 1, memoryBeforeBytes: 2, memoryAfterBytes: 1, swapBytes: 0 };
  if (route.startsWith('/diff')) return { entries: [{ path: '/a', change: 'added', type: 'file' }], nextCursor: null, frozen: true };
  if (route.startsWith('/trajectory')) return { sandboxId: ID, items: [{ seq: 0, kind: 'exec' }], nextCursor: null };
  if (route === '/replay') return { sandbox: sandboxInfo('node1-r1'), fromSeq: -1, steps: [], summary: {}, truncated: false };
  return { error: { code: 'NOT_FOUND', message: `no route ${method} ${path}` } };
}

before(async () => {
  server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString()));
    req.on('end', () => {
      const path = (req.url ?? '').split('?')[0] ?? '';
      seen.push(`${req.method} ${path}`);
      const reply = answer(req.method ?? '', path, body);
      const status = reply && typeof reply === 'object' && 'error' in reply ? 404 : 200;
      res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(reply));
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  client = new DsecClient({ apiUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, apiKey: 'k' });
});
after(() => new Promise<void>((r) => server.close(() => r())));
beforeEach(() => {
  seen = [];
});

test('a sandbox is made of its modules', () => {
  const sb = Sandbox.fromId(ID, { client });
  assert.ok(sb.commands instanceof Commands);
  assert.ok(sb.files instanceof Files);
  assert.ok(sb.snapshots instanceof Snapshots);
  assert.ok(sb.changes instanceof Changes);
  assert.equal(typeof sb.network, 'function');
  assert.equal(typeof sb.network.set, 'function');
  assert.equal(typeof sb.trajectory, 'function');
  assert.equal(typeof sb.trajectory.replay, 'function');
  assert.equal(seen.length, 0, 'fromId asks nothing');
});

test('exec and commands.run send the same request and return the same result', async () => {
  const sb = Sandbox.fromId(ID, { client });
  const a = await sb.exec('echo hi');
  const b = await sb.commands.run('echo hi');
  assert.deepEqual(a, b);
  assert.equal(a.pid, 4);
  assert.deepEqual(seen, [`POST /v1/sandboxes/${ID}/exec`, `POST /v1/sandboxes/${ID}/exec`]);
  assert.deepEqual(await sb.processes(), await sb.commands.list());
});

test('exec with check throws a CommandExitError that is a DsecError', async () => {
  const sb = Sandbox.fromId(ID, { client });
  await assert.rejects(sb.exec('false', { check: true }), (err: unknown) => {
    assert.ok(err instanceof CommandExitError);
    assert.ok(err instanceof DsecError);
    assert.equal(err.code, 'COMMAND_FAILED');
    assert.equal(err.exitCode, 1);
    assert.equal(err.stdout, 'hi');
    assert.equal(err.details.sandboxId, ID);
    return true;
  });
  assert.equal((await sb.exec('false')).exitCode, 1, 'without check a non-zero exit is a result');
});

test('network: calling the module and its methods reach the network routes', async () => {
  const sb = Sandbox.fromId(ID, { client });
  assert.deepEqual(await sb.network(), await sb.network.info());
  await sb.setNetwork({ mode: 'none' });
  await sb.network.patch({ mode: 'none' });
  assert.equal((await sb.networkLog({ limit: 5 }))[0]?.verdict, 'denied');
  const route = `/v1/sandboxes/${ID}/network`;
  assert.deepEqual(seen, [`GET ${route}`, `GET ${route}`, `PUT ${route}`, `PATCH ${route}`, `GET ${route}/log`]);
  await assert.rejects(sb.network.set({ mode: 'everything' } as never), (err: unknown) => err instanceof DsecError && err.code === 'INVALID_ARGUMENT');
  assert.equal(seen.length, 5, 'a bad policy is refused before anything is sent');
});

test('fork and replay hand back Sandbox objects on the same client', async () => {
  const sb = Sandbox.fromId(ID, { client });
  const fork = await sb.fork(2);
  assert.deepEqual(
    fork.sandboxes.map((s) => s.id),
    ['node1-f1', 'node1-f2'],
  );
  assert.ok(fork.sandboxes.every((s) => s instanceof Sandbox && s.client === client && s.lastInfo?.id === s.id));
  const replay = await sb.replay();
  assert.ok(replay.sandbox instanceof Sandbox);
  assert.equal(replay.sandbox.id, 'node1-r1');
  assert.equal((await sb.snapshot()).digest, (await sb.snapshots.create()).digest);
});

test('lifecycle calls keep lastInfo, changes and trajectory page through their routes', async () => {
  const sb = Sandbox.fromId(ID, { client });
  const state = (): string | undefined => sb.lastInfo?.state;
  assert.equal(state(), undefined);
  await sb.pause();
  assert.equal(state(), 'paused');
  await sb.info();
  assert.equal(state(), 'running');
  const paths: string[] = [];
  for await (const e of sb.diffEntries()) paths.push(e.path);
  assert.deepEqual(paths, ['/a']);
  const steps: number[] = [];
  for await (const s of sb.trajectory()) steps.push(s.seq);
  assert.deepEqual(steps, [0]);
  assert.equal((await sb.trajectoryPage()).sandboxId, ID);
});
