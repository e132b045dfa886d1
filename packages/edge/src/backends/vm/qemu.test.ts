// The full VM's QEMU command line: the root disk's bus follows the image (NVMe by default, any OS
// boots from it; virtio-blk for dsec's desktop image, which QEMU can migrate), and nothing on it
// names a host path but the VM's own run directory.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { fullVmArgs } from './qemu.js';

const base = { accel: 'tcg', memoryMiB: 512, vcpus: 1, runDir: '/run/dsec/vm/sb-1' } as const;

function rootDevice(args: string[]): string {
  const devices = args.filter((_, i) => args[i - 1] === '-device');
  const roots = devices.filter((d) => d.includes('drive=root'));
  assert.equal(roots.length, 1, 'one root disk');
  return roots[0]!;
}

test('the root disk is NVMe unless the image asks for virtio-blk', () => {
  assert.match(rootDevice(fullVmArgs(base)), /^nvme,drive=root,.*bootindex=0/);
  assert.match(rootDevice(fullVmArgs({ ...base, disk: 'nvme' })), /^nvme,/);
  assert.match(rootDevice(fullVmArgs({ ...base, disk: 'virtio-blk' })), /^virtio-blk-pci,drive=root,.*bootindex=0/);
});

test('no host path on the command line but the run directory and the fd sets', () => {
  for (const disk of ['nvme', 'virtio-blk'] as const) {
    const args = fullVmArgs({ ...base, disk });
    for (const a of args) {
      for (const m of a.matchAll(/(?:file|filename|path)=([^,]+)/g)) {
        assert.ok(m[1]!.startsWith('/dev/fdset/') || m[1]!.startsWith(base.runDir), a);
      }
    }
  }
});
