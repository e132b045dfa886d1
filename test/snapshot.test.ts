// Snapshots ("pack diff") and fork, end to end: real sandboxes on a real platform; a snapshot
// must reproduce the file state (deletions and replaced directories included), chain, and fork
// into independent sandboxes.
import assert from 'node:assert/strict';
import { chown, mkdir, mkdtemp, rm, stat, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Cgroups, LayerStore, detectCgroupMode, mountsUnder, umount, MNT } from '@dsec/edge';
import { DsecClient, Sandbox, isDsecError } from '@dsec/sdk';
import { MAX_FORK_COUNT, MAX_SNAPSHOT_DEPTH } from '@dsec/protocol';
import { startTestPlatform } from './helpers/platform.js';
import type { TestPlatform } from './helpers/platform.js';
import { apiCall, sh } from './helpers/assert.js';

let platform: TestPlatform;
let client: DsecClient;
const made: Sandbox[] = [];

const SMALL = { cpu: 0.1, memoryMiB: 64, diskMiB: 16 } as const;

async function create(spec: Parameters<typeof Sandbox.create>[0]): Promise<Sandbox> {
  const sb = await Sandbox.create({ resources: SMALL, ...spec }, { client });
  made.push(sb);
  return sb;
}

const call = (method: string, route: string, json?: unknown, key = platform.adminKey) => apiCall(platform.url, key, method, route, json);

/** A listing of a tree inside a sandbox: type, mode, owner, size and content digest per path. */
async function treeOf(sb: Sandbox, dir: string): Promise<string> {
  return sh(
    sb,
    `cd ${dir} && find . | sort | while read -r f; do if [ -L "$f" ]; then echo "$f L $(readlink "$f")"; elif [ -d "$f" ]; then echo "$f D $(stat -c '%a %u:%g' "$f")"; else echo "$f F $(stat -c '%a %u:%g %s' "$f") $(md5sum < "$f" | cut -c1-32)"; fi; done`,
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

describe('snapshots', () => {
  test('a snapshot reproduces the file state, deletions and replaced directories included; snapshots chain', async () => {
    const a = await create({ image: { base: 'busybox' } });
    await sh(
      a,
      'mkdir -p /work/dir /work/tree/sub && echo keep > /work/keep && echo gone > /work/gone && echo 1 > /work/dir/a && echo 2 > /work/dir/b && echo deep > /work/tree/sub/f',
    );
    await sh(a, 'chmod 750 /work/keep && chown 1234:5678 /work/dir/a && ln -s ../keep /work/dir/link && ln /work/keep /work/hard');
    const first = await a.snapshot();
    assert.equal(first.kind, 'snapshot');
    assert.match(first.digest, /^sha256:[0-9a-f]{64}$/);
    assert.deepEqual(first.snapshot?.parents, (await a.info()).layers);
    assert.equal(first.snapshot?.sandboxId, a.id);

    // The source is thawed and keeps running.
    assert.equal(await sh(a, 'echo still-here'), 'still-here\n');
    const b = await create({ snapshot: first.digest });
    assert.equal(b.lastInfo?.snapshot, first.digest);
    assert.deepEqual(b.lastInfo?.layers, [...first.snapshot.parents, first.digest]);
    assert.equal(await treeOf(b, '/work'), await treeOf(a, '/work'));

    // Deletions of files from the snapshot and from the base, a directory replaced by a new one
    // (an opaque directory), a tree removed, a file changed.
    await sh(
      b,
      'rm /work/gone /etc/group && rm -rf /work/dir /work/tree && mkdir /work/dir && echo new > /work/dir/c && echo more >> /work/keep && mkdir -p /work/tree && echo fresh > /work/tree/g',
    );
    const second = await b.snapshot({ name: 'chain-test:two' });
    assert.deepEqual(second.names, ['chain-test:two']);
    assert.deepEqual(second.snapshot?.parents, [...first.snapshot.parents, first.digest]);
    const c = await create({ snapshot: 'chain-test:two' });
    assert.deepEqual(c.lastInfo?.layers, [...second.snapshot.parents, second.digest]);
    assert.deepEqual(c.lastInfo?.image, { base: first.snapshot.parents[0] });
    assert.equal(await treeOf(c, '/work'), await treeOf(b, '/work'));
    assert.equal((await c.exec('test -e /work/gone')).exitCode, 1);
    assert.equal((await c.exec('test -e /etc/group')).exitCode, 1);
    assert.equal(await sh(c, 'ls /work/dir'), 'c\n');
    assert.equal(await sh(c, 'ls /work/tree'), 'g\n');
    assert.equal(await sh(c, 'cat /work/keep /work/dir/c'), 'keep\nmore\nnew\n');
    assert.equal(await sh(c, "stat -c '%a' /work/keep"), '750\n');
    // The base's other files are still there.
    assert.match(await sh(c, 'cat /etc/passwd'), /^root:/);

    // The layer listing shows where a snapshot comes from.
    const listed = await client.layers.get(second.digest);
    assert.equal(listed.kind, 'snapshot');
    assert.equal(listed.snapshot?.sandboxId, b.id);

    // A layer below a snapshot cannot be deleted while the snapshot exists.
    const del = await call('DELETE', `/v1/layers/${first.digest}`);
    assert.equal(del.status, 409, JSON.stringify(del.body));
  });

  test('the sandbox is frozen while it is packed and thawed after: a busy writer goes on', async () => {
    const a = await create({ image: { base: 'busybox' } });
    const writer = await a.spawn('i=0; while [ $i -lt 400 ]; do echo $i > /tmp/n.$((i % 20)); i=$((i+1)); done; echo done');
    const snap = await a.snapshot();
    const b = await create({ snapshot: snap.digest });
    // Every file the snapshot holds is whole: a number, or empty when the freeze fell between the
    // shell's truncating open and its write (a state the sandbox itself was in).
    const listing = await sh(b, 'for f in /tmp/n.*; do [ -e "$f" ] && printf "%s:%s\\n" "$f" "$(cat "$f")"; done; true');
    for (const line of listing.split('\n').filter(Boolean)) assert.match(line, /^\/tmp\/n\.\d+:\d*$/);
    const exit = await writer.wait();
    assert.equal(exit.exitCode, 0);
    const cgroups = new Cgroups(await detectCgroupMode(), 'dsec');
    assert.equal(await cgroups.isFrozen(a.id), false);

    // Snapshots of one sandbox at once: each is consistent, and the sandbox ends up thawed.
    const both = await Promise.all([a.snapshot(), a.snapshot(), a.snapshot()]);
    assert.equal(new Set(both.map((l) => l.digest)).size, 1, 'nothing changed in between');
    assert.equal(await cgroups.isFrozen(a.id), false);
    assert.equal(await sh(a, 'echo ok'), 'ok\n');

    // A sandbox frozen before (paused) stays frozen.
    await cgroups.freeze(a.id);
    try {
      await a.snapshot();
      assert.equal(await cgroups.isFrozen(a.id), true);
    } finally {
      await cgroups.thaw(a.id);
    }
    assert.equal(await sh(a, 'echo thawed'), 'thawed\n');
  });

  test('fork gives N independent sandboxes', async () => {
    const src = await create({ image: { base: 'busybox' }, labels: { role: 'source' }, env: { EPISODE: 'e1' } });
    await sh(src, 'echo base > /shared');
    const { snapshot, sandboxes } = await src.fork(3, { labels: { role: 'fork' } });
    made.push(...sandboxes);
    assert.ok(snapshot, 'a fork without memory makes a snapshot');
    assert.equal(snapshot.kind, 'snapshot');
    assert.equal(sandboxes.length, 3);
    assert.equal(new Set(sandboxes.map((s) => s.id)).size, 3);
    for (const [i, sb] of sandboxes.entries()) {
      assert.equal(sb.lastInfo?.snapshot, snapshot.digest);
      assert.equal(sb.lastInfo?.labels.role, 'fork');
      assert.equal(await sh(sb, 'cat /shared; echo $EPISODE'), 'base\ne1\n');
      await sh(sb, `echo mine-${i} > /own && echo ${i} >> /shared`);
    }
    await sh(src, 'echo source-after > /own');
    for (const [i, sb] of sandboxes.entries()) {
      assert.equal(await sh(sb, 'cat /own /shared'), `mine-${i}\nbase\n${i}\n`);
    }
    assert.equal(await sh(src, 'cat /own /shared'), 'source-after\nbase\n');
    // A fork with memory is for VMs: a container's is refused naming the field, as is a bad value.
    for (const memory of [true, 'yes']) {
      const r = await call('POST', `/v1/sandboxes/${src.id}/fork`, { count: 1, memory });
      assert.equal(r.status, 400, JSON.stringify(r.body));
      assert.match(JSON.stringify(r.body), /memory/);
    }
  });

  test('a fork past the quota leaves no sandbox behind and names its snapshot', async () => {
    const p = await call('POST', '/v1/projects', { name: 'fork-quota', quota: { sandboxes: 3 } });
    assert.equal(p.status, 201, JSON.stringify(p.body));
    const key = (await call('POST', '/v1/keys', { name: 'fork-quota', role: 'member', project: p.body.id })).body.key as string;
    const src = await call('POST', '/v1/sandboxes', { image: { base: 'busybox' }, resources: SMALL }, key);
    assert.equal(src.status, 201, JSON.stringify(src.body));
    made.push(await Sandbox.connect(src.body.id, { client }));
    const fork = await call('POST', `/v1/sandboxes/${src.body.id}/fork`, { count: 3 }, key);
    assert.equal(fork.status, 429, JSON.stringify(fork.body));
    assert.equal(fork.body.error.code, 'QUOTA_EXCEEDED');
    assert.match(fork.body.error.snapshot, /^sha256:/);
    const left = await call('GET', '/v1/sandboxes', undefined, key);
    assert.deepEqual(
      left.body.items.map((s: { id: string }) => s.id),
      [src.body.id],
    );
    assert.equal((await call('GET', `/v1/projects/${p.body.id}`)).body.usage.sandboxes, 1);
    // Within the quota the same fork works.
    const ok = await call('POST', `/v1/sandboxes/${src.body.id}/fork`, { count: 2 }, key);
    assert.equal(ok.status, 201, JSON.stringify(ok.body));
    for (const sb of ok.body.sandboxes) made.push(await Sandbox.connect(sb.id, { client }));
  });

  test('unknown sandboxes and snapshots are 404; bad input is a 400 naming the field', async () => {
    const missing = 'nosuch-0000000000000000';
    for (const route of [`/v1/sandboxes/${missing}/snapshot`, `/v1/sandboxes/${missing}/fork`]) {
      const r = await call('POST', route, route.endsWith('fork') ? { count: 1 } : {});
      assert.equal(r.status, 404, route);
      assert.equal(r.body.error.code, 'SANDBOX_NOT_FOUND');
    }
    const unknown = await call('POST', '/v1/sandboxes', { snapshot: `sha256:${'0'.repeat(64)}` });
    assert.equal(unknown.status, 404);
    assert.equal(unknown.body.error.code, 'LAYER_NOT_FOUND');
    assert.equal(unknown.body.error.field, 'snapshot');

    const notSnapshot = await call('POST', '/v1/sandboxes', { snapshot: 'busybox' });
    assert.equal(notSnapshot.status, 400);
    assert.equal(notSnapshot.body.error.field, 'snapshot');
    const both = await call('POST', '/v1/sandboxes', { image: { base: 'busybox' }, snapshot: 'busybox' });
    assert.equal(both.status, 400);
    assert.equal(both.body.error.field, 'image');
    const neither = await call('POST', '/v1/sandboxes', {});
    assert.equal(neither.status, 400);

    const sb = await create({ image: { base: 'busybox' } });
    for (const count of [MAX_FORK_COUNT + 1, 0, 1.5, '3', undefined]) {
      const r = await call('POST', `/v1/sandboxes/${sb.id}/fork`, count === undefined ? {} : { count });
      assert.equal(r.status, 400, `count ${String(count)}`);
      assert.equal(r.body.error.field, 'count');
    }
    const badName = await call('POST', `/v1/sandboxes/${sb.id}/snapshot`, { name: 'Not A Name' });
    assert.equal(badName.status, 400);
    assert.equal(badName.body.error.field, 'name');
    const extra = await call('POST', `/v1/sandboxes/${sb.id}/snapshot`, { nope: 1 });
    assert.equal(extra.status, 400);
    // The forks' labels are the source's merged with the request's: together they are held to the
    // limit of one create (64), and nothing is created past it.
    const labelled = await create({
      image: { base: 'busybox' },
      resources: SMALL,
      labels: Object.fromEntries(Array.from({ length: 40 }, (_, i) => [`src${i}`, 'x'])),
    });
    const before = (await call('GET', '/v1/sandboxes')).body.items.length as number;
    const tooMany = await call('POST', `/v1/sandboxes/${labelled.id}/fork`, {
      count: 1,
      labels: Object.fromEntries(Array.from({ length: 40 }, (_, i) => [`req${i}`, 'y'])),
    });
    assert.equal(tooMany.status, 400, JSON.stringify(tooMany.body));
    assert.equal(tooMany.body.error.field, 'labels');
    assert.equal((await call('GET', '/v1/sandboxes')).body.items.length, before);

    // A sibling project's snapshot (and sandbox) is not there for it; a sub-project sees its
    // parent's, as with every layer.
    const memberOf = async (name: string): Promise<string> => {
      const p = await call('POST', '/v1/projects', { name });
      const k = await call('POST', '/v1/keys', { name, role: 'member', project: p.body.id });
      return k.body.key as string;
    };
    const mine = await memberOf('snap-mine');
    const theirs = await memberOf('snap-theirs');
    const own = await call('POST', '/v1/sandboxes', { image: { base: 'busybox' }, resources: SMALL }, mine);
    assert.equal(own.status, 201, JSON.stringify(own.body));
    made.push(await Sandbox.connect(own.body.id, { client }));
    const snap = await call('POST', `/v1/sandboxes/${own.body.id}/snapshot`, {}, mine);
    assert.equal(snap.status, 201, JSON.stringify(snap.body));
    const foreign = await call('POST', '/v1/sandboxes', { snapshot: snap.body.digest }, theirs);
    assert.equal(foreign.status, 404);
    assert.equal(foreign.body.error.code, 'LAYER_NOT_FOUND');
    const foreignSnap = await call('POST', `/v1/sandboxes/${own.body.id}/snapshot`, {}, theirs);
    assert.equal(foreignSnap.status, 404);
    const foreignFork = await call('POST', `/v1/sandboxes/${own.body.id}/fork`, { count: 1 }, theirs);
    assert.equal(foreignFork.status, 404);
    // A snapshot layer cannot be uploaded as such.
    const upload = await fetch(`${platform.url}/v1/layers?kind=snapshot`, {
      method: 'POST',
      headers: { authorization: `Bearer ${platform.adminKey}` },
      body: Buffer.alloc(1024),
    });
    assert.equal(upload.status, 400);
    assert.equal(((await upload.json()) as any).error.field, 'query.kind');
  });

  test(`a chain is at most ${MAX_SNAPSHOT_DEPTH} snapshots deep; past it a snapshot is a 409`, async () => {
    let sb = await create({ image: { base: 'busybox' } });
    for (let i = 0; i < MAX_SNAPSHOT_DEPTH; i++) {
      await sh(sb, `echo ${i} > /level`);
      const snap = await sb.snapshot();
      const next = await create({ snapshot: snap.digest });
      await sb.kill();
      sb = next;
    }
    assert.equal(sb.lastInfo?.layers.length, 1 + MAX_SNAPSHOT_DEPTH);
    assert.equal(await sh(sb, 'cat /level'), `${MAX_SNAPSHOT_DEPTH - 1}\n`);
    await assert.rejects(sb.snapshot(), (err: unknown) => isDsecError(err, 'CONFLICT'));
  });
});

describe('packing an upper directory', () => {
  test('owners shifted from a user namespace range are stored as the sandbox saw them; the parents are part of the digest', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'dsec-test-upper-'));
    const store = new LayerStore({ root: path.join(dir, 'layers'), unmountLingerMs: 0 });
    try {
      const upper = path.join(dir, 'upper');
      await mkdir(path.join(upper, 'home'), { recursive: true });
      await writeFile(path.join(upper, 'home', 'f'), 'x');
      await chown(path.join(upper, 'home', 'f'), 100_005, 100_007);
      await chown(path.join(upper, 'home'), 100_000, 100_000);
      await writeFile(path.join(upper, 'outside'), 'y');
      await chown(path.join(upper, 'outside'), 5, 5);
      const parents = [`sha256:${'a'.repeat(64)}`];
      const shifted = await store.build({ type: 'upper', dir: upper, parents, idShift: { uid: 100_000, gid: 100_000 } }, { kind: 'snapshot' });
      const plain = await store.build({ type: 'upper', dir: upper, parents }, { kind: 'snapshot' });
      const otherParents = await store.build({ type: 'upper', dir: upper, parents: [`sha256:${'b'.repeat(64)}`] }, { kind: 'snapshot' });
      assert.notEqual(shifted.digest, plain.digest);
      assert.notEqual(plain.digest, otherParents.digest, 'the parents are part of the digest');
      assert.equal((await store.build({ type: 'upper', dir: upper, parents }, { kind: 'snapshot' })).digest, plain.digest, 'deterministic');
      const mnt = await store.acquire(shifted.digest);
      try {
        const f = await stat(path.join(mnt, 'home', 'f'));
        assert.deepEqual([f.uid, f.gid], [5, 7]);
        const home = await stat(path.join(mnt, 'home'));
        assert.deepEqual([home.uid, home.gid], [0, 0]);
        const out = await stat(path.join(mnt, 'outside'));
        assert.deepEqual([out.uid, out.gid], [65534, 65534], 'ids outside the range');
      } finally {
        await store.release(shifted.digest);
      }
      await assert.rejects(store.build({ type: 'upper', dir: upper, parents, idShift: { uid: -1, gid: 0 } }, { kind: 'snapshot' }), (err: unknown) =>
        isDsecError(err, 'INVALID_ARGUMENT'),
      );
      assert.deepEqual(await mountsUnder(path.join(dir, 'layers', 'tmp')), [], 'no mount left behind');
    } finally {
      await store.close();
      for (const m of await mountsUnder(dir)) umount(m, MNT.DETACH);
      await rm(dir, { recursive: true, force: true });
    }
  });
});
