import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readFile, readlink, rm, stat, symlink, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { after, test } from 'node:test';
import tar from 'tar-stream';
import { packDir, unpackInto } from './tar.js';

const dirs: string[] = [];
after(async () => {
  for (const d of dirs) await rm(d, { recursive: true, force: true });
});
async function tmp(): Promise<string> {
  const d = await mkdtemp(path.join(os.tmpdir(), 'dsec-sdk-tar-'));
  dirs.push(d);
  return d;
}

test('packDir and unpackInto round-trip files, modes, dirs and symlinks', async () => {
  const src = await tmp();
  await mkdir(path.join(src, 'a/b'), { recursive: true });
  await writeFile(path.join(src, 'a/b/run.sh'), '#!/bin/sh\necho hi\n', { mode: 0o755 });
  await writeFile(path.join(src, 'top.txt'), 'top');
  await symlink('a/b/run.sh', path.join(src, 'link'));
  const dst = await tmp();
  await unpackInto(Readable.from(packDir(src)), path.join(dst, 'out'));
  assert.equal(await readFile(path.join(dst, 'out/top.txt'), 'utf8'), 'top');
  assert.equal((await stat(path.join(dst, 'out/a/b/run.sh'))).mode & 0o777, 0o755);
  assert.equal(await readlink(path.join(dst, 'out/link')), 'a/b/run.sh');
});

test('unpackInto refuses entries that escape the target or pass through a symlink', async () => {
  for (const entries of [
    [{ name: '../evil', content: 'x' }],
    [
      { name: 'l', link: '/etc' },
      { name: 'l/passwd', content: 'x' },
    ],
  ]) {
    const pack = tar.pack();
    for (const e of entries) {
      if ('link' in e) pack.entry({ name: e.name, type: 'symlink', linkname: e.link });
      else pack.entry({ name: e.name }, e.content);
    }
    pack.finalize();
    const dst = await tmp();
    await assert.rejects(unpackInto(Readable.from(pack as AsyncIterable<Buffer>), dst), /escapes|symlink/);
  }
});
