// Image layers: kinds, references, images as stacks of layers, and layers as nodes and the API
// describe them.
import { z } from 'zod';

/**
 * The kind of an image layer: a base, a workspace on top, toolkits above that; a snapshot is a
 * sandbox's packed writable layer, above the layers it was taken over.
 */
export const LayerKindSchema = z.enum(['base', 'workspace', 'toolkit', 'snapshot', 'disk']);

/** The kind of an image layer. */
export type LayerKind = z.infer<typeof LayerKindSchema>;

/** Kinds a layer can be built or uploaded as (snapshots only come from sandboxes). */
export const BuildableLayerKindSchema = z.enum(['base', 'workspace', 'toolkit']);

/** A kind a layer can be built as. */
export type BuildableLayerKind = z.infer<typeof BuildableLayerKindSchema>;

/** A layer reference: `sha256:<64 hex>`, a bare 64-hex digest, `name` or `name:tag`. */
export const LayerRefSchema = z
  .string()
  .min(1)
  .max(256)
  .regex(/^(sha256:[0-9a-f]{64}|[0-9a-f]{64}|[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]{1,128})?)$/, 'not a layer reference (sha256:<hex>, name or name:tag)');

/** An environment: base + optional workspace + toolkits (lowest first). */
export const ImageSpecSchema = z.strictObject({
  base: LayerRefSchema,
  workspace: LayerRefSchema.optional(),
  toolkits: z.array(LayerRefSchema).max(16).optional(),
});

/** An environment: base + optional workspace + toolkits. */
export type ImageSpec = z.infer<typeof ImageSpecSchema>;

/**
 * The layers of an image, bottom first, each with the field that named it (`image.base`,
 * `image.workspace`, `image.toolkits.2`): the one place that says how an image stacks.
 */
export function imageLayers(image: ImageSpec): Array<{ field: string; ref: string }> {
  const out = [{ field: 'image.base', ref: image.base }];
  if (image.workspace !== undefined) out.push({ field: 'image.workspace', ref: image.workspace });
  (image.toolkits ?? []).forEach((ref, i) => out.push({ field: `image.toolkits.${i}`, ref }));
  return out;
}

/** POST /v1/layers query (the body is a tar stream, optionally gzip-compressed). */
export const UploadLayerQuerySchema = z.strictObject({
  /** Required for `tar` and `oci`; a `disk` upload is always a `disk` layer. */
  kind: BuildableLayerKindSchema.optional(),
  name: z.string().max(256).optional(),
  /**
   * `tar`: one layer tar (default); `oci`: an OCI layout or `docker save` tarball, squashed;
   * `disk`: a qcow2 or raw disk image of any OS (a `disk` layer, for `backend: "vm"`).
   */
  format: z.enum(['tar', 'oci', 'disk']).optional(),
});
/** POST /v1/layers query. */
export type UploadLayerQuery = z.infer<typeof UploadLayerQuerySchema>;

/** POST /v1/layers/debian */
export const DebianLayerRequestSchema = z.strictObject({
  kind: BuildableLayerKindSchema,
  name: z.string().max(256).optional(),
  packages: z.array(z.string().regex(/^[a-z0-9][a-z0-9+.-]+$/, 'not a Debian package name')).max(500),
  suite: z
    .string()
    .regex(/^[a-z]+$/)
    .optional(),
});
/** POST /v1/layers/debian body. */
export type DebianLayerRequest = z.infer<typeof DebianLayerRequestSchema>;

/**
 * POST /v1/layers/vm: a bootable VM disk image (a `disk` layer, qcow2) built from Debian with
 * systemd, the QEMU guest agent and chronus as a service; `packages` are added to those.
 * `desktop`: Debian's generic kernel with an initramfs and a virtio-blk root, Xorg, twm and an
 * xterm logged in on the VGA screen, and chromium (`browser URL`); a VM of it may also pause with
 * its memory in a file.
 */
export const VmLayerRequestSchema = z.strictObject({
  name: z.string().max(256).optional(),
  packages: DebianLayerRequestSchema.shape.packages.optional(),
  suite: DebianLayerRequestSchema.shape.suite,
  desktop: z.boolean().optional(),
});
/** POST /v1/layers/vm body. */
export type VmLayerRequest = z.infer<typeof VmLayerRequestSchema>;

/** An image in a registry: `host[:port]/repository[:tag]` or `...@sha256:<hex>`. */
export const ImageRefSchema = z
  .string()
  .min(3)
  .max(512)
  .regex(/^[^\s/]+\/[^\s]+$/, 'not an image reference (host[:port]/repository[:tag|@sha256:<hex>])');

/** POST /v1/layers/pull: an OCI or Docker image imported from a registry the node may pull from, squashed into one layer. */
export const PullLayerRequestSchema = z.strictObject({
  ref: ImageRefSchema,
  kind: BuildableLayerKindSchema.default('base'),
  name: z.string().max(256).optional(),
});
/** POST /v1/layers/pull body. */
export type PullLayerRequest = z.infer<typeof PullLayerRequestSchema>;

/** A layer as the API returns it. */
export const LayerSchema = z.object({
  digest: z.string(),
  kind: LayerKindSchema,
  names: z.array(z.string()),
  /** `public` for the node's built-in layers, else the owning project. */
  project: z.string(),
  contentBytes: z.number(),
  files: z.number(),
  createdAt: z.string(),
  /** For a snapshot layer: where it comes from and what it sits on. */
  snapshot: z
    .object({
      /** The layers below it, bottom first (a sandbox made from it gets these plus it). */
      parents: z.array(z.string()),
      /** The sandbox it was taken of. */
      sandboxId: z.string(),
      /** Trajectory steps of that sandbox with a lower seq were recorded before it was taken. */
      seq: z.number(),
      /** Visible to the sub-projects of its project (else private to the project). */
      sharedWithSubProjects: z.boolean().optional(),
    })
    .optional(),
});

export type Layer = z.infer<typeof LayerSchema>;

/** PATCH /v1/layers/{ref}: what may change of a layer. */
export const UpdateLayerRequestSchema = z.strictObject({
  /** A snapshot: share it with the sub-projects of its project, or make it private again. */
  shareWithSubProjects: z.boolean(),
});
/** PATCH /v1/layers/{ref} body. */
export type UpdateLayerRequest = z.infer<typeof UpdateLayerRequestSchema>;

/** A content-addressed layer held by a node. */
export const LayerInfoSchema = z.object({
  /** `sha256:<hex>` of the layer's EROFS metadata image followed by its data blob. */
  digest: z.string(),
  kind: LayerKindSchema,
  /** `name:tag` aliases pointing at this layer. */
  names: z.array(z.string()),
  labels: z.record(z.string(), z.string()),
  /** Bytes of file content in the layer. */
  contentBytes: z.number(),
  metaBytes: z.number(),
  blobBytes: z.number(),
  files: z.number(),
  createdAt: z.string(),
});
/** A content-addressed layer held by a node. */
export type LayerInfo = z.infer<typeof LayerInfoSchema>;
