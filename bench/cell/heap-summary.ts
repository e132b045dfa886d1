// node bench/dist/cell/heap-summary.js <file.heapsnapshot> [--top N]
// Sums a V8 heap snapshot's objects by kind and constructor (self sizes, counts): what the
// apiserver keeps as the cell fills (`npm run cell -- --profile <dir> --heap-snapshot`). Kinds
// whose count grows with the sandboxes are what each sandbox costs the apiserver.
import { readFile } from 'node:fs/promises';
import { parseArgs } from 'node:util';

interface Snapshot {
  snapshot: { meta: { node_fields: string[]; node_types: [string[], ...unknown[]] } };
  nodes: number[];
  strings: string[];
}

const { values, positionals } = parseArgs({ allowPositionals: true, options: { top: { type: 'string', default: '40' } } });
const file = positionals[0];
const top = Number(values.top);
if (!file || !Number.isInteger(top) || top < 1) {
  process.stderr.write('usage: heap-summary <file.heapsnapshot> [--top N]\n');
  process.exit(2);
}
const snap = JSON.parse(await readFile(file, 'utf8')) as Snapshot;
const fields = snap.snapshot.meta.node_fields;
const types = snap.snapshot.meta.node_types[0];
const width = fields.length;
const [typeAt, nameAt, sizeAt] = ['type', 'name', 'self_size'].map((f) => fields.indexOf(f)) as [number, number, number];
if (typeAt < 0 || nameAt < 0 || sizeAt < 0) throw new Error(`${file}: not a V8 heap snapshot (node fields ${fields.join(', ')})`);
const groups = new Map<string, { count: number; bytes: number }>();
let total = 0;
for (let i = 0; i < snap.nodes.length; i += width) {
  const type = types[snap.nodes[i + typeAt]!] ?? '?';
  // Strings and code by kind alone; objects, closures and arrays by constructor or name.
  const byName = type === 'object' || type === 'closure' || type === 'native' || type === 'hidden';
  const key = byName ? `${type} ${snap.strings[snap.nodes[i + nameAt]!] ?? '?'}` : `(${type})`;
  const size = snap.nodes[i + sizeAt]!;
  const g = groups.get(key) ?? groups.set(key, { count: 0, bytes: 0 }).get(key)!;
  g.count++;
  g.bytes += size;
  total += size;
}
const rows = [...groups].sort((a, b) => b[1].bytes - a[1].bytes).slice(0, top);
process.stdout.write(`${file}: ${(snap.nodes.length / width).toLocaleString('en')} objects, ${(total / 1048576).toFixed(1)} MiB (self sizes)\n`);
process.stdout.write('     MiB      count  kind\n');
for (const [key, g] of rows) process.stdout.write(`${(g.bytes / 1048576).toFixed(1).padStart(8)} ${String(g.count).padStart(10)}  ${key.slice(0, 100)}\n`);
