// The real `e2b` npm package (2.45.0 and 2.51.0, unmodified) against a real dsec: control plane,
// envd's REST and Connect-RPC data plane, signed URLs, error cases, the base template's 503.
import assert from 'node:assert/strict';
import { execFile, execFileSync } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { request as httpRequest } from 'node:http';
import { createServer as createNetServer, connect as netConnect } from 'node:net';
import type { AddressInfo } from 'node:net';
import { chmod, chown, copyFile, mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import * as E45 from 'e2b-v2-45';
import * as E51 from 'e2b-v2-51';
import { DsecClient } from '@dsec/sdk';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';

let platform: TestPlatform;
let e2bKey: string;
let viewerKey: string;
let scratch: string;
const TEMPLATE = `e2b-test-${process.pid}`;
/** The name under which the test's names live (its certificate is `*.e2b.test`). */
const NAME = 'e2b.test';
/**
 * The `e2b.domain` of the test platform, `e2b.test:<port of its HTTPS listener>`: host names are
 * sent as Host headers to its plain address, or resolved to loopback by the resolver shim.
 */
let DOMAIN = NAME;
/** The local CA's certificate (PEM file) that signed the HTTPS listener's `*.e2b.test`. */
let caFile: string;
let certFile: string;
let keyFile: string;

/** A local CA and a wildcard certificate `*.e2b.test` signed by it (openssl, in `dir`). */
function makeCertificates(dir: string): void {
  const ssl = (...args: string[]): void => void execFileSync('openssl', args, { cwd: dir, stdio: 'ignore' });
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  ssl(
    'req',
    '-x509',
    ...ec,
    '-keyout',
    'ca.key',
    '-out',
    'ca.pem',
    '-days',
    '2',
    '-subj',
    '/CN=dsec test CA',
    '-addext',
    'basicConstraints=critical,CA:TRUE',
    '-addext',
    'keyUsage=critical,keyCertSign',
  );
  ssl('req', ...ec, '-keyout', 'leaf.key', '-out', 'leaf.csr', '-subj', `/CN=*.${NAME}`);
  execFileSync('sh', ['-c', `printf 'subjectAltName=DNS:*.${NAME},DNS:${NAME}\n' > leaf.ext`], { cwd: dir });
  ssl('x509', '-req', '-in', 'leaf.csr', '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial', '-days', '2', '-extfile', 'leaf.ext', '-out', 'leaf.pem');
  caFile = path.join(dir, 'ca.pem');
  certFile = path.join(dir, 'leaf.pem');
  keyFile = path.join(dir, 'leaf.key');
}

/** A loopback port free now (the HTTPS listener takes it next; the domain must name it). */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createNetServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

/** A small image for E2B: busybox, the host's bash (with its libraries), a `user` account. */
async function imageDir(dir: string): Promise<void> {
  for (const d of ['bin', 'etc', 'home/user', 'tmp', 'root', 'lib64', 'lib/x86_64-linux-gnu']) await mkdir(path.join(dir, d), { recursive: true });
  await copyFile('/bin/busybox', path.join(dir, 'bin/busybox'));
  for (const applet of execFileSync('/bin/busybox', ['--list'], { encoding: 'utf8' })
    .split('\n')
    .filter((a) => a && a !== 'busybox' && a !== 'bash'))
    await symlink('busybox', path.join(dir, 'bin', applet));
  await copyFile('/bin/bash', path.join(dir, 'bin/bash'));
  for (const line of execFileSync('ldd', ['/bin/bash'], { encoding: 'utf8' }).split('\n')) {
    const m = /(\/\S+)\s+\(0x/.exec(line);
    if (m) {
      await mkdir(path.join(dir, path.dirname(m[1]!)), { recursive: true });
      await copyFile(m[1]!, path.join(dir, m[1]!));
    }
  }
  await writeFile(path.join(dir, 'etc/passwd'), 'root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n');
  await writeFile(path.join(dir, 'etc/group'), 'root:x:0:\nuser:x:1000:\n');
  await chmod(path.join(dir, 'tmp'), 0o1777);
  await chown(path.join(dir, 'home/user'), 1000, 1000);
}

before(async () => {
  scratch = await mkdtemp(path.join(os.tmpdir(), 'dsec-e2b-'));
  // `base` takes its Debian part from the small local image: no test reaches the Debian archive.
  makeCertificates(scratch);
  const tlsPort = await freePort();
  DOMAIN = `${NAME}:${tlsPort}`;
  platform = await startTestPlatform({ e2b: { baseFrom: TEMPLATE, domain: DOMAIN, tls: { certFile, keyFile, addr: `127.0.0.1:${tlsPort}` } } });
  const client = new DsecClient({ apiUrl: platform.url, apiKey: platform.adminKey });
  const key = await client.keys.create({ name: 'e2b', role: 'admin', format: 'e2b' });
  e2bKey = key.key;
  viewerKey = (await client.keys.create({ name: 'e2b-viewer', role: 'viewer', format: 'e2b' })).key;
  const dir = path.join(scratch, 'image');
  await imageDir(dir);
  await client.layers.uploadDir(dir, { kind: 'base', name: TEMPLATE });
});

after(async () => {
  await platform?.close();
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

test('POST /v1/keys with format e2b issues e2b_<hex> keys that are ordinary dsec keys', async () => {
  assert.match(e2bKey, /^e2b_[0-9a-f]{40}$/);
  const r = await fetch(`${platform.url}/v1/sandboxes`, { headers: { authorization: `Bearer ${e2bKey}` } });
  assert.equal(r.status, 200);
  const bad = await fetch(`${platform.url}/v2/sandboxes`, { headers: { 'x-api-key': 'e2b_00' } });
  assert.equal(bad.status, 401);
  assert.equal(((await bad.json()) as { code: number }).code, 401);
});

// Both versions have the same surface for what is tested here; one type serves both.
const VERSIONS: Array<[string, typeof E51]> = [
  ['2.45.0', E45 as unknown as typeof E51],
  ['2.51.0', E51],
];
for (const [version, E2B] of VERSIONS) {
  describe(`e2b ${version}`, () => {
    const opts = () => ({ apiKey: e2bKey, apiUrl: platform.url, sandboxUrl: platform.url, requestTimeoutMs: 30_000 });
    let sbx: InstanceType<typeof E2B.Sandbox>;
    const tag = `v${version.replace(/\./g, '')}`;

    before(async () => {
      sbx = await E2B.Sandbox.create(TEMPLATE, { ...opts(), timeoutMs: 120_000, metadata: { suite: tag }, envs: { GREETING: 'hi' } });
    });
    after(async () => {
      await sbx?.kill().catch(() => undefined);
    });

    test('commands: run, env, cwd, user, exit codes, background, stdin, kill, list', async () => {
      const r = await sbx.commands.run('echo $GREETING $FOO; pwd; id -u', { envs: { FOO: 'bar' } });
      assert.equal(r.exitCode, 0);
      assert.equal(r.stdout, 'hi bar\n/home/user\n1000\n');
      assert.equal((await sbx.commands.run('id -u', { user: 'root', cwd: '/tmp' })).stdout, '0\n');
      await assert.rejects(sbx.commands.run('echo oops >&2; exit 3'), (err: unknown) => {
        const e = err as { exitCode: number; stderr: string };
        return e.exitCode === 3 && e.stderr === 'oops\n';
      });
      const bg = await sbx.commands.run('cat', { background: true, stdin: true });
      await sbx.commands.sendStdin(bg.pid, 'piped\n');
      const listed = await sbx.commands.list();
      assert.ok(listed.some((p) => p.pid === bg.pid));
      await (sbx.commands as unknown as { closeStdin(pid: number): Promise<void> }).closeStdin(bg.pid);
      const done = await bg.wait().catch((e: unknown) => e as { stdout: string });
      assert.equal(done.stdout, 'piped\n');
      const sleeper = await sbx.commands.run('sleep 30', { background: true });
      assert.equal(await sbx.commands.kill(sleeper.pid), true);
      await assert.rejects(sleeper.wait());
      await assert.rejects(sbx.commands.run('sleep 10', { timeoutMs: 1000 }));
    });

    test('commands: connect to a running process; pty with resize', async () => {
      const h = await sbx.commands.run('for i in 1 2 3 4 5 6; do echo tick $i; sleep 0.3; done', { background: true });
      await h.disconnect();
      let seen = '';
      const again = await sbx.commands.connect(h.pid, { onStdout: (d) => void (seen += d) });
      const r = await again.wait();
      assert.equal(r.exitCode, 0);
      assert.match(seen + r.stdout, /tick 6/);
      let out = '';
      const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => void (out += Buffer.from(d).toString()) });
      await sbx.pty.resize(pty.pid, { cols: 100, rows: 30 });
      await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('stty size; exit\n'));
      await pty.wait().catch(() => undefined);
      assert.match(out, /30 100/);
    });

    test('files: write, read, list with depth, stat, mkdir, move, remove, exists, gzip', async () => {
      const info = await sbx.files.write('dir/a.txt', 'hello');
      assert.equal(info.path, '/home/user/dir/a.txt');
      assert.equal(await sbx.files.read('/home/user/dir/a.txt'), 'hello');
      await sbx.files.write([
        { path: '/tmp/m/one', data: 'one' },
        { path: '/tmp/m/two', data: new Blob(['two']) },
      ]);
      assert.equal(await sbx.files.read('/tmp/m/two'), 'two');
      assert.equal((await sbx.commands.run('stat -c %U /home/user/dir/a.txt')).stdout, 'user\n');
      assert.equal(await sbx.files.makeDir('dir/sub/deep'), true);
      assert.equal(await sbx.files.makeDir('dir/sub/deep'), false);
      const flat = await sbx.files.list('dir');
      assert.deepEqual(
        flat.map((e) => e.name),
        ['a.txt', 'sub'],
      );
      const deep = await sbx.files.list('dir', { depth: 3 });
      assert.deepEqual(
        deep.map((e) => e.path),
        ['/home/user/dir/a.txt', '/home/user/dir/sub', '/home/user/dir/sub/deep'],
      );
      const st = await sbx.files.getInfo('dir/a.txt');
      assert.equal(st.type, 'file');
      assert.equal(st.size, 5);
      assert.equal(st.owner, 'user');
      const moved = await sbx.files.rename('dir/a.txt', 'dir/b.txt');
      assert.equal(moved.path, '/home/user/dir/b.txt');
      assert.equal(await sbx.files.exists('dir/a.txt'), false);
      await sbx.files.remove('dir');
      await sbx.files.remove('dir');
      assert.equal(await sbx.files.exists('dir'), false);
      await assert.rejects(sbx.files.read('/nope'), E2B.FileNotFoundError);
      const big = 'x'.repeat(100_000);
      await sbx.files.write('/tmp/big', big);
      assert.equal(await sbx.files.read('/tmp/big', { gzip: true } as never), big);
    });

    test('files: metadata kept as xattrs of the file (write, getInfo, list, rename); an upload without it clears it; bad metadata is 400', async () => {
      const meta = { Owner: 'ada', 'run.id': 'r 1' };
      const w = await sbx.files.write('/tmp/meta.txt', 'm', { metadata: meta } as never);
      const want = { owner: 'ada', 'run.id': 'r 1' };
      assert.deepEqual((w as { metadata?: unknown }).metadata, want);
      assert.deepEqual((await sbx.files.getInfo('/tmp/meta.txt')).metadata, want);
      const listed = await sbx.files.list('/tmp');
      assert.deepEqual(listed.find((e) => e.name === 'meta.txt')?.metadata, want);
      assert.equal(listed.find((e) => e.name === 'big')?.metadata, undefined);
      // Kept on the file itself: a rename carries it.
      assert.deepEqual((await sbx.files.rename('/tmp/meta.txt', '/tmp/meta2.txt')).metadata, want);
      const again = await sbx.files.write('/tmp/meta2.txt', 'n');
      assert.equal((again as { metadata?: unknown }).metadata, undefined);
      assert.equal((await sbx.files.getInfo('/tmp/meta2.txt')).metadata, undefined);
      const token = (
        (await (await fetch(`${platform.url}/sandboxes/${sbx.sandboxId}`, { headers: { 'x-api-key': e2bKey } })).json()) as { envdAccessToken: string }
      ).envdAccessToken;
      const bad = await fetch(`${platform.url}/files?path=/tmp/bad`, {
        method: 'POST',
        headers: { 'e2b-sandbox-id': sbx.sandboxId, 'x-access-token': token, 'content-type': 'application/octet-stream', 'x-metadata-big': 'x'.repeat(5000) },
        body: 'b',
      });
      const body = (await bad.json()) as { code: number; message: string };
      assert.equal(bad.status, 400);
      assert.equal(body.code, 400);
      assert.match(body.message, /X-Metadata/);
    });

    test('files: watch a directory (recursive, entries)', async () => {
      await sbx.files.makeDir('/tmp/w');
      const events: Array<{ name: string; type: string }> = [];
      const handle = await sbx.files.watchDir('/tmp/w', (e) => void events.push({ name: e.name, type: e.type }), { recursive: true });
      await sbx.files.write('/tmp/w/new.txt', 'x');
      const deadline = Date.now() + 15_000;
      while (!events.some((e) => e.name === 'new.txt' && e.type === 'write') && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
      await handle.stop();
      assert.ok(
        events.some((e) => e.name === 'new.txt' && e.type === 'create'),
        JSON.stringify(events),
      );
      assert.ok(
        events.some((e) => e.name === 'new.txt' && e.type === 'write'),
        JSON.stringify(events),
      );
    });

    test('signed URLs: upload and download without headers; expired and wrong signatures are 401', async () => {
      const up = await sbx.uploadUrl('/tmp/signed.txt', { useSignatureExpiration: 60 });
      const put = await fetch(up, { method: 'POST', body: (() => { const f = new FormData(); f.append('file', new Blob(['signed!']), 'signed.txt'); return f; })() }); // prettier-ignore
      assert.equal(put.status, 200);
      const down = await sbx.downloadUrl('/tmp/signed.txt', { useSignatureExpiration: 60 });
      assert.equal(await (await fetch(down)).text(), 'signed!');
      const expired = await sbx.downloadUrl('/tmp/signed.txt', { useSignatureExpiration: -10 });
      assert.equal((await fetch(expired)).status, 401);
      const wrong = new URL(down);
      wrong.searchParams.set('signature', 'v1_AAAA');
      assert.equal((await fetch(wrong)).status, 401);
    });

    test('control plane: list with metadata and state, info, timeout, metrics', async () => {
      const page = E2B.Sandbox.list({ ...opts(), query: { metadata: { suite: tag }, state: ['running'] } });
      const items = await page.nextItems();
      assert.deepEqual(
        items.map((s) => s.sandboxId),
        [sbx.sandboxId],
      );
      assert.deepEqual(items[0]!.metadata, { suite: tag });
      // Paging: limit 1 over two matching sandboxes gives two pages (X-Next-Token), newest first.
      const other = await E2B.Sandbox.create(TEMPLATE, { ...opts(), timeoutMs: 60_000, metadata: { suite: tag } });
      try {
        const pages = E2B.Sandbox.list({ ...opts(), limit: 1, query: { metadata: { suite: tag } } });
        const first = await pages.nextItems();
        assert.equal(pages.hasNext, true);
        const second = await pages.nextItems();
        assert.equal(pages.hasNext, false);
        assert.deepEqual(
          [...first, ...second].map((s) => s.sandboxId),
          [other.sandboxId, sbx.sandboxId],
        );
      } finally {
        await other.kill();
      }
      const info = await sbx.getInfo();
      assert.equal(info.templateId, TEMPLATE);
      await sbx.setTimeout(300_000);
      const later = await sbx.getInfo();
      assert.ok(later.endAt.getTime() > Date.now() + 200_000);
      const m = await sbx.getMetrics();
      assert.ok(m.length >= 1 && m[0]!.memTotal > 0);
      assert.equal(await sbx.isRunning(), true);
    });

    test('the envd token: hidden from labels and from viewer keys; data-plane calls audited without it', async () => {
      const admin = (await (await fetch(`${platform.url}/sandboxes/${sbx.sandboxId}`, { headers: { 'x-api-key': e2bKey } })).json()) as {
        envdAccessToken: string;
      };
      const token = admin.envdAccessToken;
      assert.match(token, /^[0-9a-f]{48}$/);
      const one = (await (await fetch(`${platform.url}/v1/sandboxes/${sbx.sandboxId}`, { headers: { authorization: `Bearer ${viewerKey}` } })).json()) as {
        labels: Record<string, string>;
      };
      assert.equal(one.labels['e2b.token'], undefined);
      const list = await (await fetch(`${platform.url}/v1/sandboxes`, { headers: { authorization: `Bearer ${viewerKey}` } })).text();
      assert.ok(!list.includes(token));
      const asViewer = (await (await fetch(`${platform.url}/sandboxes/${sbx.sandboxId}`, { headers: { 'x-api-key': viewerKey } })).json()) as {
        envdAccessToken: string | null;
      };
      assert.equal(asViewer.envdAccessToken, null);
      // The viewer's own data-plane calls (no token) are refused.
      const r = await fetch(`${platform.url}/process.Process/Start`, {
        method: 'POST',
        headers: { 'e2b-sandbox-id': sbx.sandboxId, 'x-api-key': viewerKey, authorization: `Bearer ${viewerKey}`, 'content-type': 'application/json' },
        body: JSON.stringify({ process: { cmd: 'true' } }),
      });
      assert.equal(r.status, 401);
      // The SDK's calls are audited as the sandbox's, with the command, never the token.
      await sbx.commands.run('echo audited');
      const deadline = Date.now() + 15_000;
      let entries: Array<{ key: string | null; route: string; command: string | null }> = [];
      while (Date.now() < deadline) {
        const page = await fetch(`${platform.url}/v1/audit?limit=500`, { headers: { authorization: `Bearer ${platform.adminKey}` } });
        const text = await page.text();
        assert.ok(!text.includes(token));
        entries = (JSON.parse(text) as { items: typeof entries }).items;
        if (entries.some((e) => e.route === '/process.Process/:method' && e.key === `e2b-envd:${sbx.sandboxId}` && /echo audited/.test(e.command ?? ''))) break;
        await new Promise((res) => setTimeout(res, 250));
      }
      assert.ok(
        entries.some((e) => e.route === '/process.Process/:method' && /echo audited/.test(e.command ?? '')),
        JSON.stringify(entries.slice(0, 5)),
      );
    });

    test('pause: the data plane answers 502 while paused; connect resumes with processes alive', async () => {
      const bg = await sbx.commands.run('sleep 600', { background: true });
      assert.equal(await sbx.pause(), true);
      assert.equal(await sbx.pause(), false);
      assert.equal(await sbx.isRunning(), false);
      await assert.rejects(sbx.commands.run('true'));
      const back = await E2B.Sandbox.connect(sbx.sandboxId, opts());
      assert.equal((await back.commands.run(`kill -0 ${bg.pid} && echo alive`)).stdout, 'alive\n');
      await back.commands.kill(bg.pid);
    });

    test('snapshots are templates; fork with count gives independent copies', async () => {
      await sbx.files.write('/tmp/snap.txt', 'from the snapshot');
      const snap = await sbx.createSnapshot();
      const child = await E2B.Sandbox.create(snap.snapshotId, { ...opts(), timeoutMs: 60_000 });
      try {
        assert.equal(await child.files.read('/tmp/snap.txt'), 'from the snapshot');
      } finally {
        await child.kill();
      }
      const forks = await sbx.fork({ count: 2, timeoutMs: 60_000 });
      try {
        assert.equal(forks.length, 2);
        const [a, b] = forks;
        assert.ok(a instanceof E2B.Sandbox && b instanceof E2B.Sandbox, forks.map((f) => (f instanceof Error ? f.message : f.sandboxId)).join(', '));
        assert.notEqual(a.sandboxId, b.sandboxId);
        assert.equal(await a.files.read('/tmp/snap.txt'), 'from the snapshot');
        await a.files.write('/tmp/snap.txt', 'changed in a');
        assert.equal(await b.files.read('/tmp/snap.txt'), 'from the snapshot');
        assert.equal(await sbx.files.read('/tmp/snap.txt'), 'from the snapshot');
        assert.equal(await sbx.isRunning(), true);
      } finally {
        for (const f of forks) if (f instanceof E2B.Sandbox) await f.kill().catch(() => undefined);
      }
    });

    test('errors: unknown sandbox, wrong token, bad template, killed sandbox cuts streams', async () => {
      await assert.rejects(E2B.Sandbox.connect('nope-0000', opts()), E2B.SandboxNotFoundError);
      assert.equal(await E2B.Sandbox.kill('nope-0000', opts()), false);
      await assert.rejects(E2B.Sandbox.create('no-such-template', opts()), (err: unknown) => err instanceof Error && /not found/.test(err.message));
      const r = await fetch(`${platform.url}/health`, { headers: { 'e2b-sandbox-id': sbx.sandboxId, 'x-access-token': 'wrong' } });
      assert.equal(r.status, 401);
      const gone = await fetch(`${platform.url}/health`, { headers: { 'e2b-sandbox-id': 'nope-0000' } });
      assert.equal(gone.status, 502);
      assert.equal(((await gone.json()) as { code: number }).code, 502);
      const victim = await E2B.Sandbox.create(TEMPLATE, { ...opts(), timeoutMs: 60_000 });
      const h = await victim.commands.run('sleep 600', { background: true });
      await victim.kill();
      await assert.rejects(h.wait());
      assert.equal(await victim.isRunning(), false);
    });
  });
}

test('base: 503 with Retry-After at once while it builds, then a sandbox with user `user`', async () => {
  const create = () =>
    fetch(`${platform.url}/v2/sandboxes`, {
      method: 'POST',
      headers: { 'x-api-key': e2bKey, 'content-type': 'application/json' },
      body: JSON.stringify({ templateID: 'base', timeout: 60 }),
    });
  const start = Date.now();
  const r = await create();
  const body = (await r.json()) as { code: number; message: string };
  assert.equal(r.status, 503, body.message);
  assert.equal(body.code, 503);
  assert.ok(Number(r.headers.get('retry-after')) > 0);
  assert.ok(Date.now() - start < 10_000);
  const deadline = Date.now() + 20_000;
  let sbx: InstanceType<typeof E51.Sandbox> | undefined;
  let last = '';
  while (!sbx && Date.now() < deadline) {
    sbx = await E51.Sandbox.create('base', { apiKey: e2bKey, apiUrl: platform.url, sandboxUrl: platform.url, timeoutMs: 60_000 }).catch((err: unknown) => {
      last = String(err);
      if (!/not ready/.test(last) || /failed/.test(last)) throw err;
      return undefined;
    });
    if (!sbx) await new Promise((res) => setTimeout(res, 500));
  }
  assert.ok(sbx, `base became ready (${last})`);
  try {
    const r2 = await sbx.commands.run('whoami; echo $HOME; stat -c %U /home/user; grep -c NOPASSWD /etc/sudoers.d/user', { user: 'root' });
    assert.equal(r2.stdout, 'root\n/root\nuser\n1\n');
    assert.equal((await sbx.commands.run('id -un; pwd')).stdout, 'user\n/home/user\n');
  } finally {
    await sbx.kill();
  }
});

/** An HTTP request to the platform's address with `host` as the Host header (the resolver shim: every name is the platform). */
function viaHost(host: string, pathname: string, headers: Record<string, string> = {}): Promise<{ status: number; body: string }> {
  const url = new URL(platform.url);
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: url.hostname, port: url.port, path: pathname, headers: { ...headers, host } }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.setTimeout(30_000, () => req.destroy(new Error('no answer within 30 s')));
    req.on('error', reject);
    req.end();
  });
}

describe('host names, network updates, auto-pause (e2b 2.51.0)', () => {
  const opts = () => ({ apiKey: e2bKey, apiUrl: platform.url, sandboxUrl: platform.url, requestTimeoutMs: 30_000 });

  test('getHost(port): HTTP and upgrades reach the port; closed to the public without the traffic token; envd by host name', async () => {
    const sbx = await E51.Sandbox.create(TEMPLATE, {
      ...opts(),
      timeoutMs: 120_000,
      network: { allowPublicTraffic: false, maskRequestHost: 'inside.test:${PORT}' },
    });
    try {
      assert.equal((await sbx.getInfo()).network?.maskRequestHost, 'inside.test:${PORT}');
      await sbx.commands.run('mkdir -p /tmp/www/cgi-bin && echo served from the sandbox > /tmp/www/index.html');
      await sbx.files.write('/tmp/www/cgi-bin/host', '#!/bin/sh\nprintf "Content-Type: text/plain\\r\\n\\r\\n%s\\n" "$HTTP_HOST"\n');
      await sbx.commands.run('chmod 755 /tmp/www/cgi-bin/host');
      await sbx.commands.run('busybox httpd -f -p 127.0.0.1:3000 -h /tmp/www', { background: true });
      const host = sbx.getHost(3000);
      assert.equal(host, `3000-${sbx.sandboxId}.${DOMAIN}`);
      const token = (sbx as unknown as { trafficAccessToken: string }).trafficAccessToken;
      assert.match(token, /^[0-9a-f]{48}$/);
      assert.equal((await viaHost(host, '/index.html')).status, 403);
      // The servers start in the background: wait until the port answers.
      let ok = await viaHost(host, '/index.html', { 'e2b-traffic-access-token': token });
      for (const until = Date.now() + 15_000; ok.status === 502 && Date.now() < until; await new Promise((r) => setTimeout(r, 200)))
        ok = await viaHost(host, '/index.html', { 'e2b-traffic-access-token': token });
      assert.equal(ok.status, 200);
      assert.equal(ok.body, 'served from the sandbox\n');
      // maskRequestHost: the port's server sees the mask (its ${PORT} replaced), not the host name.
      const masked = await viaHost(host, '/cgi-bin/host', { 'e2b-traffic-access-token': token });
      assert.equal(masked.body, 'inside.test:3000\n');
      assert.equal((await viaHost(`3999-${sbx.sandboxId}.${DOMAIN}`, '/', { 'e2b-traffic-access-token': token })).status, 502);
      assert.equal((await viaHost(`3000-nope-0000.${DOMAIN}`, '/')).status, 502);
      // An upgrade (as a WebSocket handshake is): the raw connection is carried both ways; the
      // server (busybox httpd, which ignores Upgrade) answers on it.
      const upgrade = (to: string, until: RegExp): Promise<string> =>
        new Promise<string>((resolve, reject) => {
          const u = new URL(platform.url);
          const sock = netConnect(Number(u.port), u.hostname, () =>
            sock.write(`GET /index.html HTTP/1.1\r\nHost: ${to}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\ne2b-traffic-access-token: ${token}\r\n\r\n`),
          );
          let got = '';
          sock.setEncoding('utf8');
          sock.on('data', (d: string) => {
            got += d;
            if (until.test(got)) {
              sock.destroy();
              resolve(got);
            }
          });
          sock.on('close', () => resolve(got));
          sock.on('error', reject);
          setTimeout(() => reject(new Error(`no answer within 30 s: ${got}`)), 30_000).unref();
        });
      assert.match(await upgrade(host, /served from the sandbox/), /^HTTP\/1\.[01] 200 /);
      // An upgrade to a port nothing listens on is answered 502, as a plain request is.
      assert.match(await upgrade(`3999-${sbx.sandboxId}.${DOMAIN}`, /\r\n\r\n\{.*\}/s), /^HTTP\/1\.1 502 /);
      // envd's own port by host name: the data plane without the E2b-Sandbox-Id header.
      const envd = await viaHost(sbx.getHost(49983), '/health', { 'x-access-token': (sbx as unknown as { envdAccessToken: string }).envdAccessToken });
      assert.equal(envd.status, 204);
    } finally {
      await sbx.kill();
    }
  });

  test('TLS: the SDK with only E2B_API_URL=https://api.<domain> (envd and getHost by host name, the operator certificate, a local CA)', async () => {
    // The resolver shim: every name under e2b.test is the platform's loopback address; the local
    // CA is trusted as an operator's users would trust theirs (NODE_EXTRA_CA_CERTS).
    const shim = path.join(scratch, 'resolver-shim.mjs');
    await writeFile(
      shim,
      `import dns from 'node:dns';
const lookup = dns.lookup;
dns.lookup = function (host, opts, cb) {
  if (typeof opts === 'function') { cb = opts; opts = {}; }
  if (host === ${JSON.stringify(NAME)} || host.endsWith(${JSON.stringify(`.${NAME}`)})) {
    return typeof opts === 'object' && opts.all ? cb(null, [{ address: '127.0.0.1', family: 4 }]) : cb(null, '127.0.0.1', 4);
  }
  return lookup.call(dns, host, opts, cb);
};
`,
    );
    const script = `import { Sandbox } from 'e2b-v2-51';
const sbx = await Sandbox.create(${JSON.stringify(TEMPLATE)}, { timeoutMs: 60_000 });
try {
  const r = await sbx.commands.run('echo over tls; id -un');
  await sbx.files.write('/tmp/t.txt', 'a file over tls');
  const read = await sbx.files.read('/tmp/t.txt');
  await sbx.commands.run('mkdir -p /tmp/www && echo a port over tls > /tmp/www/index.html');
  await sbx.commands.run('busybox httpd -f -p 127.0.0.1:3000 -h /tmp/www', { background: true });
  let port = '';
  for (const until = Date.now() + 15_000; !port && Date.now() < until; await new Promise((r) => setTimeout(r, 200))) {
    const res = await fetch('https://' + sbx.getHost(3000) + '/index.html').catch(() => undefined);
    if (res?.status === 200) port = await res.text();
  }
  console.log(JSON.stringify({ stdout: r.stdout, read, port, host: sbx.getHost(3000).replace(sbx.sandboxId, 'ID') }));
} finally {
  await sbx.kill();
}
`;
    const env = { PATH: '/usr/bin:/bin', NODE_EXTRA_CA_CERTS: caFile, E2B_API_KEY: e2bKey, E2B_API_URL: `https://api.${DOMAIN}` };
    const out = await new Promise<string>((resolve, reject) =>
      execFile(
        process.execPath,
        ['--import', shim, '--input-type=module', '-e', script],
        { env, cwd: path.join(import.meta.dirname, '..', '..'), timeout: 60_000 },
        (err, stdout, stderr) => (err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(stdout)),
      ),
    );
    assert.deepEqual(JSON.parse(out.trim().split('\n').pop()!), {
      stdout: 'over tls\nuser\n',
      read: 'a file over tls',
      port: 'a port over tls\n',
      host: `3000-ID.${DOMAIN}`,
    });
    // A client that does not trust the CA is refused at the handshake.
    await assert.rejects(fetch(`${platform.platform.e2bTlsUrl!}/health`), (err: unknown) =>
      /certificate|self.signed|unable to verify/i.test(String((err as Error).cause ?? err)),
    );
  });

  test('PUT /sandboxes/{id}/network replaces the egress rules, validated as at create', async () => {
    const sbx = await E51.Sandbox.create(TEMPLATE, { ...opts(), timeoutMs: 60_000 });
    try {
      assert.deepEqual((await sbx.getInfo()).network?.allowOut, []);
      await sbx.updateNetwork({ allowOut: ['example.com'], denyOut: ['bad.example.com'] });
      const info = await sbx.getInfo();
      assert.deepEqual(info.network?.allowOut, ['example.com']);
      assert.equal(info.allowInternetAccess, true);
      await assert.rejects(sbx.updateNetwork({ allowOut: ['0.0.0.0/0'] }), /allowOut/);
      await sbx.updateNetwork({});
      assert.deepEqual((await sbx.getInfo()).network?.allowOut, []);
      await assert.rejects(E51.Sandbox.updateNetwork('nope-0000', {}, opts()), E51.SandboxNotFoundError);
    } finally {
      await sbx.kill();
    }
  });

  test('autoPause: the timeout pauses; list shows it paused; connect resumes with its files and processes', async () => {
    const sbx = await E51.Sandbox.create(TEMPLATE, { ...opts(), timeoutMs: 2000, lifecycle: { onTimeout: 'pause' } });
    try {
      assert.equal((await sbx.getInfo()).lifecycle?.onTimeout, 'pause');
      await sbx.files.write('/tmp/kept.txt', 'kept');
      const bg = await sbx.commands.run('sleep 600', { background: true });
      const deadline = Date.now() + 30_000;
      while ((await sbx.getInfo()).state !== 'paused' && Date.now() < deadline) await new Promise((r) => setTimeout(r, 250));
      assert.equal((await sbx.getInfo()).state, 'paused');
      const listed = await E51.Sandbox.list({ ...opts(), query: { state: ['paused'] } }).nextItems();
      assert.ok(listed.some((s) => s.sandboxId === sbx.sandboxId));
      const back = await E51.Sandbox.connect(sbx.sandboxId, { ...opts(), timeoutMs: 60_000 });
      assert.equal(await back.files.read('/tmp/kept.txt'), 'kept');
      assert.equal((await back.commands.run(`kill -0 ${bg.pid} && echo alive`)).stdout, 'alive\n');
      // Still running a pass later: the resume gave it a new lifetime.
      await new Promise((r) => setTimeout(r, 2500));
      assert.equal((await back.getInfo()).state, 'running');
    } finally {
      await sbx.kill();
    }
  });

  test('autoResume: data-plane traffic resumes a paused sandbox; allowOut at create; the watcher RPCs of the Python SDK', async () => {
    const sbx = await E51.Sandbox.create(TEMPLATE, {
      ...opts(),
      timeoutMs: 60_000,
      lifecycle: { onTimeout: 'pause', autoResume: true },
      network: { allowOut: ['pypi.org'] },
    });
    try {
      const info = await sbx.getInfo();
      assert.deepEqual(info.network?.allowOut, ['pypi.org']);
      assert.equal(info.allowInternetAccess, true);
      const bg = await sbx.commands.run('sleep 600', { background: true });
      assert.equal(await sbx.pause(), true);
      assert.equal((await sbx.getInfo()).state, 'paused');
      // A command through the data plane resumes it, processes kept.
      assert.equal((await sbx.commands.run(`kill -0 ${bg.pid} && echo resumed`)).stdout, 'resumed\n');
      assert.equal((await sbx.getInfo()).state, 'running');
      // CreateWatcher / GetWatcherEvents / RemoveWatcher, as the Python SDK calls them (JSON Connect).
      const token = (sbx as unknown as { envdAccessToken: string }).envdAccessToken;
      const rpc = async (method: string, body: object): Promise<Record<string, unknown>> => {
        const r = await fetch(`${platform.url}/filesystem.Filesystem/${method}`, {
          method: 'POST',
          headers: { 'e2b-sandbox-id': sbx.sandboxId, 'x-access-token': token, 'content-type': 'application/json', 'connect-protocol-version': '1' },
          body: JSON.stringify(body),
        });
        const json = (await r.json()) as Record<string, unknown>;
        assert.equal(r.status, 200, JSON.stringify(json));
        return json;
      };
      await sbx.files.makeDir('/tmp/pw');
      const { watcherId } = (await rpc('CreateWatcher', { path: '/tmp/pw', recursive: true })) as { watcherId: string };
      await sbx.files.write('/tmp/pw/x.txt', 'x', { metadata: { k: 'v' } } as never);
      const { events } = (await rpc('GetWatcherEvents', { watcherId, includeEntry: true })) as {
        events: Array<{ name: string; type: string; entry?: { metadata?: Record<string, string> } }>;
      };
      assert.ok(
        events.some((e) => e.name === 'x.txt' && e.type === 'EVENT_TYPE_CREATE'),
        JSON.stringify(events),
      );
      assert.deepEqual(events.find((e) => e.name === 'x.txt')?.entry?.metadata, { k: 'v' });
      await rpc('RemoveWatcher', { watcherId });
      const gone = await fetch(`${platform.url}/filesystem.Filesystem/GetWatcherEvents`, {
        method: 'POST',
        headers: { 'e2b-sandbox-id': sbx.sandboxId, 'x-access-token': token, 'content-type': 'application/json' },
        body: JSON.stringify({ watcherId }),
      });
      assert.equal(gone.status, 404);
    } finally {
      await sbx.kill();
    }
  });
});

test('the docs example runs as written with only E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL set', async () => {
  const doc = await readFile(path.join(import.meta.dirname, '..', '..', 'docs', 'e2b.md'), 'utf8');
  const code = /```ts\n([\s\S]*?)```/.exec(doc)?.[1];
  assert.ok(code, 'docs/e2b.md has a ts example');
  // The package is installed here under its versioned name; the image is the test's own.
  const script = `${code.replace("from 'e2b'", "from 'e2b-v2-51'").replace("'my-image'", JSON.stringify(TEMPLATE))}\nconsole.log(JSON.stringify({ stdout: r.stdout }));\n`;
  const env = { PATH: '/usr/bin:/bin', E2B_API_KEY: e2bKey, E2B_API_URL: platform.url, E2B_SANDBOX_URL: platform.url };
  const out = await new Promise<string>((resolve, reject) =>
    execFile(
      process.execPath,
      ['--input-type=module', '-e', script],
      { env, cwd: path.join(import.meta.dirname, '..', '..'), timeout: 60_000 },
      (err, stdout, stderr) => (err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(stdout)),
    ),
  );
  // The test image has bash and a `user` account, as `base` does.
  assert.deepEqual(JSON.parse(out.trim().split('\n').pop()!), { stdout: 'hello\nuser\n' });
});
