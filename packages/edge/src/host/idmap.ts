// A view of a host directory with its owners shifted down by a fixed offset: an idmapped bind
// mount. A sandbox in a user namespace writes its files as host ids `base + n`; packing them
// into a layer must store `n` (the ids as the sandbox saw them), so that any sandbox, with any
// range of its own, sees the same owners. erofs-utils 1.5 has no uid/gid offset option, and
// copying the tree to re-own it would double the work; the mount costs a few system calls.
import { spawn } from 'node:child_process';
import { closeSync, openSync } from 'node:fs';
import { mkdir, readlink, rmdir, writeFile } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { DsecError } from '@dsec/protocol';
import { idmappedBind, MNT, umount } from '../sys/linux.js';

/** Host ids `uid..uid+count` (and `gid..gid+count`) are stored as `0..count`. */
export interface IdShift {
  /** First host uid of the range (the sandbox's uid 0). */
  uid: number;
  /** First host gid of the range (the sandbox's gid 0). */
  gid: number;
  /** Ids in the range; default {@link DEFAULT_ID_RANGE}. Ids outside it are stored as 65534. */
  count?: number;
}

/** Ids a sandbox's user namespace maps by default (uid and gid 0..65535). */
export const DEFAULT_ID_RANGE = 65_536;
const MAX_ID = 4_294_967_294;

/** Checks an id shift; INVALID_ARGUMENT naming the field when it cannot be a range. */
export function checkIdShift(shift: IdShift): Required<IdShift> {
  const count = shift.count ?? DEFAULT_ID_RANGE;
  for (const [field, v] of [
    ['uid', shift.uid],
    ['gid', shift.gid],
    ['count', count],
  ] as const) {
    if (!Number.isSafeInteger(v) || v < 0 || v > MAX_ID)
      throw new DsecError('INVALID_ARGUMENT', `idShift.${field}: must be an integer id`, { field: `idShift.${field}` });
  }
  if (count < 1 || shift.uid + count - 1 > MAX_ID || shift.gid + count - 1 > MAX_ID) {
    throw new DsecError('INVALID_ARGUMENT', 'idShift.count: the range must hold 1 or more valid ids', { field: 'idShift.count' });
  }
  return { uid: shift.uid, gid: shift.gid, count };
}

/**
 * Mounts `dir` at `target` (created) with owners shifted down by `shift`, runs `fn`, and
 * unmounts. The mount is private to this call and gone when it returns or throws.
 */
export async function withShiftedView<T>(dir: string, target: string, shift: IdShift, fn: () => Promise<T>): Promise<T> {
  const s = checkIdShift(shift);
  // An idmapped mount takes its mapping from a user namespace: one made for the purpose, held
  // by a sleeping child only until its namespace file is open.
  const child = spawn('unshare', ['--user', '--', 'sleep', '60'], { stdio: 'ignore' });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.once('error', () => undefined);
  let nsFd = -1;
  try {
    const pid = child.pid;
    if (pid === undefined) throw new DsecError('INTERNAL', 'could not start unshare for an id-mapped view');
    const own = await readlink('/proc/self/ns/user');
    for (let i = 0; ; i++) {
      const theirs = await readlink(`/proc/${pid}/ns/user`).catch(() => own);
      if (theirs !== own) break;
      if (i > 2000 || child.exitCode !== null) throw new DsecError('INTERNAL', 'unshare did not enter a new user namespace');
      await sleep(1);
    }
    // A mount's mapping runs inside -> outside: an inode owned by base+n (inside) shows as n.
    await writeFile(`/proc/${pid}/uid_map`, `${s.uid} 0 ${s.count}\n`);
    await writeFile(`/proc/${pid}/gid_map`, `${s.gid} 0 ${s.count}\n`);
    nsFd = openSync(`/proc/${pid}/ns/user`, 'r');
    await mkdir(target);
    idmappedBind(dir, target, nsFd);
  } catch (err) {
    await rmdir(target).catch(() => undefined);
    throw err;
  } finally {
    if (nsFd >= 0) closeSync(nsFd);
    child.kill('SIGKILL');
    await exited;
  }
  try {
    return await fn();
  } finally {
    umount(target, MNT.DETACH);
    await rmdir(target).catch(() => undefined);
  }
}
