// SandboxFusion's run_code through dsec, end to end with the request shapes verl and SkyRL send:
// python, pytest, bash and c (compile and run, compile errors), stdin, base64 files in and out,
// time and memory limits, a runtime still being built (java: SandboxError at once), the ping,
// validation, and an endpoint token in the path for a client that sends no headers (made,
// listed, used, kept out of the audit, revoked; also through the CLI).
//
// The python and gcc runtime layers come from the machine-wide cache the platform is pointed
// at (DSEC_TEST_CACHE, default /var/tmp/dsec-test-cache/runtimes): built there on the first run
// (minutes), taken in at once afterwards.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { access } from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { after, before, describe, test } from 'node:test';
import { RUNTIME_LAYERS, runtimeLayerName } from '@dsec/edge';
import { REPO_ROOT } from './helpers/node.js';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';

const run = promisify(execFile);
const CACHE = path.join(process.env.DSEC_TEST_CACHE ?? '/var/tmp/dsec-test-cache', 'runtimes');
/** A first run builds python and gcc from Debian packages. */
const READY_WITHIN_MS = 900_000;

interface CommandRunResult {
  status: string;
  execution_time: number;
  return_code: number | null;
  stdout: string;
  stderr: string;
}
interface RunCodeResponse {
  status: string;
  message: string;
  compile_result: CommandRunResult | null;
  run_result: CommandRunResult | null;
  executor_pod_name: string | null;
  files: Record<string, string>;
}

let platform: TestPlatform;
let javaCached = false;

async function post(url: string, body: unknown, headers: Record<string, string> = {}): Promise<{ status: number; json: unknown }> {
  const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
  return { status: res.status, json: await res.json() };
}

/** run_code with the admin key in `Authorization`. */
async function runCode(body: Record<string, unknown>): Promise<RunCodeResponse> {
  const r = await post(`${platform.url}/v1/sandboxfusion/run_code`, body, { authorization: `Bearer ${platform.adminKey}` });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  return r.json as RunCodeResponse;
}

/** The request verl's reward function sends (every field present). */
function verlRequest(code: string, language: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return { code, language, compile_timeout: 10, run_timeout: 10, memory_limit_MB: 1024, stdin: null, files: {}, fetch_files: [], ...extra };
}

const b64 = (s: string): string => Buffer.from(s).toString('base64');

before(async () => {
  javaCached = await access(path.join(CACHE, runtimeLayerName(RUNTIME_LAYERS.java, 'bookworm'), 'layer.json')).then(
    () => true,
    () => false,
  );
  platform = await startTestPlatform({ calls: { runtimeCache: CACHE, prebuild: ['python', 'gcc'] } });
  // Until its layers are in, a call answers SandboxError at once: poll.
  for (const language of ['python', 'c']) {
    const until = Date.now() + READY_WITHIN_MS;
    for (;;) {
      const r = await runCode(verlRequest(language === 'c' ? 'int main(void){return 0;}' : 'pass', language));
      if (r.status !== 'SandboxError') break;
      assert.match(r.message, /is not ready yet/);
      if (Date.now() > until) assert.fail(`${language} not ready: ${r.message}`);
      await new Promise((res) => setTimeout(res, 2000));
    }
  }
});

after(async () => {
  await platform?.close();
});

describe('sandboxfusion run_code', () => {
  test('python: success, stdin, base64 files in and out, the exact response shape', async () => {
    const r = await runCode(
      verlRequest(
        'import sys\nn = int(sys.stdin.read())\nprint(open("data/in.txt").read().strip(), n * 2)\nopen("out.bin", "wb").write(bytes([0, 255, 1]))\n',
        'python',
        {
          stdin: '21\n',
          files: { 'data/in.txt': b64('hello'), 'skipped.txt': null },
          fetch_files: ['out.bin', 'missing.txt'],
        },
      ),
    );
    assert.deepEqual(Object.keys(r).sort(), ['compile_result', 'executor_pod_name', 'files', 'message', 'run_result', 'status']);
    assert.equal(r.status, 'Success', JSON.stringify(r));
    assert.equal(r.message, '');
    assert.equal(r.compile_result, null);
    assert.ok(r.run_result);
    assert.deepEqual(Object.keys(r.run_result).sort(), ['execution_time', 'return_code', 'status', 'stderr', 'stdout']);
    assert.equal(r.run_result.status, 'Finished');
    assert.equal(r.run_result.return_code, 0);
    assert.equal(r.run_result.stdout, 'hello 42\n');
    assert.equal(typeof r.run_result.execution_time, 'number');
    assert.deepEqual(r.files, { 'out.bin': Buffer.from([0, 255, 1]).toString('base64') });
  });

  test('python: failure, timeout, memory limit; stdin null is end of input', async () => {
    const failed = await runCode(verlRequest('import sys\nprint(sys.stdin.read() == "")\nraise SystemExit(3)', 'python'));
    assert.equal(failed.status, 'Failed');
    assert.equal(failed.run_result?.status, 'Finished');
    assert.equal(failed.run_result?.return_code, 3);
    assert.equal(failed.run_result?.stdout, 'True\n');
    const slow = await runCode(verlRequest('import time\nprint("started", flush=True)\ntime.sleep(60)', 'python', { run_timeout: 1 }));
    assert.equal(slow.status, 'Failed');
    assert.equal(slow.run_result?.status, 'TimeLimitExceeded');
    assert.equal(slow.run_result?.stdout, 'started\n');
    const big = await runCode(verlRequest('x = bytearray(400 << 20)\nprint("no")', 'python', { memory_limit_MB: 64 }));
    assert.equal(big.status, 'Failed');
    assert.equal(big.run_result?.status, 'Finished');
    assert.equal(big.run_result?.return_code, 137, JSON.stringify(big));
    assert.equal(big.run_result?.stdout, '');
    // SandboxFusion's defaults: only code and language.
    const minimal = await runCode({ code: 'print(1)', language: 'python' });
    assert.equal(minimal.status, 'Success');
  });

  test('pytest and bash', async () => {
    const passing = await runCode(verlRequest('def test_add():\n    assert 1 + 1 == 2\n', 'pytest'));
    assert.equal(passing.status, 'Success', JSON.stringify(passing));
    assert.match(passing.run_result?.stdout ?? '', /1 passed/);
    const failing = await runCode(verlRequest('def test_add():\n    assert 1 + 1 == 3\n', 'pytest'));
    assert.equal(failing.status, 'Failed');
    assert.equal(failing.run_result?.return_code, 1);
    const bash = await runCode(verlRequest('f() { echo "$1-$(pwd)"; }\nread x\nf "$x"\necho err >&2', 'bash', { stdin: 'in\n' }));
    assert.equal(bash.status, 'Success');
    assert.equal(bash.run_result?.stdout, 'in-/work\n');
    assert.equal(bash.run_result?.stderr, 'err\n');
  });

  test('c and cpp: compiled, then run; a compile error has no run', async () => {
    const c = await runCode(
      verlRequest('#include <stdio.h>\n#include <math.h>\nint main(void){int n; scanf("%d",&n); printf("%d %.0f\\n", n+1, sqrt(16.0)); return 0;}', 'c', {
        stdin: '41',
      }),
    );
    assert.equal(c.status, 'Success', JSON.stringify(c));
    assert.equal(c.compile_result?.status, 'Finished');
    assert.equal(c.compile_result?.return_code, 0);
    assert.equal(c.run_result?.stdout, '42 4\n');
    const cpp = await runCode(
      verlRequest(
        '#include <iostream>\n#include <thread>\n#include <optional>\nint main(){std::optional<int> v=6; int r=0; std::thread t([&]{r=*v*7;}); t.join(); std::cout<<r<<"\\n";}',
        'cpp',
      ),
    );
    assert.equal(cpp.status, 'Success', JSON.stringify(cpp));
    assert.equal(cpp.run_result?.stdout, '42\n');
    const broken = await runCode(verlRequest('int main(void){ return nope; }', 'c'));
    assert.equal(broken.status, 'Failed');
    assert.equal(broken.compile_result?.status, 'Finished');
    assert.notEqual(broken.compile_result?.return_code, 0);
    assert.match(broken.compile_result?.stderr ?? '', /nope/);
    assert.equal(broken.run_result, null);
  });

  test('a runtime still being built answers SandboxError at once, with why', async (t) => {
    if (javaCached) {
      t.diagnostic('java is in the machine-wide cache: it runs instead');
      const r = await runCode(
        verlRequest('public class Main { public static void main(String[] a) { assert a.length == 0; System.out.println("hi"); } }', 'java'),
      );
      assert.equal(r.status, 'Success', JSON.stringify(r));
      return;
    }
    const start = Date.now();
    const r = await runCode(verlRequest('public class Main { public static void main(String[] a) { } }', 'java'));
    assert.equal(r.status, 'SandboxError');
    assert.match(r.message, /runtime java is not ready yet: its layer .*default-jdk-headless/);
    assert.equal(r.run_result, null);
    assert.ok(Date.now() - start < 10_000, 'answered without waiting for the build');
  });

  test('ping, validation and authentication', async () => {
    const ping = await fetch(`${platform.url}/v1/sandboxfusion/v1/ping`, { headers: { authorization: `Bearer ${platform.adminKey}` } });
    assert.equal(ping.status, 200);
    assert.equal(await ping.json(), 'pong');
    const auth = { authorization: `Bearer ${platform.adminKey}` };
    const badLanguage = await post(`${platform.url}/v1/sandboxfusion/run_code`, { code: 'x', language: 'cobol' }, auth);
    assert.equal(badLanguage.status, 400);
    assert.equal((badLanguage.json as { error: { field: string } }).error.field, 'language');
    const badTimeout = await post(`${platform.url}/v1/sandboxfusion/run_code`, { code: 'x', language: 'python', run_timeout: -1 }, auth);
    assert.equal((badTimeout.json as { error: { field: string } }).error.field, 'run_timeout');
    const badFile = await post(`${platform.url}/v1/sandboxfusion/run_code`, { code: 'x', language: 'python', files: { '../x': b64('x') } }, auth);
    assert.equal(badFile.status, 400);
    const noKey = await post(`${platform.url}/v1/sandboxfusion/run_code`, verlRequest('print(1)', 'python'));
    assert.equal(noKey.status, 401);
    const doc = (await (await fetch(`${platform.url}/v1/openapi.json`)).json()) as { paths: Record<string, Record<string, unknown>> };
    for (const p of ['/v1/sandboxfusion/run_code', '/v1/sandboxfusion/t/{token}/run_code', '/v1/endpoint-tokens', '/v1/sandboxes/{id}/swerex/run_in_session'])
      assert.ok(doc.paths[p], `${p} in the OpenAPI document`);
  });
});

describe('endpoint tokens', () => {
  test('made by an admin, used without headers, kept out of the audit, listed, revoked', async () => {
    const auth = { authorization: `Bearer ${platform.adminKey}` };
    const made = await post(`${platform.url}/v1/endpoint-tokens`, { name: 'verl', protocol: 'sandboxfusion' }, auth);
    assert.equal(made.status, 201, JSON.stringify(made.json));
    const tok = made.json as { id: string; token: string; path: string };
    assert.match(tok.token, /^dsec_ept_/);
    assert.equal(tok.path, `/v1/sandboxfusion/t/${tok.token}`);
    // verl's client: a bare POST to the URL, no headers but the content type.
    const r = await post(`${platform.url}${tok.path}/run_code`, verlRequest('print(6 * 7)', 'python'));
    assert.equal(r.status, 200);
    assert.equal((r.json as RunCodeResponse).run_result?.stdout, '42\n');
    const ping = await fetch(`${platform.url}${tok.path}/v1/ping`);
    assert.equal(await ping.json(), 'pong');
    // The token works only under its prefix.
    assert.equal((await fetch(`${platform.url}/v1/sandboxes`, { headers: { authorization: `Bearer ${tok.token}` } })).status, 401);

    const list = await fetch(`${platform.url}/v1/endpoint-tokens`, { headers: auth });
    const items = ((await list.json()) as { items: Array<Record<string, unknown>> }).items;
    const listed = items.find((i) => i.id === tok.id);
    assert.ok(listed);
    assert.equal(listed.token, undefined);
    assert.equal(JSON.stringify(items).includes(tok.token), false);

    await new Promise((res) => setTimeout(res, 300));
    const audit = await (await fetch(`${platform.url}/v1/audit?limit=1000`, { headers: auth })).text();
    assert.ok(audit.includes('/v1/sandboxfusion/t/:token/run_code'), 'the audit names the route');
    assert.ok(audit.includes(tok.id), 'the audit names the token by its id');
    assert.equal(audit.includes(tok.token), false, 'never the token');
    const metrics = await (await fetch(`${platform.url}/metrics`)).text();
    assert.equal(metrics.includes(tok.token), false, 'metrics label requests by route pattern');

    const del = await fetch(`${platform.url}/v1/endpoint-tokens/${tok.id}`, { method: 'DELETE', headers: auth });
    assert.equal(del.status, 204);
    const revoked = await post(`${platform.url}${tok.path}/run_code`, verlRequest('print(1)', 'python'));
    assert.equal(revoked.status, 401);
    const unknown = await post(`${platform.url}/v1/sandboxfusion/t/dsec_ept_nope/run_code`, verlRequest('print(1)', 'python'));
    assert.equal(unknown.status, 401);
  });

  test('the CLI creates, lists and revokes them', async () => {
    const cli = async (...args: string[]): Promise<string> => {
      const { stdout } = await run(process.execPath, [path.join(REPO_ROOT, 'packages/cli/dist/main.js'), ...args], {
        env: { PATH: process.env.PATH ?? '/usr/bin:/bin', DSEC_API_URL: platform.url, DSEC_API_KEY: platform.adminKey },
      });
      return stdout;
    };
    const url = (await cli('endpoint-tokens', 'create', '--name', 'skyrl')).trim();
    assert.match(url, /^http:\/\/127\.0\.0\.1:\d+\/v1\/sandboxfusion\/t\/dsec_ept_[\w-]+\/run_code$/);
    const r = await post(url, verlRequest('print("cli")', 'python'));
    assert.equal((r.json as RunCodeResponse).run_result?.stdout, 'cli\n');
    const listed = JSON.parse(await cli('endpoint-tokens', 'ls', '--json')) as Array<{ id: string; name: string }>;
    const id = listed.find((t) => t.name === 'skyrl')?.id;
    assert.ok(id);
    await cli('endpoint-tokens', 'revoke', id);
    assert.equal((await post(url, verlRequest('print(1)', 'python'))).status, 401);
  });

  test('dsec call compiles c: the exit of the program, or the compile failure', async () => {
    const dsec = (...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> =>
      new Promise((resolve) => {
        execFile(
          process.execPath,
          [path.join(REPO_ROOT, 'packages/cli/dist/main.js'), ...args],
          { env: { PATH: process.env.PATH ?? '/usr/bin:/bin', DSEC_API_URL: platform.url, DSEC_API_KEY: platform.adminKey } },
          (err, stdout, stderr) => resolve({ code: err ? Number((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
        );
      });
    const ran = await dsec('call', '--runtime', 'c', '-c', '#include <stdio.h>\nint main(void){puts("compiled"); return 3;}');
    assert.deepEqual([ran.code, ran.stdout], [3, 'compiled\n'], ran.stderr);
    const broken = await dsec('call', '--runtime', 'c', '-c', 'int main(void){ return nope; }');
    assert.equal(broken.code, 1);
    assert.match(broken.stderr, /nope[\s\S]*dsec: compile failed/);
  });
});
