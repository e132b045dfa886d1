// The Node and npm that run this process, laid out as `/usr/local` of a toolkit layer, for tests
// and benchmarks whose sandboxes need a current Node and npm over a small Debian base (Debian's
// own npm package pulls in some 400 packages and takes minutes to build into a layer).
import { chmod, copyFile, cp, mkdir, symlink } from 'node:fs/promises';
import path from 'node:path';

/** Writes the toolkit tree under `dest` (bin/node, bin/npm, bin/npx, lib/node_modules/npm below usr/local). */
export async function writeNodeToolkitTree(dest: string): Promise<void> {
  const npmDir = path.join(path.dirname(process.execPath), '..', 'lib', 'node_modules', 'npm');
  const bin = path.join(dest, 'usr/local/bin');
  await mkdir(bin, { recursive: true });
  await mkdir(path.join(dest, 'usr/local/lib/node_modules'), { recursive: true });
  await copyFile(process.execPath, path.join(bin, 'node'));
  await chmod(path.join(bin, 'node'), 0o755);
  await cp(npmDir, path.join(dest, 'usr/local/lib/node_modules/npm'), { recursive: true });
  await symlink('../lib/node_modules/npm/bin/npm-cli.js', path.join(bin, 'npm'));
  await symlink('../lib/node_modules/npm/bin/npx-cli.js', path.join(bin, 'npx'));
}

/** A layer name for this process's Node (`node-20-20-2`). */
export function nodeToolkitName(prefix: string): string {
  return `${prefix}-${process.version.replace(/[^0-9]+/g, '-').replace(/^-|-$/g, '')}`;
}
