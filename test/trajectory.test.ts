// The trajectory log and replay, end to end: an episode of commands and file changes through
// every route is recorded with exit codes, digests and bounded copies; a replay on a fresh
// sandbox reproduces the files and reports the step whose output cannot be the same.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import Database from 'better-sqlite3';
import { StateStore, TrajectoryLog } from '@dsec/apiserver';
import type { TrajectoryHeader } from '@dsec/apiserver';
import { DsecClient, Sandbox, isDsecError } from '@dsec/sdk';
import type { TrajectoryStep } from '@dsec/sdk';
import { REPO_ROOT } from './helpers/node.js';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';
import { apiCall, sh } from './helpers/assert.js';

let platform: TestPlatform;
let client: DsecClient;
const made: Sandbox[] = [];
const SMALL = { cpu: 0.1, memoryMiB: 64, diskMiB: 32 } as const;

const sha256 = (data: string | Buffer): string => createHash('sha256').update(data).digest('hex');

async function create(): Promise<Sandbox> {
  const sb = await Sandbox.create({ image: { base: 'busybox' }, resources: SMALL, env: { TOKEN: 'callers-own' } }, { client });
  made.push(sb);
  return sb;
}

const call = (method: string, route: string, json?: unknown, key = platform.adminKey) => apiCall(platform.url, key, method, route, json);

async function allSteps(sb: Sandbox): Promise<TrajectoryStep[]> {
  const out: TrajectoryStep[] = [];
  for await (const s of sb.trajectory()) out.push(s);
  return out;
}

/** Type, mode, size and content digest of every path below `dir` in a sandbox. */
async function treeOf(sb: Sandbox, dir: string): Promise<string> {
  return sh(
    sb,
    `cd ${dir} && find . | sort | while read -r f; do if [ -d "$f" ]; then echo "$f D"; else echo "$f F $(stat -c '%a %s' "$f") $(md5sum < "$f" | cut -c1-32)"; fi; done`,
  );
}

before(async () => {
  platform = await startTestPlatform();
  client = new DsecClient({ apiUrl: platform.url, apiKey: platform.adminKey, requestTimeoutMs: 120_000 });
});
after(async () => {
  for (const sb of made) await sb.kill().catch(() => undefined);
  await platform?.close();
});

describe('trajectory', () => {
  let source: Sandbox;
  let localDir: string;

  before(async () => {
    localDir = await mkdtemp(path.join(os.tmpdir(), 'dsec-scratch-traj-'));
    await mkdir(path.join(localDir, 'b'));
    await writeFile(path.join(localDir, 'a.txt'), 'alpha\n');
    await writeFile(path.join(localDir, 'b', 'c.txt'), 'gamma\n');
  });
  after(async () => {
    await rm(localDir, { recursive: true, force: true });
  });

  test('an episode of commands and file changes is recorded in order, with exit codes and digests', async () => {
    source = await create();
    await sh(source, 'echo hello'); // 0
    await source.files.makeDir('/work/sub'); // 1
    await source.files.write('/work/notes.txt', 'first line\n'); // 2
    const piped = await source.exec('cat > /work/sub/from-stdin && echo "$STEP $TOKEN"', { stdin: 'piped\n', env: { STEP: 'three' }, cwd: '/work' }); // 3
    assert.equal(piped.stdout, 'three callers-own\n');
    assert.equal((await source.exec('echo failing >&2; exit 3')).exitCode, 3); // 4
    await source.files.uploadDir(localDir, '/work/up'); // 5
    await source.files.rename('/work/notes.txt', '/work/renamed.txt'); // 6
    await source.files.write('/work/tmp', 'x'); // 7
    await source.files.remove('/work/tmp'); // 8
    const streamed: string[] = [];
    const r9 = await source.exec('echo streamed; echo err >&2', { onStdout: (d) => streamed.push(d) }); // 9
    assert.equal(r9.exitCode, 0);
    await sh(source, 'cat /proc/sys/kernel/random/uuid > /work/id; cat /work/id'); // 10
    const ws = await source.spawn('cat > /work/ws.txt; echo done', { stdin: true }); // 11
    await ws.writeStdin('via-ws\n');
    await ws.closeStdin();
    assert.equal((await ws.wait()).exitCode, 0);

    const steps = await allSteps(source);
    assert.deepEqual(
      steps.map((s) => [s.seq, s.kind]),
      [
        [0, 'exec'],
        [1, 'mkdir'],
        [2, 'write'],
        [3, 'exec'],
        [4, 'exec'],
        [5, 'tar'],
        [6, 'rename'],
        [7, 'write'],
        [8, 'remove'],
        [9, 'exec'],
        [10, 'exec'],
        [11, 'exec'],
      ],
    );
    const [s0, s1, s2, s3, s4, s5, s6, , s8, s9, , s11] = steps as TrajectoryStep[] & { length: 12 };
    assert.deepEqual(s0!.command, { cmd: 'echo hello', timeoutMs: 60_000 });
    assert.equal(s0!.via, 'exec');
    assert.deepEqual(s0!.exit, { exitCode: 0, signal: null, timedOut: false, oomKilled: false });
    assert.equal(s0!.stdout?.sha256, sha256('hello\n'));
    assert.equal(s0!.stdout?.base64, Buffer.from('hello\n').toString('base64'));
    assert.equal(s0!.stdout?.partial, false);
    assert.equal(s0!.stderr?.sha256, sha256(''));
    assert.ok(typeof s0!.durationMs === 'number' && s0!.durationMs >= 0);
    assert.ok(!Number.isNaN(Date.parse(s0!.startedAt)));
    assert.equal(s1!.path, '/work/sub');
    assert.equal(s2!.path, '/work/notes.txt');
    assert.equal(s2!.data?.sha256, sha256('first line\n'));
    assert.equal(s3!.command?.cwd, '/work');
    assert.deepEqual(s3!.command?.env, { STEP: 'three' });
    assert.equal(Buffer.from(s3!.stdin!.base64!, 'base64').toString(), 'piped\n');
    assert.equal(s4!.exit?.exitCode, 3);
    assert.equal(Buffer.from(s4!.stderr!.base64!, 'base64').toString(), 'failing\n');
    assert.equal(s5!.path, '/work/up');
    assert.ok((s5!.data?.bytes ?? 0) > 0);
    assert.deepEqual([s6!.from, s6!.to], ['/work/notes.txt', '/work/renamed.txt']);
    assert.equal(s8!.path, '/work/tmp');
    assert.equal(s9!.via, 'stream');
    assert.equal(s9!.stdout?.sha256, sha256('streamed\n'));
    assert.equal(s9!.stderr?.sha256, sha256('err\n'));
    assert.equal(s11!.via, 'ws');
    assert.equal(Buffer.from(s11!.stdin!.base64!, 'base64').toString(), 'via-ws\n');
    assert.equal(s11!.exit?.exitCode, 0);
    assert.ok(steps.every((s) => s.replayable));

    // Pages, and listings without the copies.
    const page = await source.trajectoryPage({ limit: 5 });
    assert.equal(page.items.length, 5);
    assert.equal(page.nextCursor, '4');
    assert.equal(page.steps, 12);
    assert.equal(page.truncated, false);
    assert.equal(page.sandboxState, 'running');
    const next = await source.trajectoryPage({ after: 4, limit: 100, content: false });
    assert.equal(next.items[0]?.seq, 5);
    assert.equal(next.nextCursor, null);
    assert.equal(next.items.find((s) => s.seq === 9)?.stdout?.base64, undefined);
    assert.equal(next.items.find((s) => s.seq === 9)?.stdout?.sha256, sha256('streamed\n'));
  });

  test('replay on a fresh sandbox reproduces the files and reports the divergent step', async () => {
    const seen: number[] = [];
    const replay = await source.replay({ onStep: (s) => seen.push(s.seq) });
    made.push(replay.sandbox);
    assert.notEqual(replay.sandbox.id, source.id);
    assert.equal(replay.fromSeq, -1);
    assert.deepEqual(
      seen,
      replay.steps.map((s) => s.seq),
    );
    assert.equal(replay.steps.length, 12);
    const verdicts = Object.fromEntries(replay.steps.map((s) => [s.seq, s.verdict]));
    assert.equal(verdicts[10], 'output-differs', JSON.stringify(replay.steps[10]));
    for (const s of replay.steps) if (s.seq !== 10) assert.equal(s.verdict, 'same', JSON.stringify(s));
    assert.deepEqual(replay.summary, { same: 11, exitDiffers: 0, outputDiffers: 1, notReplayable: 0 });
    assert.match(replay.steps[10]!.reason ?? '', /stdout/);

    // The replay has a trajectory of its own, step for step.
    assert.deepEqual(
      (await allSteps(replay.sandbox)).map((s) => s.kind),
      (await allSteps(source)).map((s) => s.kind),
    );

    // The files are those of the episode, except the one written from a random id.
    const tree = (t: string) =>
      t
        .split('\n')
        .filter((l) => !l.startsWith('./id '))
        .join('\n');
    assert.equal(tree(await treeOf(replay.sandbox, '/work')), tree(await treeOf(source, '/work')));
    assert.equal(await replay.sandbox.files.read('/work/ws.txt'), 'via-ws\n');
    assert.equal(await replay.sandbox.files.read('/work/up/b/c.txt'), 'gamma\n');
    assert.equal(await replay.sandbox.files.exists('/work/tmp'), false);
    assert.notEqual(await replay.sandbox.files.read('/work/id'), await source.files.read('/work/id'));

    // upTo and stopOnDivergence bound a replay.
    const partial = await source.replay({ upTo: 4 });
    made.push(partial.sandbox);
    assert.deepEqual(
      partial.steps.map((s) => s.seq),
      [0, 1, 2, 3, 4],
    );
    const stopped = await source.replay({ stopOnDivergence: true });
    made.push(stopped.sandbox);
    assert.equal(stopped.steps[stopped.steps.length - 1]?.seq, 10);
  });

  test('a divergent exit code is reported as exit-differs', async () => {
    const sb = await Sandbox.create({ image: { base: 'busybox' }, resources: SMALL, env: { MODE: 'a' } }, { client });
    made.push(sb);
    assert.equal((await sb.exec('test "$MODE" = a')).exitCode, 0);
    await sb.files.write('/after', 'x');
    // A command that cannot start is recorded with its error, and replays to the same error.
    await assert.rejects(sb.exec(['/no/such/program']), (err: unknown) => isDsecError(err, 'FILE_NOT_FOUND'));
    const same = await sb.replay();
    made.push(same.sandbox);
    assert.deepEqual(
      same.steps.map((s) => s.verdict),
      ['same', 'same', 'same'],
    );
    // The same step in a sandbox whose environment differs exits 1.
    const other = await sb.replay({ env: { MODE: 'b' } });
    made.push(other.sandbox);
    assert.equal(other.steps[0]?.verdict, 'exit-differs');
    assert.equal(other.steps[0]?.expected?.exitCode, 0);
    assert.equal(other.steps[0]?.actual?.exitCode, 1);
    assert.match(other.steps[0]?.reason ?? '', /exit 0 recorded, 1 now/);
    assert.equal(other.steps[1]?.verdict, 'same');
    assert.deepEqual(other.summary, { same: 2, exitDiffers: 1, outputDiffers: 0, notReplayable: 0 });

    // A snapshot of another sandbox is no starting point for this one's replay.
    const snap = await source.snapshot();
    const wrong = await call('POST', `/v1/sandboxes/${sb.id}/replay`, { snapshot: snap.digest });
    assert.equal(wrong.status, 400);
    assert.equal(wrong.body.error.field, 'snapshot');
  });

  test('replay from a snapshot re-runs only the steps after it', async () => {
    const sb = await create();
    await sh(sb, 'echo one > /f1');
    const snap = await sb.snapshot();
    assert.equal(snap.snapshot?.seq, 1);
    await sh(sb, 'echo two > /f2; cat /f1');
    const replay = await sb.replay({ snapshot: snap.digest });
    made.push(replay.sandbox);
    assert.equal(replay.fromSeq, 0);
    assert.deepEqual(
      replay.steps.map((s) => [s.seq, s.verdict]),
      [[1, 'same']],
    );
    assert.equal(replay.sandbox.lastInfo?.snapshot, snap.digest);
    assert.equal(await replay.sandbox.files.read('/f1'), 'one\n');
    assert.equal(await replay.sandbox.files.read('/f2'), 'two\n');
  });

  test('the trajectory outlives its sandbox, and replays after it is gone', async () => {
    const sb = await create();
    await sb.files.write('/keep.txt', 'kept\n');
    await sh(sb, 'cat /keep.txt');
    await sb.kill();
    const t = await sb.trajectoryPage();
    assert.equal(t.sandboxState, 'gone');
    assert.ok(t.endedAt !== null);
    assert.equal(t.items.length, 2);
    const replay = await sb.replay();
    made.push(replay.sandbox);
    assert.equal(replay.summary.same, 2);
    assert.equal(await replay.sandbox.files.read('/keep.txt'), 'kept\n');
  });

  test('content past the bound is kept as a digest and is not replayable; a command still running is started again', async () => {
    const sb = await create();
    const big = Buffer.alloc(2 * 1024 * 1024, 'z');
    await sb.files.write('/big', big);
    const bg = await sb.spawn('echo up; sleep 600');
    for await (const ev of bg) if (ev.data.toString().includes('up')) break;
    bg.disconnect();
    const steps = await allSteps(sb);
    assert.equal(steps.length, 2);
    assert.equal(steps[0]?.replayable, false);
    assert.match(steps[0]?.reason ?? '', /over 1048576 bytes/);
    assert.equal(steps[0]?.data?.sha256, sha256(big));
    assert.equal(steps[0]?.data?.partial, true);
    assert.equal(steps[1]?.exit, null);
    assert.equal(steps[1]?.durationMs, null);
    const replay = await sb.replay();
    made.push(replay.sandbox);
    assert.deepEqual(
      replay.steps.map((s) => s.verdict),
      ['not-replayable', 'same'],
    );
    assert.match(replay.steps[1]?.reason ?? '', /running/);
    const procs = await replay.sandbox.processes();
    assert.ok(
      procs.some((p) => p.state === 'running' && p.argv.join(' ').includes('sleep 600')),
      JSON.stringify(procs),
    );
  });

  test('a command whose reader left early is recorded to its end', async () => {
    const sb = await create();
    for (const stdin of [false, true]) {
      // ndjson (no stdin) and WebSocket (stdin: true): the reader goes right after the start.
      const h = await sb.spawn('sleep 0.5; echo late; echo err >&2', { stdin });
      h.disconnect();
    }
    let steps: TrajectoryStep[] = [];
    for (let i = 0; i < 100; i++) {
      steps = await allSteps(sb);
      if (steps.length === 2 && steps.every((s) => s.exit)) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.deepEqual(
      steps.map((s) => s.via),
      ['stream', 'ws'],
    );
    for (const s of steps) {
      assert.equal(s.exit?.exitCode, 0, JSON.stringify(s));
      assert.equal(s.stdout?.sha256, sha256('late\n'));
      assert.equal(s.stderr?.sha256, sha256('err\n'));
      assert.ok(typeof s.durationMs === 'number');
    }
  });

  test('unknown sandboxes are 404, other projects see nothing, bad input is a 400 naming the field', async () => {
    const missing = 'nosuch-0000000000000000';
    assert.equal((await call('GET', `/v1/sandboxes/${missing}/trajectory`)).status, 404);
    const r = await call('POST', `/v1/sandboxes/${missing}/replay`, {});
    assert.equal(r.status, 404);
    assert.equal(r.body.error.code, 'SANDBOX_NOT_FOUND');

    const upTo = await call('POST', `/v1/sandboxes/${source.id}/replay`, { upTo: -1 });
    assert.equal(upTo.status, 400);
    assert.equal(upTo.body.error.field, 'upTo');
    const extra = await call('POST', `/v1/sandboxes/${source.id}/replay`, { nope: true });
    assert.equal(extra.status, 400);
    const limit = await call('GET', `/v1/sandboxes/${source.id}/trajectory?limit=0`);
    assert.equal(limit.status, 400);
    assert.equal(limit.body.error.field, 'query.limit');
    const unknownSnap = await call('POST', `/v1/sandboxes/${source.id}/replay`, { snapshot: `sha256:${'0'.repeat(64)}` });
    assert.equal(unknownSnap.status, 404);

    const p = await call('POST', '/v1/projects', { name: 'traj-other' });
    const viewer = await call('POST', '/v1/keys', { name: 'v', role: 'viewer' });
    const other = await call('POST', '/v1/keys', { name: 'o', role: 'member', project: p.body.id });
    assert.equal((await call('GET', `/v1/sandboxes/${source.id}/trajectory`, undefined, viewer.body.key)).status, 403);
    assert.equal((await call('GET', `/v1/sandboxes/${source.id}/trajectory`, undefined, other.body.key)).status, 404);
    assert.equal((await call('POST', `/v1/sandboxes/${source.id}/replay`, {}, other.body.key)).status, 404);
  });
});

describe('the dsec command', () => {
  /** Runs `dsec args...` against the test platform. */
  const dsec = (args: string[]): Promise<{ code: number; stdout: string; stderr: string }> =>
    new Promise((resolve) => {
      execFile(
        process.execPath,
        [path.join(REPO_ROOT, 'packages/cli/dist/main.js'), ...args],
        { env: { PATH: process.env.PATH ?? '', DSEC_API_URL: platform.url, DSEC_API_KEY: platform.adminKey }, timeout: 60_000 },
        (err, stdout, stderr) => resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
      );
    });

  test('sandbox snapshot, fork, create --snapshot, trajectory and replay', async () => {
    const sb = await create();
    await sh(sb, 'echo from-cli > /cli.txt');
    const snap = await dsec(['sandbox', 'snapshot', sb.id]);
    assert.equal(snap.code, 0, snap.stderr);
    const digest = snap.stdout.trim();
    assert.match(digest, /^sha256:[0-9a-f]{64}$/);
    const created = await dsec(['sandbox', 'create', '--snapshot', digest, '--cpu', '0.1']);
    assert.equal(created.code, 0, created.stderr);
    const fromSnap = await Sandbox.connect(created.stdout.trim(), { client });
    made.push(fromSnap);
    assert.equal(await fromSnap.files.read('/cli.txt'), 'from-cli\n');
    const fork = await dsec(['sandbox', 'fork', sb.id, '--count', '2']);
    assert.equal(fork.code, 0, fork.stderr);
    const ids = fork.stdout.trim().split('\n');
    assert.equal(ids.length, 2);
    for (const id of ids) made.push(await Sandbox.connect(id, { client }));
    const usage = await dsec(['sandbox', 'fork', sb.id, '--count', 'many']);
    assert.equal(usage.code, 2);
    const tooMany = await dsec(['sandbox', 'fork', sb.id, '--count', '1000']);
    assert.equal(tooMany.code, 1);
    assert.match(tooMany.stderr, /INVALID_ARGUMENT: count/);
    const both = await dsec(['sandbox', 'create', '--base', 'busybox', '--snapshot', digest]);
    assert.equal(both.code, 2);

    const log = await dsec(['sandbox', 'trajectory', sb.id]);
    assert.equal(log.code, 0, log.stderr);
    assert.match(log.stdout, /^SEQ +KIND +MS +STEP\n0 +exec +\d+ +echo from-cli > \/cli.txt {2}\[exit 0\]\n$/);
    const replay = await dsec(['sandbox', 'replay', sb.id]);
    assert.equal(replay.code, 0, replay.stderr);
    made.push(await Sandbox.connect(replay.stdout.trim(), { client }));
    assert.match(replay.stderr, /^0\texec\tsame\n/);
    assert.match(replay.stderr, /same 1, exit differs 0, output differs 0, not replayable 0/);
  });
});

describe('trajectory limits', () => {
  test('steps past the limits are not stored, bytes past the limit lose their copies, and the log says truncated', async () => {
    const store = await StateStore.openSqlite(new Database(':memory:'));
    const header = (id: string): TrajectoryHeader => ({
      sandboxId: id,
      projectId: 'root',
      spec: { backend: 'container', image: { base: `sha256:${'a'.repeat(64)}` }, resources: {} },
      layers: [],
      createdAt: new Date().toISOString(),
    });
    const log = new TrajectoryLog(store, async () => undefined, { maxSteps: 3, maxBytes: 4096 });
    try {
      log.open(header('s-steps'));
      for (let i = 0; i < 5; i++) (await log.beginFile('s-steps', 'mkdir', { path: `/d${i}` })).ok();
      const h = await log.header('s-steps');
      assert.equal(h?.steps, 3);
      assert.equal(h?.truncated, 1);
      assert.deepEqual(
        (await log.page('s-steps', -1, 10)).map((s) => s.path),
        ['/d0', '/d1', '/d2'],
      );

      log.open(header('s-bytes'));
      const rec = await log.beginFile('s-bytes', 'write', { path: '/f' });
      for await (const _ of rec.tap(
        (async function* () {
          yield Buffer.alloc(8192, 1);
        })(),
      ))
        assert.ok(_);
      rec.ok();
      const [step] = await log.page('s-bytes', -1, 10);
      assert.equal(step?.data?.base64, undefined);
      assert.equal(step?.data?.sha256, sha256(Buffer.alloc(8192, 1)));
      assert.equal(step?.replayable, false);
      assert.equal((await log.header('s-bytes'))?.truncated, 1);

      // A sandbox that has no trajectory and no row cannot be written to.
      await assert.rejects(log.beginExec('s-none', { cmd: 'true' }, 'exec'), (err: unknown) => isDsecError(err, 'SANDBOX_NOT_FOUND'));

      // Ended trajectories go after the retention time.
      log.end('s-steps');
      await log.flush();
      assert.equal(await log.prune(Date.now() + 8 * 86_400_000), 1);
      assert.equal(await log.header('s-steps'), undefined);
    } finally {
      await log.close();
      await store.close();
    }
  });
});
