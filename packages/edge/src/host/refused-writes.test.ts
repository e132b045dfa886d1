import assert from 'node:assert/strict';
import { appendFileSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, test } from 'node:test';
import { parseRefusedWriteLine, RefusedWriteLogs } from './refused-writes.js';

const dir = mkdtempSync(path.join(os.tmpdir(), 'dsec-refused-'));
after(() => rmSync(dir, { recursive: true, force: true }));

test('a log line names the op and the path, escaped bytes (space, newline, backslash, UTF-8) decoded', () => {
  assert.deepEqual(parseRefusedWriteLine('open-write /project/tests/run.sh'), { op: 'open-write', path: '/project/tests/run.sh' });
  assert.deepEqual(parseRefusedWriteLine('unlink /a\\040b\\012c\\134d'), { op: 'unlink', path: '/a b\nc\\d' });
  assert.deepEqual(parseRefusedWriteLine('overflow'), { overflow: true });
  for (const bad of ['', 'open-write', 'open-write relative', ' /x']) assert.equal(parseRefusedWriteLine(bad), undefined, bad);
});

test('logs are followed from their start or their end, a line split across reads is whole, an overflow is told once', () => {
  const a = path.join(dir, 'a.log');
  const b = path.join(dir, 'b.log');
  writeFileSync(a, 'create /p/new\n');
  writeFileSync(b, 'unlink /old\n');
  const logs = new RefusedWriteLogs();
  try {
    logs.add('sa', a, true);
    logs.add('sb', b, false); // adopted: what is there was raised before
    assert.deepEqual(logs.drain(100).refused, [{ sandboxId: 'sa', op: 'create', path: '/p/new' }]);
    appendFileSync(b, 'truncate /p/\\303\\251t');
    assert.deepEqual(logs.drain(100).refused, []);
    appendFileSync(b, '\\303\\251\noverflow\n');
    assert.deepEqual(logs.drain(100), { refused: [{ sandboxId: 'sb', op: 'truncate', path: '/p/été' }], overflowed: ['sb'] });
    appendFileSync(b, 'overflow\n');
    assert.deepEqual(logs.drain(100).overflowed, []);
    logs.remove('sa');
    appendFileSync(a, 'mkdir /p/d\n');
    assert.deepEqual(logs.drain(100).refused, []);
  } finally {
    logs.close();
  }
});
