// Imported disk images: the format comes from the magic bytes, never from qemu-img's probing, and
// an image that names a host file (backing file, external data file, VMDK extent) is refused.
// A VM's overlay flattened for a snapshot: read over the image given, never over the backing
// file its header names.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtemp, open, readFile, rm, stat, truncate, writeFile } from 'node:fs/promises';
import os from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { DsecError } from '@dsec/protocol';
import { flattenOverlay, importDiskImage } from './vm-image.js';

const refusedNaming = (pattern: RegExp) => (err: unknown) =>
  err instanceof DsecError && err.code === 'INVALID_ARGUMENT' && err.details.field === 'body' && pattern.test(err.message);

describe('importDiskImage', () => {
  let dir: string;
  before(async () => {
    dir = await mkdtemp(join(os.tmpdir(), 'dsec-vm-import-'));
  });
  after(async () => rm(dir, { recursive: true, force: true }));

  test('a raw image and a plain qcow2 are imported as qcow2', async () => {
    const raw = join(dir, 'plain.raw');
    await writeFile(raw, 'not a format header\n');
    await truncate(raw, 4 * 1024 * 1024);
    assert.deepEqual(await importDiskImage(raw, join(dir, 'plain-out.qcow2')), { format: 'raw', virtualBytes: 4 * 1024 * 1024 });
    const qcow = join(dir, 'plain.qcow2');
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', qcow, '8M']);
    assert.deepEqual(await importDiskImage(qcow, join(dir, 'plain2-out.qcow2')), { format: 'qcow2', virtualBytes: 8 * 1024 * 1024 });
  });

  test('a qcow2 with a backing file or an external data file is refused before qemu-img reads it', async () => {
    const backed = join(dir, 'backed.qcow2');
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', '-u', '-b', '/etc/shadow', '-F', 'raw', backed, '8M']);
    await assert.rejects(importDiskImage(backed, join(dir, 'o1.qcow2')), refusedNaming(/backing file/));
    const external = join(dir, 'external.qcow2');
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', '-o', `data_file=${join(dir, 'external.data')}`, external, '8M']);
    await assert.rejects(importDiskImage(external, join(dir, 'o2.qcow2')), refusedNaming(/external data file/));
  });

  test('a VMDK descriptor naming /etc/shadow is refused, not probed', async () => {
    const vmdk = join(dir, 'shadow.vmdk');
    const descriptor = [
      '# Disk DescriptorFile',
      'version=1',
      'CID=fffffffe',
      'parentCID=ffffffff',
      'createType="monolithicFlat"',
      'RW 2048 FLAT "/etc/shadow" 0',
      '',
    ];
    await writeFile(vmdk, descriptor.join('\n'));
    await assert.rejects(importDiskImage(vmdk, join(dir, 'o3.qcow2')), refusedNaming(/vmdk/));
  });
});

describe('flattenOverlay', () => {
  let dir: string;
  before(async () => {
    dir = await mkdtemp(join(os.tmpdir(), 'dsec-vm-flatten-'));
  });
  after(async () => rm(dir, { recursive: true, force: true }));

  /** The first `bytes` of a qcow2's guest view, read as raw. */
  async function guestBytes(qcow: string, name: string, bytes: number): Promise<Buffer> {
    const raw = join(dir, `${name}.raw`);
    execFileSync('qemu-img', ['convert', '-f', 'qcow2', '-O', 'raw', qcow, raw]);
    return (await readFile(raw)).subarray(0, bytes);
  }

  test("the overlay's clusters over the image given, one standalone qcow2; the header's backing path is never opened", async () => {
    const base = join(dir, 'base.qcow2');
    const seed = join(dir, 'seed.raw');
    await writeFile(seed, Buffer.concat([Buffer.alloc(65536, 'a'), Buffer.alloc(65536, 'b')]));
    await truncate(seed, 4 * 1024 * 1024);
    execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'qcow2', seed, base]);
    // The overlay's header names a host file; its second cluster is rewritten.
    const overlay = join(dir, 'overlay.qcow2');
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', '-u', '-b', '/etc/shadow', '-F', 'raw', overlay, '4M']);
    const opts = `driver=qcow2,file.filename=${overlay},backing.driver=qcow2,backing.file.filename=${base}`;
    execFileSync('qemu-io', ['--image-opts', '-c', 'write -P 0x63 65536 65536', opts], { stdio: 'ignore' });
    const out = join(dir, 'flat.qcow2');
    await flattenOverlay(overlay, base, out, 4 * 1024 * 1024);
    const info = JSON.parse(execFileSync('qemu-img', ['info', '--output=json', '-f', 'qcow2', out], { encoding: 'utf8' })) as Record<string, unknown>;
    assert.equal(info['backing-filename'], undefined);
    assert.equal(info['virtual-size'], 4 * 1024 * 1024);
    const got = await guestBytes(out, 'flat', 3 * 65536);
    assert.ok(got.subarray(0, 65536).equals(Buffer.alloc(65536, 'a')), 'the image where the overlay has nothing');
    assert.ok(got.subarray(65536, 2 * 65536).equals(Buffer.alloc(65536, 'c')), "the overlay's cluster");
    assert.ok(got.subarray(2 * 65536).equals(Buffer.alloc(65536, 0)));
  });

  test("an overlay whose header was changed to a virtual size above the sandbox's disk is refused, nothing written", async () => {
    const base = join(dir, 'small-base.qcow2');
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', base, '4M']);
    const overlay = join(dir, 'grown.qcow2');
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', '-F', 'qcow2', '-b', base, '-u', overlay, '4M']);
    // What a guest's QEMU (or anything that can write the file) could do: the header's size field set to 1 TiB.
    const fh = await open(overlay, 'r+');
    try {
      const size = Buffer.alloc(8);
      size.writeBigUInt64BE(1n << 40n);
      await fh.write(size, 0, 8, 24);
    } finally {
      await fh.close();
    }
    const out = join(dir, 'grown-flat.qcow2');
    await assert.rejects(flattenOverlay(overlay, base, out, 4 * 1024 * 1024), /virtual size of 1099511627776 bytes, above the sandbox's disk of 4194304 bytes/);
    await assert.rejects(stat(out), { code: 'ENOENT' });
  });

  test('an overlay naming an external data file is refused', async () => {
    const overlay = join(dir, 'external.qcow2');
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', '-o', `data_file=${join(dir, 'external.data')}`, overlay, '4M']);
    await assert.rejects(flattenOverlay(overlay, overlay, join(dir, 'o.qcow2'), 4 * 1024 * 1024), /external data file/);
  });
});
