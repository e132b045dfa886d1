// Imported disk images: the format comes from the magic bytes, never from qemu-img's probing, and
// an image that names a host file (backing file, external data file, VMDK extent) is refused.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtemp, rm, truncate, writeFile } from 'node:fs/promises';
import os from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { DsecError } from '@dsec/protocol';
import { importDiskImage } from './vm-image.js';

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
