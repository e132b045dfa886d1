// Uploads over the server's body limit (MAX_UPLOAD_BYTES) are refused here, before a byte is
// sent: the server would cut the stream off at its limit and the command would fail late and
// unclearly.
import { lstat, readdir } from 'node:fs/promises';
import path from 'node:path';
import { DsecError, MAX_UPLOAD_BYTES } from '@dsec/protocol';

const GiB = 1024 * 1024 * 1024;
const TAR_BLOCK = 512;

/** Throws PAYLOAD_TOO_LARGE naming `what` when `bytes` is over the server's upload limit; `hint` says what to do instead. */
export function checkUploadSize(what: string, bytes: number, hint?: string): void {
  if (bytes <= MAX_UPLOAD_BYTES) return;
  throw new DsecError(
    'PAYLOAD_TOO_LARGE',
    `${what}: ${(bytes / GiB).toFixed(2)} GiB (${bytes} bytes); uploads are limited to ${MAX_UPLOAD_BYTES / GiB} GiB (${MAX_UPLOAD_BYTES} bytes)${hint ? `: ${hint}` : ''}`,
  );
}

/**
 * The least bytes `dir` takes as the tar the SDK packs of it (a header per file, directory and
 * symlink, file data padded to 512 bytes, the end marker); long names add PAX headers on top.
 */
export async function minTarBytes(dir: string): Promise<number> {
  let bytes = 2 * TAR_BLOCK;
  const walk = async (rel: string): Promise<void> => {
    for (const e of await readdir(path.join(dir, rel), { withFileTypes: true })) {
      const name = path.join(rel, e.name);
      const st = await lstat(path.join(dir, name));
      if (st.isDirectory()) {
        bytes += TAR_BLOCK;
        await walk(name);
      } else if (st.isSymbolicLink()) bytes += TAR_BLOCK;
      else if (st.isFile()) bytes += TAR_BLOCK + Math.ceil(st.size / TAR_BLOCK) * TAR_BLOCK;
      // Sockets, fifos and devices are not packed.
    }
  };
  await walk('');
  return bytes;
}
