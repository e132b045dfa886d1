// End-to-end tests of warm pools against a real platform (apiserver + edge + crun sandboxes):
// configuration, quota, claims that are indistinguishable from fresh sandboxes, refill, idle
// shrink and removal.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readdir } from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { DsecClient, Sandbox } from '@dsec/sdk';
import type { PoolInfo, SandboxCreateOptions } from '@dsec/sdk';
import { REPO_ROOT } from './helpers/node.js';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';
import { isCode } from './helpers/assert.js';

let platform: TestPlatform;
let admin: DsecClient;
let projects = 0;

const POOL_SPEC = { image: { base: 'busybox' }, resources: { cpu: 0.1, memoryMiB: 32, diskMiB: 16 } } satisfies SandboxCreateOptions;

interface TestProject {
  id: string;
  client: DsecClient;
  key: string;
}

async function project(quota: { sandboxes?: number; cpu?: number; memoryMiB?: number }): Promise<TestProject> {
  const p = await admin.projects.create({ name: `pools-${projects++}`, quota });
  const k = await admin.keys.create({ name: `${p.name}-member`, role: 'member', project: p.id });
  return { id: p.id, key: k.key, client: new DsecClient({ apiUrl: platform.url, apiKey: k.key }) };
}

async function usage(p: TestProject): Promise<number> {
  return (await admin.projects.get(p.id)).usage.sandboxes;
}

async function nodeSandboxes(): Promise<string[]> {
  return readdir(path.join(platform.home, 'node', 'sandboxes')).catch(() => []);
}

async function eventually(what: string, check: () => Promise<boolean>, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function readyCount(p: TestProject, name: string, n: number): Promise<PoolInfo> {
  let pool: PoolInfo | undefined;
  await eventually(`pool ${name} to hold ${n} ready`, async () => (pool = await p.client.pools.get(name)).ready === n && pool.creating === 0);
  return pool!;
}

/** Waits for a project's usage to settle at `n` (destroys and refills finish in the background). */
async function usageIs(p: TestProject, n: number): Promise<void> {
  await eventually(`project usage ${n}`, async () => (await usage(p)) === n);
}

/** Removes a project's pools and sandboxes, and waits until nothing of it is left on the node. */
async function cleanup(p: TestProject): Promise<void> {
  for (const pool of await p.client.pools.list()) if (pool.project === p.id) await p.client.pools.delete(pool.name);
  for (const s of await Sandbox.list({}, { client: p.client }).toArray()) await Sandbox.kill(s.id, { client: p.client });
  // A member that was being created when its pool went is removed once it is ready.
  await usageIs(p, 0);
}

before(async () => {
  platform = await startTestPlatform();
  admin = new DsecClient({ apiUrl: platform.url, apiKey: platform.adminKey });
});

after(async () => {
  await platform?.close();
});

describe('pool configuration', () => {
  test('a pool larger than the quota is a 400 naming size; bad names and layers are refused', async () => {
    const p = await project({ sandboxes: 3, memoryMiB: 1024 });
    await assert.rejects(p.client.pools.put('big', { spec: POOL_SPEC, size: 4 }), isCode('INVALID_ARGUMENT', 'size'));
    // 3 x 512 MiB does not fit a 1 GiB memory quota either.
    await assert.rejects(
      p.client.pools.put('fat', { spec: { image: { base: 'busybox' }, resources: { memoryMiB: 512 } }, size: 3 }),
      isCode('INVALID_ARGUMENT', 'size'),
    );
    await assert.rejects(p.client.pools.put('ok', { spec: POOL_SPEC, size: 1001 }), isCode('INVALID_ARGUMENT', 'size'));
    await assert.rejects(p.client.pools.put('ok', { spec: { image: { base: 'no-such-layer' } }, size: 1 }), isCode('LAYER_NOT_FOUND', 'spec.image.base'));
    // env and labels belong to a claim, not to a pool.
    await assert.rejects(p.client.pools.put('ok', { spec: { ...POOL_SPEC, env: { A: '1' } } as never, size: 1 }), isCode('INVALID_ARGUMENT', 'spec'));
    const raw = await fetch(`${platform.url}/v1/pools/Bad_Name`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${p.key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ spec: POOL_SPEC, size: 1 }),
    });
    assert.equal(raw.status, 400);
    assert.equal(((await raw.json()) as { error: { field: string } }).error.field, 'name');
    await assert.rejects(p.client.pools.get('missing'), isCode('NOT_FOUND'));
    assert.deepEqual(await p.client.pools.list(), []);
    assert.equal(await usage(p), 0);
  });
});

describe('claims', () => {
  test('a pool fills; its sandboxes count against the quota but are invisible until claimed', async () => {
    const p = await project({ sandboxes: 4 });
    const before = new Set(await nodeSandboxes());
    const put = await p.client.pools.put('warm', { spec: POOL_SPEC, size: 2 });
    assert.equal(put.size, 2);
    await readyCount(p, 'warm', 2);
    assert.equal(await usage(p), 2);
    assert.deepEqual(await Sandbox.list({}, { client: p.client }).toArray(), []);
    const members = (await nodeSandboxes()).filter((id) => !before.has(id));
    assert.equal(members.length, 2);
    for (const id of members) {
      // Nobody can reach a pool's sandbox before it is claimed: not even to look.
      await assert.rejects(Sandbox.connect(id, { client: p.client }), isCode('SANDBOX_NOT_FOUND'));
      await assert.rejects(Sandbox.connect(id, { client: admin }), isCode('SANDBOX_NOT_FOUND'));
      const exec = await fetch(`${platform.url}/v1/sandboxes/${id}/exec`, {
        method: 'POST',
        headers: { authorization: `Bearer ${platform.adminKey}`, 'content-type': 'application/json' },
        body: JSON.stringify({ cmd: 'touch /tmp/x' }),
      });
      assert.equal(exec.status, 404);
    }
    // The pool's spec is the quota's first call: a fresh create of another spec finds 2 of 4 used.
    const other = await Sandbox.create({ ...POOL_SPEC, resources: { ...POOL_SPEC.resources, diskMiB: 17 } }, { client: p.client });
    assert.equal(await usage(p), 3);
    await other.kill();
    await cleanup(p);
    assert.equal(await usage(p), 0);
  });

  test('a claim is indistinguishable from a fresh sandbox: own id, env and labels applied, clean state', async () => {
    const p = await project({ sandboxes: 6 });
    await p.client.pools.put('clean', { spec: POOL_SPEC, size: 2 });
    await readyCount(p, 'clean', 2);
    const members = new Set(await nodeSandboxes());

    const fresh = await Sandbox.create(
      { ...POOL_SPEC, resources: { ...POOL_SPEC.resources, diskMiB: 17 }, env: { EPISODE: 'fresh' }, labels: { kind: 'fresh' }, timeoutMs: 120_000 },
      { client: p.client },
    );
    const t0 = Date.now();
    const a = await Sandbox.create(
      { ...POOL_SPEC, env: { EPISODE: 'a', SECRET: 's1' }, labels: { kind: 'claim', n: '1' }, timeoutMs: 120_000 },
      { client: p.client },
    );
    assert.ok(members.has(a.id), 'the create was answered by a pool sandbox');
    const info = a.lastInfo!;
    const freshInfo = fresh.lastInfo!;
    assert.deepEqual(Object.keys(info).sort(), Object.keys(freshInfo).sort());
    assert.equal(info.state, 'running');
    assert.deepEqual(info.labels, { kind: 'claim', n: '1' });
    assert.deepEqual(info.envKeys.sort(), ['EPISODE', 'SECRET']);
    assert.deepEqual(info.image, POOL_SPEC.image);
    assert.deepEqual(info.resources, { ...freshInfo.resources, diskMiB: 16 });
    assert.ok(Date.parse(info.createdAt) >= t0 - 1000, 'createdAt is the claim time');
    assert.equal(Date.parse(info.expiresAt) - Date.parse(info.createdAt), 120_000);
    assert.deepEqual(await a.processes(), [], 'nothing ever ran in it');
    assert.equal((await a.exec('echo $EPISODE $SECRET')).stdout, 'a s1\n');
    assert.deepEqual(
      (await Sandbox.list({ labels: { kind: 'claim' } }, { client: p.client }).toArray()).map((s) => s.id),
      [a.id],
    );
    await a.files.write('/tmp/left-by-a', 'a was here');

    const b = await Sandbox.create({ ...POOL_SPEC, env: { EPISODE: 'b' }, labels: { kind: 'claim', n: '2' } }, { client: p.client });
    assert.ok(members.has(b.id));
    assert.notEqual(b.id, a.id);
    assert.deepEqual(await b.processes(), []);
    // Another sandbox's files and env do not show through.
    assert.equal((await b.exec('ls /tmp; echo "[$SECRET]" $EPISODE')).stdout, '[] b\n');
    await assert.rejects(b.files.read('/tmp/left-by-a'), isCode('FILE_NOT_FOUND'));
    await readyCount(p, 'clean', 2);
    assert.equal(await usage(p), 1 + 2 + 2, 'fresh + two claimed + the pool refilled to 2');
    await a.kill();
    await b.kill();
    await fresh.kill();
    await cleanup(p);
  });

  test('the pool refills in the background after claims', async () => {
    const p = await project({ sandboxes: 6 });
    await p.client.pools.put('refill', { spec: POOL_SPEC, size: 2 });
    await readyCount(p, 'refill', 2);
    const members = new Set(await nodeSandboxes());
    const claimed = [await Sandbox.create(POOL_SPEC, { client: p.client }), await Sandbox.create(POOL_SPEC, { client: p.client })];
    for (const s of claimed) assert.ok(members.has(s.id));
    const pool = await readyCount(p, 'refill', 2);
    assert.equal(pool.lastError, null);
    // The refill made new sandboxes: a third claim gets one that was not there before.
    const third = await Sandbox.create(POOL_SPEC, { client: p.client });
    assert.ok(!members.has(third.id));
    assert.ok(!claimed.some((s) => s.id === third.id));
    await cleanup(p);
  });

  test('a create that differs in what the sandbox is (resources) does not claim', async () => {
    const p = await project({ sandboxes: 4 });
    await p.client.pools.put('exact', { spec: POOL_SPEC, size: 1 });
    await readyCount(p, 'exact', 1);
    const members = new Set(await nodeSandboxes());
    const other = await Sandbox.create({ ...POOL_SPEC, resources: { ...POOL_SPEC.resources, memoryMiB: 48 } }, { client: p.client });
    assert.ok(!members.has(other.id));
    assert.equal(other.lastInfo!.resources.memoryMiB, 48);
    assert.equal((await p.client.pools.get('exact')).ready, 1);
    // Another project's create with the same spec does not claim this project's pool either.
    const q = await project({ sandboxes: 2 });
    const stranger = await Sandbox.create(POOL_SPEC, { client: q.client });
    assert.ok(!members.has(stranger.id));
    assert.equal((await p.client.pools.get('exact')).ready, 1);
    await stranger.kill();
    await cleanup(p);
  });

  test('a batch claims from the pool first, then creates the rest', async () => {
    const p = await project({ sandboxes: 6 });
    await p.client.pools.put('batch', { spec: POOL_SPEC, size: 2 });
    await readyCount(p, 'batch', 2);
    const members = new Set(await nodeSandboxes());
    const result = await Sandbox.createBatch({ spec: { ...POOL_SPEC, labels: { b: '1' } }, count: 3 }, {}, { client: p.client });
    assert.equal(result.created, 3);
    assert.equal(result.sandboxes.filter((s) => members.has(s.id)).length, 2);
    for (const s of result.sandboxes) assert.equal(s.lastInfo!.labels.b, '1');
    await cleanup(p);
  });
});

describe('pool lifecycle', () => {
  test('deleting a pool destroys its ready sandboxes; claimed ones stay', async () => {
    const p = await project({ sandboxes: 4 });
    const before = (await nodeSandboxes()).length;
    await p.client.pools.put('gone', { spec: POOL_SPEC, size: 2 });
    await readyCount(p, 'gone', 2);
    const kept = await Sandbox.create(POOL_SPEC, { client: p.client });
    await readyCount(p, 'gone', 2);
    await p.client.pools.delete('gone');
    await assert.rejects(p.client.pools.get('gone'), isCode('NOT_FOUND'));
    await usageIs(p, 1);
    assert.equal((await nodeSandboxes()).length, before + 1);
    assert.equal((await kept.exec('echo still here')).stdout, 'still here\n');
    await kept.kill();
    assert.equal((await nodeSandboxes()).length, before);
  });

  test('an idle pool drops its ready sandboxes; a matching create wakes it up', async () => {
    const p = await project({ sandboxes: 4 });
    await p.client.pools.put('sleepy', { spec: POOL_SPEC, size: 2, idleTimeoutMs: 1000 });
    await readyCount(p, 'sleepy', 2);
    await eventually('the pool to go idle and shrink', async () => {
      const pool = await p.client.pools.get('sleepy');
      return pool.idle && pool.ready === 0;
    });
    await usageIs(p, 0);
    const sb = await Sandbox.create(POOL_SPEC, { client: p.client });
    assert.equal((await p.client.pools.get('sleepy')).idle, false);
    await readyCount(p, 'sleepy', 2);
    await sb.kill();
    await cleanup(p);
  });

  test('resizing keeps the pool; a new spec replaces its sandboxes', async () => {
    const p = await project({ sandboxes: 4 });
    await p.client.pools.put('resize', { spec: POOL_SPEC, size: 3 });
    await readyCount(p, 'resize', 3);
    const first = new Set(await nodeSandboxes());
    await p.client.pools.put('resize', { spec: POOL_SPEC, size: 1 });
    await readyCount(p, 'resize', 1);
    await usageIs(p, 1);
    const after1 = await nodeSandboxes();
    assert.ok(
      after1.every((id) => first.has(id)),
      'shrinking created nothing',
    );
    const bigger = { ...POOL_SPEC, resources: { ...POOL_SPEC.resources, memoryMiB: 40 } };
    const replaced = await p.client.pools.put('resize', { spec: bigger, size: 1 });
    assert.deepEqual(replaced.spec, bigger);
    await readyCount(p, 'resize', 1);
    const members = (await nodeSandboxes()).filter((id) => !first.has(id));
    assert.equal(members.length, 1, 'the old spec sandbox was replaced by one of the new spec');
    const claimed = await Sandbox.create(bigger, { client: p.client });
    assert.equal(claimed.id, members[0]);
    assert.equal(claimed.lastInfo!.resources.memoryMiB, 40);
    await cleanup(p);
  });
});

describe('cli', () => {
  /** Runs `dsec args...` as a real process with a project's key. */
  function dsec(p: TestProject, args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
    return new Promise((resolve) => {
      execFile(
        process.execPath,
        [path.join(REPO_ROOT, 'packages/cli/dist/main.js'), ...args],
        { env: { PATH: process.env.PATH ?? '', DSEC_API_URL: platform.url, DSEC_API_KEY: p.key }, timeout: 60_000 },
        (err, stdout, stderr) => resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
      );
    });
  }

  test('dsec pools put/ls/get/rm and dsec sandbox create --count', async () => {
    const p = await project({ sandboxes: 4 });
    const put = await dsec(p, ['pools', 'put', 'cli', '--base', 'busybox', '--cpu', '0.1', '--memory', '32', '--disk', '16', '--size', '1']);
    assert.equal(put.code, 0, put.stderr);
    assert.equal(put.stdout, 'cli\n');
    await readyCount(p, 'cli', 1);
    const ls = await dsec(p, ['pools', 'ls']);
    assert.match(ls.stdout, /^NAME +PROJECT/);
    assert.match(ls.stdout, /\ncli +prj_\w+ +busybox +1 +1 +0 +no/);
    const get = JSON.parse((await dsec(p, ['pools', 'get', 'cli', '--json'])).stdout) as PoolInfo;
    assert.equal(get.size, 1);
    const tooBig = await dsec(p, ['pools', 'put', 'cli', '--base', 'busybox', '--size', '5']);
    assert.equal(tooBig.code, 1);
    assert.match(tooBig.stderr, /INVALID_ARGUMENT: size:/);
    const rm = await dsec(p, ['pools', 'rm', 'cli']);
    assert.equal(rm.code, 0, rm.stderr);
    await usageIs(p, 0);
    // A batch of 4 against a quota of 3: three ids on stdout, one refusal on stderr, exit 1.
    const q = await project({ sandboxes: 3 });
    const batch = await dsec(q, [
      'sandbox',
      'create',
      '--base',
      'busybox',
      '--cpu',
      '0.1',
      '--memory',
      '32',
      '--disk',
      '16',
      '--count',
      '4',
      '--label',
      'via=cli',
    ]);
    assert.equal(batch.code, 1, 'a failed item makes the exit status 1');
    const ids = batch.stdout.trim().split('\n');
    assert.equal(ids.length, 3);
    assert.match(batch.stderr, /QUOTA_EXCEEDED: item \d/);
    assert.deepEqual((await Sandbox.list({ labels: { via: 'cli' } }, { client: q.client }).toArray()).map((s) => s.id).sort(), ids.sort());
    await cleanup(q);
  });
});
