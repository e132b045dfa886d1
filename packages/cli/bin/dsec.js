#!/usr/bin/env node
// The `dsec` command. npm links this file into node_modules/.bin when it installs (a fresh clone
// has no build yet, and npm skips a bin whose file is missing), so `npx dsec` works once the
// TypeScript is built; before that, it says how to build.
import { existsSync } from 'node:fs';

const main = new URL('../dist/main.js', import.meta.url);
if (!existsSync(main)) {
  process.stderr.write('dsec: the CLI is not built yet: run `npm run setup` (or `npx tsc -b`) in the checkout\n');
  process.exit(1);
}
await import(main.href);
