// One adapter per package ecosystem: which public names it serves, how a request maps onto the
// mirror, and how a frozen mirror hides what was published after its cutoff.
//
// The freeze has two mechanisms, and an adapter uses the one its ecosystem allows:
// - Filtering (npm, PyPI): the metadata document lists artifacts with publish times, so
//   the adapter drops the later ones from it (`transformMetadata`) and refuses any artifact that is
//   not in the filtered document (`MirrorTransform.artifacts`). For PyPI, the metadata document is
//   the JSON simple index (`/simple/<project>/`, PEP 691, asked for with
//   `Accept: application/vnd.pypi.simple.v1+json`): `files[]` carry `upload-time` (PEP 700); the
//   adapter drops files uploaded after the cutoff, and an artifact request on
//   files.pythonhosted.org names its file, whose project (from the wheel or sdist file name,
//   normalised per PEP 503) gives the `metadata` request to check it against.
// - Choosing the upstream (Debian): Release files are signed over the Packages indexes, so they
//   cannot be filtered without re-signing. Instead a frozen mirror reads a snapshot archive
//   (snapshot.debian.org-style: the upstream is the `archive/` root, and `classify` puts
//   `<archive>/<YYYYMMDDTHHMMSSZ>/` before the path), whose content is immutable: every request is
//   `kind: 'other'`, and signatures hold because nothing is changed.
import type { NetworkPreset } from '@dsec/protocol';

/** What a request to a mirrored name is, as the adapter sees it. */
export interface MirrorRequest {
  /** `metadata`: a document that lists artifacts (filtered when frozen); `artifact`: a package file; `other`: served as is, or refused when frozen and the adapter says so. */
  kind: 'metadata' | 'artifact' | 'other';
  /** Path relative to the upstream base (no leading slash), URL-encoded as the upstream wants it. */
  upstreamPath: string;
  /** The `Accept` header to send upstream. */
  accept?: string;
  /** For artifacts: the request of the metadata document that lists it. */
  metadata?: MirrorRequest;
  /** For artifacts: its id in that document's {@link MirrorTransform.artifacts}. */
  artifactId?: string;
  /** For artifacts: its key in that document's {@link MirrorTransform.digests}; set, the metadata is consulted even unfrozen (to check the file). */
  digestId?: string;
  /** How long a cached copy is good: `immutable` (forever), `metadata` (refreshed after the metadata TTL; forever when frozen and fetched after the cutoff), `none`. */
  cache: 'immutable' | 'metadata' | 'none';
  /** Whether a frozen mirror may serve this `other` request (it cannot reveal anything newer). */
  servedWhenFrozen?: boolean;
  /** The public name whose upstream base `upstreamPath` is relative to (see {@link MirrorAdapter.upstreamBase}); default: the name asked. */
  host?: string;
}

/** The context of one transformation. */
export interface MirrorContext {
  /** Hide what was published after this time; undefined: not frozen. */
  cutoff?: Date;
  /** Base URL the sandbox used (`http://registry.npmjs.org/`): URLs in documents are rewritten onto it, so that follow-up requests come back through the proxy. */
  publicBase: string;
  /** Base URL of the mirror the documents came from. */
  upstreamBase: string;
}

/** A metadata document as the sandbox gets it. */
export interface MirrorTransform {
  body: Buffer;
  contentType: string;
  /** The ids of the artifacts it lists (visible ones only, when frozen). */
  artifacts: Set<string>;
  /** SHA-256 (hex) of artifacts by {@link MirrorRequest.digestId}, where the document gives them: such files are cached by content and checked. */
  digests?: Map<string, string>;
}

/** An ecosystem's mirror logic. Implementations are pure: no I/O. */
export interface MirrorAdapter {
  /** The preset it serves (`npm`). */
  readonly preset: NetworkPreset;
  /** Public names whose plain-HTTP requests are served from the mirror. */
  readonly hosts: readonly string[];
  /** The public registry, fetched when a policy's mirror names no upstream. */
  readonly defaultUpstream: string;
  /**
   * The upstream base of requests for the public name `host`, given the mirror's upstream `url`
   * (PyPI's files live on another origin than its index when the upstream is the public one).
   */
  upstreamBase(url: string, cutoff: Date | undefined, host: string): string;
  /** Maps a GET/HEAD of `path` (origin-form, with query) on `host`; undefined: not served (404). */
  classify(host: string, path: string, cutoff?: Date): MirrorRequest | undefined;
  /** The document as the sandbox should see it; undefined when nothing in it is visible (404). Throws on a malformed document. */
  transformMetadata(doc: Buffer, req: MirrorRequest, ctx: MirrorContext): MirrorTransform | undefined;
}
