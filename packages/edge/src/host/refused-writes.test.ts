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

test('an adopted log reads on from the offset the previous edge raised it to', () => {
  const log = path.join(dir, 'c.log');
  writeFileSync(log, 'create /p/one\n');
  const before = new RefusedWriteLogs();
  try {
    before.add('sc', log, true);
    assert.deepEqual(before.drain(100).refused, [{ sandboxId: 'sc', op: 'create', path: '/p/one' }]);
  } finally {
    before.close();
  }
  // Written while no edge read it: raised by the next one, once.
  appendFileSync(log, 'unlink /p/two\nrename /p/thr');
  const after = new RefusedWriteLogs();
  try {
    after.add('sc', log, false);
    assert.deepEqual(after.drain(100).refused, [{ sandboxId: 'sc', op: 'unlink', path: '/p/two' }]);
    appendFileSync(log, 'ee\n');
    assert.deepEqual(after.drain(100).refused, [{ sandboxId: 'sc', op: 'rename', path: '/p/three' }]);
    assert.deepEqual(after.drain(100).refused, []);
  } finally {
    after.close();
  }
});

test('a flooding log takes only its share of a drain, and drains start at each log in turn', () => {
  const flood = path.join(dir, 'flood.log');
  const quiet = path.join(dir, 'quiet.log');
  writeFileSync(flood, 'create /f\n'.repeat(50));
  writeFileSync(quiet, 'unlink /q\n'.repeat(3));
  const logs = new RefusedWriteLogs();
  try {
    logs.add('flood', flood, true);
    logs.add('quiet', quiet, true);
    const first = logs.drain(10).refused;
    assert.equal(first.filter((r) => r.sandboxId === 'flood').length, 5);
    assert.equal(first.filter((r) => r.sandboxId === 'quiet').length, 3);
    // Its share again, however much of the budget the quiet log leaves.
    assert.equal(logs.drain(4).refused.length, 2);
    let rest = 0;
    for (let i = 0; i < 20; i++) rest += logs.drain(10).refused.length;
    assert.equal(rest, 50 - 5 - 2);
  } finally {
    logs.close();
  }
});
