// End-to-end: a control plane (`dsec up --node-addr`) and two nodes on this machine joined with
// `dsec edge --join` (real processes, real sandboxes, the node protocol over HTTP/2 in mutual
// TLS). Each joined node runs in a network namespace of its own, reaching the control plane's
// node port over a veth pair on a bridge the test makes, as a node on another machine would. With the control plane's own edge that is three edges on one host, each
// with its own cgroup parent, run directory and network tag, and the watcher collecting garbage
// on all of them every second. Sandboxes on a remote node are used through the API (exec,
// attach from an offset, files, pause, snapshot); a caller without a member certificate is
// refused; a node killed with -9 becomes unreachable then lost, its sandboxes lost, and a
// replay-enabled one comes back on another node; the node restarts and reconciles; drain stops
// placement and moves sandboxes with --replay; a node cut off from the control plane freezes its
// sandboxes itself and resumes them when it returns; a removed node is refused. docs/deploy.md
// shows the same commands. Needs root.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import http2 from 'node:http2';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';
import { Edge, MNT, mountsUnder, umount } from '@dsec/edge';
import { DsecClient, Sandbox } from '@dsec/sdk';
import { WAIT_MS, freePort, hasCgroup, run, stopProc, until, waitFor } from './helpers/cli-process.js';
import type { Proc } from './helpers/cli-process.js';
import { AGENT_BINARY } from './helpers/node.js';
import { EDGE_WIRE_VERSION } from '@dsec/protocol';

/** Silence before a node is unreachable, and the grace before it is lost (short for the test). */
const UNREACHABLE_AFTER_MS = 5000;
const LOST_AFTER_MS = 10_000;
/** Node names (their cgroup parents, dsec-ct-*, are what scripts/clean-test-leftovers.sh knows). */
const E1 = 'ct-e1';
const E2 = 'ct-e2';
const EDGES = [E1, E2] as const;
/**
 * The test's own network: a bridge with the control plane's node port on it, and one namespace
 * per joined node with a veth into it (names that scripts/clean-test-leftovers.sh removes).
 */
const BRIDGE = 'dsec-test-ctbr';
const NET = '10.213.7';
const CONTROL_PLANE_ADDR = `${NET}.1`;
const netnsOf = (name: string): string => `dsec-test-${name}`;

const sh = promisify(execFile);
async function ip(...args: string[]): Promise<void> {
  await sh('ip', args);
}

/** The bridge, and per node a namespace whose eth0 (`${NET}.N`) is a veth on it. */
async function makeNetwork(): Promise<void> {
  await removeNetwork();
  await ip('link', 'add', BRIDGE, 'type', 'bridge');
  await ip('addr', 'add', `${CONTROL_PLANE_ADDR}/24`, 'dev', BRIDGE);
  await ip('link', 'set', BRIDGE, 'up');
  for (const [i, name] of EDGES.entries()) {
    const ns = netnsOf(name);
    const host = `dtct${i}`;
    await ip('netns', 'add', ns);
    await ip('link', 'add', host, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns);
    await ip('link', 'set', host, 'master', BRIDGE);
    await ip('link', 'set', host, 'up');
    await ip('-n', ns, 'addr', 'add', `${NET}.${i + 2}/24`, 'dev', 'eth0');
    await ip('-n', ns, 'link', 'set', 'eth0', 'up');
    await ip('-n', ns, 'link', 'set', 'lo', 'up');
  }
}

/** The namespaces (their veths go with them) and the bridge; nothing missing is an error. */
async function removeNetwork(): Promise<void> {
  for (const name of EDGES) await ip('netns', 'del', netnsOf(name)).catch(() => undefined);
  await ip('link', 'del', BRIDGE).catch(() => undefined);
}

describe('cluster: remote edges joined over mutual TLS', { timeout: 300_000 }, () => {
  let dir: string;
  let home: string;
  let nodePort: number;
  let up: Proc | undefined;
  let apiUrl: string;
  let nodeUrl: string;
  let client: DsecClient;
  let local = '';
  const edges = new Map<string, Proc>();
  const edgeHome = (name: string): string => path.join(dir, `edge-${name}`);
  const conn = (): { client: DsecClient } => ({ client });

  const startUp = async (): Promise<void> => {
    up = run(
      [
        'up',
        '--addr',
        '127.0.0.1:0',
        '--no-prebuild',
        '--node-addr',
        `${CONTROL_PLANE_ADDR}:${nodePort}`,
        '--config',
        path.join(dir, 'config.json'),
        '--clean',
      ],
      {
        DSEC_HOME: home,
      },
    );
    apiUrl = (await waitFor(up, /listening on (http:\/\/\S+)/, 'dsec up'))[1]!;
    nodeUrl = (await waitFor(up, /nodes join on (https:\/\/\S+)/, 'dsec up'))[1]!;
    client = new DsecClient({ apiUrl, apiKey: (await readFile(path.join(home, 'admin.key'), 'utf8')).trim() });
  };
  const startEdge = async (name: string, token?: string): Promise<Proc> => {
    const p = run(['edge', '--join', nodeUrl, ...(token ? ['--token', token] : []), '--name', name, '--home', edgeHome(name), '--clean'], {}, netnsOf(name));
    edges.set(name, p);
    await waitFor(p, /joined/, `dsec edge ${name}`);
    return p;
  };
  const nodeState = async (name: string): Promise<string | undefined> => (await client.nodes.list()).find((n) => n.name === name)?.state;
  /** Only `name` takes new sandboxes. */
  const only = async (name: string): Promise<void> => {
    for (const n of await client.nodes.list()) {
      if (n.state !== 'ready') continue;
      if (n.name === name) await client.nodes.uncordon(n.name);
      else await client.nodes.cordon(n.name);
    }
  };

  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-cluster-'));
    home = path.join(dir, 'cp');
    await makeNetwork();
    nodePort = await freePort(CONTROL_PLANE_ADDR);
    await writeFile(
      path.join(dir, 'config.json'),
      JSON.stringify({
        cluster: { unreachableAfterMs: UNREACHABLE_AFTER_MS, lostAfterMs: LOST_AFTER_MS },
        watcher: { intervalMs: 500, gcIntervalMs: 1000 },
        // No fncall runtime builds in the background here (dsec up starts them by default).
        node: { calls: { prebuild: [] } },
      }),
    );
    await startUp();
    local = (await client.nodes.list())[0]!.name;
    const tokens = await Promise.all(EDGES.map(() => client.nodes.joinToken()));
    await Promise.all(EDGES.map((name, i) => startEdge(name, tokens[i]!.token)));
    await until('both edges ready', async () => (await nodeState(E1)) === 'ready' && (await nodeState(E2)) === 'ready');
  });

  after(async () => {
    await stopProc(up);
    for (const p of edges.values()) await stopProc(p);
    // Whatever a killed process left: each node's home opened once more and shut down.
    const homes: Array<[string, string, string]> = EDGES.map((name) => [edgeHome(name), name, `dsec-${name}`]);
    if (local) homes.push([path.join(home, 'node'), local, 'dsec']);
    for (const [nodeHome, name, cgroupParent] of homes) {
      if (!existsSync(nodeHome)) continue;
      try {
        const e = await Edge.open({ home: nodeHome, agentBinary: AGENT_BINARY, nodeName: name, cgroupParent });
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
    await removeNetwork();
  });

  test('the joined nodes are ready, remote, and shown in full', async () => {
    const n = await client.nodes.get(E1);
    assert.equal(n.state, 'ready');
    assert.equal(n.remote, true);
    assert.equal(n.version, EDGE_WIRE_VERSION);
    assert.ok(n.backends.includes('container'));
    assert.equal((await client.nodes.get(local)).remote, false);
  });

  test('a sandbox on a remote node: exec, attach from an offset, files, pause, snapshot through the API', async () => {
    await only(E1);
    const sb = await Sandbox.create({ image: { base: 'busybox' } }, conn());
    try {
      assert.equal((await sb.info()).node, E1);
      assert.ok(hasCgroup(`dsec-${E1}`, sb.id), 'its cgroup is under the node-named parent');
      const r = await sb.exec('echo hello from $(hostname)');
      assert.equal(r.exitCode, 0, r.stderr);
      assert.match(r.stdout, /^hello from/);

      const h = await sb.spawn('for i in 1 2 3 4 5; do echo line-$i; done; sleep 30');
      let seen = '';
      for await (const ev of h) {
        seen += Buffer.from(ev.data).toString();
        if (seen.includes('line-5')) break;
      }
      const again = await sb.attach(h.pid, { fromStdout: 'line-1\n'.length });
      let tail = '';
      for await (const ev of again) {
        tail += Buffer.from(ev.data).toString();
        if (tail.includes('line-5')) break;
      }
      assert.ok(tail.startsWith('line-2'), tail);
      await again.kill();

      await sb.files.write('/tmp/note.txt', 'remote bytes');
      assert.equal(await sb.files.read('/tmp/note.txt'), 'remote bytes');
      await sb.pause();
      assert.equal((await sb.info()).state, 'paused');
      await sb.resume();
      assert.equal((await sb.exec('cat /tmp/note.txt')).stdout, 'remote bytes');
      const snap = await sb.snapshot();
      assert.match(snap.digest, /^sha256:[0-9a-f]{64}$/);
    } finally {
      await sb.kill().catch(() => undefined);
    }
  });

  test('a caller without a member certificate is refused on the node port', async () => {
    const session = http2.connect(nodeUrl, { rejectUnauthorized: false });
    session.on('error', () => undefined);
    try {
      const req = session.request({ ':method': 'POST', ':path': '/v1/node/session', 'dsec-edge-wire-version': '1' });
      req.end();
      const status = await new Promise<number>((resolve, reject) => {
        req.once('response', (hdr) => resolve(Number(hdr[':status'])));
        req.once('error', reject);
      });
      assert.equal(status, 401);
    } finally {
      session.destroy();
    }
  });

  test('kill -9 a node: unreachable, then lost; a replay-enabled sandbox comes back elsewhere; the node returns and reconciles', async () => {
    await only(E1);
    const plain = await Sandbox.create({ image: { base: 'busybox' } }, conn());
    const kept = await Sandbox.create({ image: { base: 'busybox' }, recovery: { onNodeLost: 'replay' } }, conn());
    await kept.files.write('/tmp/progress.txt', 'step 1 done');
    assert.equal((await kept.info()).node, E1);
    await client.nodes.uncordon(local);
    await client.nodes.uncordon(E2);

    const e1 = edges.get(E1)!;
    e1.child.kill('SIGKILL');
    await e1.exited;
    await until('e1 unreachable', async () => (await nodeState(E1)) === 'unreachable');
    await until('e1 lost', async () => (await nodeState(E1)) === 'lost');
    await until('its sandboxes lost', async () => (await plain.info()).state === 'lost' && (await kept.info()).state === 'lost');
    const copy = await until('the replayed copy', async () => (await Sandbox.find({ labels: { 'dsec.replay-of': kept.id } }, conn()))[0]);
    assert.notEqual(copy.id, kept.id);
    // Found by its label as soon as its row exists: it runs once its replay has made it.
    const info = await until('the copy running', async () => {
      const i = await copy.info();
      return i.state === 'running' && i;
    });
    assert.notEqual(info.node, E1);
    assert.deepEqual(info.recovery, { onNodeLost: 'replay' });
    assert.equal((await copy.exec('cat /tmp/progress.txt')).stdout, 'step 1 done');

    // Back with the certificate it holds (no token): the lost sandboxes still running there go.
    assert.ok(hasCgroup(`dsec-${E1}`, plain.id) && hasCgroup(`dsec-${E1}`, kept.id));
    await startEdge(E1);
    await until('e1 ready again', async () => (await nodeState(E1)) === 'ready');
    await until('e1 reconciled', () => !hasCgroup(`dsec-${E1}`, plain.id) && !hasCgroup(`dsec-${E1}`, kept.id));
    await plain.kill();
    await kept.kill();
    await copy.kill();
  });

  test('drain stops placement; drain --replay moves the sandboxes; no node removes another node’s objects', async () => {
    await only(E2);
    const moved = await Sandbox.create({ image: { base: 'busybox' }, labels: { job: 'drain' } }, conn());
    await moved.files.write('/tmp/state', 'kept');
    await client.nodes.uncordon(local);
    await client.nodes.uncordon(E1);
    await client.nodes.drain(E2);
    assert.equal((await client.nodes.get(E2)).cordoned, true);
    const placed = await Promise.all([0, 1, 2].map(() => Sandbox.create({ image: { base: 'busybox' } }, conn())));
    for (const sb of placed) assert.notEqual((await sb.info()).node, E2);

    // Three edges on one host, each collecting its garbage every second: after a few passes each
    // one's sandboxes are still there, under its own cgroup parent.
    await new Promise((r) => setTimeout(r, 3000));
    for (const sb of [moved, ...placed]) {
      const node = (await sb.info()).node;
      assert.ok(hasCgroup(node === local ? 'dsec' : `dsec-${node}`, sb.id), `${sb.id} on ${node}`);
      assert.equal((await sb.exec('true')).exitCode, 0);
    }

    const r = await client.nodes.drain(E2, { replay: true });
    assert.equal(r.failed.length, 0, JSON.stringify(r.failed));
    const m = r.replayed.find((x) => x.from === moved.id);
    assert.ok(m, JSON.stringify(r));
    const copy = await Sandbox.connect(m.to, conn());
    assert.notEqual((await copy.info()).node, E2);
    assert.equal((await copy.exec('cat /tmp/state')).stdout, 'kept');
    await assert.rejects(moved.info());
    await client.nodes.uncordon(E2);
    for (const sb of [copy, ...placed]) await sb.kill();
  });

  test('a node cut off from the control plane freezes its sandboxes, and runs them again when it returns', async () => {
    await only(E2);
    const sb = await Sandbox.create({ image: { base: 'busybox' } }, conn());
    const id = sb.id;
    const e2 = edges.get(E2)!;
    const before = e2.err().length;
    up!.child.kill('SIGKILL');
    await up!.exited;
    await until('e2 froze its sandbox', () => /froze [1-9]\d* sandbox/.test(e2.err().slice(before)));
    await startUp();
    await until('e2 back', async () => (await nodeState(E2)) === 'ready');
    const back = await Sandbox.connect(id, conn());
    assert.equal((await back.info()).state, 'running');
    await until('it runs again', async () => (await back.exec('echo alive', { timeoutMs: 5000 })).stdout === 'alive\n');
    await back.kill();
  });

  test('a removed node is revoked: its session ends and it cannot come back', async () => {
    await client.nodes.remove(E2);
    const e2 = edges.get(E2)!;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const code = await Promise.race([e2.exited, new Promise<string>((r) => (timer = setTimeout(() => r('still running'), WAIT_MS)))]);
    clearTimeout(timer);
    assert.notEqual(code, 'still running');
    assert.notEqual(code, 0);
    assert.match(e2.err(), /not a member of this cluster/);
    assert.equal(
      (await client.nodes.list()).find((n) => n.name === E2),
      undefined,
    );
  });
});
