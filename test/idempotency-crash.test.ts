// End-to-end, issue 13 §4: a crash after a sandbox stands but before its idempotency key
// completes must not let a retry with the same key make a second sandbox. A real platform
// (`dsec up` as a child process) is killed by its own kill point (DSEC_TEST_CRASH_AT) once the
// sandbox runs on its node and its row says so (`create.running`), and once a warm pool's member
// has been handed over on its node and its row says so (`claim.running`); restarted on the same
// home, the retry with the same key gets that very sandbox, and the project has one sandbox, not
// two. (A claim cut before its row runs, `claim.node`, is rolled back as a create is: crash.test.ts.) Needs root.
import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import { CRASH_AT_ENV } from '@dsec/apiserver';
import type { CrashStep } from '@dsec/apiserver';
import { freshHome, killChildren, removeHome, stop, up } from './helpers/child-platform.js';
import type { RunningNode } from './helpers/child-platform.js';

/** A request that hangs this long is a hang, not a slow machine. */
const REQUEST_TIMEOUT_MS = 60_000;
const BUSYBOX = { image: { base: 'busybox' } };

interface Reply {
  status: number;
  body: any;
}

async function call(node: RunningNode, method: string, route: string, body?: unknown, headers: Record<string, string> = {}): Promise<Reply> {
  const res = await fetch(`${node.url}${route}`, {
    method,
    headers: { authorization: `Bearer ${node.apiKey}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...headers },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
  });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : undefined };
}

/** Sandboxes of the root project carrying label `lane=<lane>`. */
async function laneSandboxes(node: RunningNode, lane: string): Promise<Array<{ id: string; state: string }>> {
  const r = await call(node, 'GET', `/v1/sandboxes?limit=500`);
  assert.equal(r.status, 200, JSON.stringify(r.body));
  return (r.body.items as Array<{ id: string; state: string; labels: Record<string, string> }>).filter((s) => s.labels.lane === lane);
}

/** Sends the create, which the platform answers by dying at its armed kill point. */
async function createUntilDeath(node: RunningNode, body: unknown, key: string): Promise<void> {
  const reply = await call(node, 'POST', '/v1/sandboxes', body, { 'idempotency-key': key }).catch((err: unknown) => err as Error);
  assert.ok(reply instanceof Error, `the platform died before answering: ${JSON.stringify(reply)}`);
  const exit = await node.exited;
  assert.equal(exit.signal, 'SIGKILL', `the platform died at its kill point: ${node.stderr()}`);
}

describe('a retry after a crash gets the sandbox its key already made', { concurrency: false }, () => {
  let home = '';
  after(async () => {
    await killChildren();
    if (home) await removeHome(home);
  });

  /** Restarts unarmed, retries the create with the same key, and checks one sandbox, the same. */
  async function retry(body: { labels: { lane: string } }, key: string): Promise<void> {
    const again = await up(home);
    try {
      const before = await laneSandboxes(again, body.labels.lane);
      assert.equal(before.length, 1, `the crash left one sandbox: ${JSON.stringify(before)}`);
      const r = await call(again, 'POST', '/v1/sandboxes', body, { 'idempotency-key': key });
      assert.ok([200, 201].includes(r.status), JSON.stringify(r.body));
      assert.equal(r.body.id, before[0]!.id, 'the retry gets the sandbox the first request made');
      assert.equal(r.body.state, 'running');
      const now = await laneSandboxes(again, body.labels.lane);
      assert.deepEqual(
        now.map((s) => s.id),
        [before[0]!.id],
        'one sandbox, not two',
      );
      assert.match(again.stderr(), new RegExp(`idempotency keys settled with their sandbox: ${key} -> ${r.body.id as string}`), again.stderr());
      // The sandbox works, and goes.
      const exec = await call(again, 'POST', `/v1/sandboxes/${r.body.id as string}/exec`, { cmd: 'echo ok' });
      assert.equal(exec.status, 200, JSON.stringify(exec.body));
      assert.equal((await call(again, 'DELETE', `/v1/sandboxes/${r.body.id as string}`)).status, 204);
    } finally {
      await call(again, 'DELETE', '/v1/pools/warm').catch(() => undefined);
      assert.equal(await stop(again, 'SIGTERM'), 0, again.stderr());
    }
  }

  async function armed(step: CrashStep): Promise<RunningNode> {
    return up(home, { env: { [CRASH_AT_ENV]: step } });
  }

  test('setup: a home', async () => {
    home = await freshHome('dsec-idem-crash-');
  });

  test('SIGKILL once the sandbox runs (create.running), then a retry with the same key', { timeout: 240_000 }, async () => {
    const body = { ...BUSYBOX, labels: { lane: 'create' } };
    await createUntilDeath(await armed('create.running'), body, 'crash-create-1');
    await retry(body, 'crash-create-1');
  });

  test('SIGKILL once a pool member is handed over (claim.running), then a retry with the same key', { timeout: 240_000 }, async () => {
    const node = await armed('claim.running');
    const pool = await call(node, 'PUT', '/v1/pools/warm', { spec: BUSYBOX, size: 1 });
    assert.equal(pool.status, 200, JSON.stringify(pool.body));
    const until = Date.now() + 120_000;
    while ((await call(node, 'GET', '/v1/pools/warm')).body.ready < 1) {
      assert.ok(Date.now() < until, 'the pool fills');
      await new Promise((r) => setTimeout(r, 200));
    }
    const body = { ...BUSYBOX, labels: { lane: 'claim' } };
    await createUntilDeath(node, body, 'crash-claim-1');
    await retry(body, 'crash-claim-1');
  });
});
