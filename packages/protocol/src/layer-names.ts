// Layer names: `name[:tag]` aliases of content-addressed layers, checked the same way by the
// API and by every node.
import { DsecError } from './errors.js';

/** Tag a layer name gets when it has none. */
export const DEFAULT_LAYER_TAG = 'latest';

const LAYER_NAME_RE = /^[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]{1,128})?$/;
const MAX_LAYER_NAME_LENGTH = 256;

/** Validates a `name[:tag]` and returns it with the tag filled in; INVALID_ARGUMENT otherwise. */
export function normalizeLayerName(name: string, field = 'name'): string {
  if (name.length > MAX_LAYER_NAME_LENGTH || !LAYER_NAME_RE.test(name)) {
    throw new DsecError('INVALID_ARGUMENT', `${field}: not a layer name (name or name:tag): ${JSON.stringify(name)}`, { field });
  }
  const [repo = ''] = name.split(':');
  // A name that reads as a digest would make references ambiguous.
  if (repo === 'sha256' || /^[0-9a-f]{64}$/.test(repo)) {
    throw new DsecError('INVALID_ARGUMENT', `${field}: a layer name may not look like a digest: ${name}`, { field });
  }
  return name.includes(':') ? name : `${name}:${DEFAULT_LAYER_TAG}`;
}
