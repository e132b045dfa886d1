// Warm pools: sandboxes of one spec kept ready, claimed by matching creates.
import { PoolNameSchema, PutPoolRequestSchema } from '@dsec/protocol';
import type { CallOptions, DsecClient } from './client.js';
import type { PoolInfo, PoolPutRequest } from './types.js';
import { validate } from './validate.js';

/**
 * Warm pools of the caller's project. A `Sandbox.create` whose spec (layers, resources, backend)
 * matches a pool's claims one of its ready sandboxes; env, labels and lifetime are its own.
 */
export class PoolsApi {
  constructor(private readonly client: DsecClient) {}

  #route(name: string): string {
    return `/v1/pools/${encodeURIComponent(validate(PoolNameSchema, name, 'name'))}`;
  }

  /** Creates or replaces a pool; it fills in the background. Its sandboxes count against the quota. */
  async put(name: string, req: PoolPutRequest, opts: CallOptions = {}): Promise<PoolInfo> {
    const body = validate(PutPoolRequestSchema, req);
    return this.client.json({ method: 'PUT', path: this.#route(name), body }, opts);
  }

  /** One pool of the caller's project. */
  async get(name: string, opts: CallOptions = {}): Promise<PoolInfo> {
    return this.client.json({ method: 'GET', path: this.#route(name) }, opts);
  }

  /** The pools of the caller's project and its sub-projects. */
  async list(opts: CallOptions = {}): Promise<PoolInfo[]> {
    return (await this.client.json<{ items: PoolInfo[] }>({ method: 'GET', path: '/v1/pools' }, opts)).items;
  }

  /** Deletes a pool and destroys its ready sandboxes (claimed ones are not affected). */
  async delete(name: string, opts: CallOptions = {}): Promise<void> {
    await this.client.request({ method: 'DELETE', path: this.#route(name) }, opts);
  }
}
