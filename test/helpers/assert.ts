// Assertions and small calls several test files share.
import assert from 'node:assert/strict';
import { DsecError } from '@dsec/protocol';
import tar from 'tar-stream';
import type { Sandbox } from '@dsec/sdk';

/** For `assert.rejects`: the error is a DsecError with this code (and, when given, this field). */
export function isCode(code: string, field?: string) {
  return (err: unknown): boolean => {
    assert.ok(err instanceof DsecError, `expected a DsecError, got ${String(err)}`);
    assert.equal(err.code, code, err.message);
    if (field !== undefined) assert.equal(err.details.field, field, err.message);
    return true;
  };
}

/** Runs a shell command in a sandbox, asserts it succeeded and returns its stdout. */
export async function sh(sb: Sandbox, cmd: string): Promise<string> {
  const r = await sb.exec(cmd);
  assert.equal(r.exitCode, 0, `${cmd}: ${r.stderr}`);
  return r.stdout;
}

/** A raw API call with a key (status and parsed JSON body), for what the SDK would refuse to send. */
export async function apiCall(url: string, key: string, method: string, route: string, json?: unknown): Promise<{ status: number; body: any }> {
  const res = await fetch(url + route, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(json !== undefined ? { 'content-type': 'application/json' } : {}) },
    ...(json !== undefined ? { body: JSON.stringify(json) } : {}),
  });
  return { status: res.status, body: await res.json() };
}

/** A tar archive of regular files (`mode` for all of them), as layer uploads take. */
export async function tarOf(files: Record<string, string>, mode = 0o644): Promise<Buffer> {
  const pack = tar.pack();
  for (const [name, content] of Object.entries(files)) pack.entry({ name, mode }, content);
  pack.finalize();
  const chunks: Buffer[] = [];
  for await (const c of pack) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}
