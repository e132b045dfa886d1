// `dsec db copy`: a home made by `dsec up` on SQLite (a project, a key, a running sandbox with a
// trajectory) moves into a PostgreSQL database, and `dsec up --db` on that home carries on
// where it was: the same admin key, the same sandbox, the trajectory continuing its seqs. A copy
// into a database that is not empty is refused.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { startPlatform } from '@dsec/apiserver';
import type { Platform } from '@dsec/apiserver';
import { MNT, mountsUnder, umount } from '@dsec/edge';
import { AGENT_BINARY, REPO_ROOT } from './helpers/node.js';
import { postgresSkipReason, startTestPostgres } from './helpers/postgres.js';
import type { TestPostgres } from './helpers/postgres.js';

const run = promisify(execFile);
const CLI = path.join(REPO_ROOT, 'packages/cli/dist/main.js');
const quiet = process.env.DSEC_TEST_LOG ? (line: string) => console.error(line) : () => undefined;

async function call(base: string, key: string, method: string, route: string, json?: unknown): Promise<{ status: number; body: any }> {
  const res = await fetch(`${base}${route}`, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(json !== undefined ? { 'content-type': 'application/json' } : {}) },
    ...(json !== undefined ? { body: JSON.stringify(json) } : {}),
    signal: AbortSignal.timeout(60_000),
  });
  const text = await res.text();
  return { status: res.status, body: text ? (JSON.parse(text) as unknown) : undefined };
}

async function dsec(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const r = await run(process.execPath, [CLI, ...args], { env: { PATH: process.env.PATH ?? '/usr/bin:/bin' }, timeout: 120_000 });
    return { code: 0, stdout: r.stdout, stderr: r.stderr };
  } catch (err) {
    const e = err as { code?: number; stdout?: string; stderr?: string };
    return { code: typeof e.code === 'number' ? e.code : -1, stdout: e.stdout ?? '', stderr: e.stderr ?? '' };
  }
}

describe('dsec db copy', { skip: postgresSkipReason() }, () => {
  let pg: TestPostgres | undefined;
  let home = '';
  let platform: Platform | undefined;

  const start = async (db?: string): Promise<Platform> =>
    startPlatform({ home, addr: '127.0.0.1:0', agentBinary: AGENT_BINARY, log: quiet, ...(db ? { db } : {}) });

  before(async () => {
    pg = await startTestPostgres();
    home = await mkdtemp(path.join(os.tmpdir(), 'dsec-copy-'));
  });
  after(async () => {
    // Whatever happened, the node's sandboxes go: through the platform that runs, else one on
    // the SQLite home.
    try {
      if (!platform) platform = await start();
      await platform.shutdown();
    } catch (err) {
      console.error('cleanup:', err);
    }
    for (const m of await mountsUnder(home).catch(() => [] as string[])) {
      try {
        umount(m, MNT.DETACH);
      } catch {
        // already gone
      }
    }
    await rm(home, { recursive: true, force: true });
    await pg?.close();
  });

  it('moves a one-machine home into PostgreSQL, and the platform carries on there', async () => {
    platform = await start();
    const admin = platform.adminKey ?? (await readFile(platform.adminKeyFile, 'utf8')).trim();
    const team = await call(platform.url, admin, 'POST', '/v1/projects', { name: 'team', quota: { sandboxes: 5 } });
    assert.equal(team.status, 201);
    const sb = await call(platform.url, admin, 'POST', '/v1/sandboxes', {
      image: { base: 'busybox' },
      resources: { cpu: 0.1, memoryMiB: 64, diskMiB: 16 },
      labels: { job: 'copy' },
    });
    assert.equal(sb.status, 201, JSON.stringify(sb.body));
    assert.equal((await call(platform.url, admin, 'POST', `/v1/sandboxes/${sb.body.id}/exec`, { cmd: 'echo before > /tmp/mark' })).status, 200);
    // A plain stop: the sandbox keeps running on the node for the next start.
    await platform.close();
    platform = undefined;

    const url = await pg!.createDatabase('copied');
    const copy = await dsec('db', 'copy', '--from', path.join(home, 'dsec.db'), '--to', url);
    assert.equal(copy.code, 0, copy.stderr);
    assert.match(copy.stdout, /copied \d+ rows/);
    const again = await dsec('db', 'copy', '--from', path.join(home, 'dsec.db'), '--to', url);
    assert.equal(again.code, 1);
    assert.match(again.stderr, /not empty/);
    const missing = await dsec('db', 'copy', '--from', path.join(home, 'nope.db'), '--to', url);
    assert.notEqual(missing.code, 0);

    platform = await start(url);
    assert.equal(platform.adminKey, undefined, 'the copied admin key is kept, no new one is made');
    const got = await call(platform.url, admin, 'GET', `/v1/sandboxes/${sb.body.id}`);
    assert.equal(got.status, 200);
    assert.equal(got.body.state, 'running');
    assert.deepEqual(got.body.labels, { job: 'copy' });
    const exec = await call(platform.url, admin, 'POST', `/v1/sandboxes/${sb.body.id}/exec`, { cmd: 'cat /tmp/mark' });
    assert.equal(exec.body.stdout, 'before\n');
    const projects = await call(platform.url, admin, 'GET', '/v1/projects');
    const copied = (projects.body.items as Array<{ name: string; usage: { sandboxes: number } }>).find((p) => p.name === 'team');
    assert.ok(copied);
    const deadline = Date.now() + 20_000;
    for (;;) {
      const t = await call(platform.url, admin, 'GET', `/v1/sandboxes/${sb.body.id}/trajectory`);
      const seqs = ((t.body.items ?? []) as Array<{ seq: number }>).map((s) => s.seq);
      if (seqs.length >= 2) {
        assert.deepEqual(seqs, [0, 1], 'the copied trajectory goes on after its last step');
        break;
      }
      if (Date.now() > deadline) assert.fail(`trajectory: ${JSON.stringify(seqs)}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  });
});
