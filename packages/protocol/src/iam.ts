// Projects, quotas and API keys.
import { z } from 'zod';

/** Roles of an API key, most powerful first. */
export const RoleSchema = z.enum(['admin', 'member', 'viewer']);

export type Role = z.infer<typeof RoleSchema>;

/** Limits of a project; usage of sub-projects counts toward every ancestor. */
export const QuotaSchema = z.strictObject({
  sandboxes: z.number().int().min(0).max(10_000_000),
  cpu: z.number().min(0).max(10_000_000),
  memoryMiB: z.number().int().min(0).max(1_000_000_000),
});

export type Quota = z.infer<typeof QuotaSchema>;

/** POST /v1/projects: a sub-project of the caller's project (or of `parent`, one of its descendants). */
export const CreateProjectRequestSchema = z.strictObject({
  name: z.string().regex(/^[a-z0-9][a-z0-9-]{0,62}$/, 'lowercase letters, digits and -'),
  parent: z.string().max(64).optional(),
  quota: QuotaSchema.partial().optional(),
});
/** POST /v1/projects body. */
export type CreateProjectRequest = z.infer<typeof CreateProjectRequestSchema>;

/** A project. */
export const ProjectSchema = z.object({
  id: z.string(),
  name: z.string(),
  parent: z.string().nullable(),
  quota: QuotaSchema,
  usage: QuotaSchema,
  createdAt: z.string(),
});

export type Project = z.infer<typeof ProjectSchema>;

/** POST /v1/keys */
export const CreateKeyRequestSchema = z.strictObject({
  name: z.string().min(1).max(64),
  role: RoleSchema,
  /** Project the key acts in; default the caller's. Must be the caller's or a descendant. */
  project: z.string().max(64).optional(),
  /** `e2b`: a key of the form E2B clients accept (`e2b_<hex>`); default `dsec` (`dsec_...`). */
  format: z.enum(['dsec', 'e2b']).optional(),
});
/** POST /v1/keys body. */
export type CreateKeyRequest = z.infer<typeof CreateKeyRequestSchema>;

/** An API key (the secret is returned once, at creation). */
export const ApiKeySchema = z.object({
  id: z.string(),
  name: z.string(),
  role: RoleSchema,
  project: z.string(),
  createdAt: z.string(),
  revokedAt: z.string().nullable(),
  key: z.string().optional(),
});

export type ApiKey = z.infer<typeof ApiKeySchema>;
