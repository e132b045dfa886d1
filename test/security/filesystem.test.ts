// Adversarial suite: files. Searching everything for answers planted outside the sandbox,
// reaching another sandbox's files, tampering with the grader and the toolchain, and leaving
// files and processes behind for the next episode.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { chmod, mkdir, mkdtemp, readdir, readFile, readlink, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, afterEach, before, describe, test } from 'node:test';
import { MAX_SERVER_RESTARTS } from '@dsec/edge';
import { REPO_ROOT } from '../helpers/node.js';
import {
  mountinfoHostPathLines,
  KIT,
  KIT_BINARY,
  KIT_IMAGE,
  destroyAndCheck,
  expectEvent,
  hex,
  hostProcessesNamed,
  newCanary,
  probe,
  probes,
  startSecurityNode,
  uniqueProcessName,
} from './fixture.js';
import type { SecurityNode } from './fixture.js';

let sec: SecurityNode;
let scratch: string;

/** The task's workspace: the answer goes to /project/answer.txt, the grader is /project/tests. */
const GRADER = '/project/tests/run.sh';
/** The test runner: runs every test_*.sh and passes only if all do. */
const RUNNER = '#!/bin/sh\nfor t in /project/tests/test_*.sh; do sh "$t" || { echo FAIL; exit 1; }; done\necho PASS\n';
/** What the grader prints for an unsolved task. */
const UNSOLVED = 'FAIL';

before(async () => {
  sec = await startSecurityNode();
  scratch = await mkdtemp(path.join(os.tmpdir(), 'dsec-scratch-fs-'));
  // A workspace with a test runner, as an RL task ships one: it runs every test_*.sh and
  // passes only if all do. The task here (write 42 to /project/answer.txt) is left unsolved.
  const ws = path.join(scratch, 'ws');
  await mkdir(path.join(ws, 'project/tests'), { recursive: true });
  await writeFile(path.join(ws, 'project/tests/run.sh'), RUNNER);
  await writeFile(path.join(ws, 'project/tests/test_answer.sh'), '#!/bin/sh\n[ "$(cat /project/answer.txt 2>/dev/null)" = 42 ]\n');
  await chmod(path.join(ws, 'project/tests/run.sh'), 0o755);
  // A stand-in for the interpreter the tests run under (busybox has no python).
  const tk = path.join(scratch, 'py');
  await mkdir(path.join(tk, 'usr/bin'), { recursive: true });
  await writeFile(path.join(tk, 'usr/bin/python3'), '#!/bin/sh\nexec sh "$@"\n', { mode: 0o755 });
  await sec.edge.layers.build({ type: 'dir', path: ws }, { kind: 'workspace', name: 'task' });
  await sec.edge.layers.build({ type: 'dir', path: tk }, { kind: 'toolkit', name: 'python-stand-in' });
});

after(async () => {
  try {
    await sec?.cleanup();
  } finally {
    if (scratch) await rm(scratch, { recursive: true, force: true });
  }
});

afterEach(async () => {
  await sec.verifyContained();
});

describe('searching for answers', () => {
  test('a search of the whole file system, /proc/*/environ and mountinfo finds none of the canaries planted outside the sandbox (and does not crash anything)', async () => {
    // Answers an agent would look for, planted where a platform keeps things: the node's home
    // (next to its layer store and its sandboxes), this process's environment (edge runs in
    // it, and so do crun and the launcher it starts), and another sandbox's files and env.
    const canary = newCanary();
    await writeFile(path.join(sec.node.home, 'expected_output.txt'), `${canary}\n`);
    await writeFile(path.join(sec.node.home, 'sandboxes', 'answers.json'), JSON.stringify({ answer: canary }));
    process.env.DSEC_TEST_ANSWER = canary;
    const victim = await sec.sandbox({ env: { ANSWER: canary } });
    await sec.sh(victim, `echo ${canary} > /root/solution.txt`);
    // A control: the same search must find a canary that is inside the attacker's sandbox.
    const control = newCanary();
    const attacker = await sec.sandbox();
    try {
      await sec.sh(attacker, `echo ${control} > /root/control.txt`);
      const needles = [canary, sec.hostCanary, sec.bystanderSecret, control].map(hex).join(',');
      const r = await sec.kit(attacker, ['scan', needles, '/'], { timeoutMs: 120_000 });
      const scan = probe(r, 'scan');
      const hits = probes(r).filter((p) => p.probe === 'hit');
      assert.deepEqual(
        hits.map((h) => [h.path, h.needle]),
        [['/root/control.txt', 3]],
        'only the control canary, in the sandbox itself, is found',
      );
      assert.ok(Number(scan.files) > 1000 && Number(scan.dirs) > 100, `the search covered the file system: ${JSON.stringify(scan)}`);
      // The same, the way an agent would type it, over /proc/*/environ and mountinfo.
      const direct = await sec.sh(
        attacker,
        `cat /proc/*/environ /proc/self/mountinfo /proc/1/mountinfo 2>/dev/null | grep -c -e ${canary} -e ${sec.hostCanary} -e ${sec.bystanderSecret}`,
      );
      assert.equal(direct.stdout.trim(), '0');
    } finally {
      delete process.env.DSEC_TEST_ANSWER;
      await sec.edge.destroy(attacker);
      await sec.edge.destroy(victim);
    }
  });

  test('mountinfo names no host path (the layer store, the run directory, the repository), a protected path and its binds included', async () => {
    // main: overlay options showed the layers' and the upper dir's host paths, and the agent's
    // bind its path in the repository. Now the overlay names its layers /proc/self/fd/N and
    // chronus is bound from a tmpfs of its own.
    const attacker = await sec.sandbox({ protect: { readOnly: ['/etc'] } });
    try {
      const r = await sec.sh(attacker, 'cat /proc/self/mountinfo; echo ---; cat /proc/1/mountinfo');
      assert.equal(r.exitCode, 0, r.stderr);
      assert.match(r.stdout, / - overlay dsec-[0-9a-f]{16} [^ ]*lowerdir=\/proc\/self\/fd\/\d+/, `the root overlay:\n${r.stdout}`);
      const leaks = mountinfoHostPathLines(r.stdout, [sec.node.home, REPO_ROOT, '/run/dsec', os.tmpdir() + '/dsec-']);
      assert.deepEqual(leaks, [], `mountinfo shows host paths:\n${r.stdout}`);
    } finally {
      await sec.edge.destroy(attacker);
    }
  });
});

describe("another sandbox's files", () => {
  test("another sandbox's files, shared memory and processes cannot be reached: its upper dir's host path does not exist inside, /dev/shm and /proc are private", async () => {
    const victim = sec.bystander;
    await sec.sh(victim, `echo ${sec.bystanderSecret} > /dev/shm/secret`);
    const attacker = await sec.sandbox();
    try {
      const upper = sec.edge.upperDir(victim);
      const hostFile = path.join(upper, 'root/sentinel');
      assert.equal((await readFile(hostFile, 'utf8')).trim(), sec.bystanderSecret, 'the host path is right');
      const r = await sec.sh(
        attacker,
        `${KIT} read ${hostFile}; ${KIT} read ${path.join(sec.node.home, 'sandboxes', victim, 'sandbox.json')}; ls -A /dev/shm | wc -l; ls -d /proc/[0-9]* | wc -l; pidof sleep || echo no-sleep`,
      );
      assert.deepEqual(
        probes(r).map((p) => p.result),
        ['ENOENT', 'ENOENT'],
      );
      const [shm, procs, sleep] = r.stdout.split('\n').filter((l) => !l.startsWith('{'));
      assert.equal(shm, '0', "the other sandbox's /dev/shm is not visible");
      // chronus, the shell and the two in the pipe: the sandbox's own pid namespace.
      assert.ok(Number(procs) <= 5, `only the attacker's own processes are visible (${procs})`);
      assert.equal(sleep, 'no-sleep', "the bystander's sleep is not visible");
    } finally {
      await sec.sh(victim, 'rm -f /dev/shm/secret');
      await sec.edge.destroy(attacker);
    }
  });

  test("writing over a file of a shared layer changes the writer's copy only: the layer on the host and other sandboxes keep the original", async () => {
    const attacker = await sec.sandbox();
    try {
      const w = await sec.sh(attacker, `echo '#!/bin/sh' > ${KIT}; echo 'echo pwned' >> ${KIT}; ${KIT}`);
      assert.equal(w.stdout, 'pwned\n');
      const kitSha = createHash('sha256')
        .update(await readFile(KIT_BINARY))
        .digest('hex');
      const layer = await sec.edge.layers.resolve(KIT_IMAGE.toolkits[0]!);
      const onHost = path.join(sec.node.home, 'layers/mnt', layer.digest.replace('sha256:', ''), 'opt/attack/kit');
      assert.equal(
        createHash('sha256')
          .update(await readFile(onHost))
          .digest('hex'),
        kitSha,
        'the shared layer is unchanged',
      );
      const other = await sec.kit(sec.bystander, ['syscall', 'bpf']);
      assert.equal(probe(other, 'bpf').result, 'EPERM', 'another sandbox still runs the real kit');
    } finally {
      await sec.edge.destroy(attacker);
    }
  });
});

describe('poisoning the next episode', () => {
  test('files and processes left by one sandbox are not seen by the next sandbox from the same image, and no process outlives its sandbox', async () => {
    const survivor = uniqueProcessName('poison');
    const first = await sec.sandbox();
    const poison = [
      'echo poison > /tmp/poison',
      'echo "echo poisoned" >> /root/.profile',
      'echo "evil:x:0:0::/root:/bin/sh" >> /etc/passwd',
      'echo poison > /dev/shm/poison',
      'mkdir -p /project && echo poison > /project/answer.txt',
      `${KIT} doublefork ${survivor} >/dev/null`,
      // Last, as it breaks every later shell in this sandbox.
      'printf "#!/bin/busybox sh\\necho poisoned\\n" > /bin/sh.new && mv /bin/sh.new /bin/sh',
    ];
    const r = await sec.sh(first, poison.join(' && '));
    assert.equal(r.exitCode, 0, r.stderr);
    assert.equal((await hostProcessesNamed(survivor)).length, 1, 'the survivor runs on the host until its sandbox goes');
    await destroyAndCheck(sec, first, [survivor]);

    const next = await sec.sandbox();
    const check = await sec.edge.exec(next, {
      argv: ['/bin/sh', '-c', 'ls /tmp /dev/shm; cat /project/answer.txt /root/.profile 2>&1; grep -c evil /etc/passwd; ps -o comm | tail -n +2'],
    });
    assert.equal(check.exitCode, 0, check.stderr);
    const lines = check.stdout.split('\n');
    assert.ok(!check.stdout.includes('poison'), `nothing of the first sandbox is left:\n${check.stdout}`);
    assert.ok(lines.includes('0'), 'no evil account');
    assert.ok(!lines.includes(survivor), 'no survivor process');
    await sec.edge.destroy(next);
  });
});

/** The task's image: the workspace with its grader, the interpreter, the kit. */
const TASK_IMAGE = { base: 'busybox', workspace: 'task', toolkits: ['python-stand-in', KIT_IMAGE.toolkits[0]!] };

/** Creates a sandbox with the task image and the grader's tree protected. */
async function protectedTaskSandbox(): Promise<string> {
  return sec.sandbox({
    image: TASK_IMAGE,
    // Read-only: the grader's tree and the interpreter. Watched: where a fake-pass hook would
    // go that the task itself may legitimately write (site-packages, the project root).
    protect: { readOnly: ['/project/tests', '/usr/bin'], watch: ['/usr/lib/python3', '/project/conftest.py'] },
  });
}

/** Waits for the protected-path.write event raised (after event `since`) for a refused `op` on `file`. */
async function refusal(id: string, file: string, op: string, since: number): Promise<void> {
  const deadline = Date.now() + 5_000;
  const raised = (): boolean =>
    sec.events.events
      .slice(since)
      .some((e) => e.kind === 'protected-path.write' && e.sandboxId === id && e.data?.path === file && (e.data.ops as string[] | undefined)?.includes(op));
  while (!raised()) {
    const seen = sec.events.events.slice(since).filter((e) => e.sandboxId === id);
    if (Date.now() > deadline) assert.fail(`no protected-path.write for ${op} of ${file}; raised: ${JSON.stringify(seen.map((e) => [e.kind, e.data]))}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** The host pid of the server of a sandbox's read-only protected paths (the one writing its refusal log). */
async function rofsServerOf(id: string): Promise<number> {
  const log = path.join(sec.node.home, 'sandboxes', id, 'refused-writes.log');
  for (const pid of await hostProcessesNamed('dsec-rofs')) {
    const fds = await readdir(`/proc/${pid}/fd`).catch(() => [] as string[]);
    for (const fd of fds) if ((await readlink(`/proc/${pid}/fd/${fd}`).catch(() => '')) === log) return pid;
  }
  assert.fail(`no dsec-rofs process writes ${log}`);
}

/** Waits (at most 5 s) for process `pid` to exit; whether it did. */
async function exited(pid: number): Promise<boolean> {
  const deadline = Date.now() + 5_000;
  while (processAlive(pid) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  return !processAlive(pid);
}

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Runs the grader the way the platform would after the episode. */
async function grade(id: string): Promise<string> {
  return (await sec.edge.exec(id, { argv: [GRADER] })).stdout.trim();
}

describe('the grader and the toolchain', () => {
  test('overwriting the test runner in a protected path fails (write, truncate, rename over, delete, replace the directory); the grader still fails an unsolved task', async () => {
    const id = await protectedTaskSandbox();
    try {
      const attempts = [
        `echo 'echo PASS' > ${GRADER}`,
        `: > ${GRADER}`,
        `printf '#!/bin/sh\\necho PASS\\n' > /tmp/r && mv /tmp/r ${GRADER}`,
        `rm -f ${GRADER}`,
        'mv /project/tests /project/tests.orig',
        `ln -sf /tmp/r ${GRADER}`,
        `chmod 777 ${GRADER}`,
      ];
      for (const cmd of attempts) {
        const r = await sec.sh(id, cmd);
        assert.notEqual(r.exitCode, 0, `${cmd} must fail`);
        const now = await sec.sh(id, `cat ${GRADER}; stat -c %a ${GRADER}`);
        assert.equal(now.stdout, `${RUNNER}755\n`, `after ${cmd} the runner is the original`);
      }
      assert.equal(await grade(id), UNSOLVED);
    } finally {
      await sec.edge.destroy(id);
    }
  });

  test('overwriting python3 in a protected path fails; the interpreter is the original', async () => {
    const id = await protectedTaskSandbox();
    try {
      for (const cmd of ['cp /bin/true /usr/bin/python3', 'echo "exit 0" > /usr/bin/python3', 'rm /usr/bin/python3', 'mv /bin/busybox /usr/bin/python3']) {
        const r = await sec.sh(id, cmd);
        assert.notEqual(r.exitCode, 0, `${cmd} must fail`);
      }
      const py = await sec.sh(id, 'cat /usr/bin/python3');
      assert.equal(py.stdout, '#!/bin/sh\nexec sh "$@"\n');
    } finally {
      await sec.edge.destroy(id);
    }
  });

  test('a fake-pass conftest.py or sitecustomize.py (or test_*.sh) cannot be left in the protected tests tree; one left where the task may write (site-packages, the project root) raises protected-path.write', async (t) => {
    const id = await protectedTaskSandbox();
    try {
      for (const file of ['conftest.py', 'sitecustomize.py', 'test_zzz.sh', '.hidden/conftest.py']) {
        const r = await sec.sh(id, `mkdir -p $(dirname /project/tests/${file}) && echo 'import sys; sys.exit(0)' > /project/tests/${file}`);
        assert.notEqual(r.exitCode, 0, `${file} must not be created`);
      }
      // Replacing a test with one that passes is the same attack.
      const r = await sec.sh(id, 'echo "exit 0" > /project/tests/test_answer.sh');
      assert.notEqual(r.exitCode, 0);
      assert.equal(await grade(id), UNSOLVED);
      // Outside the read-only tree the write succeeds (installing packages must work) and is seen.
      const hooks = ['/usr/lib/python3/site-packages/sitecustomize.py', '/project/conftest.py'];
      const w = await sec.sh(id, hooks.map((h) => `mkdir -p $(dirname ${h}) && echo 'import sys; sys.exit(0)' > ${h}`).join(' && '));
      assert.equal(w.exitCode, 0, w.stderr);
      for (const h of hooks) await expectEvent(t, sec.events, 'protected-path.write', id, { path: h });
    } finally {
      await sec.edge.destroy(id);
    }
  });

  test('a refused write, truncate, rename over or unlink of the read-only grader is raised as protected-path.write with its path', async () => {
    const id = await protectedTaskSandbox();
    try {
      // Each attempt refused, and each raised on its own: the op the server refused is named.
      const attempts: Array<[string, string]> = [
        [`echo 'echo PASS' > ${GRADER}`, 'open-write'],
        [`${KIT} reopen ${GRADER} /tmp`, 'truncate'],
        ['mv /project/tests/test_answer.sh /project/tests/run.sh', 'rename'],
        [`rm -f ${GRADER}`, 'unlink'],
        [`chmod 777 ${GRADER}`, 'setattr'],
      ];
      for (const [cmd, op] of attempts) {
        const since = sec.events.events.length;
        const r = await sec.sh(id, cmd);
        if (cmd.startsWith(KIT)) for (const p of probes(r)) assert.notEqual(p.result, 'OK', `${p.probe} must fail`);
        else assert.notEqual(r.exitCode, 0, `${cmd} must fail`);
        await refusal(id, GRADER, op, since);
        const now = await sec.sh(id, `cat ${GRADER}; stat -c %a ${GRADER}`);
        assert.equal(now.stdout, `${RUNNER}755\n`, `after ${cmd} the runner is the original`);
      }
      // By other names: an O_PATH descriptor reopened for writing, and a hard link (refused:
      // another mount). The reopened write is raised too.
      const since = sec.events.events.length;
      const routes = await sec.sh(id, `${KIT} reopen ${GRADER} /tmp`);
      const results = Object.fromEntries(probes(routes).map((p) => [p.probe, p.result]));
      assert.deepEqual(results, { 'reopen-write': 'EROFS', 'reopen-truncate': 'EROFS', 'hardlink-write': 'EXDEV' });
      await refusal(id, GRADER, 'open-write', since);
      // Creating beside it is raised with the new path.
      const created = sec.events.events.length;
      assert.notEqual((await sec.sh(id, 'echo x > /project/tests/conftest.py')).exitCode, 0);
      await refusal(id, '/project/tests/conftest.py', 'create', created);
      assert.equal(await grade(id), UNSOLVED);
    } finally {
      await sec.edge.destroy(id);
    }
  });

  test("a sandbox's protected-path server cannot stall another's and ends with its sandbox", async () => {
    const live = [await protectedTaskSandbox(), await protectedTaskSandbox()];
    const [a, b] = live as [string, string];
    try {
      const server = await rofsServerOf(a);
      // Stopped: a's protected paths wait on it, b's are answered by its own server.
      process.kill(server, 'SIGSTOP');
      try {
        const started = Date.now();
        assert.equal(await grade(b), UNSOLVED);
        assert.ok(Date.now() - started < 2_000, "b's grader runs while a's server is stopped");
      } finally {
        process.kill(server, 'SIGCONT');
      }
      // b's server goes with b.
      const bServer = await rofsServerOf(b);
      live.pop();
      await sec.edge.destroy(b);
      assert.ok(await exited(bServer), "b's server exits with b");
    } finally {
      for (const id of live) await sec.edge.destroy(id);
    }
  });

  test('a killed protected-path server is restarted: the grader is readable again within 2 s and writes are still refused and raised; past 3 restarts a minute it stays gone', async (t) => {
    const id = await protectedTaskSandbox();
    try {
      for (let kill = 1; kill <= MAX_SERVER_RESTARTS; kill++) {
        const server = await rofsServerOf(id);
        const since = sec.events.events.length;
        const killedAt = Date.now();
        process.kill(server, 'SIGKILL');
        // Fail closed meanwhile: whether it answers "not connected" or its new server refuses.
        assert.notEqual((await sec.sh(id, `echo 'echo PASS' > ${GRADER}`)).exitCode, 0, `a write right after kill ${kill}`);
        const deadline = Date.now() + 2_000;
        let r = await sec.sh(id, `cat ${GRADER}`);
        while (r.stdout !== RUNNER && Date.now() < deadline) {
          await new Promise((res) => setTimeout(res, 50));
          r = await sec.sh(id, `cat ${GRADER}`);
        }
        assert.equal(r.stdout, RUNNER, `after kill ${kill} the grader is readable again within 2 s (${r.stderr.trim()})`);
        t.diagnostic(`kill ${kill}: the grader readable again after ${Date.now() - killedAt} ms`);
        await sec.events.waitFor('protected-path.server-restarted', id, { restarts: kill, limit: MAX_SERVER_RESTARTS }, 2_000);
        assert.notEqual(await rofsServerOf(id), server, 'a new server');
        const written = sec.events.events.length;
        assert.notEqual((await sec.sh(id, `echo 'echo PASS' > ${GRADER}`)).exitCode, 0, `a write after restart ${kill}`);
        await refusal(id, GRADER, 'open-write', written);
        assert.equal(await grade(id), UNSOLVED);
        assert.ok(!sec.events.events.slice(since).some((e) => e.kind === 'protected-path.server-gone' && e.sandboxId === id));
      }
      // The 4th death within the minute is raised and left: the paths answer "not connected".
      process.kill(await rofsServerOf(id), 'SIGKILL');
      const gone = await sec.events.waitFor('protected-path.server-gone', id, {}, 2_000);
      assert.equal(gone.severity, 'critical');
      assert.match(String(gone.data?.why), new RegExp(`restarted ${MAX_SERVER_RESTARTS} times`));
      const r = await sec.sh(id, `cat ${GRADER}; echo 'echo PASS' > ${GRADER}`);
      assert.notEqual(r.exitCode, 0);
      assert.match(r.stderr, /not connected/i);
      assert.equal(sec.events.events.filter((e) => e.kind === 'protected-path.server-restarted' && e.sandboxId === id).length, MAX_SERVER_RESTARTS);
    } finally {
      await sec.edge.destroy(id);
    }
  });

  test('FIFOs made in the writable layer survive a snapshot; restored under a protected tree, one carries data and a reader waiting on it holds up neither the listing nor the grader', async () => {
    const source = await protectedTaskSandbox();
    let restored: string | undefined;
    try {
      const made = await sec.sh(source, 'mkfifo /project/pipe && mkdir -p /root/spool && mkfifo -m 600 /root/spool/pipe');
      assert.equal(made.exitCode, 0, made.stderr);
      const layer = await sec.edge.snapshot(source);
      restored = await sec.sandbox({ image: TASK_IMAGE, snapshots: [layer.digest], protect: { readOnly: ['/project'] } });
      const kinds = await sec.sh(restored, 'stat -c "%n %F %a" /project/pipe /root/spool/pipe');
      assert.equal(kinds.stdout, '/project/pipe fifo 644\n/root/spool/pipe fifo 600\n', kinds.stderr);
      // Each carries data from a writer to a reader in the sandbox (the protected one too: a
      // pipe's data is not a change to the tree).
      for (const fifo of ['/project/pipe', '/root/spool/pipe']) {
        const r = await sec.sh(restored, `timeout 5 cat ${fifo} > /tmp/got & echo through > ${fifo}; wait; cat /tmp/got`, { timeoutMs: 10_000 });
        assert.equal(r.stdout, 'through\n', `${fifo}: ${r.stderr}`);
      }
      // A reader left waiting on the protected FIFO: the tree and the grader still answer.
      await (await sec.edge.spawn(restored, { cmd: 'cat /project/pipe' })).detach();
      const started = Date.now();
      const listing = await sec.sh(restored, 'ls /project', { timeoutMs: 10_000 });
      assert.equal(listing.exitCode, 0, listing.stderr);
      assert.match(listing.stdout, /^pipe$/m);
      assert.equal(await grade(restored), UNSOLVED);
      assert.ok(Date.now() - started < 2_000, 'the listing and the grader answer while a reader waits on the FIFO');
    } finally {
      if (restored) await sec.edge.destroy(restored);
      await sec.edge.destroy(source);
    }
  });
});
