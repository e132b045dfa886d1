// Builds the dashboard into dist/: dist/assets/main-<hash>.{js,css} (esbuild: TypeScript and JSX
// bundled with Preact, uPlot and xterm.js, minified) and dist/index.html naming them. No network,
// about a second; scripts/install.sh runs it. Type checking is `tsc -b` (ui/tsconfig.json).
import { mkdir, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { build } from 'esbuild';

const root = path.dirname(fileURLToPath(import.meta.url));
const out = path.join(root, 'dist');
await rm(path.join(out, 'assets'), { recursive: true, force: true });
await mkdir(out, { recursive: true });
const result = await build({
  absWorkingDir: root,
  entryPoints: ['src/main.tsx'],
  bundle: true,
  minify: true,
  format: 'esm',
  target: 'es2022',
  jsx: 'automatic',
  jsxImportSource: 'preact',
  outdir: 'dist/assets',
  entryNames: '[name]-[hash]',
  assetNames: '[name]-[hash]',
  metafile: true,
  legalComments: 'linked',
  logLevel: 'warning',
});
const outputs = Object.keys(result.metafile.outputs).map((p) => path.basename(p));
const js = outputs.find((f) => f.endsWith('.js'));
const css = outputs.find((f) => f.endsWith('.css'));
if (!js || !css) throw new Error(`dashboard build: no script or style sheet in ${outputs.join(', ')}`);
// No inline script or style: the Content-Security-Policy of /ui allows only files of this origin.
const html = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>dsec</title>
<link rel="stylesheet" href="/ui/assets/${css}">
<script type="module" src="/ui/assets/${js}"></script>
</head>
<body><div id="app"></div></body>
</html>
`;
await writeFile(path.join(out, 'index.html'), html);
