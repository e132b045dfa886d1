// Uploads over the server's body limit are refused by the CLI before a byte is sent. The
// commands run as the real `dsec` against an API URL where nothing listens (loopback port 9):
// without the check they would fail connecting, not naming the limit.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdir, mkdtemp, rm, symlink, truncate, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { isDsecError, MAX_UPLOAD_BYTES } from '@dsec/protocol';
import { checkUploadSize, minTarBytes } from './upload-size.js';

const DSEC = fileURLToPath(new URL('../bin/dsec.js', import.meta.url));
let dir = '';

before(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'dsec-cli-upload-test-'));
});
after(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** Runs `dsec` with `args`; its exit status and stderr. */
function dsec(args: string[]): Promise<{ code: number; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [DSEC, '--api-url', 'http://127.0.0.1:9', '--api-key', 'k', ...args], { timeout: 30_000 }, (err, _stdout, stderr) =>
      resolve({ code: err ? ((err as { code?: number }).code ?? -1) : 0, stderr }),
    );
  });
}

test('upload size: the limit itself passes, one byte more is PAYLOAD_TOO_LARGE naming the file', () => {
  checkUploadSize('a', MAX_UPLOAD_BYTES);
  assert.throws(
    () => checkUploadSize('big.tar', MAX_UPLOAD_BYTES + 1),
    (err: unknown) => isDsecError(err, 'PAYLOAD_TOO_LARGE') && /big\.tar/.test((err as Error).message),
  );
});

test('a tree as a tar: a header per entry, data padded to 512 bytes, the end marker', async () => {
  const tree = path.join(dir, 'tree');
  await mkdir(path.join(tree, 'sub'), { recursive: true });
  await writeFile(path.join(tree, 'sub', 'f'), Buffer.alloc(1000));
  await writeFile(path.join(tree, 'empty'), '');
  await symlink('sub/f', path.join(tree, 'link'));
  // sub, sub/f (2 blocks of data), empty, link, the end marker.
  assert.equal(await minTarBytes(tree), 512 + (512 + 1024) + 512 + 512 + 1024);
});

test('dsec cp and dsec image build --from-tar / --from-dir over the limit are refused before connecting', async () => {
  const big = path.join(dir, 'big');
  await writeFile(big, '');
  await truncate(big, MAX_UPLOAD_BYTES + 1);
  const bigDir = path.join(dir, 'bigdir');
  await mkdir(bigDir);
  await writeFile(path.join(bigDir, 'f'), '');
  await truncate(path.join(bigDir, 'f'), MAX_UPLOAD_BYTES);
  for (const args of [
    ['cp', big, 'sb1:/tmp/big'],
    ['cp', bigDir, 'sb1:/tmp'],
    ['image', 'build', 'big', '--kind', 'base', '--from-tar', big],
    ['image', 'build', 'big', '--kind', 'base', '--from-dir', bigDir],
  ]) {
    const r = await dsec(args);
    assert.equal(r.code, 1, args.join(' '));
    assert.match(r.stderr, /PAYLOAD_TOO_LARGE: .*uploads are limited to 1 GiB/, args.join(' '));
  }
  // Within the limit, the same command goes on to the server (and finds none).
  await truncate(big, 10);
  const r = await dsec(['cp', big, 'sb1:/tmp/big']);
  assert.equal(r.code, 1);
  assert.doesNotMatch(r.stderr, /PAYLOAD_TOO_LARGE/);
});
