// A node's layers in an OCI registry. One dsec layer is one OCI artifact in the configured
// repository, tagged `sha256-<hex>` after the layer's digest: its config blob is the layer's
// record (kind, sizes, labels), its two blobs the EROFS metadata image and the data blob, so
// any registry that speaks the distribution API stores them, deduplicates them and serves them
// by range. A node pushes every layer before it commits it, and pulls by digest a layer it does
// not hold.
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { readFile, rm, stat, writeFile } from 'node:fs/promises';
import { z } from 'zod';
import { DsecError, LayerKindSchema } from '@dsec/protocol';
import type { LayerInfo } from '@dsec/protocol';
import { layerDigest } from './erofs.js';
import { buildChunkIndex, decodeChunkIndex, encodeChunkIndex, erofsChunkExtents } from './lazy-index.js';
import type { ChunkIndex } from './lazy-index.js';
import { RegistryClient } from './registry.js';
import type { RegistryEndpoint } from './registry.js';

/** The registry a node keeps its layers in. */
export interface LayerRegistryOptions extends RegistryEndpoint {
  /** Repository of the layers; default {@link DEFAULT_LAYER_REPOSITORY}. */
  repository?: string | undefined;
}

/** Repository of a node's layers when none is configured. */
export const DEFAULT_LAYER_REPOSITORY = 'dsec/layers';

export const MANIFEST_TYPE = 'application/vnd.oci.image.manifest.v1+json';
export const LAYER_ARTIFACT_TYPE = 'application/vnd.dsec.layer.v1';
const CONFIG_TYPE = 'application/vnd.dsec.layer.config.v1+json';
const META_TYPE = 'application/vnd.dsec.erofs.meta.v1';
const BLOB_TYPE = 'application/vnd.dsec.erofs.blob.v1';
/** The chunk index (lazy-index.ts): what a node mounting the layer lazily fetches instead of the blob. */
const CHUNKS_TYPE = 'application/vnd.dsec.erofs.chunks.v1';
/**
 * A layer's access profile (an artifact of its own beside the layer, tagged `<layer tag>.profile`,
 * its `subject` the layer's manifest): the chunks the first run of the layer read, in order.
 */
export const PROFILE_ARTIFACT_TYPE = 'application/vnd.dsec.layer.profile.v1';
const PROFILE_TYPE = 'application/vnd.dsec.layer.profile.v1+json';
const EMPTY_CONFIG_TYPE = 'application/vnd.oci.empty.v1+json';
/** Largest profile read (4 bytes per chunk index, give or take). */
const MAX_PROFILE_BYTES = 64 * 1024 * 1024;
/** Largest metadata image or data blob pulled (a layer's content is bounded when it is built). */
const MAX_BLOB_BYTES = 64 * 1024 ** 3;
const MAX_CONFIG_BYTES = 1024 * 1024;

const DescriptorSchema = z.object({ mediaType: z.string(), digest: z.string().regex(/^sha256:[0-9a-f]{64}$/), size: z.number().int().nonnegative() });
const LayerManifestSchema = z.object({
  schemaVersion: z.literal(2),
  config: DescriptorSchema.extend({ mediaType: z.literal(CONFIG_TYPE) }),
  layers: z.union([
    z.tuple([DescriptorSchema.extend({ mediaType: z.literal(META_TYPE) }), DescriptorSchema.extend({ mediaType: z.literal(BLOB_TYPE) })]),
    z.tuple([
      DescriptorSchema.extend({ mediaType: z.literal(META_TYPE) }),
      DescriptorSchema.extend({ mediaType: z.literal(BLOB_TYPE) }),
      DescriptorSchema.extend({ mediaType: z.literal(CHUNKS_TYPE) }),
    ]),
  ]),
});
const LayerRecordSchema = z.object({
  digest: z.string(),
  kind: LayerKindSchema,
  labels: z.record(z.string(), z.string()),
  contentBytes: z.number().int().nonnegative(),
  files: z.number().int().nonnegative(),
  createdAt: z.string(),
});

/** A layer's record as stored in the registry (what {@link LayerInfo} says beyond names and sizes). */
export type LayerRecord = z.infer<typeof LayerRecordSchema>;

/** What a node needs to mount a layer without its data blob (see {@link LayerRegistry.pullLazy}). */
export interface LazyLayer {
  record: LayerRecord;
  /** Digest of the data blob in the repository (what chunks are fetched from). */
  blobDigest: string;
  index: ChunkIndex;
}

const ProfileManifestSchema = z.object({
  schemaVersion: z.literal(2),
  artifactType: z.literal(PROFILE_ARTIFACT_TYPE),
  layers: z.tuple([DescriptorSchema.extend({ mediaType: z.literal(PROFILE_TYPE) })]),
});
const ProfileSchema = z.object({
  layer: z.string(),
  chunks: z.array(z.int().nonnegative()),
  recordedAt: z.string(),
});

/** A layer's access profile as stored in the registry. */
export type LayerProfile = z.infer<typeof ProfileSchema>;

/** The tag of a layer's access profile. */
export function profileTag(digest: string): string {
  return `${layerTag(digest)}.profile`;
}

/** Files of a layer: its EROFS metadata image and data blob. */
export interface LayerFiles {
  meta: string;
  blob: string;
}

/** sha256 and size of a file. */
async function describe(path: string, mediaType: string): Promise<z.infer<typeof DescriptorSchema>> {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(path)) hash.update(chunk as Buffer);
  return { mediaType, digest: `sha256:${hash.digest('hex')}`, size: (await stat(path)).size };
}

/** The tag of a layer in the repository. */
export function layerTag(digest: string): string {
  return digest.replace(':', '-');
}

/** Layers of a node in a registry. */
export class LayerRegistry {
  readonly client: RegistryClient;
  readonly repository: string;
  /** The registry and credentials (handed to a lazy server, which fetches chunks itself). */
  readonly endpoint: RegistryEndpoint;

  constructor(opts: LayerRegistryOptions) {
    this.client = new RegistryClient(opts);
    this.endpoint = { url: opts.url, username: opts.username, password: opts.password };
    this.repository = opts.repository ?? DEFAULT_LAYER_REPOSITORY;
  }

  /** Whether the registry holds the layer. */
  async has(digest: string, signal?: AbortSignal): Promise<boolean> {
    return (await this.client.manifest(this.repository, layerTag(digest), [MANIFEST_TYPE], signal)) !== undefined;
  }

  /** Pushes a layer's blobs, then its manifest (so the tag never names missing blobs). */
  async push(files: LayerFiles, layer: Omit<LayerInfo, 'names'>, signal?: AbortSignal): Promise<void> {
    const repo = this.repository;
    const record: LayerRecord = {
      digest: layer.digest,
      kind: layer.kind,
      labels: layer.labels,
      contentBytes: layer.contentBytes,
      files: layer.files,
      createdAt: layer.createdAt,
    };
    const configBody = Buffer.from(JSON.stringify(record));
    const [meta, blob] = await Promise.all([describe(files.meta, META_TYPE), describe(files.blob, BLOB_TYPE)]);
    const indexFile = `${files.meta}.chunks`;
    await writeFile(indexFile, encodeChunkIndex(await buildChunkIndex(files.meta, files.blob)));
    const chunks = await describe(indexFile, CHUNKS_TYPE);
    await this.client.pushBlob(repo, chunks.digest, indexFile, chunks.size, signal);
    await rm(indexFile, { force: true });
    const config = { mediaType: CONFIG_TYPE, digest: `sha256:${createHash('sha256').update(configBody).digest('hex')}`, size: configBody.length };
    await this.client.pushBlob(repo, meta.digest, files.meta, meta.size, signal);
    await this.client.pushBlob(repo, blob.digest, files.blob, blob.size, signal);
    const configFile = `${files.meta}.config.json`;
    await writeFile(configFile, configBody);
    await this.client.pushBlob(repo, config.digest, configFile, config.size, signal);
    await rm(configFile, { force: true });
    const manifest = {
      schemaVersion: 2,
      mediaType: MANIFEST_TYPE,
      artifactType: LAYER_ARTIFACT_TYPE,
      config,
      layers: [meta, blob, chunks],
      annotations: { 'dev.dsec.layer.digest': layer.digest },
    };
    await this.client.putManifest(repo, layerTag(layer.digest), MANIFEST_TYPE, Buffer.from(JSON.stringify(manifest)), signal);
  }

  /**
   * Pulls the layer `digest` into `dir` (as `files` names it there) and checks that the files
   * are the layer (their digest is the one asked for). LAYER_NOT_FOUND when the registry has no
   * such layer; UNAVAILABLE when it cannot be reached.
   */
  async pull(digest: string, files: LayerFiles, signal?: AbortSignal): Promise<LayerRecord> {
    const repo = this.repository;
    const { manifest, record } = await this.manifestOf(digest, files.meta, signal);
    const [meta, blob] = manifest.layers;
    await this.client.pullBlob(repo, meta.digest, files.meta, Math.min(meta.size, MAX_BLOB_BYTES), signal);
    await this.client.pullBlob(repo, blob.digest, files.blob, Math.min(blob.size, MAX_BLOB_BYTES), signal);
    if ((await layerDigest(files.meta, files.blob)) !== digest) {
      throw new DsecError('LAYER_INVALID', `registry ${this.client.url}: the files of ${layerTag(digest)} are not that layer`, { layer: digest });
    }
    return record;
  }

  /**
   * Pulls what a lazy mount of the layer needs: its record, metadata image (to `metaPath`) and
   * chunk index (checked against the metadata image). Undefined when the layer was pushed
   * without an index (by an older node): it can only be pulled whole.
   */
  async pullLazy(digest: string, metaPath: string, signal?: AbortSignal): Promise<LazyLayer | undefined> {
    const repo = this.repository;
    const { manifest, record } = await this.manifestOf(digest, metaPath, signal);
    if (manifest.layers.length < 3) return undefined;
    const [meta, blob, chunks] = manifest.layers as [Descriptor, Descriptor, Descriptor];
    await this.client.pullBlob(repo, meta.digest, metaPath, Math.min(meta.size, MAX_BLOB_BYTES), signal);
    const indexFile = `${metaPath}.chunks`;
    await this.client.pullBlob(repo, chunks.digest, indexFile, Math.min(chunks.size, MAX_BLOB_BYTES), signal);
    const index = decodeChunkIndex(await readFile(indexFile));
    await rm(indexFile, { force: true });
    const extents = erofsChunkExtents(await readFile(metaPath));
    const consistent =
      index.blobBytes === blob.size &&
      extents.length === index.chunks.length &&
      extents.every((e, i) => e.offset === index.chunks[i]!.offset && e.length === index.chunks[i]!.length);
    if (!consistent)
      throw new DsecError('LAYER_INVALID', `registry ${this.client.url}: the chunk index of ${layerTag(digest)} does not match its metadata`, {
        layer: digest,
      });
    return { record, blobDigest: blob.digest, index };
  }

  /**
   * Stores a layer's access profile (`scratch`: a file path to stage the blob in). The layer must
   * be in the registry: the profile names its manifest as `subject`.
   */
  async pushProfile(digest: string, chunks: number[], scratch: string, signal?: AbortSignal): Promise<void> {
    const repo = this.repository;
    const layer = await this.client.manifest(repo, layerTag(digest), [MANIFEST_TYPE], signal);
    if (layer === undefined) throw new DsecError('LAYER_NOT_FOUND', `no layer ${digest} in registry ${this.client.url}`, { layer: digest });
    const profile: LayerProfile = { layer: digest, chunks, recordedAt: new Date().toISOString() };
    const empty = Buffer.from('{}');
    try {
      await writeFile(scratch, JSON.stringify(profile));
      const body = await describe(scratch, PROFILE_TYPE);
      await this.client.pushBlob(repo, body.digest, scratch, body.size, signal);
      await writeFile(scratch, empty);
      const config = await describe(scratch, EMPTY_CONFIG_TYPE);
      await this.client.pushBlob(repo, config.digest, scratch, config.size, signal);
      const manifest = {
        schemaVersion: 2,
        mediaType: MANIFEST_TYPE,
        artifactType: PROFILE_ARTIFACT_TYPE,
        config,
        layers: [body],
        subject: { mediaType: MANIFEST_TYPE, digest: layer.digest, size: layer.body.length },
        annotations: { 'dev.dsec.layer.digest': digest },
      };
      await this.client.putManifest(repo, profileTag(digest), MANIFEST_TYPE, Buffer.from(JSON.stringify(manifest)), signal);
    } finally {
      await rm(scratch, { force: true });
    }
  }

  /** A layer's access profile; undefined when none was stored (`scratch`: a file path to stage it in). */
  async profile(digest: string, scratch: string, signal?: AbortSignal): Promise<LayerProfile | undefined> {
    const repo = this.repository;
    const fetched = await this.client.manifest(repo, profileTag(digest), [MANIFEST_TYPE], signal);
    if (fetched === undefined) return undefined;
    const manifest = ProfileManifestSchema.safeParse(JSON.parse(fetched.body.toString('utf8')));
    if (!manifest.success) throw new DsecError('LAYER_INVALID', `registry ${this.client.url}: ${profileTag(digest)} is not a profile`, { layer: digest });
    try {
      await this.client.pullBlob(repo, manifest.data.layers[0].digest, scratch, MAX_PROFILE_BYTES, signal);
      const profile = ProfileSchema.safeParse(JSON.parse(await readFile(scratch, 'utf8')));
      if (!profile.success || profile.data.layer !== digest) {
        throw new DsecError('LAYER_INVALID', `registry ${this.client.url}: ${profileTag(digest)} is not that layer's profile`, { layer: digest });
      }
      return profile.data;
    } finally {
      await rm(scratch, { force: true });
    }
  }

  /** The manifest and record of a layer; LAYER_NOT_FOUND when the registry lacks it. */
  private async manifestOf(
    digest: string,
    near: string,
    signal?: AbortSignal,
  ): Promise<{ manifest: z.infer<typeof LayerManifestSchema>; record: LayerRecord }> {
    const repo = this.repository;
    const fetched = await this.client.manifest(repo, layerTag(digest), [MANIFEST_TYPE], signal);
    if (fetched === undefined) throw new DsecError('LAYER_NOT_FOUND', `no layer ${digest} on this node or in registry ${this.client.url}`, { layer: digest });
    const parsed = LayerManifestSchema.safeParse(JSON.parse(fetched.body.toString('utf8')));
    if (!parsed.success) throw new DsecError('LAYER_INVALID', `registry ${this.client.url}: ${layerTag(digest)} is not a dsec layer`, { layer: digest });
    const configFile = `${near}.config.json`;
    await this.client.pullBlob(repo, parsed.data.config.digest, configFile, MAX_CONFIG_BYTES, signal);
    const record = LayerRecordSchema.safeParse(JSON.parse(await readFile(configFile, 'utf8')));
    await rm(configFile, { force: true });
    if (!record.success || record.data.digest !== digest) {
      throw new DsecError('LAYER_INVALID', `registry ${this.client.url}: the record of ${layerTag(digest)} is not that layer's`, { layer: digest });
    }
    return { manifest: parsed.data, record: record.data };
  }
}

type Descriptor = z.infer<typeof DescriptorSchema>;
