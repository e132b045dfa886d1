// Files of a sandbox: file routes, metadata, and the diff and integrity check of its writable layer.
import { z } from 'zod';
import { NormalisedPathSchema } from './common.js';

/** File type in a sandbox. */
export const FileTypeSchema = z.enum(['file', 'dir', 'symlink', 'other']);
/** File type in a sandbox. */
export type FileType = z.infer<typeof FileTypeSchema>;

/** Metadata of one file in a sandbox. */
export const FileStatSchema = z.object({
  name: z.string(),
  type: FileTypeSchema,
  mode: z.number(),
  size: z.number(),
  mtimeMs: z.number(),
  uid: z.number().exactOptional(),
  gid: z.number().exactOptional(),
  linkTarget: z.string().exactOptional(),
});
/** Metadata of one file in a sandbox. */
export type FileStat = z.infer<typeof FileStatSchema>;

/** Query of the file routes. */
export const FilePathQuerySchema = z.strictObject({
  path: z.string().startsWith('/', 'must be absolute').max(4096),
  offset: z.coerce.number().int().min(0).optional(),
  length: z.coerce.number().int().min(0).optional(),
  mode: z
    .string()
    .regex(/^[0-7]{3,4}$/, 'octal mode')
    .optional(),
  append: z.enum(['true', 'false']).optional(),
  recursive: z.enum(['true', 'false']).optional(),
});
/** Query of the file routes. */
export type FilePathQuery = z.infer<typeof FilePathQuerySchema>;

/** POST /v1/sandboxes/{id}/files/rename */
export const RenameRequestSchema = z.strictObject({
  from: z.string().startsWith('/', 'must be absolute').max(4096),
  to: z.string().startsWith('/', 'must be absolute').max(4096),
});
/** POST /v1/sandboxes/{id}/files/rename body. */
export type RenameRequest = z.infer<typeof RenameRequestSchema>;

/** Default and largest page of a diff. */
export const DEFAULT_DIFF_PAGE = 1000;

export const MAX_DIFF_PAGE = 10_000;

/** Largest file hashed in a diff or an integrity check (larger ones are reported unhashed). */
export const MAX_HASH_BYTES = 64 * 1024 * 1024;

/** Most paths in one integrity check. */
export const MAX_VERIFY_PATHS = 1024;

/** Options of a diff: which paths, whether to hash, which page. */
export const DiffOptionsSchema = z.strictObject({
  /** Only entries at or below these paths (default: everything). */
  paths: z.array(NormalisedPathSchema).max(32).optional(),
  /** sha256 of added and changed regular files (default true). */
  hash: z.boolean().optional(),
  limit: z.number().int().min(1).max(MAX_DIFF_PAGE).optional(),
  /** `nextCursor` of the previous page. */
  cursor: z.string().max(8192).optional(),
});

export type DiffOptions = z.infer<typeof DiffOptionsSchema>;

/** GET /v1/sandboxes/{id}/diff query (`path` repeats). */
export const DiffQuerySchema = z.strictObject({
  path: z.array(NormalisedPathSchema).max(32).optional(),
  hash: z.enum(['true', 'false']).optional(),
  limit: z.coerce.number().int().min(1).max(MAX_DIFF_PAGE).optional(),
  cursor: z.string().max(8192).optional(),
});
/** GET /v1/sandboxes/{id}/diff query. */
export type DiffQuery = z.infer<typeof DiffQuerySchema>;

/**
 * One change of a sandbox against its layers. `added`: not in the layers; `changed`: in the
 * layers, written or its metadata changed; `deleted`: in the layers, removed; `replaced`: a
 * directory removed and made again (nothing below it comes from the layers) or a path whose
 * type changed.
 */
export const DiffEntrySchema = z.object({
  path: z.string(),
  change: z.enum(['added', 'changed', 'deleted', 'replaced']),
  type: FileTypeSchema,
  /** Mode bits and owner as the sandbox sees them (absent for deletions). */
  mode: z.number().optional(),
  uid: z.number().optional(),
  gid: z.number().optional(),
  size: z.number().optional(),
  /** sha256 (hex) of a regular file's content. */
  sha256: z.string().optional(),
  /** Why a regular file has no sha256 (too large, the call's hashing budget spent). */
  hashSkipped: z.string().optional(),
  /** For `changed` regular files that were hashed: false when only metadata changed. */
  contentChanged: z.boolean().optional(),
  linkTarget: z.string().optional(),
});

export type DiffEntry = z.infer<typeof DiffEntrySchema>;

/** 200 reply of GET /v1/sandboxes/{id}/diff: entries in path order, a page at a time. */
export const DiffResultSchema = z.object({
  entries: z.array(DiffEntrySchema),
  nextCursor: z.string().nullable(),
  /** False while the sandbox kept running during the walk (no freeze available): a file written meanwhile may be seen half-written. */
  frozen: z.boolean(),
});

export type DiffResult = z.infer<typeof DiffResultSchema>;

/** POST /v1/sandboxes/{id}/verify: the sha256 each path must have. */
export const VerifyRequestSchema = z.strictObject({
  expected: z
    .record(NormalisedPathSchema, z.string().regex(/^[0-9a-f]{64}$/, 'must be a lowercase hex sha256'))
    .refine((e) => Object.keys(e).length >= 1 && Object.keys(e).length <= MAX_VERIFY_PATHS, `1 to ${MAX_VERIFY_PATHS} paths`),
});

export type VerifyRequest = z.infer<typeof VerifyRequestSchema>;

/** The check of one path. */
export const VerifyItemSchema = z.object({
  path: z.string(),
  expected: z.string(),
  /** sha256 of what the sandbox holds there now; null when it is not a regular file or is too large. */
  actual: z.string().nullable(),
  ok: z.boolean(),
  /** Why it failed: missing, not-a-file, symlink-in-path, too-large, mismatch. */
  reason: z.string().optional(),
  /** Where the content comes from: the sandbox's writable layer or its image layers. */
  source: z.enum(['upper', 'layers']).optional(),
});

export type VerifyItem = z.infer<typeof VerifyItemSchema>;

/** 200 reply of POST /v1/sandboxes/{id}/verify. */
export const VerifyResultSchema = z.object({ ok: z.boolean(), results: z.array(VerifyItemSchema) });

export type VerifyResult = z.infer<typeof VerifyResultSchema>;
