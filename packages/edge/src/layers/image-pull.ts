// `dsec image pull`: an OCI or Docker image fetched from a registry by reference into an OCI
// image layout on disk, which the OCI importer then squashes into one layer. Only registries the
// operator listed (`node.pullFrom`) are reached: a tenant's reference can never make the node
// dial an address of its choosing.
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { DsecError, invalidArgument } from '@dsec/protocol';
import { RegistryClient } from './registry.js';
import type { RegistryEndpoint } from './registry.js';

const MANIFEST_TYPES = [
  'application/vnd.oci.image.index.v1+json',
  'application/vnd.docker.distribution.manifest.list.v2+json',
  'application/vnd.oci.image.manifest.v1+json',
  'application/vnd.docker.distribution.manifest.v2+json',
];
const INDEX_TYPES = new Set(MANIFEST_TYPES.slice(0, 2));
/** Largest compressed layer of an image pulled (the importer bounds what it unpacks). */
const MAX_IMAGE_BLOB_BYTES = 16 * 1024 ** 3;
/** Most layers an image pulled may have. */
const MAX_IMAGE_LAYERS = 128;

/** An image reference split: `host[:port]/repo[:tag][@sha256:...]`. */
export interface ImageRef {
  host: string;
  repository: string;
  /** Tag or `sha256:` digest. */
  reference: string;
}

const REPO_RE = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:\/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$/;
const TAG_RE = /^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$/;

/** Parses an image reference that names its registry; INVALID_ARGUMENT (field `ref`) otherwise. */
export function parseImageRef(ref: string): ImageRef {
  const bad = (why: string) => invalidArgument('ref', `${why}: ${JSON.stringify(ref)} (expected host[:port]/repository[:tag|@sha256:<hex>])`);
  if (ref.length > 512) throw bad('too long');
  const slash = ref.indexOf('/');
  if (slash <= 0) throw bad('no registry host');
  const host = ref.slice(0, slash);
  if (!/^[A-Za-z0-9.-]+(:\d{1,5})?$/.test(host) && !/^\[[0-9a-fA-F:]+\](:\d{1,5})?$/.test(host)) throw bad('not a registry host');
  let rest = ref.slice(slash + 1);
  let reference = 'latest';
  const at = rest.indexOf('@');
  if (at >= 0) {
    reference = rest.slice(at + 1);
    rest = rest.slice(0, at);
    if (!/^sha256:[0-9a-f]{64}$/.test(reference)) throw bad('not a sha256 digest');
  } else {
    const colon = rest.lastIndexOf(':');
    if (colon >= 0) {
      reference = rest.slice(colon + 1);
      rest = rest.slice(0, colon);
      if (!TAG_RE.test(reference)) throw bad('not a tag');
    }
  }
  if (!REPO_RE.test(rest)) throw bad('not a repository name');
  return { host: host.toLowerCase(), repository: rest, reference };
}

/** Options of {@link pullImage}. */
export interface PullImageOptions {
  /** The registries the operator allows (`node.pullFrom`). */
  registries: readonly RegistryEndpoint[];
  signal?: AbortSignal | undefined;
  onProgress?: ((msg: string) => void) | undefined;
}

interface Descriptor {
  mediaType?: string;
  digest: string;
  size: number;
  platform?: { os?: string; architecture?: string };
}

function descriptors(value: unknown, what: string): Descriptor[] {
  if (!Array.isArray(value)) throw new DsecError('LAYER_INVALID', `image ${what}: not a list of descriptors`);
  return value.map((d: Partial<Descriptor> | null) => {
    if (typeof d?.digest !== 'string' || !/^sha256:[0-9a-f]{64}$/.test(d.digest) || typeof d.size !== 'number' || d.size < 0) {
      throw new DsecError('LAYER_INVALID', `image ${what}: bad descriptor`);
    }
    return d as Descriptor;
  });
}

/** Fetches image `ref` into an OCI image layout at `dir` (made here). */
export async function pullImage(ref: string, dir: string, opts: PullImageOptions): Promise<void> {
  const image = parseImageRef(ref);
  const endpoint = opts.registries.find((r) => new URL(r.url).host.toLowerCase() === image.host);
  if (endpoint === undefined) {
    throw new DsecError('PERMISSION_DENIED', `ref: registry ${image.host} is not one this node pulls from (node.pullFrom)`, { field: 'ref' });
  }
  const client = new RegistryClient(endpoint);
  const { signal } = opts;
  const progress = opts.onProgress ?? (() => undefined);
  const blobs = join(dir, 'blobs', 'sha256');
  await mkdir(blobs, { recursive: true });
  const save = async (digest: string, body: Buffer) => writeFile(join(blobs, digest.slice('sha256:'.length)), body);

  let top = await client.manifest(image.repository, image.reference, MANIFEST_TYPES, signal);
  if (top === undefined) throw new DsecError('NOT_FOUND', `ref: ${ref} is not in registry ${image.host}`, { field: 'ref' });
  let doc = JSON.parse(top.body.toString('utf8')) as { mediaType?: string; manifests?: unknown; layers?: unknown; config?: unknown };
  if (INDEX_TYPES.has(top.mediaType) || (doc.manifests !== undefined && doc.layers === undefined)) {
    const arch = process.arch === 'x64' ? 'amd64' : process.arch;
    const all = descriptors(doc.manifests, 'index');
    const chosen = all.find((d) => d.platform?.os === 'linux' && d.platform.architecture === arch);
    if (chosen === undefined) throw invalidArgument('ref', `${ref} has no linux/${arch} image`);
    top = await client.manifest(image.repository, chosen.digest, MANIFEST_TYPES.slice(2), signal);
    if (top === undefined) throw new DsecError('LAYER_INVALID', `image ${ref}: manifest ${chosen.digest} is missing`);
    doc = JSON.parse(top.body.toString('utf8')) as typeof doc;
  }
  await save(top.digest, top.body);
  const layers = descriptors(doc.layers, 'manifest layers');
  if (layers.length > MAX_IMAGE_LAYERS) throw new DsecError('LAYER_INVALID', `image ${ref} has ${layers.length} layers, over ${MAX_IMAGE_LAYERS}`);
  const [config] = descriptors([doc.config], 'config');
  await client.pullBlob(image.repository, config!.digest, join(blobs, config!.digest.slice(7)), 4 * 1024 * 1024, signal);
  for (const [i, layer] of layers.entries()) {
    progress(`pulling layer ${i + 1}/${layers.length} ${layer.digest} (${layer.size} bytes)`);
    await client.pullBlob(image.repository, layer.digest, join(blobs, layer.digest.slice(7)), Math.min(layer.size, MAX_IMAGE_BLOB_BYTES), signal);
  }
  await writeFile(join(dir, 'oci-layout'), JSON.stringify({ imageLayoutVersion: '1.0.0' }));
  const index = { schemaVersion: 2, manifests: [{ mediaType: top.mediaType || MANIFEST_TYPES[2], digest: top.digest, size: top.body.length }] };
  await writeFile(join(dir, 'index.json'), JSON.stringify(index));
}
