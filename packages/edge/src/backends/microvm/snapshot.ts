// A microVM's writable layer read out for a snapshot. The overlay's upper directory lives on the
// guest's ext4 disk, which the host never mounts; the guest reads it itself, through chronus:
// its `rw` disk is mounted a second time (the same superblock) outside the overlay, frozen
// (`fsfreeze`: every writer of the overlay waits, the disk is consistent), its `upper/` streamed
// out as a tar (busybox keeps whiteouts as char 0:0 devices), the overlay's opaque-directory
// markers read with chronus's xattr operation, and the freeze lifted. The host extracts the tar
// with the untrusted-tar extractor (whiteouts recorded) into a private directory and marks the
// opaque directories there: the same tree a container's upper directory is.
import { lstat, mkdir, mkdtemp, rm } from 'node:fs/promises';
import path from 'node:path';
import { DsecError } from '@dsec/protocol';
import type { GuestUpper, SandboxAgent } from '../../backend.js';
import { TarExtractor } from '../../layers/tar-extract.js';
import type { TarLimits } from '../../layers/tar-extract.js';
import { lsetxattr, OVERLAY_OPAQUE_XATTR } from '../../sys/linux.js';
import { collectOutput, freezeLines, runGuestStep, thawLines } from '../qemu/guest-steps.js';

/** Where the guest mounts its writable disk for the read: on its devtmpfs, never in the overlay. */
export const SNAPSHOT_MOUNT = '/dev/.dsec-snapshot';
/** Paths per xattr request. */
const XATTR_BATCH = 256;

const BUSYBOX = '/.dsec/busybox';
/** Every step runs the initramfs's busybox sh and tools, whatever the image holds. */
const SHELL = [BUSYBOX, 'sh'];
/** Prefix chronus reads overlayfs's markers under, and the opaque marker's name below it. */
const OVERLAY_PREFIX = 'trusted.overlay.';
const OPAQUE_NAME = OVERLAY_OPAQUE_XATTR.slice(OVERLAY_PREFIX.length);

/**
 * Mounts the disk a second time, read-only, starts the guard, syncs and freezes it
 * ({@link freezeLines}); prints the guard's pid, then every directory of `upper/`.
 */
const FREEZE = `set -e
B=${BUSYBOX}
M=${SNAPSHOT_MOUNT}
D=
for b in /sys/block/vd*; do [ "$($B cat $b/serial 2>/dev/null)" = rw ] && D=/dev/\${b##*/}; done
[ -n "$D" ] || { echo "no writable disk" >&2; exit 3; }
if $B grep -q " $M " /proc/mounts; then $B fsfreeze --unfreeze $M 2>/dev/null || true; $B umount $M; fi
$B mkdir -p $M
$B mount -t ext4 -o nodev,nosuid,noexec "$D" $M
$B mount -o remount,bind,ro,nodev,nosuid,noexec $M
${freezeLines('$M', '$B ')}cd $M/upper
$B find . -type d
`;

/** Streams `upper/` as a tar on stdout, then lifts the freeze (also when the tar failed). */
const TAR = `B=${BUSYBOX}
M=${SNAPSHOT_MOUNT}
cd $M/upper || exit 3
$B tar cf - .
rc=$?
cd /
$B fsfreeze --unfreeze $M
exit $rc
`;

/** Lifts the freeze, ends the guard (`$1`), unmounts; safe to run again. */
const THAW = `B=${BUSYBOX}
M=${SNAPSHOT_MOUNT}
${thawLines('$M', '$B ')}if $B grep -q " $M " /proc/mounts; then $B umount $M; fi
$B rmdir $M 2>/dev/null
exit 0
`;

/** Options of {@link exportGuestUpper}. */
export interface ExportUpperOptions {
  id: string;
  /** An empty folder only root reaches (0700): the export goes into a new folder inside it. */
  workDir: string;
  limits: Partial<TarLimits>;
  signal?: AbortSignal | undefined;
}

/**
 * Reads a running microVM's upper directory into a new host folder (see the file's header).
 * The guest is frozen from the mount to the end of the tar; on any failure the freeze is lifted
 * and nothing is left on the host.
 */
export async function exportGuestUpper(agent: SandboxAgent, o: ExportUpperOptions): Promise<GuestUpper> {
  if (!agent.xattrs)
    throw new DsecError('INVALID_ARGUMENT', `sandbox ${o.id}: its agent cannot read extended attributes (too old for a snapshot)`, { sandboxId: o.id });
  await mkdir(o.workDir, { recursive: true, mode: 0o700 });
  const dir = await mkdtemp(path.join(o.workDir, 'upper-'));
  const remove = (): Promise<void> => rm(dir, { recursive: true, force: true });
  let guard = '';
  try {
    const list = await runGuestStep(agent, { id: o.id, step: 'freeze', shell: SHELL, script: FREEZE, consume: collectOutput, signal: o.signal });
    const lines = list.toString('utf8').split('\n');
    guard = /^\d+$/.test(lines[0] ?? '') ? (lines[0] as string) : '';
    const dirs = lines.slice(1).filter((l) => l.startsWith('./') && l.length > 2);
    const opaque: string[] = [];
    for (let at = 0; at < dirs.length; at += XATTR_BATCH) {
      const batch = dirs.slice(at, at + XATTR_BATCH);
      const attrs = await agent.xattrs(
        batch.map((d) => `${SNAPSHOT_MOUNT}/upper/${d.slice(2)}`),
        OVERLAY_PREFIX,
      );
      attrs.forEach((a, i) => {
        if (a?.[OPAQUE_NAME] === 'y') opaque.push((batch[i] as string).slice(2));
      });
    }
    const extractor = new TarExtractor(dir, { whiteouts: 'record', limits: o.limits, signal: o.signal });
    // Bounded by its silence, not its length: the tar grows with the layer.
    await runGuestStep(agent, {
      id: o.id,
      step: 'tar',
      shell: SHELL,
      script: TAR,
      bound: 'idle',
      consume: async (chunks) => {
        await extractor.extract(chunks);
        await extractor.finish();
      },
      signal: o.signal,
    });
    for (const rel of opaque) await markOpaque(dir, rel);
    await thaw(agent, o.id, guard);
    return { dir, remove };
  } catch (err) {
    await thaw(agent, o.id, guard).catch(() => undefined);
    await remove();
    throw err;
  }
}

async function thaw(agent: SandboxAgent, id: string, guard: string): Promise<void> {
  await runGuestStep(agent, { id, step: 'thaw', shell: SHELL, script: THAW, args: guard ? [guard] : [], consume: async () => undefined });
}

/** Sets the overlay's opaque marker on `rel` in `root`, a directory reached through directories only. */
async function markOpaque(root: string, rel: string): Promise<void> {
  let p = root;
  for (const c of rel.split('/')) {
    if (c === '' || c === '.' || c === '..') return;
    p = path.join(p, c);
    const st = await lstat(p).catch(() => null);
    // Not extracted (a socket's parent, say) or not a directory here: nothing to mark.
    if (!st?.isDirectory()) return;
  }
  lsetxattr(p, OVERLAY_OPAQUE_XATTR, 'y');
}
