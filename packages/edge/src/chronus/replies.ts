// Decoding of the chronus agent's replies: exit reports, file stats, signal names, and the
// agent's errno mapped onto a DsecError with a stable code.
import { constants as osConstants } from 'node:os';
import { DsecError } from '@dsec/protocol';
import type { ErrorDetails, FileStat, FileType } from '@dsec/protocol';
import { F } from './wire.js';
import type { Fields } from './wire.js';
import type { AgentExit } from './client.js';

const SIGNAL_NAMES = new Map<number, string>(Object.entries(osConstants.signals).map(([name, n]) => [n, name]));

/** Maps a signal name or number to its number. */
export function signalNumber(sig: string | number): number {
  if (typeof sig === 'number') return sig;
  const n = (osConstants.signals as Record<string, number>)[sig.startsWith('SIG') ? sig : `SIG${sig}`];
  if (n === undefined) throw new DsecError('INVALID_ARGUMENT', `unknown signal ${sig}`, { field: 'signal' });
  return n;
}

const ERRNO_CODES: Record<number, { code: 'FILE_NOT_FOUND' | 'PROCESS_NOT_FOUND' | 'INVALID_ARGUMENT' | 'CONFLICT' | 'PERMISSION_DENIED' | 'PAYLOAD_TOO_LARGE'; name: string }> = {
  2: { code: 'FILE_NOT_FOUND', name: 'ENOENT' },
  9: { code: 'CONFLICT', name: 'EBADF' },
  11: { code: 'CONFLICT', name: 'EAGAIN' },
  32: { code: 'CONFLICT', name: 'EPIPE' },
  3: { code: 'PROCESS_NOT_FOUND', name: 'ESRCH' },
  16: { code: 'CONFLICT', name: 'EBUSY' },
  1: { code: 'PERMISSION_DENIED', name: 'EPERM' },
  13: { code: 'PERMISSION_DENIED', name: 'EACCES' },
  17: { code: 'CONFLICT', name: 'EEXIST' },
  20: { code: 'INVALID_ARGUMENT', name: 'ENOTDIR' },
  21: { code: 'INVALID_ARGUMENT', name: 'EISDIR' },
  22: { code: 'INVALID_ARGUMENT', name: 'EINVAL' },
  // A unix socket (or a FIFO opened for writing with no reader) where a file was expected.
  6: { code: 'INVALID_ARGUMENT', name: 'ENXIO' },
  40: { code: 'INVALID_ARGUMENT', name: 'ELOOP' },
  39: { code: 'CONFLICT', name: 'ENOTEMPTY' },
  28: { code: 'PAYLOAD_TOO_LARGE', name: 'ENOSPC' },
  122: { code: 'PAYLOAD_TOO_LARGE', name: 'EDQUOT' },
  // An agent older than the operation (or a file system without it): the request cannot be served
  // by this sandbox, which is the caller's to know, not a failure of the node.
  38: { code: 'INVALID_ARGUMENT', name: 'ENOSYS' },
  95: { code: 'INVALID_ARGUMENT', name: 'EOPNOTSUPP' },
};

/** Errnos that say the operation is missing, not that the path is wrong. */
const UNSUPPORTED = new Set([38, 95]);

/** The agent's error reply as a DsecError: its errno mapped to a stable code, with the path if any. */
export function agentError(fields: Fields, what: string, path?: string): DsecError {
  const errno = fields.num(F.ERRNO) ?? 0;
  const message = fields.str(F.MESSAGE) ?? `${what}: errno ${errno}`;
  const mapped = ERRNO_CODES[errno];
  const details: ErrorDetails = { errno: mapped?.name ?? String(errno) };
  if (path !== undefined) {
    details.path = path;
    if (mapped?.code === 'INVALID_ARGUMENT' && !UNSUPPORTED.has(errno)) details.field = 'path';
  }
  return new DsecError(mapped?.code ?? 'BACKEND_FAILED', message, details);
}

/** An exit report from its fields. */
export function parseExit(f: Fields): AgentExit {
  const sig = f.num(F.SIGNAL) ?? 0;
  return {
    proc: f.num(F.PROC) ?? 0,
    pid: f.num(F.PID) ?? 0,
    exitCode: sig === 0 ? (f.num(F.EXIT_CODE) ?? 0) : null,
    signal: sig === 0 ? null : (SIGNAL_NAMES.get(sig) ?? `SIG${sig}`),
    timedOut: f.has(F.TIMED_OUT),
    durationMs: f.num(F.DURATION_MS) ?? 0,
    cpuUserMs: f.num(F.CPU_USER_MS) ?? 0,
    cpuSysMs: f.num(F.CPU_SYS_MS) ?? 0,
    peakMemoryKiB: f.num(F.MAXRSS_KIB) ?? 0,
    stdoutBytes: f.num(F.STDOUT_END) ?? 0,
    stderrBytes: f.num(F.STDERR_END) ?? 0,
  };
}

const FTYPES: Record<number, FileType> = { 1: 'file', 2: 'dir', 3: 'symlink', 4: 'other' };

/** A file's stat from its fields; `name` is the entry's name. */
export function parseStat(f: Fields, name: string): FileStat {
  const stat: FileStat = {
    name,
    type: FTYPES[f.num(F.FTYPE) ?? 4] ?? 'other',
    mode: (f.num(F.MODE) ?? 0) & 0o7777,
    size: f.num(F.SIZE) ?? 0,
    mtimeMs: f.num(F.MTIME_MS) ?? 0,
  };
  const uid = f.num(F.UID_OUT);
  const gid = f.num(F.GID_OUT);
  const link = f.str(F.LINK);
  if (uid !== undefined) stat.uid = uid;
  if (gid !== undefined) stat.gid = gid;
  if (link !== undefined) stat.linkTarget = link;
  return stat;
}
