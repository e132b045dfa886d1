import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { ExecEvent } from '@dsec/protocol';
import { DsecError } from '@dsec/protocol';
import { ExecHandle } from './exec-handle.js';
import type { EventSource, OutputOffsets, ProcessControl } from './exec-handle.js';
import { PushQueue } from './push-queue.js';

const exitEvent = (pid: number): ExecEvent => ({
  type: 'exit',
  pid,
  exitCode: 0,
  signal: null,
  timedOut: false,
  oomKilled: false,
  durationMs: 1,
  cpuUserMs: 0,
  cpuSysMs: 0,
  peakMemoryKiB: 0,
  stdoutBytes: 0,
  stderrBytes: 0,
});
const out = (stream: 'stdout' | 'stderr', offset: number, text: string): ExecEvent => ({
  type: 'output',
  stream,
  offset,
  data: Buffer.from(text).toString('base64'),
});

function sourceOf(events: ExecEvent[], endWith?: unknown): EventSource {
  const q = new PushQueue<ExecEvent>();
  for (const e of events) q.push(e);
  if (endWith) q.fail(endWith);
  else q.end();
  return { events: q, close: () => q.end() };
}

const noControl: ProcessControl = {
  writeStdin: async () => undefined,
  closeStdin: async () => undefined,
  signal: async () => undefined,
};

test('skips overlapping output, counts gaps, decodes split UTF-8 for callbacks', async () => {
  const euro = Buffer.from('€');
  const texts: string[] = [];
  const h = new ExecHandle({
    sandboxId: 's',
    pid: 3,
    control: noControl,
    callbacks: { onStdout: (t) => texts.push(t) },
    source: sourceOf([
      { type: 'output', stream: 'stdout', offset: 0, data: euro.subarray(0, 2).toString('base64') },
      { type: 'output', stream: 'stdout', offset: 2, data: euro.subarray(2).toString('base64') },
      out('stdout', 0, '€'), // already seen
      { type: 'gap', stream: 'stderr', offset: 0, bytes: 10 },
      out('stderr', 10, 'err'),
      exitEvent(3),
    ]),
  });
  const events = [];
  for await (const ev of h) events.push(ev);
  const exit = await h.wait();
  assert.equal(exit.exitCode, 0);
  assert.equal(texts.join(''), '€');
  assert.deepEqual(h.offsets, { stdout: 3, stderr: 13 });
  assert.deepEqual(h.lostBytes, { stdout: 0, stderr: 10 });
  assert.deepEqual(
    events.map((e) => [e.stream, e.offset, e.data.length]),
    [
      ['stdout', 0, 2],
      ['stdout', 2, 1],
      ['stderr', 10, 3],
    ],
  );
});

test('reconnects from the offsets seen when the stream drops', async () => {
  const asked: OutputOffsets[] = [];
  const control: ProcessControl = {
    ...noControl,
    reconnect: async (offsets) => {
      asked.push(offsets);
      // The server replays from the offset asked; one overlapping byte must not be repeated.
      return sourceOf([out('stdout', 2, 'cdef'), exitEvent(7)]);
    },
  };
  const h = new ExecHandle({ sandboxId: 's', pid: 7, control, source: sourceOf([out('stdout', 0, 'abc')], new DsecError('UNAVAILABLE', 'reset')) });
  const chunks: string[] = [];
  for await (const ev of h) chunks.push(ev.data.toString());
  assert.equal(chunks.join(''), 'abcdef');
  assert.deepEqual(asked, [{ stdout: 3, stderr: 0 }]);
  assert.equal((await h.wait()).exitCode, 0);
});

test('disconnect ends the handle without an exit', async () => {
  const q = new PushQueue<ExecEvent>();
  q.push(out('stdout', 0, 'a'));
  const h = new ExecHandle({ sandboxId: 's', pid: 1, control: noControl, source: { events: q, close: () => q.end() } });
  await new Promise((r) => setImmediate(r));
  h.disconnect();
  await assert.rejects(h.wait(), (err: unknown) => err instanceof DsecError && err.code === 'UNAVAILABLE');
  assert.deepEqual(h.offsets, { stdout: 1, stderr: 0 });
});

test('an error event rejects wait() with its code', async () => {
  const h = new ExecHandle({
    sandboxId: 's',
    pid: 1,
    control: noControl,
    source: sourceOf([{ type: 'error', error: { code: 'SANDBOX_NOT_RUNNING', message: 'gone' } }]),
  });
  await assert.rejects(h.wait(), (err: unknown) => err instanceof DsecError && err.code === 'SANDBOX_NOT_RUNNING');
});
