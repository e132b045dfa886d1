// Pieces every resource shares: environment variables, labels, sandbox paths, idempotency keys
// and the error bodies of the API.
import { z } from 'zod';

const envKey = z
  .string()
  .regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'not an environment variable name')
  .max(256);

/** Environment variables: names are shell identifiers, values at most 128 KiB. */
export const EnvSchema = z.record(envKey, z.string().max(131_072)).refine((e) => Object.keys(e).length <= 1024, 'at most 1024 variables');
/** Environment variables of a sandbox or a command. */
export type Env = z.infer<typeof EnvSchema>;

/** Labels: short keys and values, at most 64. */
export const LabelsSchema = z
  .record(z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$/, 'not a label key'), z.string().max(256))
  .refine((l) => Object.keys(l).length <= 64, 'at most 64 labels');
/** Labels of a sandbox. */
export type Labels = z.infer<typeof LabelsSchema>;

/** An absolute, normalised path inside a sandbox: no `.`/`..` components, no `//`, no trailing `/` (`/` itself allowed). */
export const NormalisedPathSchema = z
  .string()
  .min(1)
  .max(4096)
  .refine((p) => p.startsWith('/') && !p.includes('\0'), 'must be an absolute path without NUL')
  .refine(
    (p) =>
      p === '/' ||
      p
        .slice(1)
        .split('/')
        .every((c) => c !== '' && c !== '.' && c !== '..'),
    'must be normalised (no empty, . or .. components, no trailing /)',
  );

/** Header that makes a create (or a batch) idempotent. */
export const IDEMPOTENCY_KEY_HEADER = 'Idempotency-Key';

/** How long an idempotency key is remembered (ms). */
export const DEFAULT_IDEMPOTENCY_TTL_MS = 86_400_000;

/** An idempotency key: 1-255 printable ASCII characters, no spaces and no `#` (batches derive `<key>#<index>`). */
export const IdempotencyKeySchema = z
  .string()
  .min(1)
  .max(255)
  .regex(/^[\x21\x22\x24-\x7e]+$/, 'printable ASCII without spaces or #');

/** Every error body: `{error: {code, message, field?, ...}}`. */
export const ErrorBodySchema = z.object({
  error: z.object({ code: z.string(), message: z.string(), field: z.string().optional() }).loose(),
});
/** Every error body of the API. */
export type ErrorBody = z.infer<typeof ErrorBodySchema>;

/** The error of one failed item (the same body as an error reply's `error`). */
export const ItemErrorSchema = z.object({ code: z.string(), message: z.string(), field: z.string().optional() }).loose();

export type ItemError = z.infer<typeof ItemErrorSchema>;
