// Unit tests of the compatibility protocols' pure parts: SandboxFusion's request and response
// mapping onto fncall, endpoint tokens in paths, bash quoting of session commands, zip reading.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { deflateRawSync } from 'node:zlib';
import { test } from 'node:test';
import { Hono } from 'hono';
import { DsecError, parseOrThrow } from '@dsec/protocol';
import type { CallResult } from '@dsec/protocol';
import { tokenInPath } from './endpoint-tokens.js';
import { RunCodeRequestSchema, sandboxError, toCallRequest, toRunCodeResponse } from './sandboxfusion.js';
import { ansiQuote } from './swerex-session.js';
import { CommandSchema, SWEREX_MAX_UPLOAD_BYTES, swerexModel, swerexUploadForm } from './swerex.js';
import { MAX_JSON_BYTES } from '../http/validate.js';
import { readZip } from './zip.js';

const step = { exitCode: 0, signal: null, stdout: 'ok\n', stderr: '', durationMs: 1500, truncated: false, timedOut: false, oomKilled: false };
const result = (r: Partial<CallResult>): CallResult => ({ ...step, cpuMs: 1, peakMemoryKiB: 1, ...r });

test('run_code requests map onto fncall calls', () => {
  const py = toCallRequest(
    parseOrThrow(RunCodeRequestSchema, { code: 'print(1)', language: 'python', files: { 'a/b.txt': 'aGk=', skip: null }, stdin: 'x' }, ''),
  );
  assert.deepEqual(py, {
    runtime: 'python3',
    timeoutMs: 10_000,
    memoryMiB: 1024,
    fileEncoding: 'base64',
    argv: ['python3', 'main.py'],
    files: { 'a/b.txt': 'aGk=', 'main.py': Buffer.from('print(1)').toString('base64') },
    stdin: 'x',
  });
  const c = toCallRequest(
    parseOrThrow(
      RunCodeRequestSchema,
      { code: 'int main(){}', language: 'c', compile_timeout: 2.5, run_timeout: 0.5, memory_limit_MB: 64, fetch_files: ['o'] },
      '',
    ),
  );
  assert.deepEqual(c, { runtime: 'c', timeoutMs: 500, memoryMiB: 64, fileEncoding: 'base64', code: 'int main(){}', compileTimeoutMs: 2500, fetchFiles: ['o'] });
  for (const [body, field] of [
    [{ code: 'x', language: 'rust' }, 'language'],
    [{ code: 'x', language: 'python', memory_limit_MB: 8 }, 'memory_limit_MB'],
    [{ code: 'x', language: 'python', run_timeout: 301 }, 'run_timeout'],
    [{ code: 'x', language: 'python', files: { '/etc/x': 'eA==' } }, 'files./etc/x'],
    [{ language: 'python' }, 'code'],
  ] as const) {
    assert.throws(
      () => parseOrThrow(RunCodeRequestSchema, body, ''),
      (err: unknown) => err instanceof DsecError && err.details.field === field,
    );
  }
});

test('fncall results map onto SandboxFusion responses', () => {
  assert.deepEqual(toRunCodeResponse(result({ files: { o: 'eA==' } })), {
    status: 'Success',
    message: '',
    compile_result: null,
    run_result: { status: 'Finished', execution_time: 1.5, return_code: 0, stdout: 'ok\n', stderr: '' },
    executor_pod_name: null,
    files: { o: 'eA==' },
  });
  const tle = toRunCodeResponse(result({ exitCode: null, signal: 'SIGKILL', timedOut: true }));
  assert.equal(tle.status, 'Failed');
  assert.deepEqual([tle.run_result?.status, tle.run_result?.return_code], ['TimeLimitExceeded', null]);
  const oom = toRunCodeResponse(result({ exitCode: null, signal: 'SIGKILL', oomKilled: true }));
  assert.deepEqual([oom.status, oom.run_result?.status, oom.run_result?.return_code], ['Failed', 'Finished', 137]);
  const compileFailed = toRunCodeResponse(result({ exitCode: null, stdout: '', compile: { ...step, exitCode: 1, stderr: 'error' } }));
  assert.deepEqual([compileFailed.status, compileFailed.compile_result?.return_code, compileFailed.run_result], ['Failed', 1, null]);
  const compiled = toRunCodeResponse(result({ compile: step }));
  assert.equal(compiled.status, 'Success');
  const err = sandboxError(new DsecError('UNAVAILABLE', 'runtime java is not ready yet'));
  assert.deepEqual(err, {
    status: 'SandboxError',
    message: 'UNAVAILABLE: runtime java is not ready yet',
    compile_result: null,
    run_result: null,
    executor_pod_name: null,
    files: {},
  });
});

test('endpoint tokens are read from their prefix only', () => {
  assert.deepEqual(tokenInPath('/v1/sandboxfusion/t/dsec_ept_abc/run_code'), { protocol: 'sandboxfusion', token: 'dsec_ept_abc' });
  assert.deepEqual(tokenInPath('/v1/sandboxfusion/t/dsec_ept_abc'), { protocol: 'sandboxfusion', token: 'dsec_ept_abc' });
  assert.equal(tokenInPath('/v1/sandboxfusion/run_code'), undefined);
  assert.equal(tokenInPath('/v1/sandboxes/t/x'), undefined);
});

test('ansiQuote: bash reads back exactly the text (quotes, backslashes, newlines, control bytes, UTF-8)', () => {
  const texts = ["it's", 'a\\b', 'x\ny\r\n', '\t\x01\x7f', 'héllo → 世界', "$HOME `id` $(id) \\'", '\\x41'];
  for (const text of texts) {
    const out = execFileSync('bash', ['-c', `printf %s ${ansiQuote(text)}`], { encoding: 'utf8' });
    assert.equal(out, text);
  }
});

test('readZip: stored and deflated entries, directories, modes; unsafe names refused', async () => {
  const entries = [
    { name: 'bin/', data: Buffer.alloc(0), method: 0, mode: 0o40755 },
    { name: 'bin/tool', data: Buffer.from('#!/bin/sh\necho hi\n'), method: 8, mode: 0o100755 },
    { name: 'README', data: Buffer.from('readme'), method: 0, mode: 0o100644 },
  ];
  const zip = makeZip(entries);
  const read = readZip(zip, 1 << 20);
  const texts: string[] = [];
  for (const e of read) texts.push((await e.read()).toString());
  assert.deepEqual(
    read.map((e, i) => [e.name, e.dir, e.mode, texts[i]]),
    [
      ['bin/', true, 0o755, ''],
      ['bin/tool', false, 0o755, '#!/bin/sh\necho hi\n'],
      ['README', false, 0o644, 'readme'],
    ],
  );
  assert.throws(() => readZip(makeZip([{ name: '../evil', data: Buffer.from('x'), method: 0, mode: 0o100644 }]), 1 << 20), /unsafe entry name/);
  assert.throws(() => readZip(zip, 10), /more than 10 bytes/);
  assert.throws(() => readZip(Buffer.from('not a zip at all, not at all'), 1 << 20), /no end of central directory/);
});

test('readZip: bounded per entry and in total; an entry larger than it declares is a 400 naming it', async () => {
  const big = { name: 'big', data: Buffer.alloc(4096, 1), method: 8, mode: 0o100644 };
  assert.throws(
    () => readZip(makeZip([big]), 1 << 20, 1000),
    (e: unknown) => e instanceof DsecError && e.code === 'PAYLOAD_TOO_LARGE' && /entry "big"/.test(e.message),
  );
  assert.throws(
    () => readZip(makeZip([big, { ...big, name: 'big2' }]), 6000, 5000),
    (e: unknown) => e instanceof DsecError && e.code === 'PAYLOAD_TOO_LARGE' && /archive unpacks to more than 6000/.test(e.message),
  );
  // Deflated and stored entries whose data is longer than their declared size.
  for (const method of [8, 0]) {
    const [liar] = readZip(makeZip([{ ...big, name: 'liar', method, declared: 10 }]), 1 << 20);
    await assert.rejects(
      liar!.read(),
      (e: unknown) => e instanceof DsecError && e.code === 'INVALID_ARGUMENT' && /entry "liar" is larger than it declares/.test(e.message),
    );
  }
  const [garbage] = readZip(makeZip([{ ...big, name: 'junk', method: 8, raw: Buffer.from([0xff, 0xff, 0xff]) }]), 1 << 20);
  await assert.rejects(garbage!.read(), (e: unknown) => e instanceof DsecError && e.code === 'INVALID_ARGUMENT' && /"junk"/.test(e.message));
});

test('SWE-ReX bodies are bounded when chunked (no Content-Length)', async () => {
  const app = new Hono();
  app.onError((err, c) => c.json({ code: err instanceof DsecError ? err.code : 'INTERNAL' }, 400));
  app.post('/json', async (c) => c.json(await swerexModel(c, CommandSchema)));
  app.post('/upload', async (c) => c.json({ n: [...(await swerexUploadForm(c)).keys()].length }));
  /** A chunked body of `mib` MiB (a stream: no length is sent). */
  const chunked = (mib: number): ReadableStream<Uint8Array> => {
    let left = mib;
    return new ReadableStream({
      pull(ctl) {
        if (left-- <= 0) ctl.close();
        else ctl.enqueue(new Uint8Array(1_048_576).fill(0x20));
      },
    });
  };
  const post = async (route: string, body: ReadableStream<Uint8Array>, type: string) =>
    (await (await app.request(route, { method: 'POST', body, headers: { 'content-type': type }, duplex: 'half' })).json()) as { code?: string };
  assert.equal((await post('/json', chunked(MAX_JSON_BYTES / 1_048_576 + 1), 'application/json')).code, 'PAYLOAD_TOO_LARGE');
  assert.equal((await post('/upload', chunked(SWEREX_MAX_UPLOAD_BYTES / 1_048_576 + 1), 'multipart/form-data; boundary=x')).code, 'PAYLOAD_TOO_LARGE');
  const ok = await app.request('/json', { method: 'POST', body: JSON.stringify({ command: 'ls' }) });
  assert.equal(((await ok.json()) as { command: string }).command, 'ls');
});

/** A minimal zip writer (Unix modes in the external attributes, as Python's zipfile writes them). */
function makeZip(entries: Array<{ name: string; data: Buffer; method: number; mode: number; declared?: number; raw?: Buffer }>): Buffer {
  const locals: Buffer[] = [];
  const centrals: Buffer[] = [];
  let offset = 0;
  for (const e of entries) {
    const name = Buffer.from(e.name);
    const body = e.raw ?? (e.method === 8 ? deflateRawSync(e.data) : e.data);
    const local = Buffer.alloc(30);
    local.writeUInt32LE(0x04034b50, 0);
    local.writeUInt16LE(e.method, 8);
    local.writeUInt32LE(body.length, 18);
    local.writeUInt32LE(e.data.length, 22);
    local.writeUInt16LE(name.length, 26);
    const central = Buffer.alloc(46);
    central.writeUInt32LE(0x02014b50, 0);
    central.writeUInt16LE((3 << 8) | 20, 4);
    central.writeUInt16LE(e.method, 10);
    central.writeUInt32LE(body.length, 20);
    central.writeUInt32LE(e.declared ?? e.data.length, 24);
    central.writeUInt16LE(name.length, 28);
    central.writeUInt32LE((e.mode << 16) >>> 0, 38);
    central.writeUInt32LE(offset, 42);
    locals.push(local, name, body);
    centrals.push(central, name);
    offset += 30 + name.length + body.length;
  }
  const cd = Buffer.concat(centrals);
  const end = Buffer.alloc(22);
  end.writeUInt32LE(0x06054b50, 0);
  end.writeUInt16LE(entries.length, 8);
  end.writeUInt16LE(entries.length, 10);
  end.writeUInt32LE(cd.length, 12);
  end.writeUInt32LE(offset, 16);
  return Buffer.concat([...locals, cd, end]);
}
