// sandbox.changes: what the sandbox changed against its image layers, and integrity checks.
import { DiffQuerySchema, VerifyRequestSchema } from '@dsec/protocol';
import type { DiffEntry, DiffResult, VerifyResult } from '@dsec/protocol';
import type { CallOptions } from './client.js';
import type { SandboxScope } from './scope.js';
import { defined, validate } from './validate.js';

/** Options of `sandbox.diff` (`sandbox.changes.diff`). */
export interface DiffOptions {
  /** Only entries at or below these paths (absolute, normalised). */
  paths?: string[];
  /** sha256 of added and changed files (default true). */
  hash?: boolean;
  /** Page size (default 1,000, at most 10,000). */
  limit?: number;
  /** `nextCursor` of the previous page. */
  cursor?: string;
}

/** The changes of one sandbox, read by its node (never through programs inside the sandbox). */
export class Changes {
  readonly #scope: SandboxScope;

  constructor(scope: SandboxScope) {
    this.#scope = scope;
  }

  /**
   * One page of what the sandbox added, changed and deleted against its image layers (read by
   * the node from the writable layer, with sha256 of file contents). Pass `nextCursor` back as
   * `cursor` for the next page, or iterate {@link Changes.entries}.
   */
  async diff(opts: DiffOptions & CallOptions = {}): Promise<DiffResult> {
    const { signal, requestTimeoutMs, ...rest } = opts;
    const q = validate(
      DiffQuerySchema,
      defined({ path: rest.paths, hash: rest.hash === undefined ? undefined : String(rest.hash), limit: rest.limit, cursor: rest.cursor }),
      'query',
    );
    return this.#scope.client.json<DiffResult>(
      { method: 'GET', path: this.#scope.route('/diff'), query: { path: q.path, hash: q.hash, limit: q.limit, cursor: q.cursor } },
      defined({ signal, requestTimeoutMs }),
    );
  }

  /** Every entry of the diff, fetching pages as it is iterated. */
  async *entries(opts: Omit<DiffOptions, 'cursor'> & CallOptions = {}): AsyncGenerator<DiffEntry> {
    let cursor: string | undefined;
    do {
      const page = await this.diff({ ...opts, ...(cursor ? { cursor } : {}) });
      yield* page.entries;
      cursor = page.nextCursor ?? undefined;
    } while (cursor);
  }

  /**
   * Integrity check for graders: whether each path holds a regular file with the given sha256
   * (read on the node, never through programs inside the sandbox; symlinks are not followed).
   */
  async verify(expected: Record<string, string>, opts: CallOptions = {}): Promise<VerifyResult> {
    const body = validate(VerifyRequestSchema, { expected });
    return this.#scope.client.json<VerifyResult>({ method: 'POST', path: this.#scope.route('/verify'), body }, opts);
  }
}
