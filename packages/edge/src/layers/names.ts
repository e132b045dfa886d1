// Layer references: a digest (`sha256:<hex>` or bare hex) or a `name[:tag]` alias.
import { DsecError } from '@dsec/protocol';

/** Tag used when a name has none. */
export const DEFAULT_TAG = 'latest';

const NAME_RE = /^[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]{1,128})?$/;
const DIGEST_RE = /^(?:sha256:)?([0-9a-f]{64})$/;
const MAX_NAME_LENGTH = 256;

/** The hex part of a digest reference, or null when `ref` is not one. */
export function digestHex(ref: string): string | null {
  return DIGEST_RE.exec(ref)?.[1] ?? null;
}

/** Validates a `name[:tag]` and returns it with the tag filled in; INVALID_ARGUMENT otherwise. */
export function normalizeName(name: string, field = 'name'): string {
  if (name.length > MAX_NAME_LENGTH || !NAME_RE.test(name)) {
    throw new DsecError('INVALID_ARGUMENT', `${field}: not a layer name (name or name:tag): ${JSON.stringify(name)}`, { field });
  }
  const [repo = ''] = name.split(':');
  // A name that reads as a digest would make references ambiguous.
  if (repo === 'sha256' || /^[0-9a-f]{64}$/.test(repo)) {
    throw new DsecError('INVALID_ARGUMENT', `${field}: a layer name may not look like a digest: ${name}`, { field });
  }
  return name.includes(':') ? name : `${name}:${DEFAULT_TAG}`;
}
