// A process stream across a lost agent connection (no sandbox): with a reattach it goes on from
// the offsets it reached; without one (or when the reattach declines) it ends with the loss.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { DsecError } from '@dsec/protocol';
import { Attachment } from './chronus/attachment.js';
import type { AgentExit, OutputEvent } from './chronus/client.js';
import type { AttachmentOwner } from './chronus/attachment.js';
import { EdgeProcessStream } from './process-stream.js';

/** An attachment's owner that answers every request (acknowledgements, detach) and sends nothing. */
const owner: AttachmentOwner = {
  send: () => undefined,
  request: () => Promise.resolve(undefined),
  forget: () => undefined,
  writeStdin: () => Promise.resolve(),
  signal: () => Promise.resolve(),
};

function attachment(from = { stdout: 0, stderr: 0 }): Attachment {
  return new Attachment(owner, 1, 7, 70, 1 << 20, from);
}

function data(offset: number, text: string): OutputEvent {
  return { kind: 'data', stream: 'stdout', offset, data: Buffer.from(text) };
}

function exit(exitCode: number): AgentExit {
  return {
    proc: 7,
    pid: 70,
    exitCode,
    signal: null,
    timedOut: false,
    durationMs: 1,
    cpuUserMs: 0,
    cpuSysMs: 0,
    peakMemoryKiB: 0,
    stdoutBytes: 0,
    stderrBytes: 0,
  };
}

const lost = (): DsecError => new DsecError('UNAVAILABLE', 'agent connection closed');

describe('EdgeProcessStream across a lost connection', () => {
  test('reattaches from the offsets reached and ends with the second attachment’s exit', async () => {
    const first = attachment();
    const second = attachment({ stdout: 4, stderr: 0 });
    const asked: Array<{ stdout: number; stderr: number }> = [];
    const stream = new EdgeProcessStream(first, (e) => ({ ...e, oomKilled: false }), {
      reattach: (from) => {
        asked.push(from);
        queueMicrotask(() => {
          second.output(data(4, 'cd'));
          second.exit(exit(0));
        });
        return Promise.resolve(second);
      },
    });
    first.output(data(0, 'ab'));
    first.output(data(2, 'xy'));
    first.fail(lost());
    let text = '';
    for await (const ev of stream) if (ev.kind === 'data') text += Buffer.from(ev.data).toString();
    assert.equal(text, 'abxycd');
    assert.deepEqual(asked, [{ stdout: 4, stderr: 0 }], 'one reattach, from the bytes read');
    assert.equal((await stream.exited).exitCode, 0);
  });

  test('the exit follows the reattach even when nobody reads the output', async () => {
    const first = attachment();
    const second = attachment();
    const stream = new EdgeProcessStream(first, (e) => ({ ...e, oomKilled: false }), { reattach: () => Promise.resolve(second) });
    first.fail(lost());
    setImmediate(() => second.exit(exit(3)));
    assert.equal((await stream.exited).exitCode, 3);
  });

  test('without a reattach, or when it declines, the stream ends with the loss', async () => {
    for (const reattach of [undefined, () => Promise.resolve(undefined)]) {
      const first = attachment();
      const stream = new EdgeProcessStream(first, (e) => ({ ...e, oomKilled: false }), reattach ? { reattach } : {});
      let ended = false;
      stream.onDetach(() => (ended = true));
      first.output(data(0, 'ab'));
      first.fail(lost());
      await assert.rejects(async () => {
        for await (const ev of stream) assert.ok(ev);
      }, /connection closed/);
      await assert.rejects(stream.exited, /connection closed/);
      await new Promise((r) => setImmediate(r));
      assert.ok(ended, 'its end is told');
    }
  });

  test('a detach during the wait for the resume ends the wait', async () => {
    const first = attachment();
    let aborted = false;
    const stream = new EdgeProcessStream(first, (e) => ({ ...e, oomKilled: false }), {
      reattach: (_from, signal) =>
        new Promise((resolve) =>
          signal.addEventListener('abort', () => {
            aborted = true;
            resolve(undefined);
          }),
        ),
    });
    first.fail(lost());
    await new Promise((r) => setImmediate(r));
    await stream.detach();
    await assert.rejects(stream.exited, /connection closed/);
    assert.ok(aborted);
  });
});
