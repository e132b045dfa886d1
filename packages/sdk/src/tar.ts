// Local directories to and from tar streams (for files.uploadDir / files.downloadDir).
import { createReadStream, createWriteStream } from 'node:fs';
import { chmod, lstat, mkdir, readdir, readlink, rm, symlink, utimes } from 'node:fs/promises';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import tar from 'tar-stream';
import { DsecError } from '@dsec/protocol';

/** A tar stream of everything under `dir` (names relative to it; regular files, dirs, symlinks). */
export function packDir(dir: string): AsyncIterable<Buffer> {
  const pack = tar.pack();
  const walk = async (rel: string): Promise<void> => {
    const entries = await readdir(path.join(dir, rel), { withFileTypes: true });
    entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    for (const e of entries) {
      const name = rel ? `${rel}/${e.name}` : e.name;
      const full = path.join(dir, name);
      const st = await lstat(full);
      const common = { name, mode: st.mode & 0o7777, mtime: st.mtime, uid: 0, gid: 0 };
      if (st.isDirectory()) {
        pack.entry({ ...common, type: 'directory' });
        await walk(name);
      } else if (st.isSymbolicLink()) {
        pack.entry({ ...common, type: 'symlink', linkname: await readlink(full) });
      } else if (st.isFile()) {
        const entry = pack.entry({ ...common, type: 'file', size: st.size });
        await pipeline(createReadStream(full), entry);
      }
      // Sockets, fifos and devices are not copied.
    }
  };
  walk('').then(
    () => pack.finalize(),
    (err: unknown) => pack.destroy(err as Error),
  );
  return pack as AsyncIterable<Buffer>;
}

/**
 * Unpacks a tar stream into `dir`. Entry names are taken relative to `dir`; a name that would
 * land outside it, or go through a symlink the archive created, is refused.
 */
export async function unpackInto(stream: NodeJS.ReadableStream, dir: string): Promise<{ files: number; bytes: number }> {
  const root = path.resolve(dir);
  await mkdir(root, { recursive: true });
  const extract = tar.extract();
  const links = new Set<string>();
  const dirModes: Array<[string, number, Date | undefined]> = [];
  let files = 0;
  let bytes = 0;
  const done = pipeline(stream, extract);
  // Observed below; an early throw leaves it rejected with a premature close.
  done.catch(() => undefined);
  for await (const entry of extract) {
    const h = entry.header;
    const rel = h.name.replace(/^(\.\/)+/, '').replace(/\/+$/, '');
    if (rel === '' || rel === '.') {
      entry.resume();
      continue;
    }
    const target = path.resolve(root, rel);
    if (target !== root && !target.startsWith(root + path.sep))
      throw new DsecError('INVALID_ARGUMENT', `tar entry escapes the target: ${h.name}`, { path: h.name });
    for (let p = path.dirname(target); p !== root && p.startsWith(root); p = path.dirname(p)) {
      if (links.has(p)) throw new DsecError('INVALID_ARGUMENT', `tar entry goes through a symlink: ${h.name}`, { path: h.name });
    }
    await mkdir(path.dirname(target), { recursive: true });
    if (h.type === 'directory') {
      await mkdir(target, { recursive: true });
      dirModes.push([target, h.mode ?? 0o755, h.mtime]);
      entry.resume();
    } else if (h.type === 'symlink') {
      await rm(target, { force: true });
      await symlink(h.linkname ?? '', target);
      links.add(target);
      entry.resume();
    } else if (h.type === 'file' || h.type === 'contiguous-file') {
      // Replace, never write through, whatever is there (a symlink would redirect the write).
      await rm(target, { force: true });
      await pipeline(entry, createWriteStream(target, { mode: (h.mode ?? 0o644) & 0o777, flags: 'wx' }));
      await chmod(target, (h.mode ?? 0o644) & 0o7777);
      if (h.mtime) await utimes(target, h.mtime, h.mtime);
      files++;
      bytes += h.size ?? 0;
    } else {
      entry.resume();
    }
  }
  await done;
  // Directory modes last, deepest first, so that read-only directories do not block their content.
  for (const [d, mode, mtime] of dirModes.reverse()) {
    await chmod(d, mode & 0o7777);
    if (mtime) await utimes(d, mtime, mtime);
  }
  return { files, bytes };
}
