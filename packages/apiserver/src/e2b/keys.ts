// The E2B key format: `e2b_<hex>` (the e2b SDK refuses other keys before it sends anything).
// Such keys are ordinary dsec keys (stored as a hash, with a project, a role and a quota); the
// E2B routes read them from `X-API-KEY`, the dsec routes from `Authorization: Bearer`.
import { randomBytes } from 'node:crypto';

/** Prefix of E2B-format keys. */
export const E2B_KEY_PREFIX = 'e2b_';
/** What the e2b SDK accepts (`src/api/index.ts`). */
export const E2B_KEY_RE = /^e2b_[0-9a-f]+$/;

/** A new secret in the E2B format (160 random bits, as E2B's own keys). */
export function newE2bKeySecret(): string {
  return E2B_KEY_PREFIX + randomBytes(20).toString('hex');
}
