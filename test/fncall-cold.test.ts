// Function calls on a cold node (issue 13, the rest): 16 first calls at once, to a runtime
// whose root is not mounted and whose pool does not exist yet, all answer, and answer right;
// then 16 first calls of another memory size (the same pool: a call's memory is a cgroup limit
// set on the sandbox it claims). Before the fix,
// concurrent first calls each mounted the runtime's root on the same directory and the losers'
// release unmounted it under the winner's pool: a call answered 500 now and then. Needs root.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';

/** First calls at once: the per-tenant call limit's default (16). */
const AT_ONCE = 16;
let platform: TestPlatform;

async function call(body: unknown): Promise<{ status: number; body: any }> {
  const res = await fetch(`${platform.url}/v1/calls`, {
    method: 'POST',
    headers: { authorization: `Bearer ${platform.adminKey}`, 'content-type': 'application/json' },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(120_000),
  });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : undefined };
}

before(async () => {
  platform = await startTestPlatform();
});
after(async () => {
  await platform?.close();
});

describe('function calls on a cold node', () => {
  for (const memoryMiB of [undefined, 96]) {
    test(
      `${AT_ONCE} first calls at once${memoryMiB ? ` (memoryMiB ${memoryMiB}: the same pool, another cgroup limit)` : ''} all answer`,
      { timeout: 180_000 },
      async () => {
        const replies = await Promise.all(
          Array.from({ length: AT_ONCE }, (_, i) => call({ runtime: 'sh', code: `echo $((${i} * 2))`, ...(memoryMiB ? { memoryMiB } : {}) })),
        );
        for (const [i, r] of replies.entries()) {
          assert.equal(r.status, 200, `call ${i}: ${r.status} ${JSON.stringify(r.body)}`);
          assert.equal(r.body.exitCode, 0, JSON.stringify(r.body));
          assert.equal(r.body.stdout, `${i * 2}\n`);
        }
      },
    );
  }
});
