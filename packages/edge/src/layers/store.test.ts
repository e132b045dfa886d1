// Layer store tests: real mkfs.erofs, real mounts (run as root). Each test owns a temp root
// and unmounts and deletes it even when it fails.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, lstatSync, readdirSync, readFileSync, readlinkSync, statSync } from 'node:fs';
import { chmod, mkdir, mkdtemp, rm, symlink, utimes, writeFile } from 'node:fs/promises';
import { createHash } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import tar from 'tar-stream';
import type { Header } from 'tar-stream';
import { isDsecError } from '@dsec/protocol';
import { mount, mountsUnder, MNT, MS, umount } from '../sys/linux.js';
import { LayerStore } from './index.js';
import type { LayerStoreOptions } from './index.js';
import { lgetxattr, OVERLAY_OPAQUE_XATTR } from '../sys/linux.js';

type TarEntrySpec = Partial<Header> & { name: string; content?: string | Buffer };

/** A tar archive (with its end-of-archive marker) built with tar-stream. */
async function makeTar(entries: TarEntrySpec[]): Promise<Buffer> {
  const pack = tar.pack();
  const chunks: Buffer[] = [];
  const done = (async () => {
    for await (const c of pack) chunks.push(c as Buffer);
  })();
  for (const e of entries) {
    const { content, ...header } = e;
    const isFile = header.type === undefined || header.type === 'file';
    const body = content !== undefined ? Buffer.from(content) : isFile ? Buffer.alloc(0) : undefined;
    await new Promise<void>((resolve, reject) => {
      const cb = (err?: Error | null) => (err ? reject(err) : resolve());
      if (body !== undefined) pack.entry({ mode: 0o644, mtime: new Date(1_000_000_000_000), ...header }, body, cb);
      else pack.entry({ mode: header.type === 'directory' ? 0o755 : 0o644, mtime: new Date(1_000_000_000_000), ...header }, cb);
    });
  }
  pack.finalize();
  await done;
  return Buffer.concat(chunks);
}

async function* chunksOf(buf: Buffer, size = 700): AsyncGenerator<Uint8Array> {
  for (let i = 0; i < buf.length; i += size) yield buf.subarray(i, i + size);
}

function sha256(buf: Buffer): string {
  return 'sha256:' + createHash('sha256').update(buf).digest('hex');
}

function mountCount(path: string): number {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .filter((l) => l.split(' ')[4] === path).length;
}

/** A temp dir with 'dsec' in its name, a store in it, and cleanup that always runs. */
class Fixture {
  dir = '';
  stores: LayerStore[] = [];

  async setup(): Promise<this> {
    this.dir = await mkdtemp(join(tmpdir(), 'dsec-layers-test-'));
    return this;
  }

  store(opts: Partial<LayerStoreOptions> = {}): LayerStore {
    const s = new LayerStore({ root: join(this.dir, 'layers'), unmountLingerMs: 0, ...opts });
    this.stores.push(s);
    return s;
  }

  async cleanup(): Promise<void> {
    for (const s of this.stores) await s.close().catch(() => undefined);
    if (this.dir === '') return;
    for (const m of await mountsUnder(this.dir)) umount(m, MNT.DETACH);
    await rm(this.dir, { recursive: true, force: true });
  }
}

async function assertLayerInvalid(p: Promise<unknown>, pattern?: RegExp): Promise<void> {
  await assert.rejects(p, (err: unknown) => {
    assert.ok(isDsecError(err, 'LAYER_INVALID'), `expected LAYER_INVALID, got ${String(err)}`);
    if (pattern) assert.match((err as Error).message, pattern);
    return true;
  });
}

describe('busybox layer', () => {
  const fx = new Fixture();
  before(() => fx.setup());
  after(() => fx.cleanup());

  test('builds in well under 2 s, mounts, reads, unmounts on the last release', async () => {
    const store = fx.store();
    await store.init();
    const progress: string[] = [];
    const t0 = performance.now();
    const info = await store.build({ type: 'busybox' }, { kind: 'base', name: 'busybox', onProgress: (m) => progress.push(m) });
    const ms = performance.now() - t0;
    assert.ok(ms < 1500, `busybox build took ${ms.toFixed(0)} ms`);
    assert.ok(progress.length > 0);
    assert.match(info.digest, /^sha256:[0-9a-f]{64}$/);
    assert.deepEqual(info.names, ['busybox:latest']);
    assert.equal(info.kind, 'base');
    assert.ok(info.blobBytes > 1_000_000 && info.metaBytes > 0 && info.files > 100);

    const hex = info.digest.slice(7);
    const root = join(fx.dir, 'layers');
    for (const f of ['meta.erofs', 'data.blob', 'layer.json']) assert.ok(existsSync(join(root, 'blobs', hex, f)), f);
    const onDisk = createHash('sha256')
      .update(readFileSync(join(root, 'blobs', hex, 'meta.erofs')))
      .update(readFileSync(join(root, 'blobs', hex, 'data.blob')))
      .digest('hex');
    assert.equal(onDisk, hex, 'digest covers meta.erofs then data.blob');
    assert.deepEqual(JSON.parse(readFileSync(join(root, 'names.json'), 'utf8')), { 'busybox:latest': info.digest });

    const mnt = await store.acquire(info.digest);
    assert.equal(mnt, join(root, 'mnt', hex));
    assert.equal(mountCount(mnt), 1);
    assert.match(readFileSync(join(mnt, 'etc/passwd'), 'utf8'), /^root:x:0:0:/);
    assert.match(readFileSync(join(mnt, 'etc/passwd'), 'utf8'), /^nobody:/m);
    assert.match(readFileSync(join(mnt, 'etc/hosts'), 'utf8'), /127\.0\.0\.1\s+localhost/);
    assert.equal(readFileSync(join(mnt, 'etc/hostname'), 'utf8'), '');
    assert.equal(readlinkSync(join(mnt, 'bin/sh')), 'busybox');
    assert.equal(readlinkSync(join(mnt, 'bin/ls')), 'busybox');
    assert.equal(statSync(join(mnt, 'tmp')).mode & 0o7777, 0o1777);
    for (const d of ['root', 'proc', 'sys', 'dev']) assert.ok(statSync(join(mnt, d)).isDirectory(), d);
    assert.ok(readFileSync(join(mnt, 'bin/busybox')).equals(readFileSync('/bin/busybox')));
    const out = execFileSync(join(mnt, 'bin/busybox'), ['echo', 'hi'], { encoding: 'utf8' });
    assert.equal(out, 'hi\n');
    // The mount is read-only.
    await assert.rejects(writeFile(join(mnt, 'new'), 'x'), /EROFS|read-only/);

    await store.release(info.digest);
    assert.equal(mountCount(mnt), 0, 'unmounted after the last release');

    // Same binary, same digest: a second build only adds the name.
    const again = await store.build({ type: 'busybox' }, { kind: 'base', name: 'bb:v2', labels: { a: 'b' } });
    assert.equal(again.digest, info.digest);
    assert.deepEqual(again.names, ['bb:v2', 'busybox:latest']);
    assert.deepEqual(again.labels, { a: 'b' });
    assert.equal((await store.list()).length, 1);
    assert.deepEqual(readdirSync(join(root, 'tmp')), []);
  });
});

describe('dir layers', () => {
  const fx = new Fixture();
  before(() => fx.setup());
  after(() => fx.cleanup());

  async function makeTree(dir: string): Promise<void> {
    await mkdir(join(dir, 'a/b'), { recursive: true });
    await writeFile(join(dir, 'a/hello.txt'), 'hello\n');
    await writeFile(join(dir, 'a/b/big.bin'), Buffer.alloc(3_000_000, 7));
    await writeFile(join(dir, 'run.sh'), '#!/bin/sh\necho ok\n');
    await chmod(join(dir, 'run.sh'), 0o755);
    await symlink('a/hello.txt', join(dir, 'link'));
    await utimes(join(dir, 'a/hello.txt'), new Date('2001-02-03T04:05:06Z'), new Date('2001-02-03T04:05:06Z'));
  }

  test('the same tree gives the same digest; content changes it; mtimes and modes are kept', async () => {
    const store = fx.store({ chunkSizeBytes: 65_536 });
    const src = join(fx.dir, 'src');
    await makeTree(src);
    const one = await store.build({ type: 'dir', path: src }, { kind: 'workspace', name: 'ws' });
    const two = await store.build({ type: 'dir', path: src }, { kind: 'workspace' });
    assert.equal(two.digest, one.digest);
    assert.deepEqual(two.names, ['ws:latest']);
    assert.equal(one.contentBytes, 6 + 3_000_000 + 18);
    assert.equal(one.files, 6);

    const changed = join(fx.dir, 'changed');
    await makeTree(changed);
    await writeFile(join(changed, 'a/hello.txt'), 'hellO\n');
    await utimes(join(changed, 'a/hello.txt'), new Date('2001-02-03T04:05:06Z'), new Date('2001-02-03T04:05:06Z'));
    const three = await store.build({ type: 'dir', path: changed }, { kind: 'workspace' });
    assert.notEqual(three.digest, one.digest);

    const mnt = await store.acquire(one.digest);
    try {
      assert.equal(readFileSync(join(mnt, 'a/hello.txt'), 'utf8'), 'hello\n');
      assert.equal(statSync(join(mnt, 'a/hello.txt')).mtime.toISOString(), '2001-02-03T04:05:06.000Z');
      assert.equal(statSync(join(mnt, 'run.sh')).mode & 0o777, 0o755);
      assert.equal(readlinkSync(join(mnt, 'link')), 'a/hello.txt');
      assert.ok(readFileSync(join(mnt, 'a/b/big.bin')).equals(Buffer.alloc(3_000_000, 7)));
    } finally {
      await store.release(one.digest);
    }
  });

  test('a layer with no file data has an empty blob and still mounts', async () => {
    const store = fx.store();
    const src = join(fx.dir, 'empty-data');
    await mkdir(join(src, 'd'), { recursive: true });
    await writeFile(join(src, 'empty'), '');
    await symlink('/nowhere', join(src, 'dangling'));
    const info = await store.build({ type: 'dir', path: src }, { kind: 'toolkit' });
    assert.equal(info.blobBytes, 0);
    const mnt = await store.acquire(info.digest);
    try {
      assert.deepEqual(readdirSync(mnt).sort(), ['d', 'dangling', 'empty']);
      assert.equal(readFileSync(join(mnt, 'empty'), 'utf8'), '');
    } finally {
      await store.release(info.digest);
    }
  });

  test('a missing dir is INVALID_ARGUMENT', async () => {
    const store = fx.store();
    await assert.rejects(store.build({ type: 'dir', path: join(fx.dir, 'nope') }, { kind: 'base' }), (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT'));
  });
});

describe('names and references', () => {
  const fx = new Fixture();
  before(() => fx.setup());
  after(() => fx.cleanup());

  test('resolve by digest, bare hex, name and name:tag; tag, untag, list by kind', async () => {
    const store = fx.store();
    const src = join(fx.dir, 'src');
    await mkdir(src);
    await writeFile(join(src, 'f'), 'x');
    const info = await store.build({ type: 'dir', path: src }, { kind: 'toolkit', name: 'tools/py:3.11' });
    const hex = info.digest.slice(7);
    for (const ref of [info.digest, hex, 'tools/py:3.11']) assert.equal((await store.resolve(ref)).digest, info.digest, ref);
    await assert.rejects(store.resolve('tools/py'), (e: unknown) => isDsecError(e, 'LAYER_NOT_FOUND'));
    await assert.rejects(
      store.resolve('sha256:' + '0'.repeat(64)),
      (e: unknown) => isDsecError(e, 'LAYER_NOT_FOUND') && e.details.layer === 'sha256:' + '0'.repeat(64),
    );
    await assert.rejects(store.resolve('Not A Ref'), (e: unknown) => isDsecError(e, 'LAYER_NOT_FOUND'));

    const tagged = await store.tag(info.digest, 'tools/py');
    assert.deepEqual(tagged.names, ['tools/py:3.11', 'tools/py:latest']);
    assert.equal((await store.resolve('tools/py')).digest, info.digest);
    for (const bad of ['Upper', '-x', 'a:b:c', 'x:' + 'a'.repeat(129), 'sha256:abc', 'a'.repeat(64), '']) {
      await assert.rejects(store.tag(info.digest, bad), (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT'), bad);
    }
    await assert.rejects(store.build({ type: 'dir', path: src }, { kind: 'base', name: 'BAD NAME' }), (e: unknown) => isDsecError(e, 'INVALID_ARGUMENT'));

    await store.untag('tools/py:3.11');
    assert.deepEqual((await store.resolve(info.digest)).names, ['tools/py:latest']);
    await assert.rejects(store.untag('tools/py:3.11'), (e: unknown) => isDsecError(e, 'LAYER_NOT_FOUND'));

    assert.equal((await store.list({ kind: 'toolkit' })).length, 1);
    assert.equal((await store.list({ kind: 'base' })).length, 0);

    // A restarted store sees the same layers and names.
    const reopened = fx.store();
    assert.deepEqual(await reopened.resolve('tools/py'), await store.resolve('tools/py'));
  });
});

describe('tar layers and overlay whiteouts', () => {
  const fx = new Fixture();
  const overlays: string[] = [];
  before(() => fx.setup());
  after(async () => {
    for (const o of overlays) umount(o, MNT.DETACH);
    await fx.cleanup();
  });

  test('whiteouts and opaque dirs hide lower files in a real overlay', async () => {
    const store = fx.store();
    const base = join(fx.dir, 'base');
    await mkdir(join(base, 'd'), { recursive: true });
    await mkdir(join(base, 'keep'));
    for (const f of ['a.txt', 'b.txt', 'd/x', 'd/y', 'keep/k']) await writeFile(join(base, f), f);
    const baseInfo = await store.build({ type: 'dir', path: base }, { kind: 'base' });

    const upperTar = await makeTar([
      { name: './', type: 'directory', mode: 0o755 },
      { name: '.wh.a.txt' },
      { name: 'd/', type: 'directory' },
      { name: 'd/.wh..wh..opq' },
      { name: 'd/z', content: 'z' },
      { name: 'c.txt', content: 'c' },
      { name: 'keep/.wh.k' },
      { name: 'keep/k2', content: 'k2' },
    ]);
    // gzip is detected by its magic bytes; the stream arrives in small chunks.
    const upper = await store.build({ type: 'tar', stream: chunksOf(gzipSync(upperTar)) }, { kind: 'toolkit', name: 'upper' });
    const plain = await store.build({ type: 'tar', stream: chunksOf(upperTar) }, { kind: 'toolkit' });
    assert.equal(plain.digest, upper.digest, 'gzip and plain tar give the same layer');

    const lowerMnt = await store.acquire(baseInfo.digest);
    const upperMnt = await store.acquire(upper.digest);
    // In the layer itself: a char device 0:0 and the opaque xattr.
    const wh = lstatSync(join(upperMnt, 'a.txt'));
    assert.ok(wh.isCharacterDevice() && wh.rdev === 0);
    assert.equal(lgetxattr(join(upperMnt, 'd'), OVERLAY_OPAQUE_XATTR), 'y');
    assert.equal(lgetxattr(join(upperMnt, 'keep'), OVERLAY_OPAQUE_XATTR), null);

    const target = join(fx.dir, 'overlay');
    await mkdir(target);
    mount('overlay', target, 'overlay', MS.RDONLY, `lowerdir=${upperMnt}:${lowerMnt}`);
    overlays.push(target);
    assert.deepEqual(readdirSync(target).sort(), ['b.txt', 'c.txt', 'd', 'keep']);
    assert.ok(!existsSync(join(target, 'a.txt')));
    assert.deepEqual(readdirSync(join(target, 'd')), ['z'], 'opaque dir hides d/x and d/y');
    assert.deepEqual(readdirSync(join(target, 'keep')), ['k2']);
    assert.equal(readFileSync(join(target, 'b.txt'), 'utf8'), 'b.txt');
    umount(target);
    overlays.pop();

    await store.release(upper.digest);
    await store.release(upper.digest);
    await store.release(baseInfo.digest);
  });

  test('tar metadata: mode, owner, mtime, symlinks and hard links are kept; setuid/setgid dropped; absolute paths made relative', async () => {
    const store = fx.store();
    const entries: TarEntrySpec[] = [
      { name: '/abs/file', content: 'abs', uid: 1000, gid: 1001, mtime: new Date('2010-01-01T00:00:00Z') },
      { name: 'bin/tool', content: '#!/bin/sh\n', mode: 0o4755 },
      { name: 'bin/sg', content: 'x', mode: 0o2711 },
      { name: 'sticky/', type: 'directory', mode: 0o1777 },
      { name: 'bin/alias', type: 'symlink', linkname: '/bin/tool' },
      { name: 'hard', type: 'link', linkname: 'abs/file' },
    ];
    const good = await makeTar(entries);
    // The same entries plus one whose '..' would stay inside the layer: still rejected.
    const t = await makeTar([...entries, { name: './x/../../', type: 'directory' }]);
    const info = await store.build({ type: 'tar', stream: chunksOf(good) }, { kind: 'workspace' });
    const mnt = await store.acquire(info.digest);
    try {
      const st = statSync(join(mnt, 'abs/file'));
      assert.equal(readFileSync(join(mnt, 'abs/file'), 'utf8'), 'abs');
      assert.equal(st.uid, 1000);
      assert.equal(st.gid, 1001);
      assert.equal(st.mtime.toISOString(), '2010-01-01T00:00:00.000Z');
      assert.equal(st.nlink, 2);
      assert.equal(statSync(join(mnt, 'hard')).ino, st.ino);
      assert.equal(statSync(join(mnt, 'bin/tool')).mode & 0o7777, 0o755);
      assert.equal(statSync(join(mnt, 'bin/sg')).mode & 0o7777, 0o711);
      assert.equal(statSync(join(mnt, 'sticky')).mode & 0o7777, 0o1777);
      assert.equal(readlinkSync(join(mnt, 'bin/alias')), '/bin/tool');
    } finally {
      await store.release(info.digest);
    }
    await assertLayerInvalid(store.build({ type: 'tar', stream: chunksOf(t) }, { kind: 'workspace' }), /\.\./);
  });
});

describe('untrusted tars', () => {
  const fx = new Fixture();
  let outside = '';
  let store: LayerStore;
  before(async () => {
    await fx.setup();
    outside = join(fx.dir, 'outside');
    await mkdir(outside);
    store = fx.store({ tarLimits: { maxEntries: 50, maxTotalBytes: 1_000_000 } });
    await store.init();
  });
  after(() => fx.cleanup());

  async function expectRejected(name: string, input: Buffer | AsyncIterable<Uint8Array>, pattern?: RegExp): Promise<void> {
    const stream = Buffer.isBuffer(input) ? chunksOf(input) : input;
    await assertLayerInvalid(store.build({ type: 'tar', stream }, { kind: 'workspace', name: 'bad' }), pattern);
    assert.deepEqual(readdirSync(outside), [], `${name}: nothing written outside`);
    assert.deepEqual(readdirSync(join(fx.dir, 'layers/tmp')), [], `${name}: temp dir cleaned`);
    assert.deepEqual(await store.list(), [], `${name}: no layer added`);
    assert.ok(!existsSync(join(fx.dir, 'escape')) && !existsSync(join(fx.dir, 'layers/escape')), `${name}: no escape`);
  }

  test('.. components are rejected', async () => {
    await expectRejected('dotdot', await makeTar([{ name: '../escape', content: 'x' }]), /\.\./);
    await expectRejected('deep dotdot', await makeTar([{ name: 'a/../../../escape', content: 'x' }]), /\.\./);
    await expectRejected('dotdot symlink path', await makeTar([{ name: '../escape', type: 'symlink', linkname: 'x' }]));
    await expectRejected('dotdot hardlink target', await makeTar([{ name: 'h', type: 'link', linkname: '../../etc/passwd' }]));
  });

  test('device nodes and fifos are rejected', async () => {
    await expectRejected('char dev', await makeTar([{ name: 'null', type: 'character-device', devmajor: 1, devminor: 3 }]), /device/);
    await expectRejected('block dev', await makeTar([{ name: 'sda', type: 'block-device', devmajor: 8, devminor: 0 }]), /device/);
    await expectRejected('fifo', await makeTar([{ name: 'p', type: 'fifo' }]), /fifo/);
    // GNU sparse file ('S'): tar-stream cannot expand it, so it must not pass as a plain file.
    const sparse = await makeTar([{ name: 'holes', content: 'abc' }]);
    sparse[156] = 'S'.charCodeAt(0);
    sparse.fill(0x20, 148, 156);
    let sum = 0;
    for (let i = 0; i < 512; i++) sum += sparse[i]!;
    sparse.write(sum.toString(8).padStart(6, '0') + '\0 ', 148, 'latin1');
    await expectRejected('sparse', sparse, /unsupported/);
  });

  test('writing through a symlink is rejected; replacing the symlink itself is safe', async () => {
    await expectRejected(
      'symlink then write through',
      await makeTar([
        { name: 'link', type: 'symlink', linkname: outside },
        { name: 'link/x', content: 'pwned' },
      ]),
      /symlink/,
    );
    await expectRejected(
      'relative symlink then write through',
      await makeTar([
        { name: 'up', type: 'symlink', linkname: '../../..' },
        { name: 'up/escape', content: 'pwned' },
      ]),
      /symlink/,
    );
    await expectRejected(
      'symlink then mkdir through',
      await makeTar([
        { name: 'link', type: 'symlink', linkname: outside },
        { name: 'link/sub/', type: 'directory' },
      ]),
    );
    await expectRejected('whiteout through symlink', await makeTar([{ name: 'link', type: 'symlink', linkname: outside }, { name: 'link/.wh.x' }]));

    const replace = await makeTar([
      { name: 's', type: 'symlink', linkname: join(outside, 'target') },
      { name: 's', content: 'regular now' },
    ]);
    const info = await store.build({ type: 'tar', stream: chunksOf(replace) }, { kind: 'workspace' });
    assert.deepEqual(readdirSync(outside), []);
    const mnt = await store.acquire(info.digest);
    try {
      assert.ok(lstatSync(join(mnt, 's')).isFile());
    } finally {
      await store.release(info.digest);
      await store.remove(info.digest);
    }
  });

  test('hard links must name a regular file already in the layer', async () => {
    await writeFile(join(outside, 'secret'), 'secret');
    try {
      await assertLayerInvalid(
        store.build({ type: 'tar', stream: chunksOf(await makeTar([{ name: 'h', type: 'link', linkname: join(outside, 'secret') }])) }, { kind: 'base' }),
        /hard link/,
      );
      await assertLayerInvalid(
        store.build(
          {
            type: 'tar',
            stream: chunksOf(
              await makeTar([
                { name: 'h', type: 'link', linkname: 'later' },
                { name: 'later', content: 'x' },
              ]),
            ),
          },
          { kind: 'base' },
        ),
        /hard link/,
      );
      await assertLayerInvalid(
        store.build(
          {
            type: 'tar',
            stream: chunksOf(
              await makeTar([
                { name: 'sl', type: 'symlink', linkname: outside },
                { name: 'h', type: 'link', linkname: 'sl/secret' },
              ]),
            ),
          },
          { kind: 'base' },
        ),
        /hard link/,
      );
      await assertLayerInvalid(
        store.build(
          {
            type: 'tar',
            stream: chunksOf(
              await makeTar([
                { name: 'd/', type: 'directory' },
                { name: 'h', type: 'link', linkname: 'd' },
              ]),
            ),
          },
          { kind: 'base' },
        ),
        /hard link/,
      );
      assert.equal(statSync(join(outside, 'secret')).nlink, 1, 'no link to the host file was made');
    } finally {
      await rm(join(outside, 'secret'));
    }
    assert.deepEqual(await store.list(), []);
  });

  test('truncated, random and garbage streams are rejected without hanging', async () => {
    const valid = await makeTar([
      { name: 'a', content: Buffer.alloc(5000, 1) },
      { name: 'b', content: 'b' },
    ]);
    await expectRejected('cut in file data', valid.subarray(0, 512 + 2000));
    await expectRejected('cut in a header', valid.subarray(0, 512 + 5120 + 100));
    await expectRejected('cut at an entry boundary', valid.subarray(0, 512 + 5120), /truncated/);
    await expectRejected('cut in the end marker', valid.subarray(0, valid.length - 512 - 100));
    await expectRejected('empty stream', Buffer.alloc(0));
    await expectRejected('random bytes', Buffer.from(Array.from({ length: 4096 }, (_, i) => (i * 7919 + 13) % 251)));
    const gz = gzipSync(valid);
    await expectRejected('gzip garbage', Buffer.concat([Buffer.from([0x1f, 0x8b, 0x08, 0x00]), Buffer.alloc(500, 0x55)]));
    await expectRejected('truncated gzip', gz.subarray(0, Math.floor(gz.length / 2)));
    await expectRejected('zstd', Buffer.from([0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0]), /zstd/);
    async function* failing(): AsyncGenerator<Uint8Array> {
      yield valid.subarray(0, 1024);
      throw new Error('connection reset');
    }
    await expectRejected('source error', failing());
    const corrupt = Buffer.from(valid);
    corrupt[100] = 0x37; // breaks the first header's checksum
    await expectRejected('bad header checksum', corrupt);
  });

  test('limits: entry count, total size, path length', async () => {
    const many = await makeTar(Array.from({ length: 60 }, (_, i) => ({ name: `f${i}`, content: '' })));
    await expectRejected('too many entries', many, /entries/);
    const big = await makeTar([{ name: 'big', content: Buffer.alloc(1_100_000) }]);
    await expectRejected('too big', big, /exceeds/);
    // Data that is read and dropped (a whiteout's, a directory's) counts as a file's does.
    await expectRejected('too big whiteout', await makeTar([{ name: '.wh.hidden', content: Buffer.alloc(1_100_000) }]), /exceeds/);
    const long = await makeTar([{ name: 'd/'.repeat(2100) + 'f', content: 'x' }]);
    await expectRejected('long path', long, /longer/);
  });

  test('an aborted build leaves nothing behind, even when the source stalls', async () => {
    const ac = new AbortController();
    async function* stalled(): AsyncGenerator<Uint8Array> {
      const t = await makeTar([{ name: 'a', content: 'a' }]);
      yield t.subarray(0, 512);
      setTimeout(() => ac.abort(new Error('stop')), 50);
      await new Promise(() => undefined); // never sends the rest
    }
    await assert.rejects(store.build({ type: 'tar', stream: stalled() }, { kind: 'base', signal: ac.signal }), /stop/);
    assert.deepEqual(readdirSync(join(fx.dir, 'layers/tmp')), []);
    assert.deepEqual(await store.list(), []);
  });
});

describe('OCI images', () => {
  const fx = new Fixture();
  before(() => fx.setup());
  after(() => fx.cleanup());

  async function imageLayers(): Promise<Buffer[]> {
    const l1 = await makeTar([
      { name: 'etc/', type: 'directory' },
      { name: 'etc/os', content: 'v1' },
      { name: 'gone', content: 'bye' },
      { name: 'cache/', type: 'directory' },
      { name: 'cache/old1', content: 'o' },
      { name: 'cache/sub/old2', content: 'o' },
      { name: 'bin/', type: 'directory' },
      { name: 'bin/sh', content: '#!', mode: 0o755 },
    ]);
    const l2 = await makeTar([
      { name: '.wh.gone' },
      { name: 'cache/new', content: 'n' }, // before the opaque marker: must survive it
      { name: 'cache/.wh..wh..opq' },
      { name: 'etc/os', content: 'v2' },
      { name: 'bin/ls', type: 'link', linkname: 'bin/sh' },
    ]);
    return [l1, l2];
  }

  function checkSquashed(mnt: string): void {
    assert.deepEqual(readdirSync(mnt).sort(), ['bin', 'cache', 'etc']);
    assert.equal(readFileSync(join(mnt, 'etc/os'), 'utf8'), 'v2');
    assert.deepEqual(readdirSync(join(mnt, 'cache')), ['new']);
    assert.equal(statSync(join(mnt, 'bin/ls')).ino, statSync(join(mnt, 'bin/sh')).ino);
    assert.ok(!readdirSync(mnt, { recursive: true }).some((p) => lstatSync(join(mnt, String(p))).isCharacterDevice()), 'no whiteouts left');
  }

  async function writeLayout(dir: string, layers: Buffer[], gzipFirst: boolean): Promise<void> {
    await mkdir(join(dir, 'blobs/sha256'), { recursive: true });
    const put = async (buf: Buffer) => {
      const d = sha256(buf);
      await writeFile(join(dir, 'blobs/sha256', d.slice(7)), buf);
      return { digest: d, size: buf.length };
    };
    const config = await put(Buffer.from(JSON.stringify({ architecture: 'amd64', os: 'linux', rootfs: { type: 'layers', diff_ids: [] } })));
    const layerDescs = [];
    for (const [i, l] of layers.entries()) {
      const gz = gzipFirst && i === 0;
      layerDescs.push({ mediaType: `application/vnd.oci.image.layer.v1.tar${gz ? '+gzip' : ''}`, ...(await put(gz ? gzipSync(l) : l)) });
    }
    const manifest = await put(
      Buffer.from(
        JSON.stringify({
          schemaVersion: 2,
          mediaType: 'application/vnd.oci.image.manifest.v1+json',
          config: { mediaType: 'application/vnd.oci.image.config.v1+json', ...config },
          layers: layerDescs,
        }),
      ),
    );
    await writeFile(join(dir, 'oci-layout'), '{"imageLayoutVersion":"1.0.0"}');
    await writeFile(
      join(dir, 'index.json'),
      JSON.stringify({
        schemaVersion: 2,
        manifests: [{ mediaType: 'application/vnd.oci.image.manifest.v1+json', ...manifest, platform: { os: 'linux', architecture: 'amd64' } }],
      }),
    );
  }

  test('OCI layout directory and tarball squash to the same layer', async () => {
    const store = fx.store();
    const layout = join(fx.dir, 'layout');
    await writeLayout(layout, await imageLayers(), true);
    const progress: string[] = [];
    const fromDir = await store.build({ type: 'oci', path: layout }, { kind: 'base', name: 'img', onProgress: (m) => progress.push(m) });
    assert.ok(
      progress.some((m) => /layer 2\/2/.test(m)),
      progress.join('\n'),
    );
    const tarball = join(fx.dir, 'layout.tar');
    execFileSync('tar', ['-C', layout, '-cf', tarball, '.']);
    const fromTar = await store.build({ type: 'oci', path: tarball }, { kind: 'base' });
    assert.equal(fromTar.digest, fromDir.digest);
    const mnt = await store.acquire(fromDir.digest);
    try {
      checkSquashed(mnt);
    } finally {
      await store.release(fromDir.digest);
    }
  });

  test('docker save tarball (with a symlinked duplicate layer) squashes in order', async () => {
    const store = fx.store();
    const [l1, l2] = await imageLayers();
    const dir = join(fx.dir, 'save');
    await mkdir(join(dir, 'aaa'), { recursive: true });
    await mkdir(join(dir, 'bbb'));
    await mkdir(join(dir, 'ccc'));
    await writeFile(join(dir, 'aaa/layer.tar'), l1!);
    await writeFile(join(dir, 'bbb/layer.tar'), l2!);
    await symlink('../aaa/layer.tar', join(dir, 'ccc/layer.tar'));
    await writeFile(join(dir, 'manifest.json'), JSON.stringify([{ Config: 'cfg.json', RepoTags: ['x:1'], Layers: ['aaa/layer.tar', 'bbb/layer.tar'] }]));
    const tarball = join(fx.dir, 'save.tar');
    execFileSync('tar', ['-C', dir, '-cf', tarball, '.']);
    const info = await store.build({ type: 'oci', path: tarball }, { kind: 'base' });
    const mnt = await store.acquire(info.digest);
    try {
      checkSquashed(mnt);
    } finally {
      await store.release(info.digest);
    }
    // Layers may be symlinks within the archive (docker dedupes that way), never outside it.
    await writeFile(join(dir, 'manifest.json'), JSON.stringify([{ Layers: ['ccc/layer.tar', 'bbb/layer.tar'] }]));
    const info2 = await store.build({ type: 'oci', path: dir }, { kind: 'base' });
    assert.equal(info2.digest, info.digest);
    await symlink('/etc/passwd', join(dir, 'evil.tar'));
    await writeFile(join(dir, 'manifest.json'), JSON.stringify([{ Layers: ['evil.tar'] }]));
    await assertLayerInvalid(store.build({ type: 'oci', path: dir }, { kind: 'base' }), /symlink/);
    await writeFile(join(dir, 'manifest.json'), JSON.stringify([{ Layers: ['../save.tar'] }]));
    await assertLayerInvalid(store.build({ type: 'oci', path: dir }, { kind: 'base' }), /escapes/);
  });

  test('a layer that does not match its digest, or a non-image, is LAYER_INVALID', async () => {
    const store = fx.store();
    const layout = join(fx.dir, 'bad-layout');
    const layers = await imageLayers();
    await writeLayout(layout, layers, false);
    const victim = sha256(layers[1]!).slice(7);
    await writeFile(join(layout, 'blobs/sha256', victim), await makeTar([{ name: 'evil', content: 'x' }]));
    await assertLayerInvalid(store.build({ type: 'oci', path: layout }, { kind: 'base' }), /digest/);
    const empty = join(fx.dir, 'not-an-image');
    await mkdir(empty);
    await assertLayerInvalid(store.build({ type: 'oci', path: empty }, { kind: 'base' }), /index\.json|manifest\.json/);
  });
});

describe('mounts, remove and gc', () => {
  const fx = new Fixture();
  before(() => fx.setup());
  after(() => fx.cleanup());

  test('one mount per layer, refcounted, adopted after a restart; remove in use is CONFLICT', async () => {
    const store = fx.store();
    const info = await store.build({ type: 'busybox' }, { kind: 'base', name: 'bb' });
    const a = await store.acquire(info.digest);
    const b = await store.acquire('bb');
    assert.equal(a, b);
    assert.equal(mountCount(a), 1);
    await store.release(info.digest);
    assert.equal(mountCount(a), 1, 'still mounted while one user remains');
    await assert.rejects(store.remove('bb'), (e: unknown) => isDsecError(e, 'CONFLICT'));
    assert.equal((await store.resolve('bb')).digest, info.digest, 'a refused remove changes nothing');

    // A new edge process: the mount is adopted, not mounted a second time.
    const restarted = fx.store();
    await restarted.init();
    const c = await restarted.acquire(info.digest);
    assert.equal(c, a);
    assert.equal(mountCount(a), 1);
    await restarted.release(info.digest);
    assert.equal(mountCount(a), 0, 'unmounted at zero');

    await store.release(info.digest);
    await store.remove('bb');
    await assert.rejects(store.resolve(info.digest), (e: unknown) => isDsecError(e, 'LAYER_NOT_FOUND'));
    assert.ok(!existsSync(join(fx.dir, 'layers/blobs', info.digest.slice(7))));
    assert.deepEqual(JSON.parse(readFileSync(join(fx.dir, 'layers/names.json'), 'utf8')), {});
  });

  test('linger keeps an unused layer mounted until close', async () => {
    const store = fx.store({ unmountLingerMs: 60_000 });
    const info = await store.build({ type: 'busybox' }, { kind: 'base' });
    const mnt = await store.acquire(info.digest);
    await store.release(info.digest);
    assert.equal(mountCount(mnt), 1);
    assert.equal(await store.acquire(info.digest), mnt);
    await store.release(info.digest);
    await store.close();
    assert.equal(mountCount(mnt), 0);
  });

  test('gc removes unnamed, unused layers only; init clears half-built temp dirs', async () => {
    const root = join(fx.dir, 'gc-layers');
    const store = fx.store({ root });
    const mk = async (name: string) => {
      const d = join(fx.dir, `gc-${name}`);
      await mkdir(d);
      await writeFile(join(d, 'f'), name);
      return d;
    };
    const named = await store.build({ type: 'dir', path: await mk('named') }, { kind: 'base', name: 'keep' });
    const loose = await store.build({ type: 'dir', path: await mk('loose') }, { kind: 'base' });
    const busy = await store.build({ type: 'dir', path: await mk('busy') }, { kind: 'base' });
    const untagged = await store.build({ type: 'dir', path: await mk('untagged') }, { kind: 'base', name: 'tmp-name' });
    await store.untag('tmp-name');
    const mnt = await store.acquire(busy.digest);
    const { removed } = await store.gc();
    assert.deepEqual(removed.sort(), [loose.digest, untagged.digest].sort());
    assert.deepEqual((await store.list()).map((l) => l.digest).sort(), [named.digest, busy.digest].sort());
    await store.release(busy.digest);
    assert.equal(mountCount(mnt), 0);
    assert.deepEqual((await store.gc()).removed, [busy.digest]);

    await mkdir(join(root, 'tmp/build-crashed/root'), { recursive: true });
    await writeFile(join(root, 'tmp/build-crashed/root/f'), 'x');
    await mkdir(join(root, 'blobs', 'f'.repeat(64)));
    const fresh = fx.store({ root });
    await fresh.init();
    assert.deepEqual(readdirSync(join(root, 'tmp')), []);
    assert.ok(!existsSync(join(root, 'blobs', 'f'.repeat(64))), 'a blob dir without layer.json is dropped');
    assert.deepEqual(
      (await fresh.list()).map((l) => l.digest),
      [named.digest],
    );
  });
});
