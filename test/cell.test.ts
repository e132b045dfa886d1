// A small simulated cell (`npm run cell`, bench/cell/): the real `dsec apiserver` on a
// PostgreSQL of the test's own, four simulated nodes in two processes joined over mutual TLS
// with single-use tokens, filled to 60 sandboxes through batch and single creates with list
// queries between. Checks that every create landed (the store holds them all, spread over the
// nodes) and that the figures come back (the CPU of each part among them); no speed is asserted.
// The run is profiled (`--profile --heap-snapshot`): the apiserver's CPU profile, PostgreSQL's
// statements and a heap snapshot that `heap-summary` reads. Also: the simulated node is
// reachable from the testing entry point only. Needs root (PostgreSQL runs as its own user).
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { pathToFileURL } from 'node:url';
import { describe, test } from 'node:test';
import { BackendKindSchema } from '@dsec/protocol';
import { REPO_ROOT } from './helpers/node.js';
import { postgresSkipReason } from './helpers/postgres.js';

interface CellModule {
  runCell: (o: Record<string, unknown>) => Promise<{
    sandboxRows: number;
    failures: number;
    stages: Array<{ filled: number; singleCreated: number; rssMiB: number; heapUsedMiB: number; heapTotalMiB: number; listP99: number }>;
    rssMiB: number;
    storeMiB: number;
    batchPerSecond: number;
    nodesUsed: number;
    busy: Record<'batch' | 'singles', { apiserver: number; postgres: number; nodes: number; load: number }>;
  }>;
}

const skip = postgresSkipReason();

describe('simulated cell', { skip, timeout: 120_000 }, () => {
  test('fills a cell of four simulated nodes through batch and single creates, profiled', async (t) => {
    const { runCell } = (await import(pathToFileURL(path.join(REPO_ROOT, 'bench/dist/cell/cell.js')).href)) as CellModule;
    const lines: string[] = [];
    const profileDir = await mkdtemp(path.join(os.tmpdir(), 'dsec-cell-profile-'));
    t.after(() => rm(profileDir, { recursive: true, force: true }));
    const r = await runCell({
      profileDir,
      heapSnapshot: true,
      nodes: 4,
      sandboxes: 60,
      edgeProcesses: 2,
      batchSize: 3,
      batchConcurrency: 2,
      singlesPerStage: 2,
      singleConcurrency: 2,
      listsPerStage: 2,
      sim: { capacity: { cpu: 2, memoryMiB: 24_576 } },
      log: (l: string) => lines.push(l),
    });
    assert.equal(r.failures, 0, lines.join('\n'));
    assert.equal(r.sandboxRows, 60);
    assert.equal(r.nodesUsed, 4, 'power-of-two placement spreads 60 sandboxes over all four nodes');
    assert.equal(r.stages.length, 10);
    assert.deepEqual(
      r.stages.map((s) => s.filled),
      Array.from({ length: 10 }, (_, i) => 6 * (i + 1)),
    );
    assert.ok(r.stages.every((s) => s.singleCreated === 2 && s.rssMiB > 0 && Number.isFinite(s.listP99)));
    // The apiserver's heap, from its /metrics: in use within what is reserved, within its RSS.
    assert.ok(
      r.stages.every((s) => s.heapUsedMiB > 0 && s.heapUsedMiB <= s.heapTotalMiB && s.heapTotalMiB < s.rssMiB),
      JSON.stringify(r.stages),
    );
    assert.ok(r.storeMiB > 0 && r.batchPerSecond > 0);
    // The CPU of each part was found (the apiserver, PostgreSQL's backends, the node processes).
    for (const phase of ['batch', 'singles'] as const) {
      const b = r.busy[phase];
      assert.ok(b.apiserver > 0 && b.postgres > 0 && b.nodes >= 0 && b.load > 0, `${phase}: ${JSON.stringify(b)}`);
    }
    // The profile: the CPU profile, the statements (the sandbox insert among them), the heap.
    const files = await readdir(profileDir);
    assert.ok(
      files.some((f) => f.endsWith('.cpuprofile')),
      files.join(', '),
    );
    assert.match(await readFile(path.join(profileDir, 'pg-statements.txt'), 'utf8'), /insert into "?sandboxes"? /i);
    const { stdout } = await promisify(execFile)(process.execPath, [
      path.join(REPO_ROOT, 'bench/dist/cell/heap-summary.js'),
      path.join(profileDir, 'apiserver.heapsnapshot'),
      '--top',
      '5',
    ]);
    assert.match(stdout, /apiserver\.heapsnapshot: [\d,]+ objects, [\d.]+ MiB/);
    assert.equal(stdout.trim().split('\n').length, 2 + 5, stdout);
  });

  test('the simulated node is a test tool: not on the main entry point, not a backend a spec can name', async () => {
    const main = (await import('@dsec/apiserver')) as Record<string, unknown>;
    assert.equal(main.SimEdge, undefined);
    const testing = (await import('@dsec/apiserver/testing')) as Record<string, unknown>;
    assert.equal(typeof testing.SimEdge, 'function');
    assert.equal(BackendKindSchema.safeParse('sim').success, false);
  });
});
