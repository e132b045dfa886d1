// API replicas on one PostgreSQL (a cluster of the test's own): `dsec up --db` (a platform with
// its edge) and an edge-less `dsec apiserver` replica that reaches the same edge, as a joined
// remote edge would be reached. Any replica serves any request: create on one, exec and read on
// the other; the quota holds under a race split over both; an idempotency key holds across them;
// the event stream of one shows what the other stored; trajectory seqs come from the database;
// /healthz is 503 while the database is down. Also: the first of two replicas starting together
// on an empty database makes the admin key, and the `dsec apiserver` command serves.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { startApiserver } from '@dsec/apiserver';
import type { Replica } from '@dsec/apiserver';
import { REPO_ROOT } from './helpers/node.js';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';
import { postgresSkipReason, startTestPostgres } from './helpers/postgres.js';
import type { TestPostgres } from './helpers/postgres.js';

const skip = postgresSkipReason();

interface Reply {
  status: number;
  body: any;
}

async function call(base: string, key: string | null, method: string, route: string, json?: unknown, headers: Record<string, string> = {}): Promise<Reply> {
  const res = await fetch(`${base}${route}`, {
    method,
    headers: { ...(key ? { authorization: `Bearer ${key}` } : {}), ...(json !== undefined ? { 'content-type': 'application/json' } : {}), ...headers },
    ...(json !== undefined ? { body: JSON.stringify(json) } : {}),
    signal: AbortSignal.timeout(60_000),
  });
  const text = await res.text();
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {
    // not JSON
  }
  return { status: res.status, body };
}

const SPEC = { image: { base: 'busybox' }, resources: { cpu: 0.1, memoryMiB: 64, diskMiB: 16 } };

async function until<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 20_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v !== undefined) return v;
    if (Date.now() > deadline) assert.fail(`${what}: not within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const CLI = path.join(REPO_ROOT, 'packages/cli/dist/main.js');
const quiet = process.env.DSEC_TEST_LOG ? (line: string) => console.error(line) : () => undefined;

describe('replicas on PostgreSQL', { skip }, () => {
  let pg: TestPostgres | undefined;
  const homes: string[] = [];
  const newHome = async (): Promise<string> => {
    const h = await mkdtemp(path.join(os.tmpdir(), 'dsec-replica-'));
    homes.push(h);
    return h;
  };
  before(async () => {
    pg = await startTestPostgres();
  });
  after(async () => {
    await pg?.close();
    for (const h of homes) await rm(h, { recursive: true, force: true });
  });

  it('the first replica on an empty database makes the admin key; every replica takes it', async () => {
    const url = await pg!.createDatabase('bootstrap');
    const replicas: Replica[] = [];
    try {
      const [homeA, homeB] = [await newHome(), await newHome()];
      replicas.push(
        ...(await Promise.all([
          startApiserver({ db: url, home: homeA, addr: '127.0.0.1:0', log: quiet }),
          startApiserver({ db: url, home: homeB, addr: '127.0.0.1:0', log: quiet }),
        ])),
      );
      const keys = replicas.map((r) => r.adminKey).filter(Boolean);
      assert.equal(keys.length, 1, 'exactly one replica made the admin key');
      assert.equal([homeA, homeB].filter((h) => existsSync(path.join(h, 'admin.key'))).length, 1);
      for (const r of replicas) {
        assert.equal((await call(r.url, keys[0]!, 'GET', '/v1/projects')).status, 200);
        assert.equal((await call(r.url, null, 'GET', '/healthz')).status, 200);
        assert.equal((await call(r.url, null, 'GET', '/metrics')).status, 200);
      }
      // Without a node, a replica answers what the store knows and refuses placement clearly.
      const noNode = await call(replicas[0]!.url, keys[0]!, 'POST', '/v1/sandboxes', SPEC);
      assert.ok(noNode.status >= 400 && noNode.status < 600 && noNode.status !== 500, JSON.stringify(noNode.body));
    } finally {
      for (const r of replicas) await r.close();
    }
  });

  it('dsec apiserver serves /healthz and /metrics and stops on SIGTERM', async () => {
    const url = await pg!.createDatabase('cli');
    const home = await newHome();
    const child = spawn(process.execPath, [CLI, 'apiserver', '--db', url, '--home', home, '--addr', '127.0.0.1:0', '--quiet'], {
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
    try {
      let out = '';
      let err = '';
      child.stderr.on('data', (b: Buffer) => (err += b.toString()));
      child.stdout.on('data', (b: Buffer) => (out += b.toString()));
      const base = await until(
        'dsec apiserver listening',
        async () => {
          const m = /listening on (http:\/\/\S+)/.exec(out);
          return m?.[1];
        },
        30_000,
      ).catch((e: unknown) => {
        throw new Error(`${(e as Error).message}; stderr: ${err}`);
      });
      await until('the admin key printed', async () => (/admin key/.test(out) ? true : undefined));
      assert.equal((await readFile(path.join(home, 'admin.key'), 'utf8')).trim().length > 10, true);
      assert.equal((await call(base, null, 'GET', '/healthz')).status, 200);
      const metrics = await call(base, null, 'GET', '/metrics');
      assert.equal(metrics.status, 200);
      child.kill('SIGTERM');
      const code = await Promise.race([exited, new Promise((r) => setTimeout(() => r('hung'), 15_000))]);
      assert.equal(code, 0);
    } finally {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGKILL');
        await exited;
      }
    }
  });

  describe('a platform and an edge-less replica on one database', () => {
    let a: TestPlatform | undefined;
    let b: Replica | undefined;
    let admin = '';
    const created: string[] = [];

    before(async () => {
      const url = await pg!.createDatabase('shared');
      a = await startTestPlatform({ db: url, watch: { heartbeatMs: 500 } });
      admin = a.adminKey;
      b = await startApiserver({ db: url, home: await newHome(), addr: '127.0.0.1:0', log: quiet, nodes: [a.platform.edge], watch: { heartbeatMs: 500 } });
      assert.equal(b.adminKey, undefined, 'the platform made the key first');
    });
    after(async () => {
      for (const id of created) await call(a!.url, admin, 'DELETE', `/v1/sandboxes/${id}`).catch(() => undefined);
      await b?.close();
      await a?.close();
    });

    it('creates on one replica and runs, lists and records on the other', async () => {
      const sb = await call(b!.url, admin, 'POST', '/v1/sandboxes', SPEC);
      assert.equal(sb.status, 201, JSON.stringify(sb.body));
      created.push(sb.body.id);
      const got = await call(a!.url, admin, 'GET', `/v1/sandboxes/${sb.body.id}`);
      assert.equal(got.body.state, 'running');
      // Steps through both replicas: seqs from the database, none given twice.
      for (const [i, base] of [a!.url, b!.url, a!.url, b!.url].entries()) {
        const r = await call(base, admin, 'POST', `/v1/sandboxes/${sb.body.id}/exec`, { cmd: `echo step${i}` });
        assert.equal(r.status, 200, JSON.stringify(r.body));
        assert.equal(r.body.stdout, `step${i}\n`);
      }
      const steps = await until('four recorded steps', async () => {
        const t = await call(a!.url, admin, 'GET', `/v1/sandboxes/${sb.body.id}/trajectory`);
        const items = (t.body.items ?? []) as Array<{ seq: number }>;
        return items.length >= 4 ? items : undefined;
      });
      assert.deepEqual(
        steps.map((s) => s.seq).sort((x, y) => x - y),
        [0, 1, 2, 3],
      );
      const listed = await call(b!.url, admin, 'GET', '/v1/sandboxes');
      assert.ok(listed.body.items.some((s: { id: string }) => s.id === sb.body.id));
    });

    it('holds the quota under 50 concurrent creates split over both replicas', async () => {
      const prj = await call(a!.url, admin, 'POST', '/v1/projects', { name: 'race', quota: { sandboxes: 8 } });
      assert.equal(prj.status, 201, JSON.stringify(prj.body));
      const key = (await call(a!.url, admin, 'POST', '/v1/keys', { name: 'race', role: 'member', project: prj.body.id })).body.key as string;
      const results = await Promise.all(Array.from({ length: 50 }, (_, i) => call(i % 2 ? a!.url : b!.url, key, 'POST', '/v1/sandboxes', SPEC)));
      const ok = results.filter((r) => r.status === 201);
      for (const r of ok) created.push(r.body.id);
      const refused = results.filter((r) => r.status !== 201);
      assert.equal(ok.length, 8, `admitted: ${ok.length}; refusals: ${JSON.stringify([...new Set(refused.map((r) => r.body?.error?.code))])}`);
      for (const r of refused) assert.equal(r.body.error.code, 'QUOTA_EXCEEDED');
      const seen = await call(b!.url, admin, 'GET', `/v1/projects/${prj.body.id}`);
      assert.equal(seen.body.usage.sandboxes, 8, JSON.stringify(seen.body));
      // Deleted through either replica: the usage goes back to zero.
      for (const [i, r] of ok.entries()) assert.equal((await call(i % 2 ? a!.url : b!.url, key, 'DELETE', `/v1/sandboxes/${r.body.id}`)).status, 204);
      created.splice(created.length - ok.length, ok.length);
      const later = await call(a!.url, admin, 'GET', `/v1/projects/${prj.body.id}`);
      assert.equal(later.body.usage.sandboxes, 0);
    });

    it('sees at once on one replica the layers and pools changed on the other (cached, dropped by NOTIFY)', async () => {
      const metric = async (name: string): Promise<number> => {
        const text = (await call(b!.url, admin, 'GET', '/metrics')).body as string;
        return Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(text)?.[1] ?? NaN);
      };
      const spec = { ...SPEC, resources: { ...SPEC.resources, memoryMiB: 65 } };
      // b reads (and caches) the project's layer scope and its pools' spec keys: no pool has this spec.
      const warm = await call(b!.url, admin, 'POST', '/v1/sandboxes', spec);
      assert.equal(warm.status, 201, JSON.stringify(warm.body));
      assert.equal((await call(b!.url, admin, 'DELETE', `/v1/sandboxes/${warm.body.id}`)).status, 204);
      // A workspace layer named on a is usable on b at once (a miss in b's cache reads the store again).
      const tar = Buffer.alloc(1024);
      const res = await fetch(`${a!.url}/v1/layers?kind=workspace&name=cached-ws`, {
        method: 'POST',
        headers: { authorization: `Bearer ${admin}` },
        body: tar,
      });
      assert.equal(res.status, 201, await res.text());
      const withWs = await call(b!.url, admin, 'POST', '/v1/sandboxes', { ...spec, image: { base: 'busybox', workspace: 'cached-ws' } });
      assert.equal(withWs.status, 201, JSON.stringify(withWs.body));
      assert.equal((await call(b!.url, admin, 'DELETE', `/v1/sandboxes/${withWs.body.id}`)).status, 204);
      // Deleted on a: b refuses the name once a's notification arrives.
      // (Once the teardown of the sandbox that used it has ended: a layer in use is not deleted.)
      await until('the layer deleted on a', async () => ((await call(a!.url, admin, 'DELETE', '/v1/layers/cached-ws')).status === 204 ? true : undefined));
      await until('b refuses the deleted layer', async () => {
        const r = await call(b!.url, admin, 'POST', '/v1/sandboxes', { ...spec, image: { base: 'busybox', workspace: 'cached-ws' } });
        if (r.status === 201) await call(b!.url, admin, 'DELETE', `/v1/sandboxes/${r.body.id}`);
        return r.status === 404 ? r : undefined;
      });
      // A pool made on a for this spec: b's next create claims from it (its cached "no pool" was dropped).
      const put = await call(a!.url, admin, 'PUT', '/v1/pools/cached-pool', { spec, size: 1 });
      assert.ok([200, 201].includes(put.status), JSON.stringify(put.body));
      try {
        await until('the pool holds one ready', async () => ((await call(a!.url, admin, 'GET', '/v1/pools/cached-pool')).body.ready === 1 ? true : undefined));
        const claims = await metric('dsec_pool_claims_total');
        const claimed = await call(b!.url, admin, 'POST', '/v1/sandboxes', spec);
        assert.equal(claimed.status, 201, JSON.stringify(claimed.body));
        created.push(claimed.body.id);
        assert.equal(await metric('dsec_pool_claims_total'), claims + 1, 'b claimed from the pool made on a');
      } finally {
        await call(a!.url, admin, 'DELETE', '/v1/pools/cached-pool');
      }
    });

    it('gives one sandbox to one idempotency key, whichever replica a retry reaches', async () => {
      const headers = { 'idempotency-key': 'job-7-episode-3' };
      const [r1, r2] = await Promise.all([
        call(a!.url, admin, 'POST', '/v1/sandboxes', SPEC, headers),
        call(b!.url, admin, 'POST', '/v1/sandboxes', SPEC, headers),
      ]);
      assert.ok([200, 201].includes(r1.status) && [200, 201].includes(r2.status), `${r1.status} ${r2.status}`);
      assert.equal(r1.body.id, r2.body.id);
      created.push(r1.body.id);
      const r3 = await call(b!.url, admin, 'POST', '/v1/sandboxes', SPEC, headers);
      assert.equal(r3.body.id, r1.body.id);
      const other = await call(a!.url, admin, 'POST', '/v1/sandboxes', { ...SPEC, labels: { x: 'y' } }, headers);
      assert.equal(other.status, 422, 'the same key with another request is refused');
      assert.equal(other.body.error.code, 'IDEMPOTENCY_KEY_REUSED');
    });

    it('streams on one replica the events the other stored', async () => {
      const sb = await call(a!.url, admin, 'POST', '/v1/sandboxes', SPEC);
      assert.equal(sb.status, 201);
      created.push(sb.body.id);
      const ctl = new AbortController();
      const res = await fetch(`${b!.url}/v1/events?sandbox=${sb.body.id}`, {
        headers: { authorization: `Bearer ${admin}`, accept: 'text/event-stream' },
        signal: ctl.signal,
      });
      assert.equal(res.status, 200);
      try {
        const reader = res.body!.getReader();
        const decoder = new TextDecoder();
        let text = '';
        // The pause goes through the platform (its edge raises sandbox.paused and the platform
        // stores it); the replica's stream shows it.
        assert.equal((await call(a!.url, admin, 'POST', `/v1/sandboxes/${sb.body.id}/pause`)).status, 200);
        const deadline = Date.now() + 20_000;
        while (!text.includes('sandbox.paused')) {
          const left = deadline - Date.now();
          if (left <= 0) assert.fail(`no sandbox.paused on the replica's stream; got: ${text}`);
          let timer: NodeJS.Timeout | undefined;
          const r = await Promise.race([reader.read(), new Promise<'timeout'>((resolve) => (timer = setTimeout(() => resolve('timeout'), left)))]);
          clearTimeout(timer);
          if (r === 'timeout') continue;
          if (r.done) assert.fail('stream ended');
          text += decoder.decode(r.value, { stream: true });
        }
      } finally {
        ctl.abort();
      }
    });

    it('answers /healthz 503 while the database is down, and 200 once it is back', async () => {
      await pg!.stop();
      try {
        for (const base of [a!.url, b!.url]) {
          const started = Date.now();
          const r = await call(base, null, 'GET', '/healthz');
          assert.equal(r.status, 503, JSON.stringify(r.body));
          assert.ok(Date.now() - started < 10_000, 'answered, not hung');
        }
      } finally {
        await pg!.start();
      }
      for (const base of [a!.url, b!.url]) {
        await until(`${base} healthy again`, async () => ((await call(base, null, 'GET', '/healthz')).status === 200 ? true : undefined));
      }
    });
  });
});
