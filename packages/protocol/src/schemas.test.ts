import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  CreateSandboxRequestSchema,
  DsecError,
  ERROR_STATUS,
  ExecReplySchema,
  ExecRequestSchema,
  ExecResultSchema,
  FileStatSchema,
  imageLayers,
  parseOrThrow,
  SandboxSpecSchema,
} from './index.js';

/** Asserts INVALID_ARGUMENT naming `field`. */
function invalid(field: string) {
  return (err: unknown) => {
    assert.ok(err instanceof DsecError, String(err));
    assert.equal(err.code, 'INVALID_ARGUMENT');
    assert.equal(err.status, ERROR_STATUS.INVALID_ARGUMENT);
    assert.equal(err.details.field, field);
    return true;
  };
}

test('parseOrThrow names the offending field under its prefix', () => {
  assert.throws(
    () => parseOrThrow(CreateSandboxRequestSchema, { image: { base: 'busybox' }, resources: { memoryMiB: 1 } }, 'body'),
    invalid('body.resources.memoryMiB'),
  );
  // An unknown key of a strict object is the field (zod reports it at the object).
  assert.throws(
    () => parseOrThrow(CreateSandboxRequestSchema, { image: { base: 'busybox' }, surprise: 1 }),
    (err: unknown) => invalid('surprise')(err) && /surprise/.test((err as Error).message),
  );
  assert.throws(() => parseOrThrow(CreateSandboxRequestSchema, { image: { base: 'busybox', extra: 'x' } }, 'body'), invalid('body.image.extra'));
  assert.throws(
    () => parseOrThrow(ExecRequestSchema, { cmd: 'true', argv: ['true'] }, 'body'),
    (err: unknown) => invalid('body.cmd')(err) && /exactly one of cmd or argv/.test((err as Error).message),
  );
  assert.deepEqual(parseOrThrow(SandboxSpecSchema, { image: { base: 'busybox' } }), { image: { base: 'busybox' } });
});

test('imageLayers stacks base, workspace and toolkits, naming each field', () => {
  assert.deepEqual(imageLayers({ base: 'b', workspace: 'w', toolkits: ['t1', 't2'] }), [
    { field: 'image.base', ref: 'b' },
    { field: 'image.workspace', ref: 'w' },
    { field: 'image.toolkits.0', ref: 't1' },
    { field: 'image.toolkits.1', ref: 't2' },
  ]);
  assert.deepEqual(imageLayers({ base: 'b' }), [{ field: 'image.base', ref: 'b' }]);
});

test("a node's exec result has no pid; the API's exec reply adds it", () => {
  const result = {
    exitCode: 0,
    signal: null,
    timedOut: false,
    oomKilled: false,
    durationMs: 1,
    cpuUserMs: 0,
    cpuSysMs: 0,
    peakMemoryKiB: 1,
    stdoutBytes: 0,
    stderrBytes: 0,
    stdout: '',
    stderr: '',
    truncated: false,
  };
  assert.ok(ExecResultSchema.safeParse(result).success);
  assert.equal(ExecReplySchema.safeParse(result).success, false);
  assert.ok(ExecReplySchema.safeParse({ ...result, pid: 3 }).success);
});

test('file metadata: optional owner fields may be absent', () => {
  assert.ok(FileStatSchema.safeParse({ name: 'a', type: 'file', mode: 0o644, size: 1, mtimeMs: 0 }).success);
  assert.equal(FileStatSchema.safeParse({ name: 'a', type: 'fifo', mode: 0o644, size: 1, mtimeMs: 0 }).success, false);
});
