// The lazy scenario's charts from a saved run, without rewriting docs/benchmarks.md:
// node bench/scripts/lazy-charts.mjs bench/results/<run>.json (a run of `--only lazy --no-docs`).
// Writes the charts of `chartsOf` whose file names start with `lazy-` into docs/benchmarks/.
import { readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const { chartsOf } = await import(path.join(repo, 'bench/dist/lib/charts.js'));
const file = process.argv[2];
if (!file) throw new Error('usage: lazy-charts.mjs <bench/results/run.json>');
const report = JSON.parse(await readFile(file, 'utf8'));
for (const c of chartsOf(report).filter((c) => c.file.startsWith('lazy-'))) {
  await writeFile(path.join(repo, 'docs', 'benchmarks', c.file), c.svg);
  console.log(`docs/benchmarks/${c.file}: ${c.title}`);
}
