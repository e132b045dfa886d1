// Importing an OCI image layout (directory or tarball) or a `docker save` tarball: the image's
// layers are applied in order into one tree, whiteouts deleting what they hide, so the result
// is one squashed, self-contained layer.
import { createHash } from 'node:crypto';
import type { Hash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { lstat, mkdir, readFile, readlink, stat } from 'node:fs/promises';
import { join, posix } from 'node:path';
import { DsecError } from '@dsec/protocol';
import { TarExtractor } from './tar-extract.js';
import type { TarLimits } from './tar-extract.js';

/** Options of {@link importOci}. */
export interface ImportOciOptions {
  /** Scratch directory private to this build (a tarball is unpacked there). */
  workDir: string;
  limits?: Partial<TarLimits> | undefined;
  signal?: AbortSignal | undefined;
  onProgress?: ((msg: string) => void) | undefined;
}

interface LayerRef {
  /** Path inside the image, relative to its root. */
  path: string;
  /** `sha256:<hex>` to verify, when the format gives one. */
  digest?: string;
}

const MAX_JSON_BYTES = 4 * 1024 * 1024;
const INDEX_TYPES = new Set(['application/vnd.oci.image.index.v1+json', 'application/vnd.docker.distribution.manifest.list.v2+json']);

function invalid(message: string, path?: string): DsecError {
  return new DsecError('LAYER_INVALID', message, path === undefined ? {} : { path });
}

/** Applies every layer of the image at `path` into `dest` (an empty directory). */
export async function importOci(path: string, dest: string, opts: ImportOciOptions): Promise<{ entries: number; bytes: number }> {
  const { signal, onProgress } = opts;
  let root = path;
  const st = await stat(path).catch(() => null);
  if (st === null) throw new DsecError('INVALID_ARGUMENT', `source.path: no such file or directory: ${path}`, { field: 'source.path', path });
  if (!st.isDirectory()) {
    // A tarball of the layout: unpack it (safely: it is as untrusted as any layer) and read that.
    root = join(opts.workDir, 'image');
    await mkdir(root, { mode: 0o700 });
    onProgress?.('unpacking image archive');
    const outer = new TarExtractor(root, { whiteouts: 'apply', limits: opts.limits, signal });
    await outer.extract(createReadStream(path));
    await outer.finish();
  }
  const layers = await imageLayers(root);
  onProgress?.(`image has ${layers.length} layer(s)`);
  const extractor = new TarExtractor(dest, { whiteouts: 'apply', limits: opts.limits, signal, onProgress });
  for (const [i, layer] of layers.entries()) {
    signal?.throwIfAborted();
    onProgress?.(`applying layer ${i + 1}/${layers.length} ${layer.digest ?? layer.path}`);
    const file = await resolveInside(root, layer.path);
    const hash = createHash('sha256');
    await extractor.extract(hashed(file, hash));
    if (layer.digest !== undefined && `sha256:${hash.digest('hex')}` !== layer.digest) {
      throw invalid(`layer ${layer.path} does not match its digest ${layer.digest}`, layer.path);
    }
  }
  return extractor.finish();
}

async function* hashed(path: string, hash: Hash): AsyncGenerator<Buffer> {
  for await (const chunk of createReadStream(path)) {
    hash.update(chunk as Buffer);
    yield chunk as Buffer;
  }
}

/** The layer files of the image rooted at `root`, lowest first. */
async function imageLayers(root: string): Promise<LayerRef[]> {
  const index = await readJsonIfExists(root, 'index.json');
  if (index !== undefined) return ociLayers(root, index, 0);
  const manifest = await readJsonIfExists(root, 'manifest.json');
  if (manifest !== undefined) return dockerSaveLayers(manifest);
  throw invalid('not an OCI image layout (index.json) or docker save archive (manifest.json)');
}

function dockerSaveLayers(manifest: unknown): LayerRef[] {
  const first = Array.isArray(manifest) ? (manifest[0] as { Layers?: unknown } | undefined) : undefined;
  const layers = first?.Layers;
  if (!Array.isArray(layers) || !layers.every((l): l is string => typeof l === 'string')) {
    throw invalid('manifest.json: expected [{"Layers": ["<path>", ...]}]');
  }
  return layers.map((p) => {
    // Newer docker writes OCI blobs and names them by digest: verify those too.
    const m = /^blobs\/sha256\/([0-9a-f]{64})$/.exec(p);
    return m ? { path: p, digest: `sha256:${m[1]}` } : { path: p };
  });
}

interface Descriptor {
  mediaType?: string;
  digest: string;
  platform?: { os?: string; architecture?: string };
}

async function ociLayers(root: string, index: unknown, depth: number): Promise<LayerRef[]> {
  if (depth > 4) throw invalid('image index nested too deeply');
  const manifests = (index as { manifests?: unknown }).manifests;
  if (!Array.isArray(manifests) || manifests.length === 0) throw invalid('index.json: no manifests');
  const descs = manifests.map(descriptor);
  const arch = process.arch === 'x64' ? 'amd64' : process.arch;
  const chosen = descs.find((d) => d.platform?.os === 'linux' && d.platform.architecture === arch) ?? descs.find((d) => d.platform === undefined) ?? descs[0]!;
  const doc = await readBlobJson(root, chosen.digest);
  const mediaType = chosen.mediaType ?? (doc as { mediaType?: string }).mediaType;
  if (mediaType !== undefined && INDEX_TYPES.has(mediaType)) return ociLayers(root, doc, depth + 1);
  const layers = (doc as { layers?: unknown }).layers;
  if (!Array.isArray(layers)) throw invalid(`manifest ${chosen.digest}: no layers`);
  return layers.map(descriptor).map((d) => ({ path: blobPath(d.digest), digest: d.digest }));
}

function descriptor(value: unknown): Descriptor {
  const d = value as Partial<Descriptor> | null;
  if (typeof d?.digest !== 'string' || !/^sha256:[0-9a-f]{64}$/.test(d.digest)) {
    throw invalid(`bad descriptor digest ${JSON.stringify(d?.digest)} (only sha256 is supported)`);
  }
  return d as Descriptor;
}

function blobPath(digest: string): string {
  return `blobs/sha256/${digest.slice('sha256:'.length)}`;
}

async function readBlobJson(root: string, digest: string): Promise<unknown> {
  const file = await resolveInside(root, blobPath(digest));
  const bytes = await readSmall(file);
  if (`sha256:${createHash('sha256').update(bytes).digest('hex')}` !== digest) throw invalid(`blob ${digest} does not match its digest`);
  return parseJson(bytes, digest);
}

async function readJsonIfExists(root: string, name: string): Promise<unknown> {
  const st = await lstat(join(root, name)).catch(() => null);
  if (st === null) return undefined;
  return parseJson(await readSmall(await resolveInside(root, name)), name);
}

async function readSmall(file: string): Promise<Buffer> {
  const st = await stat(file);
  if (!st.isFile() || st.size > MAX_JSON_BYTES) throw invalid(`${file}: not a small regular file`);
  return readFile(file);
}

function parseJson(bytes: Buffer, what: string): unknown {
  try {
    return JSON.parse(bytes.toString('utf8')) as unknown;
  } catch {
    throw invalid(`${what}: not valid JSON`);
  }
}

/**
 * Resolves `rel` inside `root`, following symlinks only while they stay inside `root`
 * (docker save links duplicate layers to one another). Returns a path to a regular file.
 */
export async function resolveInside(root: string, rel: string): Promise<string> {
  let pending = rel.split('/').filter((c) => c !== '' && c !== '.');
  const done: string[] = [];
  let hops = 0;
  while (pending.length > 0) {
    const comp = pending.shift()!;
    if (comp === '..') {
      if (done.length === 0) throw invalid(`${rel}: escapes the image`, rel);
      done.pop();
      continue;
    }
    const path = join(root, ...done, comp);
    const st = await lstat(path).catch(() => null);
    if (st === null) throw invalid(`${rel}: missing from the image`, rel);
    if (st.isSymbolicLink()) {
      if (++hops > 40) throw invalid(`${rel}: too many symlinks`, rel);
      const target = await readlink(path);
      if (posix.isAbsolute(target)) throw invalid(`${rel}: absolute symlink in the image`, rel);
      pending = [...target.split('/').filter((c) => c !== '' && c !== '.'), ...pending];
      continue;
    }
    if (pending.length > 0 && !st.isDirectory()) throw invalid(`${rel}: not a directory on the way`, rel);
    if (pending.length === 0 && !st.isFile()) throw invalid(`${rel}: not a regular file`, rel);
    done.push(comp);
  }
  if (done.length === 0) throw invalid(`${rel}: empty path`, rel);
  return join(root, ...done);
}
