// Layer references: a digest (`sha256:<hex>` or bare hex) or a `name[:tag]` alias (checked by
// protocol's `normalizeLayerName`, the one rule the API and every node share).
const DIGEST_RE = /^(?:sha256:)?([0-9a-f]{64})$/;

/** The hex part of a digest reference, or null when `ref` is not one. */
export function digestHex(ref: string): string | null {
  return DIGEST_RE.exec(ref)?.[1] ?? null;
}
