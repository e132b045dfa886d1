// The benchmark's check of issue 15's density and destroy targets (bench/lib/targets.ts) on
// rows as the density scenario writes them: the density targets are judged only on a node
// filled to 10,000 sandboxes, a full-size run that held fewer misses the count, and destroy is
// judged per 3,200 sandboxes at the rate of all of them. Pure: no sandbox, under a second.
import assert from 'node:assert/strict';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { test } from 'node:test';
import { REPO_ROOT } from './helpers/node.js';

interface Row {
  scenario: string;
  metric: string;
  system: string;
  unit: string;
  value?: number;
  p50?: number;
  note?: string;
  targets?: Array<{ text: string; met: boolean }>;
}
interface TargetResult {
  figure: string;
  target: string;
  verdict: 'MET' | 'MISSED' | 'not measured';
  measured: string;
}
interface TargetsModule {
  checkTargets: (rows: readonly Row[]) => TargetResult[];
}

/** The dsec rows of a density run that held `n` of `asked` sandboxes. */
function densityRows(n: number, asked: number, o: { beyondMiB: number; at0: number; at100: number; destroyS: number }): Row[] {
  const rows: Row[] = [
    { scenario: 'density', metric: 'create at 0% fill', system: 'dsec', unit: 'ms', p50: o.at0 },
    { scenario: 'density', metric: 'create at 100% fill', system: 'dsec', unit: 'ms', p50: o.at100 },
    {
      scenario: 'density',
      metric: 'idle sandboxes running',
      system: 'dsec',
      unit: 'sandboxes',
      value: n,
      note: 'filled',
      ...(asked >= 10_000 ? { targets: [{ text: '>= 10,000 running on 24 GiB', met: n >= 10_000 }] } : {}),
    },
    { scenario: 'density', metric: 'host memory per sandbox beyond its cgroups', system: 'dsec', unit: 'MiB', value: o.beyondMiB },
    { scenario: 'density', metric: 'destroy all', system: 'dsec', unit: 's', value: o.destroyS },
  ];
  if (n >= 3200) rows.push({ scenario: 'density', metric: 'destroy, per 3,200 sandboxes', system: 'dsec', unit: 's', value: (o.destroyS * 3200) / n });
  return rows;
}

test('density targets are judged at 10,000 sandboxes, destroy per 3,200', async () => {
  const { checkTargets } = (await import(pathToFileURL(path.join(REPO_ROOT, 'bench/dist/lib/targets.js')).href)) as TargetsModule;
  const verdicts = (rows: Row[]): Record<string, string> =>
    Object.fromEntries(
      checkTargets(rows)
        .map((t) => [t.target, t.verdict])
        .filter(([k]) => /10,000|1 MiB|100% fill|15 s/.test(k!)),
    );

  // A full run: 10,000 held, 40 s to destroy them all = 12.8 s per 3,200.
  assert.deepEqual(verdicts(densityRows(10_000, 10_000, { beyondMiB: 0.9, at0: 40, at100: 50, destroyS: 40 })), {
    '10,000 idle busybox sandboxes on the 24 GiB node': 'MET',
    '<= 1 MiB host memory per sandbox beyond its cgroups': 'MET',
    'p50 at 100% fill <= 1.5x p50 at 0%': 'MET',
    'all gone in <= 15 s': 'MET',
  });
  // Over the bounds: 1.2 MiB beyond, 100% fill at 2x, 60 s for 10,000 = 19.2 s per 3,200.
  assert.deepEqual(verdicts(densityRows(10_000, 10_000, { beyondMiB: 1.2, at0: 40, at100: 80, destroyS: 60 })), {
    '10,000 idle busybox sandboxes on the 24 GiB node': 'MET',
    '<= 1 MiB host memory per sandbox beyond its cgroups': 'MISSED',
    'p50 at 100% fill <= 1.5x p50 at 0%': 'MISSED',
    'all gone in <= 15 s': 'MISSED',
  });
  // A full-size run stopped at 8,000 (memory floor): the count is missed, the rest unjudged.
  assert.deepEqual(verdicts(densityRows(8000, 10_000, { beyondMiB: 0.9, at0: 40, at100: 50, destroyS: 30 })), {
    '10,000 idle busybox sandboxes on the 24 GiB node': 'MISSED',
    '<= 1 MiB host memory per sandbox beyond its cgroups': 'not measured',
    'p50 at 100% fill <= 1.5x p50 at 0%': 'not measured',
    'all gone in <= 15 s': 'MET',
  });
  // The quick run's 20: nothing of the density targets is judged.
  assert.deepEqual(verdicts(densityRows(20, 20, { beyondMiB: 0.5, at0: 40, at100: 50, destroyS: 1 })), {
    '10,000 idle busybox sandboxes on the 24 GiB node': 'not measured',
    '<= 1 MiB host memory per sandbox beyond its cgroups': 'not measured',
    'p50 at 100% fill <= 1.5x p50 at 0%': 'not measured',
    'all gone in <= 15 s': 'not measured',
  });
});
