// A sandbox's lifecycle: its description, stats, pause and resume, lease, owner, and its end.
import { LeaseSchema, PauseRequestSchema, ResumeRequestSchema, UpdateSandboxRequestSchema } from '@dsec/protocol';
import type { PauseMemory } from '@dsec/protocol';
import type { CallOptions } from './client.js';
import type { SandboxScope } from './scope.js';
import type { LeaseOptions, PauseResult, SandboxInfo, SandboxStats } from './types.js';
import { defined, validate } from './validate.js';

/** The lifecycle calls of one sandbox (the Sandbox object offers them as its own methods). */
export class Lifecycle {
  readonly #scope: SandboxScope;

  constructor(scope: SandboxScope) {
    this.#scope = scope;
  }

  /** Fetches the sandbox's current description. */
  async info(opts: CallOptions = {}): Promise<SandboxInfo> {
    return this.#remember(await this.#scope.client.json<SandboxInfo>({ method: 'GET', path: this.#scope.route() }, opts));
  }

  /** Resource use read from the sandbox's cgroups and writable layer. */
  async stats(opts: CallOptions = {}): Promise<SandboxStats> {
    return this.#scope.client.json<SandboxStats>({ method: 'GET', path: this.#scope.route('/stats') }, opts);
  }

  /**
   * Destroys the sandbox and everything in it. `wait: false` returns as soon as the platform has
   * durably taken the delete (the sandbox is gone for the API from then on); its teardown on the
   * node, and the return of its quota, follow in the background.
   */
  async kill(opts: CallOptions & { wait?: boolean } = {}): Promise<void> {
    const { wait, ...call } = opts;
    const headers = wait === false ? { headers: { prefer: 'respond-async' } } : {};
    await this.#scope.client.request({ method: 'DELETE', path: this.#scope.route(), ...headers }, call);
  }

  /** Freezes every process and makes its memory reclaimable; processes, files and the file system are kept. */
  async pause(opts: CallOptions & { memory?: PauseMemory } = {}): Promise<PauseResult> {
    const { memory, ...call } = opts;
    const body = memory ? validate(PauseRequestSchema, { memory }) : undefined;
    const reply = await this.#scope.client.json<PauseResult>({ method: 'POST', path: this.#scope.route('/pause'), ...(body ? { body } : {}) }, call);
    this.#remember(reply.sandbox);
    return reply;
  }

  /** Resumes a paused sandbox (`prefetch: false` skips reading swapped-out memory back first). */
  async resume(opts: CallOptions & { prefetch?: boolean } = {}): Promise<PauseResult> {
    const { prefetch, ...call } = opts;
    const body = validate(ResumeRequestSchema, defined({ prefetch }));
    const reply = await this.#scope.client.json<PauseResult>({ method: 'POST', path: this.#scope.route('/resume'), body }, call);
    this.#remember(reply.sandbox);
    return reply;
  }

  /** Changes the lease: the fields given replace the current ones. */
  async setLease(lease: LeaseOptions, opts: CallOptions = {}): Promise<SandboxInfo> {
    const body = validate(UpdateSandboxRequestSchema, { lease: validate(LeaseSchema, lease, 'lease') });
    return this.#remember(await this.#scope.client.json<SandboxInfo>({ method: 'PATCH', path: this.#scope.route(), body }, opts));
  }

  /** Hands the sandbox to an owner session (null: none); resumes it if its old owner's loss paused it. */
  async setOwner(owner: string | null, opts: CallOptions = {}): Promise<SandboxInfo> {
    const body = validate(UpdateSandboxRequestSchema, { owner });
    return this.#remember(await this.#scope.client.json<SandboxInfo>({ method: 'PATCH', path: this.#scope.route(), body }, opts));
  }

  #remember(info: SandboxInfo): SandboxInfo {
    this.#scope.remember(info);
    return info;
  }
}
