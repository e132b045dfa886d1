import assert from 'node:assert/strict';
import { test } from 'node:test';
import { cpioNewc, GUEST_INIT } from './guest.js';

test('the initramfs archive is the same bytes for the same input (owners, times, inodes fixed)', () => {
  const entries = [
    { name: 'bin', mode: 0o40755 },
    { name: 'init', mode: 0o100755, data: Buffer.from(GUEST_INIT) },
  ];
  const a = cpioNewc(entries);
  const b = cpioNewc(entries.map((e) => ({ ...e })));
  assert.deepEqual(a, b);
  const text = a.toString('latin1');
  // newc: magic, then 13 eight-digit hex fields; uid, gid and mtime are 0.
  assert.ok(text.startsWith('070701'));
  const header = text.slice(6, 6 + 13 * 8);
  const field = (i: number): number => parseInt(header.slice(i * 8, i * 8 + 8), 16);
  assert.equal(field(0), 1, 'inode by position');
  assert.equal(field(1), 0o40755);
  assert.equal(field(2), 0, 'uid');
  assert.equal(field(3), 0, 'gid');
  assert.equal(field(5), 0, 'mtime');
  assert.ok(text.includes('TRAILER!!!'));
  assert.equal(a.length % 4, 0);
  // A change of one byte of content changes the archive.
  assert.notDeepEqual(a, cpioNewc([entries[0]!, { ...entries[1]!, data: Buffer.from(GUEST_INIT + ' ') }]));
});
