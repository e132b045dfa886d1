// End-to-end tests of @dsec/sdk against a real platform (apiserver + edge + crun sandboxes).
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, readFile, readlink, rm, stat, symlink, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { CommandExitError, DsecClient, DsecError, Sandbox } from '@dsec/sdk';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';
import { isCode } from './helpers/assert.js';

let platform: TestPlatform | undefined;
let client: DsecClient;
let sandbox: Sandbox;
let scratch: string;
/** Every sandbox of this run carries this label, so that `after` finds them all. */
const RUN = `sdk-${randomBytes(4).toString('hex')}`;

before(async () => {
  scratch = await mkdtemp(path.join(os.tmpdir(), 'dsec-sdk-e2e-'));
  platform = await startTestPlatform();
  client = new DsecClient({ apiUrl: platform.url, apiKey: platform.adminKey });
  sandbox = await Sandbox.create(
    { image: { base: 'busybox' }, labels: { run: RUN, role: 'main' }, env: { GREETING: 'hello' }, resources: { memoryMiB: 128 } },
    { client },
  );
});

after(async () => {
  try {
    if (client) {
      for await (const s of Sandbox.list({ labels: { run: RUN } }, { client })) await Sandbox.kill(s.id, { client }).catch(() => undefined);
    }
  } finally {
    await platform?.close();
    await rm(scratch, { recursive: true, force: true });
  }
});

describe('sandboxes', () => {
  test('create returns a running sandbox with its labels; info and stats answer', async () => {
    assert.match(sandbox.id, /^[a-z0-9-]+-[0-9a-f]+$/);
    const info = await sandbox.info();
    assert.equal(info.state, 'running');
    assert.deepEqual(info.labels, { run: RUN, role: 'main' });
    assert.deepEqual(info.envKeys, ['GREETING']);
    assert.equal(info.resources.memoryMiB, 128);
    const stats = await sandbox.stats();
    assert.equal(stats.memoryLimitBytes, 128 * 1024 * 1024);
    assert.equal(typeof stats.pids, 'number');
  });

  test('list filters by labels', async () => {
    const other = await Sandbox.create({ image: { base: 'busybox' }, labels: { run: RUN, role: 'other' } }, { client });
    const all = await Sandbox.list({ labels: { run: RUN } }, { client }).toArray();
    assert.deepEqual(all.map((s) => s.id).sort(), [sandbox.id, other.id].sort());
    const main = await Sandbox.list({ labels: { run: RUN, role: 'main' } }, { client }).toArray();
    assert.deepEqual(
      main.map((s) => s.id),
      [sandbox.id],
    );
    const paged = await Sandbox.list({ labels: { run: RUN }, limit: 1 }, { client }).toArray();
    assert.equal(paged.length, 2, 'pages are followed');
    await other.kill();
    await assert.rejects(other.info(), isCode('SANDBOX_NOT_FOUND'));
  });

  test('connect finds a sandbox; unknown ids are SANDBOX_NOT_FOUND (404)', async () => {
    const again = await Sandbox.connect(sandbox.id, { client });
    assert.equal(again.lastInfo?.id, sandbox.id);
    await assert.rejects(
      Sandbox.connect('test-0123456789abcdef', { client }),
      (err: unknown) => isCode('SANDBOX_NOT_FOUND')(err) && (err as DsecError).status === 404,
    );
  });

  test('bad input is INVALID_ARGUMENT naming the field, before sending', async () => {
    await assert.rejects(
      Sandbox.create({ image: { base: 'busybox' }, resources: { memoryMiB: 4 } }, { client }),
      isCode('INVALID_ARGUMENT', 'resources.memoryMiB'),
    );
    await assert.rejects(sandbox.exec('true', { cwd: 'relative' }), isCode('INVALID_ARGUMENT', 'cwd'));
    await assert.rejects(sandbox.files.read('relative'), isCode('INVALID_ARGUMENT', 'path'));
    // The server maps its own checks the same way.
    await assert.rejects(
      Sandbox.create({ image: { base: 'no-such-layer' } }, { client }),
      (err: unknown) => err instanceof DsecError && err.status >= 400 && err.status < 500,
    );
  });

  test('a missing or wrong key is UNAUTHENTICATED', async () => {
    const anonymous = new DsecClient({ apiUrl: client.apiUrl, apiKey: 'dsec_wrong' });
    await assert.rejects(Sandbox.listPage({}, { client: anonymous }), isCode('UNAUTHENTICATED'));
  });
});

describe('exec', () => {
  test('exit codes are results; output and env come back', async () => {
    const r = await sandbox.exec('echo out; echo err >&2; echo $GREETING; exit 3');
    assert.equal(r.exitCode, 3);
    assert.equal(r.stdout, 'out\nhello\n');
    assert.equal(r.stderr, 'err\n');
    assert.equal(r.truncated, false);
    const argv = await sandbox.exec(['sh', '-c', 'echo "$1 $X"', 'sh', 'a b'], { env: { X: 'y' }, cwd: '/tmp' });
    assert.equal(argv.stdout, 'a b y\n');
    assert.equal((await sandbox.exec('pwd', { cwd: '/tmp' })).stdout, '/tmp\n');
  });

  test('stdin as text and as bytes', async () => {
    assert.equal((await sandbox.exec('cat', { stdin: 'abc' })).stdout, 'abc');
    const bytes = Buffer.from([0, 1, 2, 255]);
    assert.equal((await sandbox.exec('wc -c', { stdin: bytes })).stdout.trim(), '4');
  });

  test('check: true throws CommandExitError with the result', async () => {
    await assert.rejects(sandbox.exec('echo bad >&2; exit 5', { check: true }), (err: unknown) => {
      assert.ok(err instanceof CommandExitError);
      assert.ok(err instanceof DsecError, 'a CommandExitError is a DsecError');
      assert.equal(err.code, 'COMMAND_FAILED');
      assert.equal(err.details.sandboxId, sandbox.id);
      assert.equal(err.result.pid, err.pid);
      assert.equal(err.exitCode, 5);
      assert.equal(err.stderr, 'bad\n');
      assert.equal(err.stdout, '');
      return true;
    });
    assert.equal((await sandbox.exec('true', { check: true })).exitCode, 0);
  });

  test('the modules answer as the methods users already call do', async () => {
    const run = await sandbox.commands.run(['echo', 'module']);
    assert.equal(run.stdout, 'module\n');
    assert.deepEqual(await sandbox.commands.list(), await sandbox.processes());
    assert.deepEqual((await sandbox.network.info()).policy, (await sandbox.network()).policy);
  });

  test('a command past its timeout is killed and reported', async () => {
    const r = await sandbox.exec('sleep 10', { timeoutMs: 300 });
    assert.equal(r.timedOut, true);
    assert.equal(r.exitCode, null);
  });

  test('onStdout/onStderr stream output as it comes', async () => {
    const seen: Array<[string, string, number]> = [];
    const t0 = Date.now();
    const r = await sandbox.exec('for i in 1 2 3; do echo o$i; echo e$i >&2; sleep 0.2; done', {
      onStdout: (d) => seen.push(['out', d, Date.now() - t0]),
      onStderr: (d) => seen.push(['err', d, Date.now() - t0]),
    });
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout, 'o1\no2\no3\n');
    assert.equal(r.stderr, 'e1\ne2\ne3\n');
    assert.equal(
      seen
        .filter(([s]) => s === 'out')
        .map(([, d]) => d)
        .join(''),
      'o1\no2\no3\n',
    );
    assert.equal(
      seen
        .filter(([s]) => s === 'err')
        .map(([, d]) => d)
        .join(''),
      'e1\ne2\ne3\n',
    );
    const first = seen.find(([s, d]) => s === 'out' && d.includes('o1'));
    assert.ok(first && first[2] < Date.now() - t0 - 250, 'the first line arrived before the command ended');
  });

  test('exec round trip on loopback', async () => {
    const times: number[] = [];
    for (let i = 0; i < 30; i++) {
      const t = process.hrtime.bigint();
      await sandbox.exec('true');
      times.push(Number(process.hrtime.bigint() - t) / 1e6);
    }
    times.sort((a, b) => a - b);
    const p50 = times[Math.floor(times.length / 2)] as number;
    console.log(`exec round trip p50 ${p50.toFixed(2)} ms, min ${times[0]?.toFixed(2)} ms`);
    assert.ok(p50 < 100, `p50 ${p50} ms`);
  });
});

describe('spawn and attach', () => {
  test('spawn, iterate output, kill', async () => {
    const h = await sandbox.spawn('echo started; sleep 30');
    const it = h[Symbol.asyncIterator]();
    const first = await it.next();
    assert.equal(first.done, false);
    assert.equal(first.value.data.toString(), 'started\n');
    assert.ok(h.pid >= 0);
    await h.kill();
    const exit = await h.wait();
    assert.equal(exit.signal, 'SIGKILL');
    assert.equal(exit.exitCode, null);
  });

  test('interactive stdin over the WebSocket route', async () => {
    let text = '';
    const h = await sandbox.spawn('cat; echo done', { stdin: true, onStdout: (d) => (text += d) });
    await h.writeStdin('hello ');
    await h.writeStdin(Buffer.from('world\n'));
    await h.closeStdin();
    const exit = await h.wait();
    assert.equal(exit.exitCode, 0);
    assert.equal(text, 'hello world\ndone\n');
  });

  test('reattach from an offset after dropping the handle: no loss, no duplicates', async () => {
    const lines = 15;
    const expected = Array.from({ length: lines }, (_, i) => `line${i + 1}\n`).join('');
    const h = await sandbox.spawn(`for i in $(seq 1 ${lines}); do echo line$i; sleep 0.1; done`);
    let got = '';
    for await (const ev of h) {
      got += ev.data.toString();
      if (got.split('\n').length > 4) break;
    }
    const offsets = h.offsets;
    assert.equal(offsets.stdout, Buffer.byteLength(got));
    h.disconnect();
    await assert.rejects(h.wait(), isCode('UNAVAILABLE'));

    const procs = await sandbox.processes();
    const p = procs.find((x) => x.pid === h.pid);
    assert.ok(p, 'the process is still listed');
    assert.equal(p.state, 'running');

    const again = await sandbox.attach(h.pid, { fromStdout: offsets.stdout, fromStderr: offsets.stderr });
    for await (const ev of again) {
      assert.ok(ev.offset >= offsets.stdout);
      got += ev.data.toString();
    }
    const exit = await again.wait();
    assert.equal(exit.exitCode, 0);
    assert.equal(got, expected);
    assert.deepEqual(again.lostBytes, { stdout: 0, stderr: 0 });
    const after = (await sandbox.processes()).find((x) => x.pid === h.pid);
    assert.equal(after?.state, 'exited');
  });
});

describe('files', () => {
  test('write, read, stat, list, rename, remove', async () => {
    await sandbox.files.makeDir('/work/sub');
    await sandbox.files.write('/work/a.txt', 'alpha\n');
    await sandbox.files.write('/work/a.txt', 'beta\n', { append: true });
    await sandbox.files.write('/work/run.sh', '#!/bin/sh\necho ran\n', { mode: 0o755 });
    const bin = randomBytes(70_000);
    await sandbox.files.write('/work/sub/blob', bin);
    assert.equal(await sandbox.files.read('/work/a.txt'), 'alpha\nbeta\n');
    assert.deepEqual(await sandbox.files.read('/work/sub/blob', { format: 'bytes' }), bin);
    assert.equal((await sandbox.exec('/work/run.sh')).stdout, 'ran\n');
    const st = await sandbox.files.stat('/work/run.sh');
    assert.equal(st.type, 'file');
    assert.equal(st.mode & 0o777, 0o755);
    const names = (await sandbox.files.list('/work')).map((f) => `${f.name}:${f.type}`).sort();
    assert.deepEqual(names, ['a.txt:file', 'run.sh:file', 'sub:dir']);
    await sandbox.files.rename('/work/a.txt', '/work/b.txt');
    assert.equal(await sandbox.files.exists('/work/a.txt'), false);
    assert.equal(await sandbox.files.exists('/work/b.txt'), true);
    await assert.rejects(sandbox.files.read('/work/nope'), isCode('FILE_NOT_FOUND'));
    await sandbox.files.remove('/work/sub', { recursive: true });
    assert.equal(await sandbox.files.exists('/work/sub'), false);
  });

  test('uploadDir and downloadDir round-trip a tree', { timeout: 30_000 }, async () => {
    const src = path.join(scratch, 'src');
    await mkdir(path.join(src, 'deep/er'), { recursive: true });
    await writeFile(path.join(src, 'top.txt'), 'top\n');
    await writeFile(path.join(src, 'deep/er/tool.sh'), '#!/bin/sh\necho tool\n', { mode: 0o755 });
    await symlink('deep/er/tool.sh', path.join(src, 'tool'));
    await sandbox.files.uploadDir(src, '/up');
    assert.equal((await sandbox.exec('/up/tool')).stdout, 'tool\n');
    assert.equal(await sandbox.files.read('/up/top.txt'), 'top\n');

    await sandbox.exec('echo made-inside > /up/inside.txt');
    const dst = path.join(scratch, 'dst');
    await sandbox.files.downloadDir('/up', dst);
    assert.equal(await readFile(path.join(dst, 'top.txt'), 'utf8'), 'top\n');
    assert.equal(await readFile(path.join(dst, 'inside.txt'), 'utf8'), 'made-inside\n');
    assert.equal((await stat(path.join(dst, 'deep/er/tool.sh'))).mode & 0o777, 0o755);
    assert.equal(await readlink(path.join(dst, 'tool')), 'deep/er/tool.sh');
  });
});

describe('layers and identity', () => {
  test('layers list includes busybox; a directory uploads as a workspace', async () => {
    const layers = await client.layers.list();
    assert.ok(layers.some((l) => l.names.some((n) => n.startsWith('busybox')) && l.project === 'public'));
    const dir = path.join(scratch, 'ws');
    await mkdir(path.join(dir, 'project'), { recursive: true });
    await writeFile(path.join(dir, 'project/README'), 'workspace\n');
    let sent = 0;
    const layer = await client.layers.uploadDir(dir, { kind: 'workspace', name: `ws-${RUN}` }, { onProgress: (n) => (sent = n) });
    assert.ok(sent > 0);
    assert.equal(layer.kind, 'workspace');
    const sb = await Sandbox.create({ image: { base: 'busybox', workspace: `ws-${RUN}` }, labels: { run: RUN } }, { client });
    assert.equal((await sb.exec('cat /project/README')).stdout, 'workspace\n');
    await assert.rejects(client.layers.remove(`ws-${RUN}`), isCode('CONFLICT'));
    await sb.kill();
    await client.layers.remove(`ws-${RUN}`);
    await assert.rejects(client.layers.get(`ws-${RUN}`), isCode('LAYER_NOT_FOUND'));
  });

  test('keys: create, use, revoke', async () => {
    const key = await client.keys.create({ name: 'viewer', role: 'viewer' });
    assert.match(key.key, /^dsec_/);
    const viewer = new DsecClient({ apiUrl: client.apiUrl, apiKey: key.key });
    assert.ok((await viewer.nodes.list()).length >= 1);
    await assert.rejects(Sandbox.create({ image: { base: 'busybox' }, labels: { run: RUN } }, { client: viewer }), isCode('PERMISSION_DENIED'));
    assert.ok((await client.keys.list()).some((k) => k.id === key.id && k.key === undefined));
    await client.keys.revoke(key.id);
    await assert.rejects(viewer.nodes.list(), isCode('UNAUTHENTICATED'));
  });
});

describe('kill', () => {
  test('kill destroys the sandbox', async () => {
    const sb = await Sandbox.create({ image: { base: 'busybox' }, labels: { run: RUN } }, { client });
    await sb.kill();
    await assert.rejects(sb.exec('true'), isCode('SANDBOX_NOT_FOUND'));
    await assert.rejects(sb.spawn('cat', { stdin: true }), isCode('SANDBOX_NOT_FOUND'), 'the WebSocket route maps errors too');
  });
});
