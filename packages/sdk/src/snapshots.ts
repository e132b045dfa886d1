// sandbox.snapshots: pack a sandbox's writable layer into a layer, and fork sandboxes from it.
import { ForkRequestSchema, SnapshotRequestSchema } from '@dsec/protocol';
import type { ForkResult } from '@dsec/protocol';
import type { CallOptions } from './client.js';
import type { Sandbox } from './sandbox.js';
import type { SandboxScope } from './scope.js';
import type { LayerInfo } from './types.js';
import { defined, validate } from './validate.js';

/** Options of `sandbox.snapshot` (`sandbox.snapshots.create`). */
export interface SnapshotOptions extends CallOptions {
  /** `name` or `name:tag` for the snapshot layer in the sandbox's project. */
  name?: string;
}

/** Options of `sandbox.fork` (`sandbox.snapshots.fork`). */
export interface ForkOptions extends CallOptions {
  /** Added to (and overriding) the source sandbox's labels. */
  labels?: Record<string, string>;
  /** Lifetime of each new sandbox (ms). */
  timeoutMs?: number;
  /**
   * Fork with memory (`microvm`, `vm`): each new sandbox resumes from a copy of the source's
   * memory and disk, its processes running on, with a network identity of its own. No snapshot.
   */
  memory?: boolean;
}

/** What `sandbox.fork` returns: the snapshot (none for a fork with memory) and the new sandboxes, ready to use. */
export interface ForkOutcome {
  snapshot?: LayerInfo;
  sandboxes: Sandbox[];
}

/** Snapshots and forks of one sandbox. */
export class Snapshots {
  readonly #scope: SandboxScope;

  constructor(scope: SandboxScope) {
    this.#scope = scope;
  }

  /**
   * Packs the sandbox's writable layer into a new snapshot layer (the sandbox is frozen while
   * it is read). `Sandbox.create({snapshot: layer.digest})` starts sandboxes from it.
   */
  async create(opts: SnapshotOptions = {}): Promise<LayerInfo> {
    const { signal, requestTimeoutMs, ...rest } = opts;
    const body = validate(SnapshotRequestSchema, defined(rest));
    return this.#scope.client.json<LayerInfo>({ method: 'POST', path: this.#scope.route('/snapshot'), body }, defined({ signal, requestTimeoutMs }));
  }

  /** One snapshot, then `count` independent sandboxes from it (all or none); with `memory`, forks of the running VM instead. */
  async fork(count: number, opts: ForkOptions = {}): Promise<ForkOutcome> {
    const { signal, requestTimeoutMs, ...rest } = opts;
    const body = validate(ForkRequestSchema, defined({ count, ...rest }));
    const reply = await this.#scope.client.json<ForkResult>(
      { method: 'POST', path: this.#scope.route('/fork'), body },
      defined({ signal, requestTimeoutMs: requestTimeoutMs ?? 0 }),
    );
    const sandboxes = reply.sandboxes.map((info) => this.#scope.adopt(info));
    return reply.snapshot ? { snapshot: reply.snapshot, sandboxes } : { sandboxes };
  }
}
