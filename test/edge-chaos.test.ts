// Chaos (issue 13, §4): an edge killed alone. A control plane (`dsec up --node-addr`) and one
// node joined with `dsec edge --join`, both real processes started here; the edge (only it, never
// the control plane) is killed with SIGKILL while a command streams output and creates are in
// flight, then started again on the same home. Running sandboxes keep running through it, the
// stream is read on from its offset, every create either finished (and works) or failed cleanly
// (no half-created sandbox listed), and once everything is deleted nothing of the sandboxes is
// left on the host: no cgroup, container, mount, writable layer, folder or id range.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { DEFAULT_ID_RANGE_DIR, Edge, MNT, mountsUnder, runDirFor, umount } from '@dsec/edge';
import { DsecError } from '@dsec/protocol';
import { DsecClient, Sandbox } from '@dsec/sdk';
import { freePort, hasCgroup, run, stopProc, until, waitFor } from './helpers/cli-process.js';
import type { Proc } from './helpers/cli-process.js';
import { AGENT_BINARY } from './helpers/node.js';

/** The node's name (its cgroup parent, dsec-ct-*, is what scripts/clean-test-leftovers.sh knows). */
const NODE = 'ct-chaos';
const CGROUP_PARENT = `dsec-${NODE}`;
/** Creates in flight when the edge is killed. */
const IN_FLIGHT = 4;
/** When the edge is killed after the creates start, one round each (ms). */
const KILL_AFTER_MS = [30, 150, 400];

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

describe('chaos: an edge killed alone', { timeout: 240_000 }, () => {
  let dir: string;
  let home: string;
  let edgeHome: string;
  let up: Proc | undefined;
  let edge: Proc | undefined;
  let client: DsecClient;
  let nodeUrl: string;

  const startEdge = async (token?: string): Promise<void> => {
    edge = run(['edge', '--join', nodeUrl, ...(token ? ['--token', token] : []), '--name', NODE, '--home', edgeHome], {});
    await waitFor(edge, /joined/, 'dsec edge');
  };
  const nodeState = async (): Promise<string | undefined> => (await client.nodes.list()).find((n) => n.name === NODE)?.state;

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

  test('SIGKILL of the edge, three times: sandboxes keep running, a stream reads on from its offset, creates finish or fail cleanly, nothing is stranded', async (t) => {
    const conn = { client };
    const sb = await Sandbox.create({ image: { base: 'busybox' } }, conn);
    assert.equal((await sb.info()).node, NODE);
    await sb.files.write('/tmp/state', 'before the crash');
    const h = await sb.spawn('i=0; while [ $i -lt 100000 ]; do echo line-$i; i=$((i+1)); sleep 0.02; done');
    let seen = '';
    for await (const ev of h) {
      seen += Buffer.from(ev.data).toString();
      if (seen.includes('line-5\n')) break;
    }
    const offset = 'line-0\nline-1\nline-2\nline-3\n'.length;
    // Its lasting processes (the agent and the loop's shell; each `sleep` ends by itself).
    const pids: number[] = [];
    for (const pid of await cgroupPids(sb.id)) {
      if ((await readFile(`/proc/${pid}/comm`, 'utf8').catch(() => 'sleep\n')) !== 'sleep\n') pids.push(pid);
    }
    assert.ok(pids.length >= 2, `the sandbox's processes: ${pids.join(' ')}`);

    const made: Sandbox[] = [];
    for (const [round, delayMs] of KILL_AFTER_MS.entries()) {
      // Creates in flight, then the edge (only the edge) killed.
      const label = { chaos: `round-${round}` };
      const creates = Promise.allSettled(Array.from({ length: IN_FLIGHT }, () => Sandbox.create({ image: { base: 'busybox' }, labels: label }, conn)));
      await new Promise((r) => setTimeout(r, delayMs));
      edge!.child.kill('SIGKILL');
      await edge!.exited;
      assert.ok(
        pids.every((pid) => alive(pid)),
        'every lasting process of the sandbox outlives its edge',
      );
      await startEdge();
      await until('the edge ready again', async () => (await nodeState()) === 'ready');

      // Each create finished (a working sandbox) or failed with a clean error.
      const settled = await creates;
      for (const s of settled) {
        if (s.status === 'fulfilled') made.push(s.value);
        else assert.ok(s.reason instanceof DsecError, `a failed create is a clean error: ${String(s.reason)}`);
      }
      // No half-created sandbox is listed: every listed one gets to running (and works) or failed.
      const listed = await until('no listed sandbox left creating', async () => {
        const all = await Sandbox.list({ labels: label }, conn).toArray();
        return all.every((s) => s.state !== 'creating' && s.state !== 'pending') && all;
      });
      for (const s of listed) {
        assert.ok(s.state === 'running' || s.state === 'failed', `${s.id} is ${s.state}`);
        if (s.state === 'running') {
          const c = await Sandbox.connect(s.id, conn);
          assert.equal((await c.exec('echo ok')).stdout, 'ok\n', `${s.id} works`);
        }
        if (!made.some((m) => m.id === s.id)) made.push(await Sandbox.connect(s.id, conn));
      }
      const failed = settled.filter((s) => s.status === 'rejected').map((s) => (s.reason as DsecError).code);
      t.diagnostic(
        `round ${round} (kill after ${delayMs} ms): ${IN_FLIGHT - failed.length} created, failed: ${failed.join(' ') || 'none'}; listed ${listed.length}`,
      );
    }

    // The sandbox ran on: its file, its processes, and its stream from the offset.
    assert.equal((await sb.info()).state, 'running');
    assert.equal(await sb.files.read('/tmp/state'), 'before the crash');
    const again = await sb.attach(h.pid, { fromStdout: offset });
    let tail = '';
    for await (const ev of again) {
      tail += Buffer.from(ev.data).toString();
      if (/line-\d{3}\n/.test(tail)) break;
    }
    assert.ok(tail.startsWith('line-4\nline-5\n'), `read on from the offset: ${tail.slice(0, 80)}`);
    const numbers = tail
      .split('\n')
      .filter(Boolean)
      .map((l) => Number(l.slice('line-'.length)));
    assert.deepEqual(
      numbers,
      numbers.map((_, i) => 4 + i),
      'no line lost or repeated across the crash',
    );
    await again.kill();

    // Everything deleted: nothing of any sandbox left on the host.
    const ids = [sb.id, ...made.map((m) => m.id)];
    await sb.kill();
    for (const m of made) await m.kill().catch(() => undefined);
    const runDir = runDirFor(edgeHome);
    await until('nothing of the sandboxes left on the host', async () => {
      const cgroups = ids.filter((id) => hasCgroup(CGROUP_PARENT, id));
      const containers = (await readdir(path.join(runDir, 'crun')).catch(() => [] as string[])).filter((c) => !c.startsWith('fn-'));
      const writable = await readdir(path.join(runDir, 'rw')).catch(() => [] as string[]);
      const folders = await readdir(path.join(edgeHome, 'sandboxes')).catch(() => [] as string[]);
      const mounts = (await mountsUnder(path.join(runDir, 'rw'))).concat(await mountsUnder(path.join(edgeHome, 'sandboxes')));
      const left = [...cgroups, ...containers, ...writable, ...folders, ...mounts];
      return left.length === 0;
    }).catch(async (err: unknown) => {
      const detail = {
        cgroups: ids.filter((id) => hasCgroup(CGROUP_PARENT, id)),
        containers: await readdir(path.join(runDir, 'crun')).catch(() => []),
        writable: await readdir(path.join(runDir, 'rw')).catch(() => []),
        folders: await readdir(path.join(edgeHome, 'sandboxes')).catch(() => []),
      };
      throw new Error(`${(err as Error).message}: ${JSON.stringify(detail)}`);
    });
    // No id range of the node's is still claimed (its claims name its home).
    const claims = await readdir(DEFAULT_ID_RANGE_DIR).catch(() => [] as string[]);
    for (const c of claims) {
      const owner = (await readFile(path.join(DEFAULT_ID_RANGE_DIR, c), 'utf8').catch(() => '')).split('\n')[0];
      assert.ok(owner !== path.resolve(edgeHome), `id range ${c} still claimed for ${owner}`);
    }
  });
});
