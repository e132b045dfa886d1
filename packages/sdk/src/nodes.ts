// Nodes of the cluster: list, one in full, join tokens, cordon, drain and removal (admin).
import type { DrainResult, JoinToken, NodeDetail } from '@dsec/protocol';
import { invalidArgument } from '@dsec/protocol';
import type { CallOptions, DsecClient } from './client.js';

function nodePath(name: string, rest = ''): string {
  if (typeof name !== 'string' || !/^[a-z0-9-]{1,64}$/.test(name)) throw invalidArgument('name', 'not a node name');
  return `/v1/nodes/${name}${rest}`;
}

/** The nodes sandboxes run on; everything but `list` needs an admin key of the root project. */
export class NodesApi {
  constructor(private readonly client: DsecClient) {}

  /** Every node with its state, capacity and allocation. */
  async list(opts: CallOptions = {}): Promise<NodeDetail[]> {
    return (await this.client.json<{ items: NodeDetail[] }>({ method: 'GET', path: '/v1/nodes' }, opts)).items;
  }

  /** One node in full. */
  async get(name: string, opts: CallOptions = {}): Promise<NodeDetail> {
    return this.client.json({ method: 'GET', path: nodePath(name) }, opts);
  }

  /** A single-use token for `dsec edge --join` (shown once). */
  async joinToken(req: { ttlMs?: number } = {}, opts: CallOptions = {}): Promise<JoinToken> {
    return this.client.json({ method: 'POST', path: '/v1/nodes/join-tokens', body: req }, opts);
  }

  /** Stops placing sandboxes on a node. */
  async cordon(name: string, opts: CallOptions = {}): Promise<NodeDetail> {
    return this.client.json({ method: 'POST', path: nodePath(name, '/cordon'), body: {} }, opts);
  }

  /** Places sandboxes on a node again. */
  async uncordon(name: string, opts: CallOptions = {}): Promise<NodeDetail> {
    return this.client.json({ method: 'POST', path: nodePath(name, '/uncordon'), body: {} }, opts);
  }

  /** Cordons a node; with `replay`, recreates its sandboxes elsewhere from their trajectories. */
  async drain(name: string, req: { replay?: boolean } = {}, opts: CallOptions = {}): Promise<DrainResult> {
    return this.client.json({ method: 'POST', path: nodePath(name, '/drain'), body: req }, opts);
  }

  /** Removes a joined node: its certificate is revoked and its sandboxes are lost (or replayed). */
  async remove(name: string, opts: CallOptions = {}): Promise<void> {
    await this.client.request({ method: 'DELETE', path: nodePath(name) }, opts);
  }
}
