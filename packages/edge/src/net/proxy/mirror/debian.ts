// The Debian archive as a mirror: `/<archive>/dists/...` (InRelease, Release, Release.gpg,
// Packages indexes, by-hash files) and `/<archive>/pool/...` (.deb and source files), for the
// archives `debian`, `debian-security`, `debian-updates`-style names. Nothing is rewritten: Release
// files are signed over the indexes, which list each pool file's size and SHA256, so apt checks
// everything the mirror serves against the archive's own key. A pool file name is unique to its
// content (the archive never reuses one), so pool files and by-hash indexes are cached forever.
//
// Frozen, the mirror reads a snapshot archive instead (snapshot.debian.org's layout: the upstream
// is the `archive/` root; a path becomes `<archive>/<YYYYMMDDTHHMMSSZ>/<rest>`, the snapshot at
// or before the cutoff), whose content never changes. The default upstream then is
// https://snapshot.debian.org/archive/; a policy's upstream must be such a root. Snapshot Release
// files are past their Valid-Until: the sandbox's apt is told not to check it (network.ts).
import { NETWORK_PRESETS } from '@dsec/protocol';
import type { MirrorAdapter, MirrorRequest, MirrorTransform } from './adapter.js';

/** The snapshot archive a frozen mirror reads when the policy names no upstream. */
export const DEBIAN_SNAPSHOT_UPSTREAM = 'https://snapshot.debian.org/archive/';
const ARCHIVE_RE = /^debian(-[a-z]+)?$/;
const SEGMENT_RE = /^[A-Za-z0-9._+~-]{1,255}$/;

/** A snapshot timestamp (`20240501T000000Z`) of a date. */
export function snapshotStamp(d: Date): string {
  return d
    .toISOString()
    .replace(/[-:]/g, '')
    .replace(/\.\d+Z$/, 'Z');
}

/** The Debian adapter. */
export class DebianMirrorAdapter implements MirrorAdapter {
  readonly preset = 'debian';
  readonly hosts: readonly string[] = NETWORK_PRESETS.debian;
  readonly defaultUpstream = 'https://deb.debian.org/';

  upstreamBase(url: string, cutoff: Date | undefined): string {
    const base = url.endsWith('/') ? url : url + '/';
    if (cutoff && new URL(base).origin === new URL(this.defaultUpstream).origin) return DEBIAN_SNAPSHOT_UPSTREAM;
    return base;
  }

  classify(_host: string, rawPath: string, cutoff?: Date): MirrorRequest | undefined {
    // Only validated segments reach the upstream path, decoded (apt writes `~` and `+` of
    // versions as %7e and %2b) and encoded again: no query, no separator, no dot segment.
    if (!rawPath.startsWith('/') || rawPath.length > 2048 || !/^[A-Za-z0-9._+~%/-]*$/.test(rawPath)) return undefined;
    let segments: string[];
    try {
      segments = rawPath.slice(1).split('/').map(decodeURIComponent);
    } catch {
      return undefined;
    }
    if (segments.some((s) => s === '.' || s === '..' || !SEGMENT_RE.test(s))) return undefined;
    const [archive, area, ...rest] = segments;
    if (!archive || !ARCHIVE_RE.test(archive) || (area !== 'dists' && area !== 'pool') || rest.length < 2) return undefined;
    const immutable = area === 'pool' || rest.includes('by-hash');
    const at = cutoff ? `${archive}/${snapshotStamp(cutoff)}` : archive;
    return {
      kind: 'other',
      upstreamPath: [at, area, ...rest.map(encodeURIComponent)].join('/'),
      // A snapshot never changes; the live archive's indexes do (refreshed after the metadata TTL).
      cache: immutable || cutoff ? 'immutable' : 'metadata',
      servedWhenFrozen: true,
    };
  }

  transformMetadata(): MirrorTransform | undefined {
    throw new Error('the Debian mirror passes every file through unchanged');
  }
}
