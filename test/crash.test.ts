// End-to-end, issue 13 §4: a crash at any point loses nothing and strands nothing. A real
// platform (`dsec up` as a child process on a temp home) runs a mixed workload (creates with
// idempotency keys, batches, execs, pauses, resumes, snapshots, warm-pool claims, networked
// sandboxes, deletes) and is killed with SIGKILL, either by a kill point it reaches
// (DSEC_TEST_CRASH_AT, walking the pipelines' CRASH_STEPS) or by the test at a random moment.
// Restarted on the same home, it must show: usage equal to the live sandboxes of every project,
// every listed sandbox deletable, no container, cgroup, mount, sandbox folder or veth of a
// sandbox without a row, and, once all are deleted, nothing left at all.
// `npm test` runs 5 kill points (one per pipeline); DSEC_LONG=1 runs every named step (the
// control plane's, and the edge's, its container backend's and its network's, which the
// in-process node reaches under the same workload) and random points (>= 30 runs). The same walk
// runs on PostgreSQL (`dsec up --db`, a cluster of the test's own: 2 kill points in `npm test`,
// all of them under DSEC_LONG=1), beside a COMMIT whose answer a proxy drops under a grouped
// reservation, a delete abandoned by a killed platform that an edge-less replica's lease
// pass finishes, and a platform killed mid pool claim beside a live replica (the claim and its
// idempotency key settled by the replica; the platform restarted beside it clears its node). Needs root.
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import type { ChildProcessWithoutNullStreams } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, readdirSync } from 'node:fs';
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { after, before, describe, test } from 'node:test';
import type { TestContext } from 'node:test';
import Database from 'better-sqlite3';
import { CRASH_AT_ENV, CRASH_STEPS, ROOT_PROJECT_ID, StateStore } from '@dsec/apiserver';
import { EMPTY_CGROUP_GRACE_MS, ifPrefixOf, seededRandom, tableOf } from '@dsec/edge';
import { BACKEND_CRASH_STEPS, EDGE_CRASH_STEPS } from '@dsec/protocol';
import type { EdgeCrashStep } from '@dsec/protocol';
import { DEFAULT_GC_INTERVAL_MS } from '@dsec/watcher';
import type { CrashStep } from '@dsec/apiserver';
import { CLI, START_TIMEOUT_MS, freshHome, killChildren, nodeMounts, removeHome, runDirOf, stop, up } from './helpers/child-platform.js';
import type { RunningNode } from './helpers/child-platform.js';
import { postgresSkipReason, startCommitCutter, startTestPostgres } from './helpers/postgres.js';
import type { TestPostgres } from './helpers/postgres.js';

const run = promisify(execFile);
const LONG = process.env.DSEC_LONG === '1';
/** One kill point per pipeline for `npm test`: each where the node has acted and the store not yet. */
const QUICK_STEPS: readonly CrashStep[] = ['create.node', 'delete.node', 'pause.node', 'claim.row', 'snapshot.node'];
/** Every named step the workload reaches: the control plane's, then the in-process edge's and its backend's and network's. */
const ALL_STEPS: ReadonlyArray<CrashStep | EdgeCrashStep> = [...CRASH_STEPS, ...EDGE_CRASH_STEPS, ...BACKEND_CRASH_STEPS];
/** Runs of the long variant killed at a random moment, beside one per step. */
const RANDOM_RUNS = Math.max(30 - ALL_STEPS.length, 16);
/** A kill point the workload never reaches within this is a failure (the machine is loaded: generous). */
const REACH_STEP_MS = 150_000;
/** A request that hangs this long is a hang, not a slow machine. */
const REQUEST_TIMEOUT_MS = 60_000;
/** How long a consistency check may take to settle (a pool being drained, a destroy finishing). */
const SETTLE_MS = 30_000;
/**
 * How long host objects may take to go: an empty cgroup that a create cut short left without
 * its folder is the node's garbage collection's after its grace (EMPTY_CGROUP_GRACE_MS) and
 * one pass (DEFAULT_GC_INTERVAL_MS); everything else goes at once.
 */
const HOST_SETTLE_MS = EMPTY_CGROUP_GRACE_MS + DEFAULT_GC_INTERVAL_MS + 30_000;
const POOL = 'warm';
const BUSYBOX = { image: { base: 'busybox' } };

type CrashRun = { step: CrashStep | EdgeCrashStep } | { afterMs: number };

const seed = Number(process.env.DSEC_CRASH_SEED ?? Date.now() % 1_000_000);
const random = seededRandom(seed);
const runs: CrashRun[] = LONG
  ? [...ALL_STEPS.map((step) => ({ step })), ...Array.from({ length: RANDOM_RUNS }, () => ({ afterMs: 200 + Math.floor(random() * 6000) }))]
  : CRASH_STEPS.filter((s) => QUICK_STEPS.includes(s)).map((step) => ({ step }));

/** A reply of the API: status and parsed body (undefined when empty or not JSON). */
interface Reply {
  status: number;
  body: any;
}

/** The API of one running platform, as a client sees it. */
class Api {
  constructor(
    readonly url: string,
    readonly key: string,
  ) {}

  async call(method: string, route: string, body?: unknown, headers: Record<string, string> = {}): Promise<Reply> {
    const res = await fetch(`${this.url}${route}`, {
      method,
      headers: { authorization: `Bearer ${this.key}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...headers },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
    });
    const text = await res.text();
    let parsed: unknown;
    try {
      parsed = text ? JSON.parse(text) : undefined;
    } catch {
      parsed = undefined;
    }
    return { status: res.status, body: parsed };
  }

  /** Like `call`, but a status other than `ok` throws with the reply. */
  async ok(method: string, route: string, body?: unknown, headers: Record<string, string> = {}, ok = [200, 201, 204]): Promise<Reply> {
    const r = await this.call(method, route, body, headers);
    if (!ok.includes(r.status)) throw new Error(`${method} ${route}: ${r.status} ${JSON.stringify(r.body)}`);
    return r;
  }

  withKey(key: string): Api {
    return new Api(this.url, key);
  }
}

interface SandboxView {
  id: string;
  project: string;
  state: string;
  resources: { cpu: number; memoryMiB: number };
}

/** Every sandbox the admin sees (all projects). */
async function listAll(api: Api): Promise<SandboxView[]> {
  const out: SandboxView[] = [];
  let cursor: string | null = null;
  do {
    const r: Reply = await api.ok('GET', `/v1/sandboxes?limit=500${cursor ? `&cursor=${cursor}` : ''}`);
    out.push(...(r.body.items as SandboxView[]));
    cursor = r.body.nextCursor as string | null;
  } while (cursor);
  return out;
}

/** The tenant of the workload: a sub-project of root with a key, created once per home. */
interface Tenant {
  id: string;
  key: string;
}

async function makeTenant(admin: Api): Promise<Tenant> {
  const project = await admin.ok('POST', '/v1/projects', { name: 'tenant', quota: { sandboxes: 12, cpu: 64, memoryMiB: 65_536 } });
  const key = await admin.ok('POST', '/v1/keys', { name: 'tenant', role: 'member', project: project.body.id });
  return { id: project.body.id as string, key: key.body.key as string };
}

/**
 * The mixed workload, in four lanes, until `stopped()` is true. Errors are part of the game (a
 * quota refusal, a conflict, the platform dying under a request); every id a reply names is
 * added to `seen`.
 */
async function workload(admin: Api, tenantApi: Api, seen: Set<string>, stopped: () => boolean): Promise<void> {
  let n = 0;
  // Keys are the project's for a day: each workload's are its own.
  const tag = randomBytes(4).toString('hex');
  let keptNet: string | undefined;
  const note = (r: Reply): string | undefined => {
    const id = r.body?.id as string | undefined;
    if (id) seen.add(id);
    return id;
  };
  const lane = async (body: () => Promise<void>): Promise<void> => {
    while (!stopped()) {
      try {
        await body();
      } catch {
        await new Promise((r) => setTimeout(r, 100));
      }
    }
  };
  await Promise.all([
    // The lifecycle of one sandbox, step by step (a create with an idempotency key).
    lane(async () => {
      const id = note(
        await tenantApi.ok(
          'POST',
          '/v1/sandboxes',
          { ...BUSYBOX, resources: { cpu: 1 }, labels: { lane: 'life' } },
          { 'idempotency-key': `${tag}-life-${n++}` },
        ),
      );
      if (!id) return;
      await tenantApi.ok('POST', `/v1/sandboxes/${id}/exec`, { cmd: 'echo hi > /tmp/a' });
      await tenantApi.ok('POST', `/v1/sandboxes/${id}/pause`);
      await tenantApi.ok('POST', `/v1/sandboxes/${id}/snapshot`, {});
      await tenantApi.ok('POST', `/v1/sandboxes/${id}/resume`, {});
      await tenantApi.ok('POST', `/v1/sandboxes/${id}/snapshot`, {});
      await tenantApi.ok('DELETE', `/v1/sandboxes/${id}`);
    }),
    // Batches: three at a time, one kept while few are live (the node's CPU over-committed holds 16).
    lane(async () => {
      const r = await admin.ok(
        'POST',
        '/v1/sandboxes:batch',
        { spec: { ...BUSYBOX, labels: { lane: 'batch' } }, count: 3 },
        { 'idempotency-key': `${tag}-batch-${n++}` },
      );
      const ids = (r.body.items as Array<{ sandbox?: { id: string } }>).flatMap((i) => (i.sandbox ? [i.sandbox.id] : []));
      for (const id of ids) seen.add(id);
      const live = (await listAll(admin)).filter((s) => s.project === 'root').length;
      for (const id of ids.slice(live > 4 ? 0 : 1)) await admin.ok('DELETE', `/v1/sandboxes/${id}`);
    }),
    // Warm-pool claims: the same spec as the pool's.
    lane(async () => {
      const id = note(await tenantApi.ok('POST', '/v1/sandboxes', { ...BUSYBOX, labels: { lane: 'claim' }, env: { CLAIMED: '1' } }));
      if (!id) return;
      await tenantApi.ok('POST', `/v1/sandboxes/${id}/exec`, { cmd: 'test "$CLAIMED" = 1' });
      await tenantApi.ok('DELETE', `/v1/sandboxes/${id}`);
    }),
    // Networked sandboxes (a veth and the node's table), a few kept.
    lane(async () => {
      const id = note(
        await admin.ok('POST', '/v1/sandboxes', { ...BUSYBOX, labels: { lane: 'net' }, network: { mode: 'allowlist', allow: [{ host: 'example.invalid' }] } }),
      );
      if (!id) return;
      await admin.ok('POST', `/v1/sandboxes/${id}/exec`, { cmd: 'true' });
      // One is kept (its veth and addresses stay across the crash); the node's CPU is 16 sandboxes in all.
      if (keptNet) await admin.ok('DELETE', `/v1/sandboxes/${id}`);
      else keptNet = id;
    }),
  ]);
}

/** Sandbox ids the store of a stopped platform holds (also those a crash left half made): its SQLite file, or its PostgreSQL database. */
async function storedIds(home: string, db?: TestPostgres): Promise<string[]> {
  if (db) return (await db.query('SELECT id FROM sandboxes', CRASH_DB)).rows.map((r: { id: string }) => r.id);
  const file = new Database(path.join(home, 'dsec.db'));
  try {
    return (file.prepare('SELECT id FROM sandboxes').all() as Array<{ id: string }>).map((r) => r.id);
  } finally {
    file.close();
  }
}

/** What the node of `home` still has on the host for sandbox `id` (empty when nothing). */
async function hostObjectsOf(home: string, id: string, mountinfo: string): Promise<string[]> {
  const found: string[] = [];
  const runDir = runDirOf(path.join(home, 'node'));
  for (const p of [
    path.join(runDir, 'crun', id),
    path.join(runDir, 'rw', id),
    path.join(runDir, 'roots', id),
    path.join(home, 'node', 'sandboxes', id),
    // its saved network policy (its slot, so its link)
    path.join(home, 'node', 'net', `${id}.json`),
  ]) {
    if (existsSync(p)) found.push(p);
  }
  const cgroupDirs = existsSync('/sys/fs/cgroup/cgroup.controllers')
    ? [path.join('/sys/fs/cgroup', 'dsec', id)]
    : readdirSync('/sys/fs/cgroup').map((c) => path.join('/sys/fs/cgroup', c, 'dsec', id));
  for (const d of cgroupDirs) if (existsSync(d)) found.push(`cgroup ${d}`);
  for (const line of mountinfo.split('\n')) {
    const target = line.split(' ')[4] ?? '';
    if (target.includes(`/${id}`)) found.push(`mount ${target}`);
  }
  return found;
}

/** Host links of the node of `home` that belong to sandboxes (`<prefix><slot in hex>`; the node's own end in `-gw`, `-gp`). */
async function nodeLinks(home: string): Promise<string[]> {
  const prefix = ifPrefixOf(path.basename(runDirOf(path.join(home, 'node'))));
  const { stdout } = await run('ip', ['-o', 'link', 'show']);
  return stdout
    .split('\n')
    .map((l) => /^\d+:\s+([^:@\s]+)/.exec(l)?.[1] ?? '')
    .filter((name) => name.startsWith(prefix) && /^[0-9a-f]+$/.test(name.slice(prefix.length)));
}

/** Rules of the node's nftables table that name one sandbox's link (the table matches them by prefix only: none should). */
async function sandboxRules(home: string): Promise<string[]> {
  const tag = path.basename(runDirOf(path.join(home, 'node')));
  const table = await run('nft', ['list', 'table', 'inet', tableOf(tag)]).then(
    (r) => r.stdout,
    () => '',
  );
  return table.split('\n').filter((l) => l.includes(ifPrefixOf(tag)) && !l.includes(`${ifPrefixOf(tag)}*`));
}

/** Polls `check` (which returns what is wrong, or nothing) until it passes or `ms` pass; then fails with the last answer. */
async function settles(what: string, check: () => Promise<string | undefined>, ms = SETTLE_MS): Promise<void> {
  const until = Date.now() + ms;
  for (;;) {
    const wrong = await check();
    if (wrong === undefined) return;
    if (Date.now() > until) assert.fail(`${what}: ${wrong}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

/** Usage of each visible project against its live sandboxes (its own and its sub-projects'); a description of any difference. */
async function usageMismatch(admin: Api): Promise<string | undefined> {
  const projects = (await admin.ok('GET', '/v1/projects')).body.items as Array<{
    id: string;
    parent: string | null;
    usage: { sandboxes: number; cpu: number; memoryMiB: number };
  }>;
  const sandboxes = await listAll(admin);
  const parent = new Map(projects.map((p) => [p.id, p.parent]));
  const wrong: string[] = [];
  for (const p of projects) {
    const mine = sandboxes.filter((s) => {
      for (let at: string | null | undefined = s.project; at; at = parent.get(at)) if (at === p.id) return true;
      return false;
    });
    const live = { sandboxes: mine.length, cpu: mine.reduce((a, s) => a + s.resources.cpu, 0), memoryMiB: mine.reduce((a, s) => a + s.resources.memoryMiB, 0) };
    if (live.sandboxes !== p.usage.sandboxes || Math.abs(live.cpu - p.usage.cpu) > 1e-9 || live.memoryMiB !== p.usage.memoryMiB)
      wrong.push(`${p.id}: usage ${JSON.stringify(p.usage)}, live ${JSON.stringify(live)}`);
  }
  return wrong.length ? wrong.join('; ') : undefined;
}

/** Host objects of sandboxes in `ids` that no live sandbox explains. */
async function strandedObjects(home: string, ids: Iterable<string>, live: Set<string>): Promise<string | undefined> {
  const mountinfo = await readFile('/proc/self/mountinfo', 'utf8');
  const stranded: string[] = [];
  for (const id of ids) if (!live.has(id)) stranded.push(...(await hostObjectsOf(home, id, mountinfo)).map((o) => `${id}: ${o}`));
  return stranded.length ? stranded.join('; ') : undefined;
}

/**
 * The walk: one home, a run per kill point (or random moment), each restarted and checked. With
 * `store`, the platform keeps its state in that PostgreSQL database (`dsec up --db`) and runs with
 * those extra arguments; else in its home's SQLite file.
 */
function crashWalk(walkRuns: readonly CrashRun[], store?: () => { pg: TestPostgres; args: string[] }): void {
  let home = '';
  let tenant: Tenant | undefined;
  /** Every sandbox id this home may ever have had (from replies, the store and the node's folders). */
  const universe = new Set<string>();

  after(async () => {
    await killChildren();
    if (home) await removeHome(home, store?.().args);
  });

  /** Starts the platform, unarmed or armed at a kill point. */
  async function start(step?: CrashStep | EdgeCrashStep): Promise<{ node: RunningNode; admin: Api; tenantApi: Api }> {
    const node = await up(home, { args: store?.().args ?? [], ...(step ? { env: { [CRASH_AT_ENV]: step } } : {}) });
    const admin = new Api(node.url, node.apiKey);
    tenant ??= await makeTenant(admin);
    return { node, admin, tenantApi: admin.withKey(tenant.key) };
  }

  /** Runs the workload on a platform armed at the run's step (or killed at its moment) until it dies. */
  async function crash(r: CrashRun): Promise<void> {
    const { node, admin, tenantApi } = await start('step' in r ? r.step : undefined);
    try {
      let dead = false;
      void node.exited.then(() => (dead = true));
      // The pool's first refill may itself reach the kill point before this reply.
      await tenantApi.ok('PUT', `/v1/pools/${POOL}`, { spec: BUSYBOX, size: 2 }).catch(async (err: unknown) => {
        await Promise.race([node.exited, new Promise((resolve) => setTimeout(resolve, 2000))]);
        if (!dead) throw err;
      });
      const load = workload(admin, tenantApi, universe, () => dead);
      if ('step' in r) {
        let timer: NodeJS.Timeout | undefined;
        const reached = await Promise.race([
          node.exited.then(() => true),
          new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), REACH_STEP_MS))),
        ]);
        clearTimeout(timer);
        if (!reached) {
          node.child.kill('SIGKILL');
          await node.exited;
          await load;
          assert.fail(`the workload never reached kill point ${r.step} in ${REACH_STEP_MS} ms: ${node.stderr()}`);
        }
      } else {
        await new Promise((resolve) => setTimeout(resolve, r.afterMs));
        node.child.kill('SIGKILL');
      }
      const exit = await node.exited;
      assert.equal(exit.signal, 'SIGKILL', `the platform died of SIGKILL (${JSON.stringify(exit)}): ${node.stderr()}`);
      await load;
    } finally {
      node.child.kill('SIGKILL');
      await node.exited;
    }
  }

  async function crashOnce(t: TestContext, r: CrashRun): Promise<void> {
    await crash(r);
    for (const id of await storedIds(home, store?.().pg)) universe.add(id);
    for (const id of await readdir(path.join(home, 'node', 'sandboxes')).catch(() => [] as string[])) universe.add(id);

    // Restarted on the same home (unarmed): everything is consistent before anything else happens.
    const { node: again, admin, tenantApi } = await start();
    try {
      const reconciled = /dsec: reconciled at start: .*/.exec(again.stderr())?.[0];
      if (reconciled) t.diagnostic(reconciled.slice(0, 2000));
      // The pool refills in the background: it goes, so that what the API lists is all there is.
      await tenantApi.ok('DELETE', `/v1/pools/${POOL}`, undefined, {}, [204, 404]);
      await settles('usage equals the live sandboxes of every project', () => usageMismatch(admin));
      const listed = await listAll(admin);
      for (const s of listed) assert.ok(['running', 'paused', 'lost', 'failed'].includes(s.state), `${s.id} is left ${s.state}`);
      const live = new Set(listed.map((s) => s.id));
      await settles('no host object of a sandbox without a row', () => strandedObjects(home, universe, live), HOST_SETTLE_MS);
      // Every listed sandbox can be deleted, whatever state it was left in.
      for (const s of listed) await admin.ok('DELETE', `/v1/sandboxes/${s.id}`);
      await settles(
        'no quota held once every sandbox is deleted',
        async () => (await usageMismatch(admin)) ?? ((await listAll(admin)).length ? 'sandboxes left' : undefined),
      );
      await settles(
        'nothing of any sandbox is left on the host',
        async () => {
          const stranded = await strandedObjects(home, universe, new Set());
          const links = await nodeLinks(home);
          const rules = await sandboxRules(home);
          return stranded ?? (links.length ? `links left: ${links.join(', ')}` : rules.length ? `rules left: ${rules.join('; ')}` : undefined);
        },
        HOST_SETTLE_MS,
      );
    } finally {
      assert.equal(await stop(again, 'SIGTERM'), 0, again.stderr());
    }
  }

  test('setup: a home for every run', async () => {
    home = await freshHome('dsec-crash-');
  });

  for (const r of walkRuns) {
    const name = 'step' in r ? `SIGKILL at ${r.step}` : `SIGKILL after ${r.afterMs} ms of workload (seed ${seed})`;
    test(name, { timeout: 400_000 }, async (t) => crashOnce(t, r));
  }

  test('at the end, dsec up --clean leaves no mount, link or table of the node', async () => {
    const node = await up(home, { args: [...(store?.().args ?? []), '--clean'] });
    assert.equal(await stop(node, 'SIGINT'), 0, node.stderr());
    assert.deepEqual(await nodeMounts(home), []);
    assert.deepEqual(await nodeLinks(home), []);
    const table = tableOf(path.basename(runDirOf(path.join(home, 'node'))));
    await assert.rejects(run('nft', ['list', 'table', 'inet', table]), `table ${table} is gone`);
  });
}

describe('a crash at any point loses nothing and strands nothing', { concurrency: false }, () => crashWalk(runs));

/** The PostgreSQL walk's database. */
const CRASH_DB = 'crash';
/** How long a `stopping` row no process here tears down waits for the lease pass (short for the tests; the default is minutes). */
const ABANDONED_MS = 2000;
/** The watcher's pass here (the lease pass runs in it). */
const PASS_MS = 250;
/** `npm test`'s kill points of the PostgreSQL walk: between a node and its row, in a create and in a delete. */
const PG_QUICK_STEPS: readonly CrashStep[] = ['create.node', 'delete.node'];
const pgRuns: CrashRun[] = LONG ? runs : PG_QUICK_STEPS.map((step) => ({ step }));

/** An edge-less `dsec apiserver` child on `home`, once it listens: its process, its stderr so far, and its exit. */
async function startReplica(
  home: string,
  args: string[],
): Promise<{ child: ChildProcessWithoutNullStreams; url: string; stderr: () => string; exited: Promise<void> }> {
  const child = spawn(process.execPath, [CLI, 'apiserver', '--home', home, '--addr', '127.0.0.1:0', ...args], {
    env: { PATH: process.env.PATH ?? '' },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let stderr = '';
  let stdout = '';
  child.stderr.on('data', (b: Buffer) => (stderr += b.toString()));
  child.stdout.on('data', (b: Buffer) => (stdout += b.toString()));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  try {
    await settles('the replica listens', async () => (/listening on/.test(stdout) ? undefined : `not yet: ${stderr}`), START_TIMEOUT_MS);
  } catch (err) {
    child.kill('SIGKILL');
    throw err;
  }
  return { child, url: /listening on (http:\/\/\S+)/.exec(stdout)![1]!, stderr: () => stderr, exited };
}

/** How long a replica with work on the store may show no session before the survivor settles it (short for the tests; the default is 10 s). */
const GONE_MS = 1500;
/** Kill points of a create on a replica that dies beside a live one: its reservation alone, and its row with the sandbox on its node (the rest under DSEC_LONG=1). */
const GONE_STEPS: readonly CrashStep[] = LONG
  ? ['create.reserved', 'create.row', 'create.node', 'pause.pausing', 'pause.node', 'delete.stopping']
  : ['create.reserved', 'create.node'];

describe('on PostgreSQL', { skip: postgresSkipReason(), concurrency: false }, () => {
  let pg: TestPostgres | undefined;
  let dir = '';
  let config = '';
  before(async () => {
    pg = await startTestPostgres();
    dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-crash-pg-'));
    config = path.join(dir, 'config.json');
    await writeFile(config, JSON.stringify({ watcher: { intervalMs: PASS_MS, abandonedStoppingMs: ABANDONED_MS } }));
    await pg.createDatabase(CRASH_DB);
  });
  after(async () => {
    await killChildren();
    await pg?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  test('a COMMIT whose answer is lost leaves a grouped reservation counted exactly once', async () => {
    const cutter = await startCommitCutter(pg!.port);
    let store: StateStore | undefined;
    try {
      await pg!.createDatabase('lost_commit');
      const opened = await StateStore.openPostgres(cutter.url('lost_commit'));
      store = opened;
      const project = await opened.createProject({ name: 'lost-commit', parentId: ROOT_PROJECT_ID, quota: { sandboxes: 10, cpu: 10, memoryMiB: 10_000 } });
      const used = async (): Promise<number> => (await opened.project(project.id))!.used_sandboxes;
      const r = { sandboxes: 1, cpu: 1, memoryMiB: 256 };
      /** Three creates' reservations of one moment (one group, one transaction), each given back by its caller when it was admitted. */
      const group = async (): Promise<boolean[]> => {
        const admitted = (await Promise.allSettled([opened.reserve(project.id, r), opened.reserve(project.id, r), opened.reserve(project.id, r)])).map(
          (s) => s.status === 'fulfilled',
        );
        for (const ok of admitted) if (ok) await opened.unreserve(project.id, r);
        return admitted;
      };
      // The server committed; its answer never came: the reservation stands, and its callers hold it.
      const cutAfter = cutter.arm('after-commit');
      cutter.statements.length = 0;
      assert.deepEqual(await group(), [true, true, true], 'the committed group is answered as admitted');
      await cutAfter;
      // The transaction's id came from the replica's reservation row, not from a statement of its own.
      assert.equal(cutter.statements.filter((q) => /returning txid_current\(\)/i.test(q)).length, 1, cutter.statements.join('\n'));
      assert.ok(!cutter.statements.some((q) => /^\s*select txid_current\(\)/i.test(q)), cutter.statements.join('\n'));
      assert.equal(await used(), 0, 'given back by the callers that held it: nothing left counted');
      // The COMMIT never reached the server: nothing was reserved, and every caller is refused.
      const cutBefore = cutter.arm('before-commit');
      assert.deepEqual(await group(), [false, false, false]);
      await cutBefore;
      assert.equal(await used(), 0);
      // The store works on after both.
      assert.deepEqual(await group(), [true, true, true]);
      assert.equal(await used(), 0);
    } finally {
      await store?.close();
      await cutter.close();
    }
  });

  test(
    'the lease pass finishes a row a dead platform left stopping on a node it does not reach, and gives its quota back once',
    { timeout: 300_000 },
    async () => {
      const url = await pg!.createDatabase('abandoned');
      const home = await freshHome('dsec-crash-abandoned-');
      const replicaHome = await mkdtemp(path.join(dir, 'replica-'));
      let replica: ChildProcessWithoutNullStreams | undefined;
      try {
        const args = ['--db', url, '--config', config];
        const armed = await up(home, { args, env: { [CRASH_AT_ENV]: 'delete.stopping' } });
        const admin = new Api(armed.url, armed.apiKey);
        const id = (await admin.ok('POST', '/v1/sandboxes', BUSYBOX)).body.id as string;
        await admin.call('DELETE', `/v1/sandboxes/${id}`).catch(() => undefined);
        assert.equal((await armed.exited).signal, 'SIGKILL', armed.stderr());
        const row = async (): Promise<string | undefined> => (await pg!.query(`SELECT state FROM sandboxes WHERE id = '${id}'`, 'abandoned')).rows[0]?.state;
        const used = async (): Promise<number> =>
          Number((await pg!.query(`SELECT used_sandboxes FROM projects WHERE id = '${ROOT_PROJECT_ID}'`, 'abandoned')).rows[0].used_sandboxes);
        assert.equal(await row(), 'stopping');
        assert.equal(await used(), 1);

        // A replica without the dead platform's node: the sandbox's node is gone for it.
        const started_ = await startReplica(replicaHome, args);
        replica = started_.child;
        const { exited } = started_;
        const stderr = (): string => started_.stderr();
        const started = Date.now();
        await settles('the row is finished', async () => ((await row()) === undefined ? undefined : `still ${await row()}`), ABANDONED_MS + 10_000);
        const took = Date.now() - started;
        assert.ok(took >= ABANDONED_MS - PASS_MS, `finished after ${took} ms: not before its bound (${ABANDONED_MS} ms)`);
        assert.match(stderr(), new RegExp(`finished the abandoned delete of ${id}`));
        assert.equal(await used(), 0, 'its quota is back');
        // More passes give nothing back twice.
        await new Promise((resolve) => setTimeout(resolve, 4 * PASS_MS));
        assert.equal(await used(), 0, 'given back once');
        replica.kill('SIGTERM');
        await exited;

        // The platform again, on its home: its node's sandbox has no row and goes.
        const again = await up(home, { args });
        try {
          await settles('nothing of the sandbox is left on the host', () => strandedObjects(home, [id], new Set()), HOST_SETTLE_MS);
          assert.equal(await used(), 0);
        } finally {
          assert.equal(await stop(again, 'SIGTERM'), 0, again.stderr());
        }
      } finally {
        replica?.kill('SIGKILL');
        await removeHome(home, ['--db', url]);
      }
    },
  );

  for (const step of GONE_STEPS) {
    test(`a replica killed at ${step} beside a live one: the live one settles its work within seconds`, { timeout: 300_000 }, async () => {
      const db = `gone_${step.replace('.', '_')}`;
      const url = await pg!.createDatabase(db);
      const home = await freshHome('dsec-crash-gone-');
      const replicaHome = await mkdtemp(path.join(dir, 'replica-'));
      const goneConfig = path.join(replicaHome, 'config.json');
      await writeFile(goneConfig, JSON.stringify({ watcher: { intervalMs: PASS_MS, goneReplicaMs: GONE_MS } }));
      const args = ['--db', url, '--config', goneConfig];
      let survivor: Awaited<ReturnType<typeof startReplica>> | undefined;
      try {
        // The platform (with its node) first: it makes the admin key; the survivor starts beside it.
        const armed = await up(home, { args, env: { [CRASH_AT_ENV]: step } });
        survivor = await startReplica(replicaHome, args);
        const admin = new Api(armed.url, armed.apiKey);
        // A pause or a delete needs a sandbox first (the armed platform dies at its first create otherwise).
        const kept = step.startsWith('create.') ? undefined : ((await admin.ok('POST', '/v1/sandboxes', BUSYBOX)).body.id as string);
        const rows = async (): Promise<Array<{ id: string; state: string }>> => (await pg!.query('SELECT id, state FROM sandboxes ORDER BY id', db)).rows;
        const used = async (): Promise<number> =>
          Number((await pg!.query(`SELECT used_sandboxes FROM projects WHERE id = '${ROOT_PROJECT_ID}'`, db)).rows[0].used_sandboxes);
        if (!kept) await admin.call('POST', '/v1/sandboxes', BUSYBOX).catch(() => undefined);
        else if (step.startsWith('pause.')) await admin.call('POST', `/v1/sandboxes/${kept}/pause`).catch(() => undefined);
        else await admin.call('DELETE', `/v1/sandboxes/${kept}`).catch(() => undefined);
        assert.equal((await armed.exited).signal, 'SIGKILL', armed.stderr());
        const left = await rows();
        assert.ok(
          step === 'create.reserved' ? (await used()) > left.length : left.some((r) => r.state !== 'running'),
          `work left: ${JSON.stringify(left)}, used ${await used()}`,
        );

        // The survivor (which does not reach the dead platform's node) settles it: usage equals
        // the rows, none left transitional, every listed sandbox deletable through it.
        const settledBy = Date.now() + GONE_MS + 10_000;
        await settles(
          "the survivor settles the dead replica's work",
          async () => {
            const now = await rows();
            if (now.some((r) => !['running', 'paused', 'failed', 'lost'].includes(r.state))) return `rows ${JSON.stringify(now)}`;
            return (await used()) === now.length ? undefined : `used ${await used()} for ${now.length} rows`;
          },
          settledBy - Date.now(),
        );
        assert.match(survivor.stderr(), /settled the work of gone replica/);
        const api = new Api(survivor.url, armed.apiKey);
        for (const s of await listAll(api)) assert.ok(['running', 'paused', 'failed', 'lost'].includes(s.state), `${s.id} is ${s.state}`);
        // More passes change nothing (given back once).
        const settledUsage = await used();
        await new Promise((resolve) => setTimeout(resolve, 4 * PASS_MS));
        assert.equal(await used(), settledUsage, 'given back once');
        for (const s of await listAll(api)) await api.ok('DELETE', `/v1/sandboxes/${s.id}`);
        assert.equal(await used(), 0);
        survivor.child.kill('SIGTERM');
        await survivor.exited;

        // The platform again, on its home: its node's sandboxes have no row and go.
        const again = await up(home, { args });
        try {
          const ids = [...(kept ? [kept] : []), ...left.map((r) => r.id), ...(await readdir(path.join(home, 'node', 'sandboxes')).catch(() => [] as string[]))];
          await settles('nothing of any sandbox is left on the host', () => strandedObjects(home, ids, new Set()), HOST_SETTLE_MS);
        } finally {
          assert.equal(await stop(again, 'SIGTERM'), 0, again.stderr());
        }
      } finally {
        survivor?.child.kill('SIGKILL');
        await removeHome(home, ['--db', url]);
      }
    });
  }

  test(
    'a platform killed at claim.node beside a live replica: the claim and its key settle with its work, and its restart beside the replica clears its node',
    // ~114 s on the loaded 2-core machine, over the suite's budget: DSEC_LONG=1 only.
    { timeout: 300_000, skip: !LONG && 'DSEC_LONG=1 only' },
    async () => {
      const db = 'gone_claim';
      const url = await pg!.createDatabase(db);
      const home = await freshHome('dsec-crash-claim-');
      const replicaHome = await mkdtemp(path.join(dir, 'replica-'));
      const goneConfig = path.join(replicaHome, 'config.json');
      await writeFile(goneConfig, JSON.stringify({ watcher: { intervalMs: PASS_MS, goneReplicaMs: GONE_MS } }));
      const args = ['--db', url, '--config', goneConfig];
      const count = async (where: string): Promise<number> => (await pg!.query(`SELECT count(*)::int AS n FROM ${where}`, db)).rows[0].n as number;
      const key = { 'idempotency-key': 'claim-1' };
      let survivor: Awaited<ReturnType<typeof startReplica>> | undefined;
      try {
        const armed = await up(home, { args, env: { [CRASH_AT_ENV]: 'claim.node' } });
        survivor = await startReplica(replicaHome, args);
        const admin = new Api(armed.url, armed.apiKey);
        await admin.ok('PUT', `/v1/pools/${POOL}`, { spec: BUSYBOX, size: 1 });
        await settles('the pool is ready', async () => ((await count(`sandboxes WHERE state = 'pooled'`)) === 1 ? undefined : 'not yet'), SETTLE_MS);
        const member = (await pg!.query(`SELECT id FROM sandboxes WHERE state = 'pooled'`, db)).rows[0].id as string;
        // The claim reaches the node, and the platform dies before its row says so.
        await admin.call('POST', '/v1/sandboxes', BUSYBOX, key).catch(() => undefined);
        assert.equal((await armed.exited).signal, 'SIGKILL', armed.stderr());

        // The survivor (without the dead platform's node) settles the claim as a create cut short,
        // and the key that waited on it: no row of the member, no pending key, usage equal to the rows.
        await settles(
          "the survivor settles the dead platform's claim and key",
          async () => {
            const left = await count(`sandboxes WHERE id = '${member}'`);
            const pending = await count(`idempotency_keys WHERE state = 'pending'`);
            const used = Number((await pg!.query(`SELECT used_sandboxes FROM projects WHERE id = '${ROOT_PROJECT_ID}'`, db)).rows[0].used_sandboxes);
            const rows = await count('sandboxes');
            return left === 0 && pending === 0 && used === rows ? undefined : `member rows ${left}, pending keys ${pending}, used ${used} for ${rows} rows`;
          },
          GONE_MS + 10_000,
        );

        // Restarted beside the live survivor: its node's sandbox without a row goes at its start.
        const again = await up(home, { args });
        try {
          assert.match(again.stderr(), new RegExp(`reconciled at start: .*orphans destroyed: [^;]*${member}`));
          await settles('nothing of the claimed sandbox is left on the host', () => strandedObjects(home, [member], new Set()), HOST_SETTLE_MS);
          // The retried create gets one new sandbox, and the key keeps it.
          const api = new Api(again.url, armed.apiKey);
          const made = (await api.ok('POST', '/v1/sandboxes', BUSYBOX, key)).body.id as string;
          assert.notEqual(made, member);
          assert.equal((await api.ok('POST', '/v1/sandboxes', BUSYBOX, key)).body.id, made);
          await api.ok('DELETE', `/v1/pools/${POOL}`, undefined, {}, [204, 404]);
          await api.ok('DELETE', `/v1/sandboxes/${made}`);
        } finally {
          assert.equal(await stop(again, 'SIGTERM'), 0, again.stderr());
        }
      } finally {
        survivor?.child.kill('SIGKILL');
        await removeHome(home, ['--db', url]);
      }
    },
  );

  describe('a crash at any point loses nothing and strands nothing', { concurrency: false }, () =>
    crashWalk(pgRuns, () => ({ pg: pg!, args: ['--db', pg!.url(CRASH_DB), '--config', config] })),
  );
});
