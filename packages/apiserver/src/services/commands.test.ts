import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type { ExecStreamEvent } from '@dsec/protocol';
import { harness } from '../testing/harness.js';
import type { Harness } from '../testing/harness.js';

describe('recorded commands and files (fake node, real store)', () => {
  let h: Harness;
  let id: string;
  before(async () => {
    h = await harness();
    id = (await h.services.sandboxes.create(h.admin, { image: { base: 'busybox' } })).id;
  });
  after(async () => h.close());

  const target = async () => {
    const { row, edge } = await h.services.lifecycle.route(h.admin, id);
    return { sandboxId: row.id, edge };
  };

  test('exec, a streamed command and a file write are trajectory steps, in order', async () => {
    const { commands, files, trajectories } = h.services;
    const t = await target();
    const { result } = await commands.exec(t, { cmd: 'echo one' });
    assert.equal(result.stdout, 'echo one\n');
    const running = await commands.spawn(t, { argv: ['echo', 'two'] }, 'stream');
    const events: ExecStreamEvent[] = [];
    for await (const ev of running.events()) events.push(ev);
    assert.deepEqual(
      events.map((e) => e.type),
      ['start', 'output', 'exit'],
    );
    assert.equal(await running.exitCode, 0);
    async function* body() {
      yield Buffer.from('hello');
    }
    await files.write(t, '/tmp/a', body(), { limitBytes: 1024 });
    assert.equal(Buffer.from(await files.read(t, '/tmp/a')).toString(), 'hello');
    const traj = await trajectories.get(h.admin, id, {});
    assert.deepEqual(
      traj.items.map((s) => [s.kind, s.via ?? null]),
      [
        ['exec', 'exec'],
        ['exec', 'stream'],
        ['write', null],
      ],
    );
    assert.equal(traj.items[1]?.exit?.exitCode, 0);
  });

  test('a failed file change is recorded with its error, and the error reaches the caller', async () => {
    const t = await target();
    await assert.rejects(h.services.files.rename(t, '/missing', '/b'), { code: 'FILE_NOT_FOUND' });
    const traj = await h.services.trajectories.get(h.admin, id, {});
    const last = traj.items[traj.items.length - 1];
    assert.equal(last?.kind, 'rename');
    assert.equal(last?.error?.code, 'FILE_NOT_FOUND');
  });

  test('replay re-runs the steps on a fresh sandbox and finds them the same', async () => {
    const result = await h.services.trajectories.replay(h.admin, id, {});
    assert.ok(result.steps.length >= 3);
    assert.equal(result.summary.outputDiffers + result.summary.exitDiffers, 0, JSON.stringify(result.steps));
    assert.notEqual(result.sandbox.id, id);
  });

  test("the request's signal reaches the node's file, diff, verify, process and attach calls; an aborted one fails the call", async () => {
    const { commands, files } = h.services;
    const t = await target();
    const { edge } = h;
    const ac = new AbortController();
    async function* body() {
      yield Buffer.from('x');
    }
    await files.write(t, '/tmp/s', body(), { limitBytes: 1024 }, ac.signal);
    await files.read(t, '/tmp/s', {}, ac.signal);
    await files.list(t, '/tmp', ac.signal);
    await files.stat(t, '/tmp/s', ac.signal);
    await files.diff(t, {}, ac.signal);
    await files.verify(t, { expected: {} }, ac.signal);
    await commands.processes(t, ac.signal);
    const running = await commands.spawn(t, { argv: ['true'] }, 'stream');
    for await (const _ of running.events());
    const out = await commands.output(t, 1, { stdout: 0, stderr: 0 }, ac.signal);
    out.detach();
    for (const method of ['writeFile', 'readFile', 'listDir', 'stat', 'diff', 'verify', 'processes', 'attach']) {
      assert.equal(edge.signals.get(method), ac.signal, method);
    }
    const reason = new Error('client went away');
    await assert.rejects(files.read(t, '/tmp/s', {}, AbortSignal.abort(reason)), (e: unknown) => e === reason);
    await assert.rejects(files.diff(t, {}, AbortSignal.abort(reason)), (e: unknown) => e === reason);
    // A file change cut short is recorded with its error, as any failed change is.
    await assert.rejects(files.mkdir(t, '/tmp/d', AbortSignal.abort(reason)), (e: unknown) => e === reason);
    const traj = await h.services.trajectories.get(h.admin, id, {});
    assert.equal(traj.items[traj.items.length - 1]?.kind, 'mkdir');
  });

  test('stdin and signals to a process the node does not know are PROCESS_NOT_FOUND', async () => {
    const t = await target();
    await assert.rejects(h.services.commands.output(t, 999, { stdout: 0, stderr: 0 }), { code: 'PROCESS_NOT_FOUND' });
  });
});
