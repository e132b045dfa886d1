// E2B's file metadata: `X-Metadata-<key>: <value>` upload headers kept as user extended
// attributes of the file (`user.e2b.<key>`, as envd keeps them), read back into `EntryInfo`.
import { DsecError, invalidArgument } from '@dsec/protocol';
import type { Services } from '../services/index.js';
import type { CommandTarget } from '../services/commands.js';

/** The extended-attribute prefix of E2B file metadata (255-byte names leave 246 for the key). */
export const FILE_METADATA_XATTR_PREFIX = 'user.e2b.';
/** Upload header prefix (lowercase, as header names are read). */
const HEADER_PREFIX = 'x-metadata-';
/** Longest key (an xattr name is at most 255 bytes with its prefix). */
export const MAX_FILE_METADATA_KEY_BYTES = 255 - FILE_METADATA_XATTR_PREFIX.length;
/** Most bytes of keys and values of one file. */
export const MAX_FILE_METADATA_BYTES = 4096;
/** HTTP token characters (the SDK's own check of keys). */
const KEY = /^[a-z0-9!#$%&'*+\-.^_`|~]+$/;
/** Paths per edge call when reading (the edge takes at most 10,000). */
const PATHS_PER_CALL = 4096;
/** Printable US-ASCII. */
const VALUE = /^[\x20-\x7e]*$/;

/** The metadata an upload's headers carry (keys lowercased, prefix stripped); 400 naming the header when bad. */
export function metadataFromHeaders(headers: Record<string, string>): Record<string, string> {
  const out: Record<string, string> = {};
  let bytes = 0;
  for (const [name, raw] of Object.entries(headers)) {
    if (!name.toLowerCase().startsWith(HEADER_PREFIX)) continue;
    const key = name.slice(HEADER_PREFIX.length).toLowerCase();
    const value = raw.trim();
    if (!KEY.test(key) || key.length > MAX_FILE_METADATA_KEY_BYTES)
      throw invalidArgument(name, `the key must be 1-${MAX_FILE_METADATA_KEY_BYTES} HTTP token characters`);
    if (!VALUE.test(value)) throw invalidArgument(name, 'the value must be printable US-ASCII');
    bytes += key.length + value.length;
    out[key] = value;
  }
  if (bytes > MAX_FILE_METADATA_BYTES) throw invalidArgument('X-Metadata-*', `at most ${MAX_FILE_METADATA_BYTES} bytes of keys and values per file`);
  return out;
}

/**
 * Replaces a file's metadata (an upload without metadata clears it, as in envd). Where the
 * sandbox cannot keep extended attributes (a `vm`'s guest agent, a file system without user
 * xattrs), clearing is skipped and setting is a 400 naming the headers.
 */
export async function replaceFileMetadata(services: Services, t: CommandTarget, abs: string, metadata: Record<string, string>): Promise<void> {
  const empty = Object.keys(metadata).length === 0;
  try {
    await services.files.xattrs(t, [abs], FILE_METADATA_XATTR_PREFIX, metadata);
  } catch (err) {
    if (empty) return;
    if (err instanceof DsecError && err.code !== 'FILE_NOT_FOUND')
      throw new DsecError('INVALID_ARGUMENT', `X-Metadata-*: this sandbox cannot keep file metadata (${err.message})`, { field: 'X-Metadata-*' });
    throw err;
  }
}

/** The metadata of each path (empty where none, or where the sandbox cannot keep any). */
export async function fileMetadataOf(services: Services, t: CommandTarget, paths: string[]): Promise<Array<Record<string, string>>> {
  const out: Array<Record<string, string>> = [];
  for (let at = 0; at < paths.length; at += PATHS_PER_CALL) {
    const batch = paths.slice(at, at + PATHS_PER_CALL);
    const got = await services.files.xattrs(t, batch, FILE_METADATA_XATTR_PREFIX).catch((err: unknown) => {
      // A sandbox whose agent has no xattr operation (a VM, an agent older than it) has no metadata.
      if (err instanceof DsecError && err.status < 500) return batch.map(() => null);
      throw err;
    });
    for (const m of got) out.push(m ?? {});
  }
  return out;
}
