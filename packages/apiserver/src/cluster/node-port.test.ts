// The node port without root: real HTTP/2 in mutual TLS and the real edge wire, with in-memory
// nodes (FakeEdge) on both sides. Joining, single-use tokens, the CA pin, refusal of callers
// without a member's certificate and of another wire version, routing, loss and replay,
// reconcile on return, revocation and the node's self-freeze.
import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import http2 from 'node:http2';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { after, before, describe, test } from 'node:test';
import { NodeAgent, credentialsDir, makeCsr, makeKey, openssl } from '@dsec/edge';
import { CONTROL_PLANE_TLS_NAME, DsecError, EDGE_WIRE_VERSION, NODE_JOIN_PATHS } from '@dsec/protocol';
import type { EdgeSandbox, NodeCapacity, SandboxSpec } from '@dsec/protocol';
import { FakeEdge, fakeLayer } from '../testing/fake-edge.js';
import { harness } from '../testing/harness.js';
import type { Harness } from '../testing/harness.js';
import { REPLAY_OF_LABEL } from '../services/nodes.js';
import { NodePort } from './node-port.js';

const UNREACHABLE_AFTER_MS = 3000;
const LOST_AFTER_MS = 2000;
/** Bound of every wait for a state change (far above the graces). */
const WAIT_MS = 20_000;

async function until(what: string, check: () => boolean | Promise<boolean>): Promise<void> {
  const deadline = Date.now() + WAIT_MS;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/**
 * A FakeEdge whose sandboxes travel over the wire (its own bookkeeping stays home). It reports
 * both VM backends with the accelerators a node's boot probe could find (microVMs under TCG, full
 * VMs under KVM), so the join shows them travelling to the node record.
 */
class RemoteFake extends FakeEdge {
  override capacity(): NodeCapacity {
    const cap = super.capacity();
    return { ...cap, backends: [...cap.backends, 'microvm', 'vm'], microvm: { accel: 'tcg', bootMs: 900 }, vm: { accel: 'kvm', bootMs: 4000 } };
  }
  override async create(spec: SandboxSpec, opts: { id?: string } = {}): Promise<EdgeSandbox> {
    return wireable(await super.create(spec, opts));
  }
  override async list(): Promise<EdgeSandbox[]> {
    return (await super.list()).map(wireable);
  }
}

function wireable(sb: EdgeSandbox & { files?: unknown; policy?: unknown }): EdgeSandbox {
  const { files: _files, policy: _policy, ...rest } = sb;
  return rest;
}

function remoteEdge(name: string): FakeEdge {
  const edge = new RemoteFake(name);
  const base = fakeLayer('busybox');
  edge.layerInfos.set(base.digest, base);
  return edge;
}

/** A raw session request; resolves with the status and body text. */
async function rawSession(url: string, opts: http2.SecureClientSessionOptions, version = '1'): Promise<{ status: number; text: string }> {
  const session = http2.connect(url, opts);
  session.on('error', () => undefined);
  try {
    const req = session.request({ ':method': 'POST', ':path': NODE_JOIN_PATHS.session, 'dsec-edge-wire-version': version });
    req.end();
    const status = await new Promise<number>((resolve, reject) => {
      req.once('response', (h) => resolve(Number(h[':status'])));
      req.once('error', reject);
    });
    let text = '';
    for await (const c of req) text += (c as Buffer).toString();
    return { status, text };
  } finally {
    session.destroy();
  }
}

describe('node port', () => {
  let h: Harness;
  let port: NodePort;
  let dir: string;
  const agents: NodeAgent[] = [];
  const remote = remoteEdge('remote-1');

  before(async () => {
    h = await harness();
    dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-node-port-'));
    port = await NodePort.start({
      host: '127.0.0.1',
      port: 0,
      caDir: path.join(dir, 'ca'),
      certTools: { openssl, makeKey, makeCsr },
      nodes: h.services.nodes,
      nodeAdmin: h.services.nodeAdmin,
      raise: (ev) => void h.raised.push(ev),
      log: (l) => void h.logged.push(l),
      unreachableAfterMs: UNREACHABLE_AFTER_MS,
      lostAfterMs: LOST_AFTER_MS,
    });
    h.services.nodeAdmin.membership = port;
  });

  after(async () => {
    if (process.env.DSEC_TEST_VERBOSE) for (const l of h.logged) console.log(l);
    for (const a of agents) await a.close();
    await port.close();
    await h.close();
    await rm(dir, { recursive: true, force: true });
  });

  const start = async (edge: FakeEdge, home: string, token?: string): Promise<NodeAgent> => {
    const agent = await NodeAgent.start({
      edge,
      url: port.url,
      home: path.join(dir, home),
      name: edge.nodeName,
      log: (l) => void h.logged.push(l),
      ...(token ? { token } : {}),
    });
    agents.push(agent);
    return agent;
  };

  test('a node joins with a single-use token; a second use and a token of another CA are refused', async () => {
    const { token } = await h.services.nodeAdmin.joinToken(h.admin, {});
    const agent = await start(remote, 'remote-1', token);
    await agent.ready;
    await until('ready', () => h.services.nodes.get('remote-1')?.state === 'ready');
    const n = await h.services.nodeAdmin.get(h.admin, 'remote-1');
    assert.equal(n.state, 'ready');
    assert.equal(n.remote, true);
    assert.equal(n.version, EDGE_WIRE_VERSION);
    assert.ok(n.lastHeardAt !== null && Date.parse(n.lastHeardAt) > Date.now() - 60_000);
    // Each VM backend's accelerator travels from the node's capacity through the session to the
    // node record, its detail and the listing (`microvmAccel` kept beside `accel`).
    assert.deepEqual(h.services.nodes.get('remote-1')?.accel, { microvm: 'tcg', vm: 'kvm' });
    assert.deepEqual(n.accel, { microvm: 'tcg', vm: 'kvm' });
    assert.equal(n.microvmAccel, 'tcg');
    const listed = h.services.iam.listNodes(h.admin).find((x) => x.name === 'remote-1');
    assert.deepEqual(listed?.accel, { microvm: 'tcg', vm: 'kvm' });
    assert.equal(listed?.microvmAccel, 'tcg');
    // The in-process fake node has no VM backend: nothing to show.
    assert.equal((await h.services.nodeAdmin.get(h.admin, 'fake')).accel, undefined);
    assert.ok((await readFile(path.join(credentialsDir(path.join(dir, 'remote-1')), 'node.key'), 'utf8')).includes('PRIVATE KEY'));

    await assert.rejects(start(remoteEdge('remote-2'), 'remote-2', token), (err: unknown) => err instanceof DsecError && err.code === 'UNAUTHENTICATED');
    const other = (await h.services.nodeAdmin.joinToken(h.admin, {})).token.replace(/\.[0-9a-f]{64}$/, `.${'0'.repeat(64)}`);
    await assert.rejects(start(remoteEdge('remote-3'), 'remote-3', other), (err: unknown) => err instanceof DsecError && err.code === 'PERMISSION_DENIED');
  });

  test('a caller without a member certificate, and another wire version, are refused', async () => {
    const noCert = await rawSession(port.url, { rejectUnauthorized: false });
    assert.equal(noCert.status, 401);
    assert.match(noCert.text, /UNAUTHENTICATED/);

    const creds = credentialsDir(path.join(dir, 'remote-1'));
    const [key, cert, ca] = await Promise.all(['node.key', 'node.crt', 'ca.crt'].map((f) => readFile(path.join(creds, f), 'utf8')));
    const member = { key, cert, ca, checkServerIdentity: (_h: string, c: tls.PeerCertificate) => tls.checkServerIdentity(CONTROL_PLANE_TLS_NAME, c) };
    const newer = await rawSession(port.url, member, '99');
    assert.equal(newer.status, 400);
    assert.match(newer.text, new RegExp(`speaks edge wire version ${EDGE_WIRE_VERSION}; node remote-1 speaks 99`));
  });

  test('a sandbox placed on the remote node is reached through its session', async () => {
    await h.services.nodeAdmin.cordon(h.admin, 'fake', true);
    const sb = await h.services.sandboxes.create(h.admin, { image: { base: 'busybox' } });
    assert.equal(sb.node, 'remote-1');
    assert.ok(remote.sandboxes.has(sb.id));
    const { edge } = await h.services.lifecycle.route(h.admin, sb.id);
    const r = await edge.exec(sb.id, { cmd: 'echo hi' });
    assert.equal(r.exitCode, 0);
    // A large file crosses in one frame each way (beyond HTTP/2's default session memory).
    const big = Buffer.alloc(24 * 1024 * 1024, 7);
    await edge.writeFile(sb.id, '/big', big);
    assert.equal((await edge.readFile(sb.id, '/big')).length, big.length);
    await h.services.nodeAdmin.cordon(h.admin, 'fake', false);
  });

  test('a node whose session ends is unreachable, then lost; a replay-enabled sandbox comes back elsewhere; the node reconciles on return', async () => {
    await h.services.nodeAdmin.cordon(h.admin, 'fake', true);
    const plain = await h.services.sandboxes.create(h.admin, { image: { base: 'busybox' } });
    const replayed = await h.services.sandboxes.create(h.admin, { image: { base: 'busybox' }, recovery: { onNodeLost: 'replay' } });
    await h.services.nodeAdmin.cordon(h.admin, 'fake', false);
    assert.equal(replayed.node, 'remote-1');
    const agent = agents[0]!;
    await agent.close();
    await until('unreachable', () => h.services.nodes.get('remote-1')?.state === 'unreachable');
    await until('lost', async () => (await h.store.sandboxOnly(replayed.id))?.state === 'lost');
    assert.equal((await h.store.sandboxOnly(plain.id))?.state, 'lost');
    let copy: { id: string; node: string } | undefined;
    await until('replayed', async () => {
      for (const r of await h.store.allSandboxes()) {
        if ((await h.store.sandbox(r.id))?.labels[REPLAY_OF_LABEL] === replayed.id) copy = r;
      }
      return copy !== undefined;
    });
    assert.equal(copy?.node, 'fake');
    assert.ok(h.raised.some((e) => e.kind === 'node.lost' && e.node === 'remote-1'));

    // Back again with the certificate it holds: what the store lost is destroyed there.
    assert.ok(remote.sandboxes.has(plain.id));
    const back = await start(remote, 'remote-1');
    await back.ready;
    await until('ready again', () => h.services.nodes.get('remote-1')?.state === 'ready');
    await until('reconciled', () => !remote.sandboxes.has(plain.id) && !remote.sandboxes.has(replayed.id));
    assert.equal(h.services.nodes.get('remote-1')?.state, 'ready');
  });

  test('a removed node is revoked: its session ends and it is refused', async () => {
    const { token } = await h.services.nodeAdmin.joinToken(h.admin, {});
    const agent = await start(remoteEdge('remote-4'), 'remote-4', token);
    await agent.ready;
    await until('remote-4 ready', () => h.services.nodes.get('remote-4')?.state === 'ready');
    await h.services.nodeAdmin.remove(h.admin, 'remote-4');
    await assert.rejects(agent.done, (err: unknown) => err instanceof DsecError && err.code === 'PERMISSION_DENIED');
    assert.equal(h.services.nodes.get('remote-4'), undefined);
  });

  test('a node cut off for longer than the lost grace freezes its sandboxes itself', async () => {
    await h.services.nodeAdmin.cordon(h.admin, 'fake', true);
    const sb = await h.services.sandboxes.create(h.admin, { image: { base: 'busybox' } });
    assert.equal(sb.node, 'remote-1');
    await port.close();
    await until('frozen', () => remote.sandboxes.get(sb.id)?.state === 'paused');
  });
});
