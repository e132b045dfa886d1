// SWE-ReX's remote runtime protocol through dsec, end to end, with the request bodies its
// RemoteRuntime sends (full pydantic models, `X-API-Key`, `X-Request-ID`): stateful bash
// sessions (cwd, environment, functions, aliases), exit codes and `check`, exact output, syntax
// errors, timeouts and interrupts, expect strings with an interactive program, long commands,
// background jobs, retried requests, execute, read/write_file, multipart upload with unzip, close;
// failures in its exception format (HTTP 511, `swerexception.class_path`).
//
// The sandbox's image is the fncall python runtime layer (Debian with bash and python3), taken
// from the machine-wide runtime cache (DSEC_TEST_CACHE, default /var/tmp/dsec-test-cache).
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { after, before, describe, test } from 'node:test';
import { ROOT_PROJECT_ID } from '@dsec/apiserver';
import { RUNTIME_LAYERS, runtimeLayerName } from '@dsec/edge';
import { DsecClient, Sandbox } from '@dsec/sdk';
import { REPO_ROOT } from './helpers/node.js';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';

const run = promisify(execFile);
const CACHE = path.join(process.env.DSEC_TEST_CACHE ?? '/var/tmp/dsec-test-cache', 'runtimes');
const IMAGE = runtimeLayerName(RUNTIME_LAYERS.python, 'bookworm');

let platform: TestPlatform;
let sandbox: Sandbox;
let base: string;
let scratch: string;
let requestSeq = 0;

interface Reply {
  status: number;
  json: Record<string, unknown>;
}

/** A POST as SWE-ReX's RemoteRuntime sends it. */
async function call(endpoint: string, body: unknown, opts: { key?: string; requestId?: string } = {}): Promise<Reply> {
  const res = await fetch(`${base}/${endpoint}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': opts.key ?? platform.adminKey, 'x-request-id': opts.requestId ?? `req-${++requestSeq}` },
    body: JSON.stringify(body),
  });
  assert.match(res.headers.get('content-type') ?? '', /application\/json/);
  return { status: res.status, json: (await res.json()) as Record<string, unknown> };
}

async function ok(endpoint: string, body: unknown): Promise<Record<string, unknown>> {
  const r = await call(endpoint, body);
  assert.equal(r.status, 200, JSON.stringify(r.json));
  return r.json;
}

/** The exception SWE-ReX's client would raise: its class path and message. */
async function raises(endpoint: string, body: unknown, classPath: string): Promise<{ message: string; extra_info: Record<string, unknown> }> {
  const r = await call(endpoint, body);
  assert.equal(r.status, 511, JSON.stringify(r.json));
  const ex = r.json.swerexception as { message: string; class_path: string; traceback: string; extra_info: Record<string, unknown> };
  assert.equal(ex.class_path, classPath, ex.message);
  assert.equal(typeof ex.traceback, 'string');
  return ex;
}

const bash = (command: string, extra: Record<string, unknown> = {}): Record<string, unknown> => ({
  command,
  session: 'default',
  timeout: 10,
  is_interactive_command: false,
  is_interactive_quit: false,
  check: 'silent',
  error_msg: '',
  expect: [],
  action_type: 'bash',
  ...extra,
});

before(async () => {
  scratch = await mkdtemp(path.join(os.tmpdir(), 'dsec-swerex-'));
  platform = await startTestPlatform({ calls: { runtimeCache: CACHE, prebuild: ['python'] } });
  const until = Date.now() + 900_000;
  let layer;
  for (;;) {
    layer = await platform.platform.edge.layers.resolve(IMAGE).catch(() => undefined);
    if (layer || Date.now() > until) break;
    await new Promise((r) => setTimeout(r, 1000));
  }
  assert.ok(layer, `${IMAGE} not built`);
  await platform.platform.services.layers.register(ROOT_PROJECT_ID, layer, IMAGE);
  const client = new DsecClient({ apiUrl: platform.url, apiKey: platform.adminKey });
  sandbox = await Sandbox.create({ image: { base: IMAGE } }, { client });
  base = `${platform.url}/v1/sandboxes/${sandbox.id}/swerex`;
});

after(async () => {
  await sandbox?.kill().catch(() => undefined);
  await platform?.close();
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

describe('swerex runtime', () => {
  test('is_alive, and the key in X-API-Key', async () => {
    const alive = await fetch(`${base}/is_alive`, { headers: { 'x-api-key': platform.adminKey } });
    assert.equal(alive.status, 200);
    assert.deepEqual(await alive.json(), { is_alive: true, message: '' });
    assert.equal((await fetch(`${base}/is_alive`)).status, 401);
    assert.equal((await fetch(`${base}/is_alive`, { headers: { 'x-api-key': 'dsec_wrong' } })).status, 401);
    // X-API-Key carries a dsec key on SWE-ReX paths only.
    assert.equal((await fetch(`${platform.url}/v1/sandboxes`, { headers: { 'x-api-key': platform.adminKey } })).status, 401);
    const other = await fetch(`${platform.url}/v1/sandboxes/nosuch-0000000000000000/swerex/is_alive`, { headers: { 'x-api-key': platform.adminKey } });
    assert.equal(other.status, 404);
  });

  test('a session keeps cwd, environment, functions and aliases; output is exact', async () => {
    const created = await ok('create_session', { session: 'default', session_type: 'bash', startup_source: ['/no/such/rc'], startup_timeout: 1.0 });
    assert.equal(created.session_type, 'bash');
    await raises(
      'create_session',
      { session: 'default', session_type: 'bash', startup_source: [], startup_timeout: 1.0 },
      'swerex.exceptions.SessionExistsError',
    );
    const setup = await ok('run_in_session', bash('cd /tmp && export FOO=bar && f() { echo "f:$1"; }\nalias greet=\'echo hello\''));
    assert.deepEqual(setup, { output: '', exit_code: 0, failure_reason: '', expect_string: '', session_type: 'bash' });
    const r = await ok('run_in_session', bash('pwd; echo "$FOO"; f x; greet'));
    assert.equal(r.output, '/tmp\nbar\nf:x\nhello\n');
    assert.equal((await ok('run_in_session', bash("printf 'a\\nb'"))).output, 'a\nb');
    assert.equal((await ok('run_in_session', bash('echo out; echo err >&2'))).output, 'out\nerr\n');
    const heredoc = await ok('run_in_session', bash("cat <<'EOF' > /tmp/h.txt\nline $HOME\nEOF\ncat /tmp/h.txt"));
    assert.equal(heredoc.output, 'line $HOME\n');
    const long = 'x'.repeat(5000);
    assert.equal((await ok('run_in_session', bash(`echo ${long} | wc -c`))).output, '5001\n');
    const bg = await ok('run_in_session', bash('sleep 100 & echo started'));
    assert.match(String(bg.output), /started\n$/);
  });

  test('exit codes and check; syntax errors', async () => {
    assert.equal((await ok('run_in_session', bash('false'))).exit_code, 1);
    assert.equal((await ok('run_in_session', bash('(exit 7)', { check: 'ignore' }))).exit_code, null);
    const failed = await raises(
      'run_in_session',
      bash('echo nope; exit_status() { return 3; }; exit_status', { check: 'raise', error_msg: 'the step' }),
      'swerex.exceptions.NonZeroExitCodeError',
    );
    assert.match(failed.message, /^the step: Command .* failed with exit code 3/);
    const syntax = await raises('run_in_session', bash("echo 'unclosed"), 'swerex.exceptions.BashIncorrectSyntaxError');
    assert.match(String(syntax.extra_info.bash_stderr), /unexpected EOF|unexpected end of file/);
    assert.equal((await ok('run_in_session', bash('echo still'))).output, 'still\n');
  });

  test('a timeout leaves the command running until an interrupt', async () => {
    const t = await raises('run_in_session', bash('echo begin; sleep 30; echo never', { timeout: 1 }), 'swerex.exceptions.CommandTimeoutError');
    assert.match(t.message, /timeout after 1 seconds while running command/);
    const intr = await ok('run_in_session', { session: 'default', timeout: 0.2, n_retry: 3, expect: [], action_type: 'bash_interrupt' });
    assert.equal(intr.exit_code, 0);
    const after = await ok('run_in_session', bash('echo after; pwd'));
    assert.equal(after.output, 'after\n/tmp\n');
  });

  test('expect strings with an interactive program', async () => {
    const start = await ok('run_in_session', bash('python3 -i -q', { is_interactive_command: true, expect: ['>>> '] }));
    assert.equal(start.expect_string, '>>> ');
    const step = await ok('run_in_session', bash('print(6 * 7)', { is_interactive_command: true, expect: ['>>> '] }));
    assert.match(String(step.output), /42/);
    await ok('run_in_session', bash('exit()', { is_interactive_quit: true }));
    assert.equal((await ok('run_in_session', bash('echo back'))).output, 'back\n');
  });

  test('X-Request-ID: a retried request answers what the first did', async () => {
    await ok('run_in_session', bash('n=0'));
    const body = bash('n=$((n+1)); echo $n');
    const first = await call('run_in_session', body, { requestId: 'same-id' });
    const retry = await call('run_in_session', body, { requestId: 'same-id' });
    assert.deepEqual(retry.json, first.json);
    assert.equal(first.json.output, '1\n');
    assert.equal((await call('run_in_session', body)).json.output, '2\n');
  });

  test('execute, read_file, write_file, upload with unzip', async () => {
    const cmd = { timeout: 10, shell: true, check: false, error_msg: '', env: null, cwd: '/tmp', merge_output_streams: false };
    const ex = await ok('execute', { command: 'pwd; echo err >&2; exit 3', ...cmd });
    assert.deepEqual(ex, { stdout: '/tmp\n', stderr: 'err\n', exit_code: 3 });
    const list = await ok('execute', { ...cmd, command: ['echo', 'a b'], shell: false });
    assert.equal(list.stdout, 'a b\n');
    await raises('execute', { ...cmd, command: 'exit 2', check: true }, 'swerex.exceptions.NonZeroExitCodeError');
    await raises('execute', { ...cmd, command: 'sleep 20', timeout: 1 }, 'swerex.exceptions.CommandTimeoutError');

    assert.deepEqual(await ok('write_file', { content: 'héllo\n', path: '/srv/new/dir/f.txt' }), {});
    assert.deepEqual(await ok('read_file', { path: '/srv/new/dir/f.txt', encoding: null, errors: null }), { content: 'héllo\n' });
    await raises('read_file', { path: '/no/such/file', encoding: null, errors: null }, 'builtins.FileNotFoundError');

    // A directory, as RemoteRuntime.upload sends it: zipped, unzip=true.
    const src = path.join(scratch, 'tools');
    await run('mkdir', ['-p', path.join(src, 'bin')]);
    await writeFile(path.join(src, 'bin', 'tool'), '#!/bin/sh\necho tool ran\n', { mode: 0o755 });
    await writeFile(path.join(src, 'README'), 'readme\n');
    const zip = path.join(scratch, 'tools.zip');
    await run('python3', ['-c', 'import shutil, sys; shutil.make_archive(sys.argv[1][:-4], "zip", sys.argv[2])', zip, src]);
    const upload = async (file: string, target: string, unzip: boolean): Promise<Reply> => {
      const form = new FormData();
      form.append('file', new Blob([await readFile(file)]), path.basename(file));
      form.append('target_path', target);
      form.append('unzip', unzip ? 'true' : 'false');
      const res = await fetch(`${base}/upload`, { method: 'POST', headers: { 'x-api-key': platform.adminKey }, body: form });
      return { status: res.status, json: (await res.json()) as Record<string, unknown> };
    };
    assert.deepEqual((await upload(zip, '/opt/tools', true)).json, {});
    const ran = await ok('execute', { ...cmd, command: '/opt/tools/bin/tool && cat /opt/tools/README' });
    assert.equal(ran.stdout, 'tool ran\nreadme\n');
    assert.deepEqual((await upload(path.join(src, 'README'), '/opt/single/README.md', false)).json, {});
    assert.equal((await ok('read_file', { path: '/opt/single/README.md' })).content, 'readme\n');
    assert.equal((await upload(path.join(src, 'README'), '/opt/bad', true)).status, 400);
  });

  test('close_session, close', async () => {
    await ok('create_session', { session: 'second', session_type: 'bash', startup_source: [], startup_timeout: 1.0 });
    assert.deepEqual(await ok('close_session', { session: 'second', session_type: 'bash' }), { session_type: 'bash' });
    await raises('run_in_session', bash('echo x', { session: 'second' }), 'swerex.exceptions.SessionDoesNotExistError');
    await raises('close_session', { session: 'second', session_type: 'bash' }, 'swerex.exceptions.SessionDoesNotExistError');
    // `close` arrives with no body at all.
    const closed = await fetch(`${base}/close`, { method: 'POST', headers: { 'x-api-key': platform.adminKey } });
    assert.equal(closed.status, 200);
    assert.deepEqual(await closed.json(), {});
    await raises('run_in_session', bash('echo x'), 'swerex.exceptions.SessionDoesNotExistError');
    // The sandbox itself stays.
    assert.equal((await sandbox.exec(['true'])).exitCode, 0);
  });

  test("a stand-in of SWE-ReX's RemoteRuntime (Python, standard library) works unchanged", async () => {
    const { stdout } = await run('python3', [path.join(REPO_ROOT, 'test/fixtures/swerex_client.py'), base, platform.adminKey, scratch], {
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin' },
      timeout: 120_000,
    });
    assert.equal(stdout.trim(), 'ok');
  });
});
