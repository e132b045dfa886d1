// The credential table that `dsec keys ls` and `dsec endpoint-tokens ls` share.
import assert from 'node:assert/strict';
import { PassThrough } from 'node:stream';
import { test } from 'node:test';
import { printCredentials } from './output.js';

test('credentials print as one table: id, name, their own column, project, age, revoked', () => {
  const out = new PassThrough();
  let text = '';
  out.on('data', (b: Buffer) => (text += b.toString()));
  const now = Date.parse('2026-01-01T01:00:00Z');
  printCredentials(
    { header: 'role', of: (k: { role: string }) => k.role },
    [
      { id: 'key_1', name: 'ci', role: 'member', project: 'prj_a', createdAt: '2026-01-01T00:00:00Z', revokedAt: null },
      { id: 'key_22', name: 'old', role: 'viewer', project: 'prj_a', createdAt: '2026-01-01T00:00:00Z', revokedAt: '2026-01-01T00:30:00Z' },
    ],
    out,
    now,
  );
  const lines = text.trimEnd().split('\n');
  assert.match(lines[0]!, /^ID\s+NAME\s+ROLE\s+PROJECT\s+AGE\s+REVOKED$/);
  assert.match(lines[1]!, /^key_1\s+ci\s+member\s+prj_a\s+\S+\s+-$/);
  assert.match(lines[2]!, /^key_22\s+old\s+viewer\s+prj_a\s+\S+\s+\S+ ago$/);
  // Columns line up.
  assert.equal(lines[1]!.indexOf('member'), lines[0]!.indexOf('ROLE'));
});
