// A tiny base layer made from the host's static busybox: enough of a root for a shell,
// coreutils-like applets and the files programs expect to find in /etc.
import { execFile } from 'node:child_process';
import { chmod, copyFile, lutimes, mkdir, readdir, symlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { DsecError } from '@dsec/protocol';

/** Where busybox-static installs its binary. */
export const BUSYBOX_PATH = '/bin/busybox';

const EPOCH = new Date(0);

const FILES: Record<string, string> = {
  'etc/passwd': 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n',
  'etc/group': 'root:x:0:\nnogroup:x:65534:\n',
  'etc/hostname': '',
  'etc/hosts': '127.0.0.1\tlocalhost\n::1\tlocalhost\n',
};

const DIRS: Record<string, number> = {
  bin: 0o755,
  etc: 0o755,
  tmp: 0o1777,
  root: 0o700,
  proc: 0o555,
  sys: 0o555,
  dev: 0o755,
};

/**
 * Writes the busybox root into `dest` (an empty directory). Every mtime is the epoch, so the
 * same busybox binary always gives the same layer digest.
 */
export async function buildBusyboxTree(dest: string, busybox = BUSYBOX_PATH): Promise<void> {
  let applets: string[];
  try {
    const { stdout } = await promisify(execFile)(busybox, ['--list']);
    applets = stdout.split('\n').filter((a) => /^[A-Za-z0-9_.[-]+$/.test(a) && a !== 'busybox');
  } catch (err) {
    throw new DsecError('UNAVAILABLE', `${busybox} is not runnable (install busybox-static)`, { path: busybox }, { cause: err });
  }
  for (const [dir, mode] of Object.entries(DIRS)) {
    await mkdir(join(dest, dir));
    await chmod(join(dest, dir), mode);
  }
  await copyFile(busybox, join(dest, 'bin/busybox'));
  await chmod(join(dest, 'bin/busybox'), 0o755);
  await Promise.all(applets.map((a) => symlink('busybox', join(dest, 'bin', a))));
  for (const [file, text] of Object.entries(FILES)) await writeFile(join(dest, file), text, { mode: 0o644 });
  await stampTree(dest, EPOCH);
}

/** Sets the mtime (and atime) of everything under `dir`, symlinks included, to `when`. */
async function stampTree(dir: string, when: Date): Promise<void> {
  for (const ent of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, ent.name);
    if (ent.isDirectory()) await stampTree(path, when);
    else await lutimes(path, when, when);
  }
  await lutimes(dir, when, when);
}
