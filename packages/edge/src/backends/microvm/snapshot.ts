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
import type { Attachment } from '../../chronus/attachment.js';
import { TarExtractor } from '../../layers/tar-extract.js';
import type { TarLimits } from '../../layers/tar-extract.js';
import { lsetxattr, OVERLAY_OPAQUE_XATTR } from '../../sys/linux.js';

/** Where the guest mounts its writable disk for the read: on its devtmpfs, never in the overlay. */
export const SNAPSHOT_MOUNT = '/dev/.dsec-snapshot';
/** Longest a guest's disk stays frozen, whatever happens to the edge (a guard in the guest lifts it). */
export const FREEZE_GUARD_S = 120;
/** Paths per xattr request. */
const XATTR_BATCH = 256;
/** Most bytes of a step's stderr kept for its error. */
const STDERR_KEEP = 4096;
/** Most bytes of the directory list (one line per directory of the upper layer). */
const MAX_LIST_BYTES = 64 * 1024 * 1024;

const BUSYBOX = '/.dsec/busybox';
/** Prefix chronus reads overlayfs's markers under, and the opaque marker's name below it. */
const OVERLAY_PREFIX = 'trusted.overlay.';
const OPAQUE_NAME = OVERLAY_OPAQUE_XATTR.slice(OVERLAY_PREFIX.length);

/**
 * Mounts the disk, freezes it and starts the guard (a process of its own session that lifts the
 * freeze after {@link FREEZE_GUARD_S}); prints the guard's pid, then every directory of `upper/`.
 * Every tool is the initramfs's busybox (`$B`), whatever the image holds.
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
$B sync
$B fsfreeze --freeze $M
$B setsid $B sh -c "$B sleep ${FREEZE_GUARD_S}; $B fsfreeze --unfreeze $M" </dev/null >/dev/null 2>&1 &
echo $!
cd $M/upper
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

/** Lifts the freeze, unmounts, ends the guard (`$1`); safe to run again. */
const THAW = `B=${BUSYBOX}
M=${SNAPSHOT_MOUNT}
if $B grep -q " $M " /proc/mounts; then $B fsfreeze --unfreeze $M 2>/dev/null; $B umount $M; fi
$B rmdir $M 2>/dev/null
[ -n "$1" ] && kill "$1" 2>/dev/null
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
    const list = await run(agent, o.id, 'freeze', FREEZE, [], collect, o.signal);
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
    await run(
      agent,
      o.id,
      'tar',
      TAR,
      [],
      async (chunks) => {
        await extractor.extract(chunks);
        await extractor.finish();
      },
      o.signal,
    );
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
  await run(agent, id, 'thaw', THAW, guard ? [guard] : [], async () => undefined);
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

/**
 * Runs `script` under the guest's busybox sh as root; `consume` gets its stdout as a stream of
 * chunks (read with the attachment's flow control) and its result is returned once the script
 * exited 0; anything else fails naming the step and its stderr.
 */
async function run<T>(
  agent: SandboxAgent,
  id: string,
  step: string,
  script: string,
  args: string[],
  consume: (chunks: AsyncIterable<Buffer>) => Promise<T>,
  signal?: AbortSignal,
): Promise<T> {
  signal?.throwIfAborted();
  const att = await agent.spawn({ argv: [BUSYBOX, 'sh', '-c', script, 'dsec-snapshot', ...args], uid: 0, gid: 0 });
  const stderr: Buffer[] = [];
  let kept = 0;
  const onAbort = (): void => void agent.signal(att.proc, 'KILL', true).catch(() => undefined);
  signal?.addEventListener('abort', onAbort, { once: true });
  try {
    const out = stdoutOf(att, (b) => {
      if (kept < STDERR_KEEP) stderr.push(b.subarray(0, STDERR_KEEP - kept));
      kept += b.length;
    });
    const result = await consume(out);
    // Whatever the consumer left unread.
    for await (const _ of out);
    const exit = await att.exited;
    signal?.throwIfAborted();
    if (exit.exitCode !== 0) {
      const why = Buffer.concat(stderr).toString('utf8').trim();
      throw new DsecError(
        'BACKEND_FAILED',
        `sandbox ${id}: the snapshot's ${step} step failed in the guest (exit ${exit.exitCode ?? exit.signal})${why ? `: ${why}` : ''}`,
        {
          sandboxId: id,
        },
      );
    }
    return result;
  } catch (err) {
    await agent.signal(att.proc, 'KILL', true).catch(() => undefined);
    throw err;
  } finally {
    signal?.removeEventListener('abort', onAbort);
    await agent.release(att.proc).catch(() => undefined);
  }
}

/** The attachment's stdout as chunks (stderr to `onStderr`); a gap (output lost) fails it. */
function stdoutOf(att: Attachment, onStderr: (b: Buffer) => void): AsyncIterable<Buffer> & AsyncIterator<Buffer> {
  const it = att[Symbol.asyncIterator]();
  const self: AsyncIterable<Buffer> & AsyncIterator<Buffer> = {
    [Symbol.asyncIterator]: () => self,
    async next(): Promise<IteratorResult<Buffer>> {
      for (;;) {
        const r = await it.next();
        if (r.done) return { done: true, value: undefined };
        const ev = r.value;
        if (ev.kind === 'gap') throw new DsecError('BACKEND_FAILED', `the guest's output lost ${ev.bytes} bytes of ${ev.stream}`);
        if (ev.stream === 'stderr') onStderr(ev.data);
        else return { done: false, value: ev.data };
      }
    },
  };
  return self;
}

async function collect(chunks: AsyncIterable<Buffer>): Promise<Buffer> {
  const parts: Buffer[] = [];
  let n = 0;
  for await (const c of chunks) {
    n += c.length;
    if (n > MAX_LIST_BYTES) throw new DsecError('BACKEND_FAILED', `the guest's directory list is over ${MAX_LIST_BYTES} bytes`);
    parts.push(c);
  }
  return Buffer.concat(parts);
}
