// dsec cp: copy files and directories between this machine and a sandbox (`ID:/path`).
import { createReadStream, createWriteStream } from 'node:fs';
import type { Stats } from 'node:fs';
import { mkdir, stat } from 'node:fs/promises';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import type { Command } from 'commander';
import { InvalidArgumentError } from 'commander';
import { Sandbox, isDsecError } from '@dsec/sdk';
import { clientFor } from '../connection.js';
import type { ConnectionFlags } from '../connection.js';
import { checkUploadSize, minTarBytes } from '../upload-size.js';

/** `ID:/path` split, or undefined for a local path. */
export function parseRemote(spec: string): { id: string; path: string } | undefined {
  const m = /^([A-Za-z0-9][A-Za-z0-9._-]*):(\/.*)$/.exec(spec);
  return m ? { id: m[1] as string, path: m[2] as string } : undefined;
}

async function localStat(p: string): Promise<Stats | undefined> {
  try {
    return await stat(p);
  } catch {
    return undefined;
  }
}

/** Registers `dsec cp`. */
export function registerCp(program: Command): void {
  program
    .command('cp')
    .description('copy between here and a sandbox: dsec cp ./src ID:/dst, dsec cp ID:/src ./dst')
    .argument('<src>')
    .argument('<dst>')
    .action(async (src: string, dst: string, _flags: object, cmd: Command) => {
      const from = parseRemote(src);
      const to = parseRemote(dst);
      if ((from && to) || (!from && !to)) throw new InvalidArgumentError('exactly one of SRC and DST must be ID:/path');
      const client = clientFor(cmd.optsWithGlobals<ConnectionFlags>());
      if (to) {
        // Upload. Into an existing remote directory, the copy keeps its name (as cp does).
        const st = await stat(src);
        // Refused before a byte is sent: the server would cut the upload off at its limit.
        checkUploadSize(st.isDirectory() ? `${src} as a tar` : src, st.isDirectory() ? await minTarBytes(src) : st.size);
        const sb = await Sandbox.connect(to.id, { client });
        let target = to.path;
        const existing = await sb.files.stat(target).catch((err: unknown) => {
          if (isDsecError(err, 'FILE_NOT_FOUND') || isDsecError(err, 'NOT_FOUND')) return undefined;
          throw err;
        });
        if (existing?.type === 'dir') target = path.posix.join(target, path.basename(path.resolve(src)));
        if (st.isDirectory()) await sb.files.uploadDir(src, target);
        else await sb.files.write(target, createReadStream(src), { mode: st.mode & 0o777 });
      } else if (from) {
        const sb = await Sandbox.connect(from.id, { client });
        const remote = await sb.files.stat(from.path);
        let target = dst;
        if ((await localStat(dst))?.isDirectory()) target = path.join(dst, path.posix.basename(from.path) || 'root');
        if (remote.type === 'dir') await sb.files.downloadDir(from.path, target);
        else {
          await mkdir(path.dirname(path.resolve(target)), { recursive: true });
          await pipeline(await sb.files.readStream(from.path), createWriteStream(target, { mode: remote.mode & 0o777 }));
        }
      }
    });
}
