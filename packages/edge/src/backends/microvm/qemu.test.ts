import assert from 'node:assert/strict';
import { test } from 'node:test';
import { qemuArgs, TCG_TB_MIB } from './qemu.js';
import type { VmLaunch } from './qemu.js';

const launch = (accel: VmLaunch['accel']): VmLaunch => ({
  qemu: 'qemu-system-x86_64',
  accel,
  kernel: '/k',
  initramfs: '/i',
  cmdline: [],
  memoryMiB: 256,
  vcpus: 1,
  disks: [],
  runDir: '/run/vm',
});

/** The value that follows each occurrence of `flag`. */
const values = (args: string[], flag: string): string[] => args.flatMap((a, i) => (a === flag ? [args[i + 1]!] : []));

test('every microVM reports free pages to the host (a balloon that is never inflated)', () => {
  for (const accel of ['kvm', 'tcg'] as const) {
    assert.ok(values(qemuArgs(launch(accel)), '-device').includes('virtio-balloon-device,free-page-reporting=on'), accel);
  }
});

test("TCG's translated-code buffer is bounded; KVM has none", () => {
  assert.deepEqual(values(qemuArgs(launch('tcg')), '-accel'), [`tcg,tb-size=${TCG_TB_MIB}`]);
  assert.deepEqual(values(qemuArgs(launch('kvm')), '-accel'), ['kvm']);
});
