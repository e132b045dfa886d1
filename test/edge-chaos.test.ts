// Chaos (issue 13, §4): an edge killed alone. A control plane (`dsec up --node-addr`) and one
// node joined with `dsec edge --join`, both real processes started here; the edge (only it, never
// the control plane) is killed with SIGKILL at random points while work of one kind is in flight
// (creates, execs, an output stream being read, pauses and resumes, deletes: the kinds take turns,
// so every step of each is hit at some round), then started again on the same home. The points
// come from a seeded generator; the seed is printed (DSEC_CHAOS_SEED=<seed> runs the same points
// again). `npm test` runs one round of each kind; DSEC_LONG=1 (npm run test:long) runs 35.
// Running sandboxes keep running through every kill, the stream is read on from its offset with
// nothing lost or repeated, every create, exec, pause, resume and delete either finished (and its
// result holds) or failed cleanly (no sandbox left half-created, half-paused or half-deleted),
// and once everything is deleted nothing of the sandboxes is left on the host: no cgroup,
// container, mount, writable layer, folder, id range, link, saved network policy or nftables
// rule. A second test walks the named kill points of the edge process (EDGE_CRASH_STEPS and the
// container backend's and the node network's BACKEND_CRASH_STEPS, armed with DSEC_TEST_CRASH_AT;
// networked sandboxes, so that every network step is reached): the edge kills itself at each
// step of the create and delete pipelines, with the same checks.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { execFile } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { after, before, describe, test } from 'node:test';
import { DEFAULT_ID_RANGE_DIR, Edge, MNT, ifPrefixOf, mountsUnder, runDirFor, seededRandom, tableOf, umount } from '@dsec/edge';
import { BACKEND_CRASH_STEPS, CRASH_AT_ENV, DsecError, EDGE_CRASH_STEPS } from '@dsec/protocol';
import type { EdgeCrashStep, SandboxSpec } from '@dsec/protocol';
import { DsecClient, Sandbox } from '@dsec/sdk';
import { freePort, hasCgroup, run, stopProc, until, waitFor } from './helpers/cli-process.js';
import type { Proc } from './helpers/cli-process.js';
import { AGENT_BINARY } from './helpers/node.js';

/** The node's name (its cgroup parent, dsec-ct-*, is what scripts/clean-test-leftovers.sh knows). */
const NODE = 'ct-chaos';
const CGROUP_PARENT = `dsec-${NODE}`;
/** Operations of one kind in flight when the edge is killed. */
const IN_FLIGHT = 4;
/** What is in flight at a round's kill; the rounds take them in turn. */
const KINDS = ['create', 'exec', 'stream', 'pause', 'delete'] as const;
type RoundKind = (typeof KINDS)[number];
/** Rounds: one of each kind in `npm test`, 35 (7 of each) under `npm run test:long`. */
const ROUNDS = process.env.DSEC_LONG === '1' ? 35 : KINDS.length;
/**
 * The kill comes this long after the round's work starts, at most (ms; drawn uniformly): about
 * as long as the work takes on this machine, so that the points fall across its steps.
 */
const MAX_KILL_AFTER_MS: Record<RoundKind, number> = { create: 300, exec: 150, stream: 500, pause: 150, delete: 120 };
/** The seed of the kill points: DSEC_CHAOS_SEED to repeat a run, else drawn and printed. */
const SEED = process.env.DSEC_CHAOS_SEED ? Number(process.env.DSEC_CHAOS_SEED) >>> 0 : Math.floor(Math.random() * 2 ** 32);

/** States a sandbox rests in (no operation under way). */
const SETTLED = ['running', 'paused', 'failed', 'lost', 'stopped'];
const BUSYBOX: SandboxSpec = { image: { base: 'busybox' } };
/** A networked sandbox (a link in its namespace, a saved policy): what the named steps create and delete. */
const NETWORKED: SandboxSpec = { ...BUSYBOX, network: { mode: 'allowlist', allow: [{ host: 'example.invalid' }] } };
/** The named kill points of the edge process, in pipeline order: the edge's own, then its backend's and network's. */
const NAMED_STEPS: readonly EdgeCrashStep[] = [...EDGE_CRASH_STEPS, ...BACKEND_CRASH_STEPS];
/** A named step of a delete (a create's otherwise). */
const isDeleteStep = (step: EdgeCrashStep): boolean => /\.(delete|destroy)\./.test(step);
const execFileP = promisify(execFile);

/** Host pids in a sandbox's cgroup (v1 memory controller, or v2). */
async function cgroupPids(id: string): Promise<number[]> {
  for (const dir of [path.join('/sys/fs/cgroup/memory', CGROUP_PARENT, id), path.join('/sys/fs/cgroup', CGROUP_PARENT, id)]) {
    const text = await readFile(path.join(dir, 'cgroup.procs'), 'utf8').catch(() => undefined);
    if (text !== undefined) return text.split('\n').filter(Boolean).map(Number);
  }
  return [];
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

describe('chaos: an edge killed alone', { timeout: process.env.DSEC_LONG === '1' ? 1_200_000 : 240_000 }, () => {
  let dir: string;
  let home: string;
  let edgeHome: string;
  let up: Proc | undefined;
  let edge: Proc | undefined;
  let client: DsecClient;
  let nodeUrl: string;

  const startEdge = async (token?: string, env: Record<string, string> = {}): Promise<void> => {
    edge = run(['edge', '--join', nodeUrl, ...(token ? ['--token', token] : []), '--name', NODE, '--home', edgeHome], env);
    await waitFor(edge, /joined/, 'dsec edge');
  };
  const nodeState = async (): Promise<string | undefined> => (await client.nodes.list()).find((n) => n.name === NODE)?.state;
  /** Kills the edge (only the edge) with SIGKILL and waits for its end. */
  const killEdge = async (): Promise<void> => {
    edge!.child.kill('SIGKILL');
    await edge!.exited;
  };
  /** Starts the edge again on its home (armed with `env`, if given) and waits until the control plane sees it ready. */
  const startReady = async (env: Record<string, string> = {}): Promise<void> => {
    await startEdge(undefined, env);
    await until('the edge ready again', async () => (await nodeState()) === 'ready');
  };
  const api = (): { client: DsecClient } => ({ client });
  const clean = (reason: unknown, what: string): void => assert.ok(reason instanceof DsecError, `a failed ${what} is a clean error: ${String(reason)}`);
  /** Waits until a sandbox is settled (no transitional state) and gives its state, or undefined once it is gone. */
  const settledState = async (id: string): Promise<string | undefined> => {
    const v = await until(`${id} settled`, async () => {
      try {
        const state = (await (await Sandbox.connect(id, api())).info()).state;
        return SETTLED.includes(state) && { state };
      } catch (err) {
        return err instanceof DsecError && err.code === 'SANDBOX_NOT_FOUND' && { state: undefined };
      }
    });
    return v.state;
  };
  /**
   * Creates a kill cut: each finished (a working sandbox) or failed with a clean error, and no
   * listed sandbox of `label` is left half-created: each gets to running (and works) or failed.
   * Every sandbox seen goes into `made`.
   */
  const checkCreates = async (label: Record<string, string>, settled: PromiseSettledResult<unknown>[], made: Sandbox[]): Promise<void> => {
    for (const s of settled) {
      if (s.status === 'fulfilled') made.push(s.value as Sandbox);
      else clean(s.reason, 'create');
    }
    const listed = await until('no listed sandbox left creating', async () => {
      const all = await Sandbox.list({ labels: label }, api()).toArray();
      return all.every((s) => s.state !== 'creating' && s.state !== 'pending') && all;
    });
    for (const s of listed) {
      assert.ok(s.state === 'running' || s.state === 'failed', `${s.id} is ${s.state}`);
      if (s.state === 'running') assert.equal((await (await Sandbox.connect(s.id, api())).exec('echo ok')).stdout, 'ok\n', `${s.id} works`);
      if (!made.some((m) => m.id === s.id)) made.push(await Sandbox.connect(s.id, api()));
    }
  };
  /**
   * A delete a kill cut: one that answered is done; one cut off is done or can be done again
   * (never stuck half-deleted). The sandbox goes into `made`.
   */
  const checkDelete = async (doomed: Sandbox, settled: PromiseSettledResult<unknown>, made: Sandbox[]): Promise<void> => {
    if (settled.status === 'rejected') clean(settled.reason, 'delete');
    const state = await settledState(doomed.id);
    if (settled.status === 'fulfilled') assert.equal(state, undefined, `${doomed.id} was deleted`);
    else if (state !== undefined) await doomed.kill();
    made.push(doomed);
  };

  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-chaos-'));
    home = path.join(dir, 'cp');
    edgeHome = path.join(dir, 'edge');
    const nodePort = await freePort();
    await writeFile(
      path.join(dir, 'config.json'),
      JSON.stringify({
        // The node is away for seconds: unreachable perhaps, never lost.
        cluster: { unreachableAfterMs: 3000, lostAfterMs: 600_000 },
        watcher: { intervalMs: 500, gcIntervalMs: 1000 },
        node: { calls: { prebuild: [] } },
      }),
    );
    up = run(['up', '--addr', '127.0.0.1:0', '--no-prebuild', '--node-addr', `127.0.0.1:${nodePort}`, '--config', path.join(dir, 'config.json'), '--clean'], {
      DSEC_HOME: home,
    });
    const apiUrl = (await waitFor(up, /listening on (http:\/\/\S+)/, 'dsec up'))[1]!;
    nodeUrl = (await waitFor(up, /nodes join on (https:\/\/\S+)/, 'dsec up'))[1]!;
    client = new DsecClient({ apiUrl, apiKey: (await readFile(path.join(home, 'admin.key'), 'utf8')).trim() });
    const local = (await client.nodes.list())[0]!.name;
    await client.nodes.cordon(local);
    await startEdge((await client.nodes.joinToken()).token);
    await until('the edge ready', async () => (await nodeState()) === 'ready');
  });

  after(async () => {
    await stopProc(edge);
    await stopProc(up);
    // Whatever the killed edge left: its home opened once more and shut down.
    if (existsSync(edgeHome)) {
      try {
        const e = await Edge.open({ home: edgeHome, agentBinary: AGENT_BINARY, nodeName: NODE, cgroupParent: CGROUP_PARENT });
        await e.shutdown();
      } catch {
        // nothing of it left to open
      }
    }
    for (const m of (await mountsUnder(dir).catch(() => [])).reverse()) {
      try {
        umount(m, MNT.DETACH);
      } catch {
        // already gone
      }
    }
    await rm(dir, { recursive: true, force: true });
  });

  test('SIGKILL of the edge at seeded random points of creates, execs, a stream, pauses and deletes: sandboxes keep running, nothing is lost or stranded', async (t) => {
    const random = seededRandom(SEED);
    console.log(`edge chaos: seed ${SEED} (DSEC_CHAOS_SEED=${SEED} repeats these kill points), ${ROUNDS} rounds`);
    t.diagnostic(`seed ${SEED}`);
    const conn = { client };
    const sb = await Sandbox.create(BUSYBOX, conn);
    assert.equal((await sb.info()).node, NODE);
    await sb.files.write('/tmp/state', 'before the crash');
    const h = await sb.spawn('i=0; while [ $i -lt 1000000 ]; do echo line-$i; i=$((i+1)); sleep 0.02; done');
    // Everything read of the stream so far, from byte 0: it must be line-0, line-1, ... to the end.
    let streamed = '';
    for await (const ev of h) {
      streamed += Buffer.from(ev.data).toString();
      if (streamed.includes('line-5\n')) break;
    }
    // Its lasting processes (the agent and the loop's shell; each `sleep` ends by itself).
    const pids: number[] = [];
    for (const pid of await cgroupPids(sb.id)) {
      if ((await readFile(`/proc/${pid}/comm`, 'utf8').catch(() => 'sleep\n')) !== 'sleep\n') pids.push(pid);
    }
    assert.ok(pids.length >= 2, `the sandbox's processes: ${pids.join(' ')}`);
    // A second sandbox that execs, pauses and resumes go to.
    const worker = await Sandbox.create({ ...BUSYBOX, labels: { chaos: 'worker' } }, conn);

    const made: Sandbox[] = [worker];

    for (let round = 0; round < ROUNDS; round++) {
      const kind: RoundKind = KINDS[round % KINDS.length]!;
      const delayMs = Math.floor(random() * MAX_KILL_AFTER_MS[kind]);
      const label = { chaos: `round-${round}` };
      // Set-up that must not be cut: the sandboxes a delete round deletes.
      const doomed = kind === 'delete' ? await Promise.all(Array.from({ length: 2 }, () => Sandbox.create({ ...BUSYBOX, labels: label }, conn))) : [];
      // Pause rounds alternate: a pause in flight, then (the worker paused first) a resume in flight.
      const pausedBefore = kind === 'pause' && Math.floor(round / KINDS.length) % 2 === 1;
      if (pausedBefore) await worker.pause();
      // The work in flight, started now; the edge (only the edge) killed after `delayMs`.
      let work: Promise<PromiseSettledResult<unknown>[]>;
      let reader: { abort: AbortController; done: Promise<void> } | undefined;
      if (kind === 'create') work = Promise.allSettled(Array.from({ length: IN_FLIGHT }, () => Sandbox.create({ ...BUSYBOX, labels: label }, conn)));
      else if (kind === 'exec')
        work = Promise.allSettled(Array.from({ length: IN_FLIGHT }, (_, i) => worker.exec(`echo exec-${round}-${i}; sleep 0.1; echo done`)));
      else if (kind === 'pause') work = Promise.allSettled([pausedBefore ? worker.resume() : worker.pause()]);
      else if (kind === 'delete') work = Promise.allSettled(doomed.map((d) => d.kill()));
      else {
        const abort = new AbortController();
        const handle = await sb.attach(h.pid, { fromStdout: streamed.length, signal: abort.signal });
        const done = (async () => {
          for await (const ev of handle) streamed += Buffer.from(ev.data).toString();
        })().catch(() => undefined);
        reader = { abort, done };
        work = Promise.resolve([]);
      }
      await new Promise((r) => setTimeout(r, delayMs));
      await killEdge();
      assert.ok(
        pids.every((pid) => alive(pid)),
        'every lasting process of the sandbox outlives its edge',
      );
      await startReady();
      const settled = await work;
      const failed = settled.flatMap((s) => (s.status === 'rejected' ? [(s.reason as DsecError).code ?? String(s.reason)] : []));

      if (kind === 'create') {
        await checkCreates(label, settled, made);
      } else if (kind === 'exec') {
        // An exec that answered has its whole output; one that did not is a clean error.
        settled.forEach((s, i) => {
          if (s.status === 'fulfilled') assert.equal((s.value as { stdout: string }).stdout, `exec-${round}-${i}\ndone\n`);
          else clean(s.reason, 'exec');
        });
      } else if (kind === 'pause') {
        // The pause (or resume) happened or did not: the sandbox settles in running or paused, and
        // a resume brings it back working.
        if (settled[0]!.status === 'rejected') clean(settled[0]!.reason, pausedBefore ? 'resume' : 'pause');
        const state = await settledState(worker.id);
        assert.ok(state === 'running' || state === 'paused', `the worker is ${state}`);
        if (settled[0]!.status === 'fulfilled') assert.equal(state, pausedBefore ? 'running' : 'paused', 'an answered pause/resume holds');
        if (state === 'paused') await worker.resume();
      } else if (kind === 'delete') {
        for (const [i, d] of doomed.entries()) await checkDelete(d, settled[i]!, made);
      } else {
        // The stream was cut (or read on through it): it is read again from the byte offset
        // reached, below, with nothing lost or repeated.
        reader!.abort.abort();
        await reader!.done;
      }
      assert.equal((await worker.exec('echo ok')).stdout, 'ok\n', 'the worker works after the kill');
      t.diagnostic(
        `round ${round} (${kind}, kill after ${delayMs} ms): ${settled.length - failed.length} of ${settled.length} answered; failed: ${failed.join(' ') || 'none'}`,
      );
    }

    // The sandbox ran on: its file, its processes, and its stream from the offset.
    assert.equal((await sb.info()).state, 'running');
    assert.equal(await sb.files.read('/tmp/state'), 'before the crash');
    const mark = streamed.length;
    const again = await sb.attach(h.pid, { fromStdout: mark });
    for await (const ev of again) {
      streamed += Buffer.from(ev.data).toString();
      if (streamed.length > mark + 200 && streamed.endsWith('\n')) break;
    }
    const lines = streamed.split('\n').filter(Boolean);
    assert.ok(lines.length > 10, `the stream was read: ${streamed.slice(0, 80)}`);
    assert.deepEqual(
      lines,
      lines.map((_, i) => `line-${i}`),
      'no line lost or repeated across every kill',
    );
    await again.kill();

    // Everything deleted: nothing of any sandbox left on the host.
    const ids = [sb.id, ...made.map((m) => m.id)];
    await sb.kill();
    for (const m of made) await m.kill().catch(() => undefined);
    await nothingLeft(ids);
  });

  test("SIGKILL of the edge at each named step of its create and delete pipelines, its backend's and its network's (DSEC_TEST_CRASH_AT): each create and delete finishes or fails cleanly, nothing is stranded", async (t) => {
    const made: Sandbox[] = [];
    /** Waits for the armed edge to kill itself at `step`. */
    const reached = async (step: EdgeCrashStep): Promise<void> => {
      let timer: NodeJS.Timeout | undefined;
      const code = await Promise.race([edge!.exited, new Promise<'alive'>((r) => (timer = setTimeout(() => r('alive'), 60_000)))]);
      // (A timer left pending would keep the test process alive for its 60 s.)
      clearTimeout(timer);
      assert.notEqual(code, 'alive', `the edge reached ${step} within 60 s`);
      assert.equal(edge!.child.signalCode, 'SIGKILL', `the edge killed itself at ${step}`);
    };
    const outcome = (s: PromiseSettledResult<unknown>): string => (s.status === 'fulfilled' ? 'answered' : `failed (${(s.reason as DsecError).code})`);
    // Creates first. The edge started again after a create step's kill is armed at the next
    // one at once: a restarting edge makes nothing (it adopts what a cut create left, and the
    // control plane only destroys what failed), so no start reaches a create step; except the
    // link step (adopting a container cut before its link links it), which goes first.
    const creates = NAMED_STEPS.filter((s) => !isDeleteStep(s)).sort((a, b) => Number(b === 'network.link.attached') - Number(a === 'network.link.attached'));
    await killEdge();
    await startReady({ [CRASH_AT_ENV]: creates[0]! });
    for (const [i, step] of creates.entries()) {
      const began = Date.now();
      const label = { chaos: step };
      const work = Promise.allSettled([Sandbox.create({ ...NETWORKED, labels: label }, api())]);
      await reached(step);
      const next = creates[i + 1];
      await startReady(next ? { [CRASH_AT_ENV]: next } : {});
      const settled = await work;
      await checkCreates(label, settled, made);
      t.diagnostic(`${step}: the create ${outcome(settled[0])} (${Date.now() - began} ms)`);
    }
    // Deletes, each armed on its own: the edge started again finishes the delete a kill cut
    // short (the control plane asks it again), which would reach the next step.
    for (const step of NAMED_STEPS.filter(isDeleteStep)) {
      const began = Date.now();
      const label = { chaos: step };
      // The sandbox the step deletes, made before the edge is armed.
      const doomed = await Sandbox.create({ ...NETWORKED, labels: label }, api());
      await killEdge();
      await startReady({ [CRASH_AT_ENV]: step });
      const work = Promise.allSettled([doomed.kill()]);
      await reached(step);
      await startReady();
      const settled = await work;
      await checkDelete(doomed, settled[0], made);
      t.diagnostic(`${step}: the delete ${outcome(settled[0])} (${Date.now() - began} ms)`);
    }
    for (const m of made) await m.kill().catch(() => undefined);
    await nothingLeft(made.map((m) => m.id));
  });

  /**
   * Nothing of the sandboxes `ids` left on the host: no cgroup, container, writable layer, folder,
   * mount, link (the node's links of sandboxes are `<prefix><slot in hex>`), saved network policy
   * or nftables rule naming one of those links (the node's table matches them by prefix only).
   */
  const nothingLeft = async (ids: string[]): Promise<void> => {
    const runDir = runDirFor(edgeHome);
    const tag = path.basename(runDir);
    const prefix = ifPrefixOf(tag);
    const leftovers = async (): Promise<Record<string, string[]>> => {
      const links = (await execFileP('ip', ['-o', 'link', 'show'])).stdout
        .split('\n')
        .map((l) => /^\d+:\s+([^:@\s]+)/.exec(l)?.[1] ?? '')
        .filter((name) => name.startsWith(prefix) && /^[0-9a-f]+$/.test(name.slice(prefix.length)));
      const table = await execFileP('nft', ['list', 'table', 'inet', tableOf(tag)]).then(
        (r) => r.stdout,
        () => '',
      );
      return {
        cgroups: ids.filter((id) => hasCgroup(CGROUP_PARENT, id)),
        containers: (await readdir(path.join(runDir, 'crun')).catch(() => [] as string[])).filter((c) => !c.startsWith('fn-')),
        writable: await readdir(path.join(runDir, 'rw')).catch(() => [] as string[]),
        folders: await readdir(path.join(edgeHome, 'sandboxes')).catch(() => [] as string[]),
        mounts: (await mountsUnder(path.join(runDir, 'rw'))).concat(await mountsUnder(path.join(edgeHome, 'sandboxes'))),
        links,
        policies: (await readdir(path.join(edgeHome, 'net')).catch(() => [] as string[])).filter((f) => ids.some((id) => f.startsWith(id))),
        rules: table.split('\n').filter((l) => new RegExp(`${prefix}[0-9a-f]`).test(l)),
      };
    };
    let last: Record<string, string[]> = {};
    await until('nothing of the sandboxes left on the host', async () => {
      last = await leftovers();
      return Object.values(last).every((v) => v.length === 0);
    }).catch((err: unknown) => {
      throw new Error(`${(err as Error).message}: ${JSON.stringify(last)}`);
    });
    // No id range of the node's is still claimed (its claims name its home).
    const claims = await readdir(DEFAULT_ID_RANGE_DIR).catch(() => [] as string[]);
    for (const c of claims) {
      const owner = (await readFile(path.join(DEFAULT_ID_RANGE_DIR, c), 'utf8').catch(() => '')).split('\n')[0];
      assert.ok(owner !== path.resolve(edgeHome), `id range ${c} still claimed for ${owner}`);
    }
  };
});
