// The writable-layer walks on plain folders (no overlay mount needed): an abort stops them.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { diffLayers, verifyLayers } from './diff.js';
import type { SandboxLayersView } from './diff.js';

describe('diff and verify walks (plain folders)', () => {
  let dir: string;
  let view: SandboxLayersView;
  before(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'dsec-diff-'));
    mkdirSync(path.join(dir, 'upper'));
    mkdirSync(path.join(dir, 'lower'));
    for (let i = 0; i < 200; i++) writeFileSync(path.join(dir, 'upper', `f${String(i).padStart(3, '0')}`), `file ${i}`);
    view = { upper: path.join(dir, 'upper'), lowers: [path.join(dir, 'lower')] };
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('a signal that does not abort changes nothing; one that aborts during the walk stops it with its reason', async () => {
    const whole = await diffLayers(view, { limit: 1000 }, new AbortController().signal);
    assert.equal(whole.entries.length, 200);
    assert.equal(whole.entries[0]?.change, 'added');
    const ac = new AbortController();
    const reason = new Error('caller went away');
    const walk = diffLayers(view, { limit: 1000 }, ac.signal);
    // The walk awaits the file system between entries: the abort lands part-way.
    setImmediate(() => ac.abort(reason));
    await assert.rejects(walk, (e: unknown) => e === reason);
    await assert.rejects(diffLayers(view, {}, AbortSignal.abort(reason)), (e: unknown) => e === reason);
  });

  test('verify stops with the reason of an aborted signal, and checks as before without one', async () => {
    const reason = new Error('caller went away');
    await assert.rejects(verifyLayers(view, { '/f000': 'a'.repeat(64) }, AbortSignal.abort(reason)), (e: unknown) => e === reason);
    const r = await verifyLayers(view, { '/f000': 'a'.repeat(64), '/missing': 'b'.repeat(64) });
    assert.deepEqual(
      r.results.map((x) => x.reason),
      ['mismatch', 'missing'],
    );
  });

  test('a file swapped for a FIFO while the walk hashes it never blocks the walk: diff and verify keep answering', async () => {
    const race = path.join(dir, 'upper', 'race');
    mkdirSync(race);
    // A writer-less FIFO: a blocking open of it would wait forever (and hold the event loop).
    const swapper = spawn('sh', ['-c', 'cd "$1" && while :; do rm -f f; echo data > f; rm -f f; mkfifo f; done', 'swap', race], { stdio: 'ignore' });
    try {
      const until = Date.now() + 3_000;
      let rounds = 0;
      while (Date.now() < until) {
        const d = await diffLayers(view, { paths: ['/race'], hash: true });
        const f = d.entries.find((e) => e.path === '/race/f');
        if (f?.type === 'other') assert.equal(f.sha256, undefined);
        const v = await verifyLayers(view, { '/race/f': 'a'.repeat(64) });
        assert.ok(['mismatch', 'missing', 'not-a-file'].includes(v.results[0]?.reason ?? ''), JSON.stringify(v.results));
        rounds++;
      }
      assert.ok(rounds > 0);
    } finally {
      swapper.kill('SIGKILL');
    }
  });
});
