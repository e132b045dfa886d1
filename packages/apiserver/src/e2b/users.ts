// Users of a sandbox as envd sees them: `/etc/passwd` and `/etc/group` read from the sandbox,
// cached for a short while per sandbox.
import path from 'node:path';
import { DsecError } from '@dsec/protocol';
import type { CommandTarget } from '../services/commands.js';
import type { FileService } from '../services/files.js';

/** A user of a sandbox. */
export interface SandboxUser {
  name: string;
  uid: number;
  gid: number;
  home: string;
}

/** The user E2B clients act as when they name none. */
export const DEFAULT_USER = 'user';
const ROOT: SandboxUser = { name: 'root', uid: 0, gid: 0, home: '/root' };
const CACHE_MS = 10_000;

interface Accounts {
  users: Map<string, SandboxUser>;
  byUid: Map<number, string>;
  groups: Map<number, string>;
  at: number;
}

function parse(text: string, fields: number): string[][] {
  return text
    .split('\n')
    .map((l) => l.split(':'))
    .filter((f) => f.length >= fields && f[0] !== '');
}

/** Reads and caches the accounts of sandboxes. */
export class SandboxUsers {
  private readonly cache = new Map<string, Accounts>();

  constructor(private readonly files: FileService) {}

  private async accounts(t: CommandTarget): Promise<Accounts> {
    const hit = this.cache.get(t.sandboxId);
    if (hit && Date.now() - hit.at < CACHE_MS) return hit;
    const read = async (p: string): Promise<string> => Buffer.from(await this.files.read(t, p).catch(() => new Uint8Array())).toString('utf8');
    const users = new Map<string, SandboxUser>();
    const byUid = new Map<number, string>();
    for (const f of parse(await read('/etc/passwd'), 7)) {
      const u = { name: f[0]!, uid: Number(f[2]), gid: Number(f[3]), home: f[5] || '/' };
      if (!Number.isInteger(u.uid) || !Number.isInteger(u.gid)) continue;
      users.set(u.name, u);
      if (!byUid.has(u.uid)) byUid.set(u.uid, u.name);
    }
    const groups = new Map<number, string>();
    for (const f of parse(await read('/etc/group'), 3)) if (!groups.has(Number(f[2]))) groups.set(Number(f[2]), f[0]!);
    const a = { users, byUid, groups, at: Date.now() };
    if (this.cache.size > 10_000) this.cache.clear();
    this.cache.set(t.sandboxId, a);
    return a;
  }

  /**
   * A named user (401 when the sandbox has no such user); with no name, `user`, or root in an
   * image that has no `user` (a dsec image that was not made for E2B).
   */
  async user(t: CommandTarget, name: string | undefined): Promise<SandboxUser> {
    const a = await this.accounts(t);
    const wanted = name ?? DEFAULT_USER;
    const u = a.users.get(wanted) ?? (wanted === 'root' ? ROOT : undefined);
    if (u) return u;
    if (name === undefined) return a.users.get('root') ?? ROOT;
    throw new DsecError('UNAUTHENTICATED', `no user ${JSON.stringify(wanted)} in this sandbox`, { field: 'username' });
  }

  /** Names of a uid and a gid (the number as text when unknown). */
  async names(t: CommandTarget, uid: number | undefined, gid: number | undefined): Promise<{ owner: string; group: string }> {
    const a = await this.accounts(t);
    return { owner: uid === undefined ? '' : (a.byUid.get(uid) ?? String(uid)), group: gid === undefined ? '' : (a.groups.get(gid) ?? String(gid)) };
  }

  /** The sandboxes whose accounts are cached. */
  ids(): string[] {
    return [...this.cache.keys()];
  }

  /** Forgets a sandbox. */
  forget(id: string): void {
    this.cache.delete(id);
  }
}

/** A path as envd takes it: relative paths from the user's home; normalised; no NUL. */
export function resolvePath(p: string | undefined, user: SandboxUser, field = 'path'): string {
  const raw = p ?? '';
  if (raw.includes('\0') || raw.length > 4096) throw new DsecError('INVALID_ARGUMENT', `${field}: not a path`, { field });
  const abs = path.posix.normalize(raw.startsWith('/') ? raw : path.posix.join(user.home, raw));
  return abs.length > 1 && abs.endsWith('/') ? abs.slice(0, -1) : abs;
}
