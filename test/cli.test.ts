// End-to-end tests of the `dsec` command, run as a real process against an in-process platform.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, readFile, rm, truncate, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { REPO_ROOT } from './helpers/node.js';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';

const CLI = path.join(REPO_ROOT, 'packages/cli/dist/main.js');
const RUN = `cli-${randomBytes(4).toString('hex')}`;

let platform: TestPlatform | undefined;
let scratch: string;
const created: string[] = [];

interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
  /** ms from start to the first stdout byte. */
  firstStdoutMs: number | undefined;
  durationMs: number;
}

/** Runs `dsec args...` with the platform's URL and key in the environment. */
function dsec(args: string[], opts: { input?: string; env?: Record<string, string> } = {}): Promise<CliResult> {
  const t0 = Date.now();
  const child = spawn(process.execPath, [CLI, ...args], {
    env: {
      PATH: process.env.PATH ?? '',
      DSEC_API_URL: platform?.url ?? '',
      DSEC_API_KEY: platform?.adminKey ?? '',
      DSEC_HOME: path.join(scratch, 'no-home'),
      ...opts.env,
    },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  let firstStdoutMs: number | undefined;
  child.stdout.on('data', (d: Buffer) => {
    firstStdoutMs ??= Date.now() - t0;
    stdout += d.toString();
  });
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  child.stdin.end(opts.input ?? '');
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr, firstStdoutMs, durationMs: Date.now() - t0 });
    });
  });
}

/** Asserts exit 0 and returns stdout. */
async function ok(args: string[], opts?: { input?: string }): Promise<string> {
  const r = await dsec(args, opts);
  assert.equal(r.code, 0, `dsec ${args.join(' ')}: ${r.stderr}`);
  return r.stdout;
}

before(async () => {
  scratch = await mkdtemp(path.join(os.tmpdir(), 'dsec-cli-e2e-'));
  platform = await startTestPlatform();
});

after(async () => {
  try {
    if (platform) {
      const ids = await dsec(['sandbox', 'ls', '--label', `run=${RUN}`, '--json'])
        .then((r) => (JSON.parse(r.stdout || '[]') as Array<{ id: string }>).map((s) => s.id))
        .catch(() => created);
      if (ids.length) await dsec(['sandbox', 'rm', ...ids]);
    }
  } finally {
    await platform?.close();
    await rm(scratch, { recursive: true, force: true });
  }
});

describe('dsec', () => {
  let id: string;

  test('sandbox create, ls, get', async () => {
    id = (await ok(['sandbox', 'create', '--base', 'busybox', '--label', `run=${RUN}`, '--label', 'kind=main', '--env', 'FOO=bar', '--memory', '128'])).trim();
    created.push(id);
    assert.match(id, /^[a-z0-9-]+-[0-9a-f]+$/);
    const json = JSON.parse(await ok(['sandbox', 'create', '--base', 'busybox', '--label', `run=${RUN}`, '--label', 'kind=other', '--json'])) as {
      id: string;
      labels: Record<string, string>;
    };
    created.push(json.id);
    assert.deepEqual(json.labels, { run: RUN, kind: 'other' });

    const table = await ok(['sandbox', 'ls', '--label', `run=${RUN}`]);
    const lines = table.trim().split('\n');
    assert.match(lines[0] ?? '', /^ID\s+STATE\s+IMAGE/);
    assert.equal(lines.length, 3);
    const only = JSON.parse(await ok(['sandbox', 'ls', '--label', `run=${RUN}`, '--label', 'kind=main', '--json'])) as Array<{ id: string }>;
    assert.deepEqual(
      only.map((s) => s.id),
      [id],
    );

    const got = JSON.parse(await ok(['sandbox', 'get', id, '--json'])) as { id: string; envKeys: string[]; resources: { memoryMiB: number } };
    assert.equal(got.id, id);
    assert.deepEqual(got.envKeys, ['FOO']);
    assert.equal(got.resources.memoryMiB, 128);
    assert.match(await ok(['sandbox', 'get', id]), /state:\s+running/);

    await ok(['sandbox', 'rm', json.id]);
    const gone = await dsec(['sandbox', 'get', json.id]);
    assert.equal(gone.code, 1);
    assert.match(gone.stderr, /^dsec: SANDBOX_NOT_FOUND: /);
  });

  test('exec propagates exit codes and streams output', async () => {
    const r = await dsec(['exec', id, '--', 'sh', '-c', 'echo out; echo err >&2; echo $FOO; exit 7']);
    assert.equal(r.code, 7);
    assert.equal(r.stdout, 'out\nbar\n');
    assert.equal(r.stderr, 'err\n');
    const killed = await dsec(['exec', id, '--', 'sh', '-c', 'kill -9 $$']);
    assert.equal(killed.code, 137);
    const env = await dsec(['exec', id, '--env', 'A=1', '--cwd', '/tmp', '--', 'sh', '-c', 'echo $A $(pwd)']);
    assert.equal(env.stdout, '1 /tmp\n');
    const streamed = await dsec(['exec', id, '--', 'sh', '-c', 'echo first; sleep 1.5; echo second']);
    assert.equal(streamed.stdout, 'first\nsecond\n');
    assert.ok(
      streamed.firstStdoutMs !== undefined && streamed.firstStdoutMs < streamed.durationMs - 1000,
      `first output at ${streamed.firstStdoutMs} ms of ${streamed.durationMs}`,
    );
    const input = await dsec(['exec', '-i', id, '--', 'wc', '-l'], { input: 'a\nb\nc\n' });
    assert.equal(input.code, 0, input.stderr);
    assert.equal(input.stdout.trim(), '3');
  });

  test('cp copies files and directories both ways', async () => {
    const file = path.join(scratch, 'hello.txt');
    await writeFile(file, 'hello from the host\n');
    await ok(['cp', file, `${id}:/tmp/hello.txt`]);
    assert.equal((await dsec(['exec', id, '--', 'cat', '/tmp/hello.txt'])).stdout, 'hello from the host\n');

    const dir = path.join(scratch, 'tree');
    await mkdir(path.join(dir, 'sub'), { recursive: true });
    await writeFile(path.join(dir, 'sub/x.txt'), 'x\n');
    await ok(['cp', dir, `${id}:/data`]);
    assert.equal((await dsec(['exec', id, '--', 'cat', '/data/sub/x.txt'])).stdout, 'x\n');

    await ok(['exec', id, '--', 'sh', '-c', 'echo made > /data/made.txt']);
    const back = path.join(scratch, 'back');
    await ok(['cp', `${id}:/data`, back]);
    assert.equal(await readFile(path.join(back, 'made.txt'), 'utf8'), 'made\n');
    assert.equal(await readFile(path.join(back, 'sub/x.txt'), 'utf8'), 'x\n');
    await ok(['cp', `${id}:/tmp/hello.txt`, path.join(scratch, 'hello-back.txt')]);
    assert.equal(await readFile(path.join(scratch, 'hello-back.txt'), 'utf8'), 'hello from the host\n');
  });

  test('image build --from-dir, ls, rm', async () => {
    const dir = path.join(scratch, 'toolkit');
    await mkdir(path.join(dir, 'opt/tk'), { recursive: true });
    await writeFile(path.join(dir, 'opt/tk/version'), 'tk 1\n');
    const name = `tk-${RUN}:v1`;
    const build = await dsec(['image', 'build', name, '--kind', 'toolkit', '--from-dir', dir]);
    assert.equal(build.code, 0, build.stderr);
    assert.match(build.stdout.trim(), /^sha256:[0-9a-f]{64}$/);
    assert.match(build.stderr, /uploaded/);
    const layers = JSON.parse(await ok(['image', 'ls', '--json'])) as Array<{ names: string[]; kind: string }>;
    assert.ok(layers.some((l) => l.names.includes(name) && l.kind === 'toolkit'));
    assert.match(await ok(['image', 'ls']), /^NAME\s+KIND\s+DIGEST/);
    const sb = (await ok(['sandbox', 'create', '--base', 'busybox', '--toolkit', name, '--label', `run=${RUN}`])).trim();
    assert.equal((await dsec(['exec', sb, '--', 'cat', '/opt/tk/version'])).stdout, 'tk 1\n');
    await ok(['sandbox', 'rm', sb]);
    await ok(['image', 'rm', name]);
    const after = JSON.parse(await ok(['image', 'ls', '--json'])) as Array<{ names: string[] }>;
    assert.ok(!after.some((l) => l.names.includes(name)));
  });

  test('keys create, ls, revoke', async () => {
    const secret = (await ok(['keys', 'create', '--name', `k-${RUN}`, '--role', 'member'])).trim();
    assert.match(secret, /^dsec_/);
    const keys = JSON.parse(await ok(['keys', 'ls', '--json'])) as Array<{ id: string; name: string; revokedAt: string | null }>;
    const key = keys.find((k) => k.name === `k-${RUN}`);
    assert.ok(key);
    const asMember = await dsec(['nodes', '--json'], { env: { DSEC_API_KEY: secret } });
    assert.equal(asMember.code, 0, asMember.stderr);
    await ok(['keys', 'revoke', key.id]);
    const revoked = await dsec(['nodes'], { env: { DSEC_API_KEY: secret } });
    assert.equal(revoked.code, 1);
    assert.match(revoked.stderr, /^dsec: UNAUTHENTICATED: /);
  });

  test('nodes --json', async () => {
    const nodes = JSON.parse(await ok(['nodes', '--json'])) as Array<{ name: string; healthy: boolean; backends: string[] }>;
    assert.ok(nodes.length >= 1);
    assert.equal(nodes[0]?.healthy, true);
    assert.ok(nodes[0]?.backends.includes('container'));
  });

  test('usage errors exit 2, request errors exit 1', async () => {
    const usage = await dsec(['sandbox', 'create', '--base', 'busybox', '--cpu', 'lots']);
    assert.equal(usage.code, 2);
    assert.match(usage.stderr, /^dsec: /);
    const bad = await dsec(['sandbox', 'create', '--base', 'busybox', '--memory', '1']);
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /^dsec: INVALID_ARGUMENT: resources\.memoryMiB/);
  });

  test('image import of a disk above the upload limit says so, naming the limit, before sending it', async () => {
    // Sparse: 2 GiB long, no block of the disk used.
    const disk = path.join(scratch, 'big.raw');
    await writeFile(disk, '');
    await truncate(disk, 2 * 1024 * 1024 * 1024);
    const r = await dsec(['image', 'import', disk, '--name', `too-big-${RUN}`]);
    assert.equal(r.code, 1, r.stderr);
    assert.match(r.stderr, /^dsec: PAYLOAD_TOO_LARGE: .*big\.raw: 2\.00 GiB \(2147483648 bytes\); uploads are limited to 1 GiB \(1073741824 bytes\)/);
    assert.doesNotMatch(r.stderr, /uploaded/, 'nothing was sent');
    const layers = JSON.parse(await ok(['image', 'ls', '--json'])) as Array<{ names: string[] }>;
    assert.ok(!layers.some((l) => l.names.some((n) => n.startsWith(`too-big-${RUN}`))));
  });
});
